"""ember's packed-weight GEMM (kernels.cpu.gemm) vs numpy's BLAS vs torch, on the shapes the model zoo
runs, plus the cost of one parallel region. One process, the same inputs, ember's weight packed
beforehand (as optimize_for_inference does), float32.

    .venv/bin/python bench/gemm.py [--threads 1 2] [--repeat 20] [--no-append]

Rows are (M, K, N) products A (M, K) @ W (K, N): ResNet-50's 1x1 convolutions at batch 1 (M =
pixels), Whisper tiny's encoder linears (M = 1500 frames) and ViT-B/16's (M = 197 tokens), and
one 3x3 convolution (ember reads the padded NHWC input in place; numpy gets a ready im2col
matrix, torch runs conv2d on channels_last input). GFLOP/s from the best of --repeat calls.
"tiny" is a 64 x 16 x 64 product: its time is mostly the cost of starting the threads.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

import numpy as np  # noqa: E402
from _common import append, set_threads  # noqa: E402

SHAPES = [  # label, M, K, N
    ("resnet50 1x1 56x56 64->256", 3136, 64, 256),
    ("resnet50 1x1 14x14 1024->256", 196, 1024, 256),
    ("resnet50 1x1 7x7 512->2048", 49, 512, 2048),
    ("whisper fc1 1500x384->1536", 1500, 384, 1536),
    ("whisper fc2 1500x1536->384", 1500, 1536, 384),
    ("vit fc1 197x768->3072", 197, 768, 3072),
    ("tiny 64x16->64", 64, 16, 64),
]


# idle time before each engine's turn: the previous engine's workers (torch's OpenMP team,
# OpenBLAS's threads) spin after a call, and an engine timed inside that window had one of the 2
# cores taken (ember's big products measured at ~250 GFLOP/s on 2 threads right after torch's,
# ~500 after a pause)
SETTLE_S = 0.3


def best(fn, repeat: int) -> float:
    """Best wall time of fn() over repeat calls (after SETTLE_S idle and one warm-up call)."""
    time.sleep(SETTLE_S)
    fn()
    t = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


def linear_row(label, m, k, n, repeat) -> str:
    """One (M, K, N) product on the three engines."""
    import torch

    from ember.kernels.cpu import gemm as G

    rng = np.random.default_rng(0)
    a, w = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    packed, bias = G.pack_weight(w, G.panel_width()), np.zeros(n, np.float32)
    rows, tap, out = (
        np.arange(m, dtype=np.int64) * k,
        np.zeros(1, np.int64),
        np.empty((m, n), np.float32),
    )
    ta, tw = torch.from_numpy(a), torch.from_numpy(w)
    G.gemm(a.reshape(-1), rows, tap, k, packed, bias, None, 0, out)
    np.testing.assert_allclose(out, a @ w, rtol=1e-3, atol=1e-3 * np.sqrt(k))
    t_e = best(lambda: G.gemm(a.reshape(-1), rows, tap, k, packed, bias, None, 0, out), repeat)
    t_n = best(lambda: np.matmul(a, w, out=out), repeat)
    with torch.inference_mode():
        t_t = best(lambda: torch.mm(ta, tw), repeat)
    return _row(label, 2 * m * k * n, t_e, t_n, t_t)


def conv_row(repeat) -> str:
    """ResNet-50's 3x3 conv at 28x28x128 (stride 1, pad 1), batch 1."""
    import torch

    from ember.kernels.cpu import conv as K
    from ember.kernels.cpu import gemm as G
    from ember.kernels.cpu.conv import window_offsets

    h = w = 28
    c = o = 128
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, h, w, c), np.float32)
    wt = rng.standard_normal((o, c, 3, 3), np.float32)
    w2 = np.ascontiguousarray(wt.transpose(2, 3, 1, 0).reshape(9 * c, o))
    xp = np.zeros((1, h + 2, w + 2, c), np.float32)
    packed, bias = G.pack_weight(w2, G.panel_width()), np.zeros(o, np.float32)
    rows, taps = window_offsets(xp.shape, (3, 3), (1, 1), h, w)
    out = np.empty((h * w, o), np.float32)

    def ember_conv():
        xp[:, 1:-1, 1:-1] = x  # the copy into the zero border is part of ember's conv
        G.gemm(xp.reshape(-1), rows, taps, c, packed, bias, None, 0, out)

    cols = np.empty((h * w, 9 * c), np.float32)

    def numpy_conv():
        K.im2col(x, cols, 3, 3, 1, 1, 1, 1, h, w)
        np.matmul(cols, w2, out=out)

    tx = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).to(memory_format=torch.channels_last)
    tw = torch.from_numpy(wt).to(memory_format=torch.channels_last)
    ember_conv()
    ref = torch.nn.functional.conv2d(tx, tw, padding=1).permute(0, 2, 3, 1).reshape(h * w, o)
    np.testing.assert_allclose(out, ref.numpy(), rtol=1e-3, atol=1e-2)
    t_e, t_n = best(ember_conv, repeat), best(numpy_conv, repeat)
    with torch.inference_mode():
        t_t = best(lambda: torch.nn.functional.conv2d(tx, tw, padding=1), repeat)
    return _row("resnet50 3x3 28x28 128->128 (conv)", 2 * h * w * 9 * c * o, t_e, t_n, t_t)


def _row(label, flops, t_e, t_n, t_t) -> str:
    g = [flops / t / 1e9 for t in (t_e, t_n, t_t)]
    return (
        f"| {label} | {t_e * 1e6:.0f} | {g[0]:.0f} | {g[1]:.0f} | {g[2]:.0f} | "
        f"{t_n / t_e:.2f}x | {t_t / t_e:.2f}x |"
    )


def main() -> None:
    """Print the table for each thread count and append it to bench/RESULTS.md."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--no-append", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args()
    from threadpoolctl import threadpool_limits

    from ember.kernels.cpu import gemm as G

    head = (
        "| product | ember us | ember GFLOP/s | numpy BLAS GFLOP/s | torch GFLOP/s | "
        "BLAS time / ember | torch time / ember |\n|---|---:|---:|---:|---:|---:|---:|"
    )
    load0, tables = os.getloadavg()[0], []
    for th in args.threads:
        set_threads(th)
        rows = [f"\n{th} thread(s), ember microkernels: {G.isa()}\n", head]
        with threadpool_limits(limits=th, user_api="blas"):
            for label, m, k, n in SHAPES:
                rows.append(linear_row(label, m, k, n, args.repeat))
                print(rows[-1], flush=True)
            rows.append(conv_row(args.repeat))
            print(rows[-1], flush=True)
        tables.append("\n".join(rows))
    note = f"\n- load average (1 min) before/after: {load0:.1f} / {os.getloadavg()[0]:.1f}"
    if not args.no_append:
        append("packed GEMM vs BLAS vs torch (bench/gemm.py)", "\n".join(tables) + note)


if __name__ == "__main__":
    main()
