"""Speech recognition: ember's Whisper vs transformers' WhisperForConditionalGeneration (tiny.en).

Both sides hold the same float32 weights (the bundled CTranslate2 tiny.en, converted by
ember.models.whisper.ct2 and loaded into transformers with load_state_dict) and transcribe the
committed espeak-ng clip (tests/models/whisper/hello.wav) greedily without timestamps, in one
process, interleaved repeat by repeat, with the same thread count:

- "features": log-mel of the 30 s window (ember numpy vs WhisperFeatureExtractor);
- "encoder": one 30 s window through the encoder;
- "transcribe": audio in, text out (features + encoder + greedy decoding with the KV cache);
  transformers runs ``generate`` with the tiny.en generation settings (notimestamps prompt,
  suppress_tokens, begin_suppress_tokens).

The real-time factor is transcription time / audio length. Medians (and bests, which time spent
preempted by other jobs inflates least) go to bench/RESULTS.md with the command. Each timed call
follows an untimed call of the same function (see ``interleaved``).

    .venv/bin/python bench/whisper.py [--threads 2] [--repeat 5] [--no-append]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "bench"))


CLIP = os.path.join(ROOT, "tests", "models", "whisper", "hello.wav")


def interleaved(fns: dict, repeat: int) -> dict:
    """{name: [seconds]} timing each function once per round, rounds interleaved, one warm-up.

    Each timed call follows an untimed call of the same function, so that it does not inherit
    the previous function's threads still spinning: after numpy's multi-threaded BLAS (in
    transformers' feature extractor) OpenBLAS's workers spin for ~0.1 s and took the cores
    from ember's encoder timed next (~50 ms of a ~180 ms pass).
    """
    for f in fns.values():
        f()
    times: dict = {k: [] for k in fns}
    for _ in range(repeat):
        for k, f in fns.items():
            f()
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    return times


def hf_model(model, cfg):
    """transformers' Whisper holding ember's weights, with tiny.en's generation settings."""
    import torch
    from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration

    keys = (
        "vocab_size num_mel_bins d_model encoder_layers decoder_layers encoder_attention_heads "
        "decoder_attention_heads encoder_ffn_dim decoder_ffn_dim max_source_positions "
        "max_target_positions"
    ).split()
    hf = WhisperForConditionalGeneration(WhisperConfig(**{k: getattr(cfg, k) for k in keys}))
    sd = {k: torch.from_numpy(v.numpy().copy()) for k, v in model.state_dict().items()}
    hf.load_state_dict(sd, strict=True)
    hf.generation_config = GenerationConfig(
        decoder_start_token_id=50257,
        eos_token_id=50256,
        pad_token_id=50256,
        bos_token_id=50256,
        no_timestamps_token_id=50362,
        suppress_tokens=list(cfg.suppress_tokens or []),
        begin_suppress_tokens=list(cfg.begin_suppress_tokens or [220, 50256]),
        is_multilingual=False,
        max_new_tokens=224,
        max_initial_timestamp_index=50,
        return_timestamps=False,
    )
    return hf.eval()


def main() -> None:
    """Run the comparison, print the table, append it to bench/RESULTS.md."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import WhisperFeatureExtractor

    try:  # the transcription loop moved to ember.generation.whisper
        from ember.generation.whisper import load_whisper, transcribe
    except ImportError:  # an older ember tree (bench before/after runs)
        from ember.models.whisper import load_whisper, transcribe
    from ember.models.whisper import load_wav, log_mel_spectrogram

    transformers.logging.set_verbosity_error()
    from _common import set_threads

    set_threads(args.threads)
    t0 = time.perf_counter()
    model, tok = load_whisper()
    t_load = time.perf_counter() - t0
    hf = hf_model(model, model.config)
    fe = WhisperFeatureExtractor()
    audio, _ = load_wav(CLIP)
    seconds = audio.size / 16000
    mel = log_mel_spectrogram(audio)[None]
    tmel = torch.from_numpy(mel)

    def hf_transcribe():
        feats = fe(audio, sampling_rate=16000, return_tensors="pt").input_features
        with torch.inference_mode():
            out = hf.generate(feats)
        return tok.decode([t for t in out[0].tolist() if t < 50256])

    ember_text = transcribe(model, tok, audio).text
    hf_text = hf_transcribe().strip()
    res = transcribe(model, tok, audio)
    n_tokens = len(res.tokens)

    def hf_encoder():
        with torch.inference_mode():
            hf.model.encoder(tmel)

    fns = {
        "ember features": lambda: log_mel_spectrogram(audio),
        "torch features": lambda: fe(audio, sampling_rate=16000, return_tensors="np"),
        "ember encoder": lambda: model.encode(mel),
        "torch encoder": hf_encoder,
        "ember transcribe": lambda: transcribe(model, tok, audio),
        "torch transcribe": hf_transcribe,
    }
    load = os.getloadavg()
    times = interleaved(fns, args.repeat)
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}

    from _common import append, blas_info

    lines = [
        f"Whisper tiny.en (bundled CTranslate2 weights, float16 stored, float32 compute), "
        f"clip {seconds:.2f} s ({n_tokens} text tokens); {args.threads} threads each; median "
        f"(best) of {args.repeat} interleaved repeats; load average at start {load[0]:.2f}. "
        f"ember load (model.bin read + fp16->fp32 + tokenizer): {t_load * 1e3:.0f} ms.",
        "",
        f"ember: {ember_text!r}; transformers: {hf_text!r} "
        f"({'same' if ember_text == hf_text else 'different'} text).",
        "",
        f"torch {torch.__version__}, transformers {transformers.__version__}; torch intra-op "
        f"threads at the end: {torch.get_num_threads()}.",
        "",
        "| stage | ember ms | torch ms | torch / ember | ember RTF | torch RTF |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key in ("features", "encoder", "transcribe"):
        e, t = med[f"ember {key}"], med[f"torch {key}"]
        eb, tb = best[f"ember {key}"], best[f"torch {key}"]
        rtf = (
            f"{e / seconds:.3f} ({eb / seconds:.3f}) | {t / seconds:.3f} ({tb / seconds:.3f})"
            if key == "transcribe"
            else "- | -"
        )
        lines.append(
            f"| {key} | {e * 1e3:.0f} ({eb * 1e3:.0f}) | {t * 1e3:.0f} ({tb * 1e3:.0f}) | "
            f"{t / e:.2f}x ({tb / eb:.2f}x) | {rtf} |"
        )
    table = "\n".join(lines) + "\n"
    print(f"BLAS: {blas_info()}\n")
    print(table)
    if not args.no_append:
        append("Speech recognition: ember Whisper vs transformers (bench/whisper.py)", table)


if __name__ == "__main__":
    main()
