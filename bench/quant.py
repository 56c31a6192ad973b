"""Quantized products at a 1B model's shapes: decode GB/s from DRAM against the read bandwidth,
and prefill against float32 BLAS.

One decoder layer of TinyLlama-1.1B's configuration is four products: q/k/v stacked
(2560 x 2048), o (2048 x 2048), gate/up stacked (11264 x 2048) and down (2048 x 5632). For each
weight type the bench builds copies of that layer totalling >= 1 GiB (so that every product
reads its weight from DRAM, as a decode step does) and times passes over them with x of
M = 1..16 rows (decode and small batches), at 1 and 2 threads: weight bytes / time, as a share
of the machine's read bandwidth measured in the same run the way the issue states it (numpy's
``a.sum()`` over 1 GiB, on 1 thread, and on 2 threads each summing half). Kernels: the default
(Q8_0/Q4_0/Q4_1/Q6_K/Q4_K on weights repacked in panels, ``kernels.cpu.quant._pdot``) and,
for the same types, ``EMBER_QUANT_REPACK=0`` (the GGUF blocks as they lie: ``_idot``'s loops,
numba's matrix-vector kernels). Q5_K, which ember does not quantize to, gets random blocks.

Prefill: the same layer's products for a 128-row x (a prompt), weight cached, against float32
BLAS ``x @ W.T`` on the dequantized weights, at 1 and 2 threads.

    python bench/quant.py [--types Q8_0,Q4_0,Q4_1,Q6_K,Q4_K,Q5_K] [--sweeps 3] [--no-append]

Wall-clock timings: run it on a quiet machine (the load average is recorded).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
from _common import append, timeit  # noqa: E402

LAYER = [("q/k/v", 2560, 2048), ("o", 2048, 2048), ("gate/up", 11264, 2048), ("down", 2048, 5632)]
MS = (1, 2, 4, 8, 16)
BW_BYTES = 1 << 30
PREFILL_M = 128


def read_bandwidth(threads: int, passes: int = 5) -> float:
    """numpy ``a.sum()`` over 1 GiB of float32 split among ``threads`` threads: best GB/s."""
    a = np.ones(BW_BYTES // 4, np.float32)
    parts = np.array_split(a, threads)
    best = float("inf")
    for _ in range(passes):
        ts = [threading.Thread(target=p.sum) for p in parts]
        t = time.perf_counter()
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        best = min(best, time.perf_counter() - t)
    return a.nbytes / best / 1e9


def _random_q5_k(rng, n: int, k: int):
    """A Q5_K QTensor of random blocks (ember does not quantize to Q5_K): random quants and
    6-bit scales, d and dmin 2**-10 (fp16 0x1400) so that every value is finite."""
    from ember.quant import QTensor

    blocks = rng.integers(0, 256, (n, k // 256, 176), dtype=np.uint8)
    blocks[:, :, 0:4] = np.frombuffer(np.array([0x1400, 0x1400], "<u2").tobytes(), np.uint8)
    return QTensor(blocks.reshape(-1), "Q5_K", (n, k))


def layer_weights(rng, qtype: str, copies: int):
    """``copies`` independent sets of the layer's four QTensors (fresh memory each)."""
    from ember.quant import QUANTIZE_TYPES, QTensor

    base = [
        QTensor.from_float(rng.standard_normal((n, k)).astype(np.float32), qtype)
        if qtype in QUANTIZE_TYPES
        else _random_q5_k(rng, n, k)
        for _, n, k in LAYER
    ]
    return [[QTensor(q.data.copy(), qtype, q.shape) for q in base] for _ in range(copies)]


def decode_gbs(sets, m: int, sweeps: int, rng) -> tuple[float, int]:
    """GB/s of weight bytes over passes of ``QTensor.matmul_t`` on every weight of every set
    (best of ``sweeps``), and how often the pool's caller went solo meanwhile (a busy core)."""
    from ember.kernels.cpu import pool

    xs = {k: rng.standard_normal((m, k)).astype(np.float32) for _, _, k in LAYER}
    nbytes = sum(q.nbytes for s in sets for q in s)
    for s in sets:  # warm up: pack, compile, fault in
        for q in s:
            q.matmul_t(xs[q.shape[1]])
    solo0 = pool.stats().get("solo_triggers", 0)
    best = float("inf")
    for _ in range(sweeps):
        t = time.perf_counter()
        for s in sets:
            for q in s:
                q.matmul_t(xs[q.shape[1]])
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9, pool.stats().get("solo_triggers", 0) - solo0


def prefill_ms(qset, m: int, repeat: int, rng) -> tuple[float, float]:
    """(quantized, float32 BLAS) ms for the layer's products with an m-row x (median)."""
    xs = {k: rng.standard_normal((m, k)).astype(np.float32) for _, _, k in LAYER}
    floats = [q.dequantize() for q in qset]

    def quant():
        for q in qset:
            q.matmul_t(xs[q.shape[1]])

    def blas():
        for w in floats:
            xs[w.shape[1]] @ w.T

    return 1e3 * timeit(quant, repeat), 1e3 * timeit(blas, repeat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q8_0,Q4_0,Q4_1,Q6_K,Q4_K,Q5_K")
    ap.add_argument("--sweeps", type=int, default=3)
    ap.add_argument("--no-append", action="store_true", help="print only")
    args = ap.parse_args()

    from threadpoolctl import threadpool_limits

    import ember
    from ember import config
    from ember.kernels.cpu.quant import _pdot
    from ember.quant.formats import nbytes_of

    load0 = os.getloadavg()[0]
    bw = {t: read_bandwidth(t) for t in (1, 2)}
    rng = np.random.default_rng(0)
    path = _pdot.state()["path"] if _pdot.state() else "none"
    rows, prefill, disturbed = [], [], 0
    for qtype in args.types.split(","):
        per_copy = sum(nbytes_of((n, k), qtype) for _, n, k in LAYER)
        sets = layer_weights(rng, qtype, max(2, -(-BW_BYTES // per_copy)))
        layouts = [True, False] if qtype in _pdot.FORMATS else [None]
        for m in MS:
            row = [qtype, m]
            for repack in layouts:
                if repack is not None:
                    config.QUANT_REPACK = repack
                for threads in (1, 2):
                    ember.set_num_threads(threads)
                    with threadpool_limits(limits=threads):
                        gbs, solo = decode_gbs(sets, m, args.sweeps, rng)
                    disturbed += solo
                    row += [gbs, 100 * gbs / bw[threads]]
            rows.append(row)
        config.QUANT_REPACK = True
        for threads in (1, 2):
            ember.set_num_threads(threads)
            with threadpool_limits(limits=threads):
                tq, tf = prefill_ms(sets[0], PREFILL_M, 5, rng)
            macs = PREFILL_M * sum(n * k for _, n, k in LAYER)
            prefill.append((qtype, threads, tq, tf, macs / tq / 1e6))
        del sets
    load1 = os.getloadavg()[0]

    def pct(v):
        return f"{v[0]:.1f} ({v[1]:.0f}%)"

    lines = [
        "Decode: one TinyLlama-1.1B layer's products (q/k/v 2560x2048, o 2048x2048, gate/up "
        "11264x2048, down 2048x5632), copies totalling >= 1 GiB so that each product reads its "
        f"weight from DRAM; GB/s of weight bytes (best of {args.sweeps} passes) and its share "
        f"of the read bandwidth at the same thread count: numpy `a.sum()` over 1 GiB, {bw[1]:.1f} "
        f"GB/s on 1 thread, {bw[2]:.1f} GB/s on 2 (each summing half). Panels: the default "
        f"(weights repacked, kernels.cpu.quant._pdot, path {path}); GGUF: EMBER_QUANT_REPACK=0.",
        "",
        "| type | M | panels 1 thread GB/s | panels 2 threads | GGUF 1 thread | GGUF 2 threads |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        vals = [(r[i], r[i + 1]) for i in range(2, len(r), 2)]
        cells = [pct(v) for v in vals] + ["-"] * (4 - len(vals))
        if len(vals) == 2:  # one layout only (a format without panels): the GGUF one
            cells = ["-", "-", pct(vals[0]), pct(vals[1])]
        lines.append(f"| {r[0]} | {r[1]} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Prefill: the same layer's products for x of {PREFILL_M} rows, weights in cache "
        "(median of 5), against float32 BLAS `x @ W.T` on the dequantized weights:",
        "",
        "| type | threads | quantized ms | f32 BLAS ms | quantized GMAC/s | vs BLAS |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for qtype, threads, tq, tf, gmacs in prefill:
        lines.append(
            f"| {qtype} | {threads} | {tq:.1f} | {tf:.1f} | {gmacs:.0f} | {tf / tq:.2f}x |"
        )
    lines += [
        "",
        f"Load average {load0:.2f} at start, {load1:.2f} at the end ({os.cpu_count()} cores); "
        f"the pool's caller went solo {disturbed} times during the decode passes (a worker "
        "preempted by another process: those passes ran on one thread).",
    ]
    table = "\n".join(lines)
    print(table)
    if not args.no_append:
        append("Quantized products at TinyLlama-1.1B shapes (bench/quant.py)", table)


if __name__ == "__main__":
    main()
