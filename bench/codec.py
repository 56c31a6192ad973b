"""EnCodec 24 kHz (full size, random weights): ember vs transformers' EncodecModel, encode and decode.

transformers builds EncodecConfig() (facebook/encodec_24khz's shape: 32 filters, ratios 8 5 4 2,
2 LSTM layers, 32 codebooks of 1024) with normal random codebooks, saves it with save_pretrained,
and ember loads that folder. Both encode --seconds of audio (a few sines plus noise) at
--bandwidth and decode the codes; engines take turns, one untimed call each first, and the
median and best of --repeat timed calls are printed with the parity figures (codes equal, the
largest audio difference). Nothing is appended to bench/RESULTS.md.

    .venv/bin/python bench/codec.py [--seconds 5] [--bandwidth 6] [--threads 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402


def main() -> None:
    """Run the comparison and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--bandwidth", type=float, default=6.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    import torch
    from _common import set_threads
    from transformers import EncodecConfig, EncodecModel

    import ember
    from ember.models.audio import EncodecModel as EmberEncodec

    set_threads(args.threads)
    torch.manual_seed(0)
    hf = EncodecModel(EncodecConfig()).eval()
    with torch.no_grad():
        for layer in hf.quantizer.layers:
            layer.codebook.embed.normal_()
    rate = hf.config.sampling_rate
    t = np.arange(int(args.seconds * rate)) / rate
    rng = np.random.default_rng(0)
    x = sum(0.2 * np.sin(2 * np.pi * f * t) for f in (220.0, 330.0, 1234.5))
    x = (x + 0.05 * rng.standard_normal(t.size)).astype(np.float32)[None, None]
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        t0 = time.perf_counter()
        em = EmberEncodec.from_pretrained(d)
        t_load = time.perf_counter() - t0
        bw = args.bandwidth

        def torch_encode():
            with torch.no_grad():
                return hf.encode(torch.from_numpy(x), bandwidth=bw)

        def torch_decode(enc):
            with torch.no_grad():
                return hf.decode(enc.audio_codes, enc.audio_scales)[0].numpy()

        engines = {
            "ember": (
                lambda: em.encode(x, bandwidth=bw),
                lambda e: em.decode(e.audio_codes).numpy(),
            ),
            "torch": (torch_encode, torch_decode),
        }
        times = {(n, s): [] for n in engines for s in ("encode", "decode")}
        outs = {}
        for i in range(args.repeat + 1):
            for name, (enc_fn, dec_fn) in engines.items():
                t0 = time.perf_counter()
                enc = enc_fn()
                t1 = time.perf_counter()
                audio = dec_fn(enc)
                t2 = time.perf_counter()
                outs[name] = (np.asarray(enc.audio_codes.numpy()), audio)
                if i:
                    times[(name, "encode")].append(t1 - t0)
                    times[(name, "decode")].append(t2 - t1)
    codes_e, audio_e = outs["ember"]
    codes_t, audio_t = outs["torch"]
    same = float(np.mean(codes_e == codes_t))
    # decode the same codes on both sides for the audio difference
    with ember.no_grad():
        audio_e = em.decode(codes_t).numpy()
    diff = float(np.abs(audio_e - audio_t).max())
    print(
        f"EnCodec 24 kHz, random weights, {args.seconds:g} s of audio at {bw:g} kbps "
        f"({codes_t.shape[2]} codebooks x {codes_t.shape[3]} steps), {args.threads} threads; "
        f"ember load {t_load * 1e3:.0f} ms"
    )
    print("| step | ember median (best) s | torch median (best) s | ember / torch |")
    print("| --- | --- | --- | --- |")
    for step in ("encode", "decode"):
        e, tt = times[("ember", step)], times[("torch", step)]
        ratio = statistics.median(e) / statistics.median(tt)
        print(
            f"| {step} | {statistics.median(e):.3f} ({min(e):.3f}) | "
            f"{statistics.median(tt):.3f} ({min(tt):.3f}) | {ratio:.2f}x |"
        )
    print(
        f"codes equal to transformers': {same * 100:.2f} %; decoded audio max |diff| {diff:.2e} "
        f"(max |audio| {np.abs(audio_t).max():.3f})"
    )


if __name__ == "__main__":
    main()
