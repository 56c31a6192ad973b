"""`ember codec encode in.wav out.npz` / `ember codec decode in.npz out.wav`: EnCodec audio codes.

The .npz holds ``codes`` (frames, codebooks, steps; int16 or int32), ``scales`` (one per frame,
or empty when the model does not normalise), ``sample_rate``, ``channels``, ``length`` (samples
of the audio encoded), ``last_frame_pad_length``, ``bandwidth`` (kbps) and ``model`` (the
folder that encoded it, used by decode unless --model is given). It is read with
allow_pickle=False and checked field by field before anything is decoded.
"""

from __future__ import annotations

import argparse
import time
import wave
import zipfile
from pathlib import Path

import numpy as np

from ember.cli._args import existing_dir, existing_file, finite_float, writable_file
from ember.cli._text import echo
from ember.errors import EmberError, FormatError, ShapeError

MODEL_HELP = "a transformers EncodecModel folder (config.json + model.safetensors)"
DEBUG_HELP = "print the full traceback of an error"
FIELDS = ("codes", "scales", "sample_rate", "channels", "length", "last_frame_pad_length")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register the encode and decode sub-commands."""
    sub = p.add_subparsers(dest="codec_command", metavar="ACTION", required=True)
    enc = sub.add_parser("encode", help="WAV -> codes (.npz)", description="WAV -> codes (.npz)")
    enc.add_argument("audio", help="a PCM WAV file (resampled to the model's rate)")
    enc.add_argument("output", help="the .npz file to write")
    enc.add_argument("--model", help=MODEL_HELP)
    enc.add_argument(
        "--bandwidth",
        type=finite_float(0.0, low_open=True),
        default=None,
        help="kbps, one of the model's target_bandwidths (default: the smallest)",
    )
    dec = sub.add_parser("decode", help="codes (.npz) -> WAV", description="codes (.npz) -> WAV")
    dec.add_argument("codes", help="a .npz written by `ember codec encode`")
    dec.add_argument("output", help="the 16-bit PCM WAV file to write")
    dec.add_argument("--model", help=f"{MODEL_HELP} (default: the one named in the .npz)")
    for s in (enc, dec):
        s.add_argument("--verbose", "-v", action="store_true", help="timings on stderr")
        s.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)


def _load_model(folder: str, flag: str = "--model"):
    from ember.models.audio import EncodecModel

    return EncodecModel.from_pretrained(existing_dir(folder, flag))


def _to_model_audio(x: np.ndarray, rate: int, cfg, name: str) -> np.ndarray:
    """(channels, samples) at any rate -> (model channels, samples) at the model's rate."""
    from ember.models.whisper import resample

    if cfg.audio_channels == 1:
        x = x.mean(axis=0, keepdims=True)
    elif x.shape[0] == 1:
        x = np.repeat(x, 2, axis=0)
    elif x.shape[0] != 2:
        raise ShapeError(f"{name}: {x.shape[0]} channels; this stereo model takes 1 or 2")
    if rate != cfg.sampling_rate:
        x = np.stack([resample(c, rate, cfg.sampling_rate) for c in x])
    return np.ascontiguousarray(x, dtype=np.float32)


def encode(args) -> int:
    """Read the WAV, encode it, write the .npz."""
    from ember.cli.transcribe import WAV_HINT
    from ember.models.whisper import load_wav

    src = existing_file(args.audio)
    out = writable_file(args.output)
    if args.model is None:
        raise EmberError(f"no EnCodec model given: pass --model FOLDER ({MODEL_HELP})")
    try:
        x, rate = load_wav(src, mono=False)
    except EmberError as e:
        raise type(e)(f"{e} ({WAV_HINT})") from None
    if x.shape[-1] == 0:
        raise EmberError(f"{args.audio}: the WAV file holds no samples")
    t0 = time.perf_counter()
    model = _load_model(args.model)
    cfg = model.config
    t_load = time.perf_counter() - t0
    if args.bandwidth is not None and args.bandwidth not in cfg.target_bandwidths:
        allowed = ", ".join(f"{b:g}" for b in cfg.target_bandwidths)
        raise EmberError(f"--bandwidth {args.bandwidth:g}: this model takes one of {allowed}")
    audio = _to_model_audio(x, rate, cfg, args.audio)
    t0 = time.perf_counter()
    enc = model.encode(audio[None], bandwidth=args.bandwidth)
    t_enc = time.perf_counter() - t0
    codes = enc.audio_codes.numpy()[:, 0]  # (frames, codebooks, steps)
    codes = codes.astype(np.int16 if cfg.codebook_size <= 1 << 15 else np.int32)
    scales = [s for s in enc.audio_scales if s is not None]
    bandwidth = cfg.target_bandwidths[0] if args.bandwidth is None else args.bandwidth
    fields = dict(
        codes=codes,
        scales=np.array([float(s.numpy().reshape(-1)[0]) for s in scales], np.float32),
        sample_rate=np.int64(cfg.sampling_rate),
        channels=np.int64(cfg.audio_channels),
        length=np.int64(audio.shape[-1]),
        last_frame_pad_length=np.int64(enc.last_frame_pad_length),
        bandwidth=np.float64(bandwidth),
        model=np.array(str(Path(args.model).resolve())),
    )
    with open(out, "wb") as f:
        np.savez(f, **fields)
    seconds = audio.shape[-1] / cfg.sampling_rate
    echo(
        f"{args.audio}: {seconds:.2f} s -> {codes.shape[1]} codebooks x {codes.shape[2]} steps"
        f"{f' x {codes.shape[0]} chunks' if codes.shape[0] > 1 else ''} at {bandwidth:g} kbps"
        f" -> {args.output}"
    )
    if args.verbose:
        rtf = t_enc / seconds if seconds else float("nan")
        echo(f"load {t_load:.2f} s, encode {t_enc:.2f} s, real-time factor {rtf:.3f}", err=True)
    return 0


def read_codes(path: Path) -> dict:
    """The fields of a codec .npz, checked for presence, dtype and shape (FormatError if not)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise FormatError(f"{path}: not a codec .npz file ({type(e).__name__}: {e})") from None
    missing = [k for k in FIELDS if k not in data]
    if missing:
        raise FormatError(f"{path}: the .npz lacks {', '.join(missing)} (expected {FIELDS})")
    codes = data["codes"]
    if codes.dtype.kind not in "iu" or codes.ndim != 3 or 0 in codes.shape:
        raise FormatError(
            f"{path}: codes must be integers (frames, codebooks, steps), "
            f"got {codes.dtype} {codes.shape}"
        )
    if codes.min() < 0:
        raise FormatError(f"{path}: codes hold negative indices (min {codes.min()})")
    for k in ("sample_rate", "channels", "length", "last_frame_pad_length"):
        v = data[k]
        if v.shape != () or v.dtype.kind not in "iu" or int(v) < 0:
            raise FormatError(f"{path}: {k} must be a non-negative integer scalar, got {v!r}")
        data[k] = int(v)
    scales = data["scales"]
    if scales.dtype.kind != "f" or scales.ndim != 1 or scales.size not in (0, codes.shape[0]):
        raise FormatError(
            f"{path}: scales must be {codes.shape[0]} floats (one per frame) or empty, "
            f"got {scales.dtype} {scales.shape}"
        )
    if not np.all(np.isfinite(scales)):
        raise FormatError(f"{path}: scales hold non-finite values")
    if data["last_frame_pad_length"] >= codes.shape[2]:
        raise FormatError(
            f"{path}: last_frame_pad_length {data['last_frame_pad_length']} >= "
            f"{codes.shape[2]} steps"
        )
    model = data.get("model")
    if model is not None and (model.dtype.kind != "U" or model.shape != ()):
        raise FormatError(f"{path}: model must be a string, got {model.dtype} {model.shape}")
    data["model"] = None if model is None else str(model)
    return data


def _check_against(data: dict, cfg, path: Path) -> None:
    codes = data["codes"]
    if data["sample_rate"] != cfg.sampling_rate or data["channels"] != cfg.audio_channels:
        raise FormatError(
            f"{path}: codes of {data['channels']}-channel {data['sample_rate']} Hz audio; the "
            f"model is {cfg.audio_channels}-channel {cfg.sampling_rate} Hz"
        )
    if codes.shape[1] > cfg.num_quantizers:
        raise FormatError(f"{path}: {codes.shape[1]} codebooks; the model has {cfg.num_quantizers}")
    if codes.max() >= cfg.codebook_size:
        raise FormatError(
            f"{path}: code {codes.max()} is out of range for {cfg.codebook_size}-entry codebooks"
        )
    if cfg.chunk_length is None and codes.shape[0] != 1:
        raise FormatError(f"{path}: {codes.shape[0]} frames; this model takes one")
    if cfg.normalize and data["scales"].size == 0:
        raise FormatError(f"{path}: this model normalises its chunks; the .npz has no scales")


def write_wav(path: Path, audio: np.ndarray, rate: int) -> None:
    """(channels, samples) floats in [-1, 1] -> a 16-bit PCM WAV file (clipped)."""
    pcm = np.round(np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(audio.shape[0])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.ascontiguousarray(pcm.T).tobytes())


def decode(args) -> int:
    """Read and check the .npz, decode it, write the WAV."""
    src = existing_file(args.codes)
    out = writable_file(args.output)
    data = read_codes(src)
    folder, flag = (args.model, "--model") if args.model else (data["model"], "the .npz's model")
    if folder is None:
        raise EmberError(f"{args.codes}: names no model; pass --model FOLDER")
    t0 = time.perf_counter()
    model = _load_model(folder, flag)
    t_load = time.perf_counter() - t0
    _check_against(data, model.config, src)
    codes = data["codes"].astype(np.int64)[:, None]  # (frames, batch 1, codebooks, steps)
    scales = [s.reshape(1, 1) for s in data["scales"]] or None
    t0 = time.perf_counter()
    audio = model.decode(codes, scales, data["last_frame_pad_length"], data["length"] or None)
    t_dec = time.perf_counter() - t0
    samples = audio.numpy()[0]
    write_wav(out, samples, model.config.sampling_rate)
    seconds = samples.shape[-1] / model.config.sampling_rate
    echo(f"{args.codes}: {seconds:.2f} s of audio -> {args.output}")
    if args.verbose:
        rtf = t_dec / seconds if seconds else float("nan")
        echo(f"load {t_load:.2f} s, decode {t_dec:.2f} s, real-time factor {rtf:.3f}", err=True)
    return 0


def run(args) -> int:
    """Dispatch to encode or decode."""
    return encode(args) if args.codec_command == "encode" else decode(args)
