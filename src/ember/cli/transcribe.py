"""`ember transcribe AUDIO.wav`: speech to text with Whisper (bundled tiny.en by default)."""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from ember.cli._args import existing_file, finite_float, int_at_least
from ember.cli._progress import add_progress_flag, bar
from ember.cli._text import echo
from ember.errors import EmberError

SILENCE_DBFS = -60.0  # below this RMS level the audio is taken for silence


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register this command's options."""
    p.add_argument(
        "audio",
        help="a PCM WAV file (any rate: resampled to 16 kHz; stereo is mixed); '-' reads stdin",
    )
    p.add_argument(
        "--model",
        help="CTranslate2 or Hugging Face Whisper folder (default: the bundled tiny.en)",
    )
    p.add_argument(
        "--temperature", type=finite_float(0.0), default=0.0, help="0 = greedy (default)"
    )
    p.add_argument(
        "--seed", type=int_at_least(0), default=None, help="seed for temperature sampling"
    )
    p.add_argument("--timestamps", action="store_true", help="print [start -> end] segments")
    p.add_argument("--language", default=None, help="language code (multilingual models)")
    p.add_argument("--task", choices=("transcribe", "translate"), default="transcribe")
    p.add_argument(
        "--threads", type=int_at_least(1), default=None, help="CPU threads (default: all cores)"
    )
    p.add_argument(
        "--quantize",
        choices=("q8_0",),
        default=None,
        help="quantize the decoder's weights at load (int8 products; the encoder stays float32)",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="timings on stderr")
    add_progress_flag(p)


def _stamp(t: float) -> str:
    m, s = divmod(t, 60.0)
    return f"{int(m):02d}:{s:05.2f}"


WAV_HINT = "ember reads integer PCM WAV; convert with: ffmpeg -i IN -c:a pcm_s16le OUT.wav"


def read_audio(name: str) -> np.ndarray:
    """16 kHz mono samples of the WAV file `name` ('-': a WAV read from stdin)."""
    import sys
    import tempfile
    from pathlib import Path

    from ember.models.whisper import load_audio

    if name != "-":
        path = existing_file(name)
        try:
            return load_audio(path)
        except EmberError as e:
            raise type(e)(f"{e} ({WAV_HINT})") from None
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else b""
    if not data:
        raise EmberError("no audio on stdin")
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "stdin.wav"
        p.write_bytes(data)
        try:
            return load_audio(p)
        except EmberError as e:
            raise type(e)(f"{str(e).replace(str(p), 'stdin')} ({WAV_HINT})") from None


def level_dbfs(audio: np.ndarray) -> float:
    """The RMS level of the samples in dB below full scale (-inf for digital silence)."""
    rms = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64))))
    return 20.0 * math.log10(rms) if rms > 0 else -math.inf


def _window_progress(model, seconds: float, enabled: bool | None):
    """A bar over the 30 s windows, advanced each time the encoder starts a window."""
    windows = max(1, math.ceil(seconds / 30.0))
    shown = enabled if enabled is not None else (None if windows > 1 else False)
    progress = bar(windows, "transcribe", "window", shown)
    started = [0]

    def on_window(_module, _inputs) -> None:
        if started[0]:
            progress.update(1)
        started[0] += 1

    handle = model.model.encoder.register_forward_pre_hook(on_window)
    return progress, handle


def run(args) -> int:
    """Transcribe and print the text (or timestamped segments)."""
    import ember
    from ember.generation.whisper import load_whisper, transcribe

    audio = read_audio(args.audio)
    name = "stdin" if args.audio == "-" else args.audio
    if audio.size == 0:
        raise EmberError(f"{name}: the WAV file holds no samples")
    level = level_dbfs(audio)
    if level < SILENCE_DBFS:
        echo(
            f"ember transcribe: warning: {name} is silent (level {level:.0f} dBFS); "
            "the transcript may be empty or made up",
            err=True,
        )
    if args.model is not None:
        from pathlib import Path

        if not Path(args.model).exists():
            raise EmberError(f"--model {args.model!r}: no such folder")
    if args.threads:
        ember.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model, tok = load_whisper(args.model, quantize=args.quantize)
    t_load = time.perf_counter() - t0
    progress, handle = _window_progress(model, audio.size / 16000, args.progress)
    try:
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
    except EmberError as e:
        given = [f"--language {args.language}"] if args.language else []
        given += ["--task translate"] if args.task == "translate" else []
        if given:  # the model refused what these flags asked for
            raise type(e)(f"{' '.join(given)}: {e}") from None
        raise
    finally:
        handle.remove()
        progress.close()
    if args.timestamps:
        for s in res.segments:
            echo(f"[{_stamp(s.start)} -> {_stamp(s.end)}] {s.text.strip()}")
    else:
        echo(res.text, text=True)
    if args.verbose:
        storage = getattr(model, "storage", None)
        if storage:
            kinds = ", ".join(f"{k} x{n} ({b / 1e6:.1f} MB)" for k, (n, b) in storage.items())
            how = f"decoder weights in {args.quantize.upper()}" if args.quantize else "float32"
            echo(f"{model.source}: stored as {kinds}; computing in {how}", err=True)
        total = res.timings["total"]
        rtf = total / res.audio_seconds if res.audio_seconds else float("nan")
        echo(
            f"load {t_load:.2f} s, audio {res.audio_seconds:.2f} s, transcribe {total:.2f} s "
            f"(features {res.timings['features']:.2f} s, encoder {res.timings['encode']:.2f} s, "
            f"decoder {res.timings['decode']:.2f} s), real-time factor {rtf:.3f}",
            err=True,
        )
    return 0
