"""`ember transcribe AUDIO.wav`: speech to text with Whisper (bundled tiny.en by default)."""

from __future__ import annotations

import argparse
import sys
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register this command's options."""
    p.add_argument("audio", help="a PCM WAV file (any rate: resampled to 16 kHz; stereo is mixed)")
    p.add_argument(
        "--model",
        help="CTranslate2 or Hugging Face Whisper folder (default: the bundled tiny.en)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, default=None, help="seed for temperature sampling")
    p.add_argument("--timestamps", action="store_true", help="print [start -> end] segments")
    p.add_argument("--language", default=None, help="language code (multilingual models)")
    p.add_argument("--task", choices=("transcribe", "translate"), default="transcribe")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--verbose", "-v", action="store_true", help="timings on stderr")


def _stamp(t: float) -> str:
    m, s = divmod(t, 60.0)
    return f"{int(m):02d}:{s:05.2f}"


def run(args) -> int:
    """Transcribe and print the text (or timestamped segments)."""
    import ember
    from ember.generation.whisper import load_whisper, transcribe
    from ember.models.whisper import load_audio

    if args.threads:
        ember.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model, tok = load_whisper(args.model)
    t_load = time.perf_counter() - t0
    audio = load_audio(args.audio)
    res = transcribe(
        model,
        tok,
        audio,
        temperature=args.temperature,
        seed=args.seed,
        timestamps=args.timestamps,
        language=args.language,
        task=args.task,
    )
    if args.timestamps:
        for s in res.segments:
            print(f"[{_stamp(s.start)} -> {_stamp(s.end)}] {s.text.strip()}")
    else:
        print(res.text)
    if args.verbose:
        storage = getattr(model, "storage", None)
        if storage:
            kinds = ", ".join(f"{k} x{n} ({b / 1e6:.1f} MB)" for k, (n, b) in storage.items())
            print(f"{model.source}: stored as {kinds}; computing in float32", file=sys.stderr)
        total = res.timings["total"]
        rtf = total / res.audio_seconds if res.audio_seconds else float("nan")
        print(
            f"load {t_load:.2f} s, audio {res.audio_seconds:.2f} s, transcribe {total:.2f} s "
            f"(features {res.timings['features']:.2f} s, encoder {res.timings['encode']:.2f} s, "
            f"decoder {res.timings['decode']:.2f} s), real-time factor {rtf:.3f}",
            file=sys.stderr,
        )
    return 0
