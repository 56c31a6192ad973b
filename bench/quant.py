"""Quantized matrix-vector products: GB/s of weight bytes read, against memory bandwidth.

For each matrix (4096x4096 and 576x1536, torch order (out, in)) and each numba kernel type,
time ``QTensor.matmul_t(x)`` for one vector x (the decode case) and report the weight bytes
it reads per second. In the same run: the machine's read bandwidth (a 2-thread numba
streaming sum over 1 GiB, plus numpy's 1-thread ``a.sum()`` for comparison) and float32 BLAS
``W @ x`` on the same matrix. Appends the table and the command to bench/RESULTS.md.

    .venv/bin/python bench/quant.py [--threads 2] [--repeat 200] [--no-append]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import platform
import shlex
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

SHAPES = [(4096, 4096), (576, 1536)]
TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"]
BW_BYTES = 1 << 30


def timed(fn, repeat: int) -> list[float]:
    """Wall-clock seconds of ``repeat`` calls after three warm-up calls."""
    for _ in range(3):
        fn()
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def cpu_time(fn, repeat: int) -> float:
    """Fastest CPU time of this thread over ``repeat`` calls: ignores time spent preempted."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t)
    return best


def bandwidth(repeat: int) -> tuple[float, float]:
    """(2-thread numba streaming-sum GB/s, 1-thread numpy sum GB/s) over 1 GiB of float32."""
    from numba import njit, prange

    @njit(parallel=True, fastmath=True, nogil=True)
    def psum(a, chunks):
        step = a.size // chunks
        part = np.zeros(chunks, np.float32)
        for c in prange(chunks):
            s = np.float32(0)
            for i in range(c * step, (c + 1) * step):
                s += a[i]
            part[c] = s
        return part.sum()

    a = np.ones(BW_BYTES // 4, np.float32)
    best_numba = min(timed(lambda: psum(a, 256), max(5, repeat // 10)))
    best_numpy = cpu_time(a.sum, max(5, repeat // 20))
    return a.nbytes / best_numba / 1e9, a.nbytes / best_numpy / 1e9


def q8_int_matvec():
    """The llama.cpp-style alternative for Q8_0: x quantized to int8 blocks, integer dots.

    Kept here (not in ember) because it measured slower: numba widens the int8 products to
    int64 lanes, and every block needs its own horizontal sum before the float scales apply.
    """
    from numba import njit, prange

    @njit(parallel=True, fastmath=True, nogil=True)
    def kernel(w, lut, xq, xd, y):
        n_rows, nb, _ = w.shape
        for n in prange(n_rows):
            acc = np.float32(0)
            for b in range(nb):
                d = lut[np.int64(w[n, b, 0]) | (np.int64(w[n, b, 1]) << 8)]
                s = np.int32(0)
                for j in range(32):
                    s += np.int32(np.int8(w[n, b, 2 + j])) * np.int32(xq[b, j])
                acc += d * xd[b] * np.float32(s)
            y[n] = acc

    def run(q, x):
        from ember.kernels.cpu.quant._common import f16_table

        xb = x.reshape(-1, 32)
        xd = (np.abs(xb).max(1) / 127).astype(np.float32)
        xq = np.round(xb / np.where(xd == 0, 1, xd)[:, None]).astype(np.int8)
        y = np.empty(q.shape[0], np.float32)
        kernel(q.data.reshape(q.shape[0], -1, 34), f16_table(), xq, xd, y)
        return y

    return run


def f32_copy_call(w: np.ndarray, x: np.ndarray):
    """A call of float32 BLAS ``W @ x`` on a private copy of W."""
    c = w.copy()
    return lambda: np.dot(c, x)


def q_copy_call(q, x: np.ndarray):
    """A call of ``QTensor.matmul_t(x)`` on a private copy of the blocks."""
    c = type(q)(q.data.copy(), q.qtype, q.shape)
    return lambda: c.matmul_t(x)


def cold_gbs(make, nbytes: int, sweeps: int) -> float:
    """GB/s over copies of a weight totalling >= 1 GiB, so each call reads from DRAM.

    ``make()`` returns a fresh (callable, bytes) pair; the copies are cycled through and the
    best of ``sweeps`` full passes is kept.
    """
    n = max(2, -(-BW_BYTES // nbytes))
    calls = [make() for _ in range(n)]
    for c in calls:
        c()
    best = float("inf")
    for _ in range(sweeps):
        t = time.perf_counter()
        for c in calls:
            c()
        best = min(best, time.perf_counter() - t)
    return n * nbytes / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--no-append", action="store_true", help="print only")
    args = ap.parse_args()

    import numba
    from threadpoolctl import threadpool_info, threadpool_limits

    from ember.quant import QTensor

    numba.set_num_threads(args.threads)
    limits = threadpool_limits(limits=args.threads)
    load = os.getloadavg()
    bw, bw_np = bandwidth(args.repeat)
    blas = [
        f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')}, "
        f"{i.get('num_threads')} threads)"
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    ]
    rng = np.random.default_rng(0)
    rows = []
    run_int_q8 = q8_int_matvec()
    for n, k in SHAPES:
        w = rng.standard_normal((n, k)).astype(np.float32)
        x = rng.standard_normal(k).astype(np.float32)
        ts = timed(lambda w=w, x=x: np.dot(w, x), args.repeat)
        t_blas = statistics.median(ts)
        with threadpool_limits(limits=1):
            t1 = cpu_time(lambda w=w, x=x: np.dot(w, x), args.repeat)
        cold = cold_gbs(functools.partial(f32_copy_call, w, x), w.nbytes, 3)
        rows.append((f"{n}x{k}", "f32 BLAS", w.nbytes, ts, 1.0, t1, cold))
        for qtype in TYPES:
            q = QTensor.from_float(w, qtype)
            ts = timed(lambda q=q, x=x: q.matmul_t(x), args.repeat)
            numba.set_num_threads(1)
            t1 = cpu_time(lambda q=q, x=x: q.matmul_t(x), args.repeat)
            numba.set_num_threads(args.threads)
            cold = cold_gbs(functools.partial(q_copy_call, q, x), q.nbytes, 3)
            row = (f"{n}x{k}", qtype, q.nbytes, ts, t_blas / statistics.median(ts), t1, cold)
            rows.append(row)
            if qtype == "Q8_0":
                ts = timed(lambda q=q, x=x: run_int_q8(q, x), args.repeat)
                speed = t_blas / statistics.median(ts)
                numba.set_num_threads(1)
                t1 = cpu_time(lambda q=q, x=x: run_int_q8(q, x), args.repeat)
                numba.set_num_threads(args.threads)
                rows.append(
                    (f"{n}x{k}", "Q8_0, x as int8 (not used)", q.nbytes, ts, speed, t1, 0.0)
                )
    prefill = []
    w = rng.standard_normal((4096, 4096)).astype(np.float32)
    for qtype in ("Q4_0", "Q4_K"):
        q = QTensor.from_float(w, qtype)
        for m in (1, 4, 16, 64):
            x = rng.standard_normal((m, 4096)).astype(np.float32)
            tq = statistics.median(timed(lambda q=q, x=x: q.matmul_t(x), max(5, args.repeat // 10)))
            tf = statistics.median(timed(lambda x=x: x @ w.T, max(5, args.repeat // 10)))
            prefill.append((qtype, m, tq, tf))
    limits.restore_original_limits()

    lines = [
        f"### quant matvec - {datetime.date.today()} - {platform.machine()}, "
        f"{os.cpu_count()} cpus, {args.threads} threads",
        "",
        f"Command: `{' '.join(shlex.quote(a) for a in [sys.executable, *sys.argv])}`",
        "",
        f"Memory read bandwidth: {bw:.1f} GB/s (2-thread numba streaming sum over 1 GiB "
        f"float32, fastest pass; numpy 1-thread `a.sum()` by CPU time: {bw_np:.1f} GB/s). "
        f"Ratios below use {bw:.1f}.",
        f"BLAS: {'; '.join(blas) or 'unknown'}; numba {numba.__version__}, threading layer "
        f"{numba.threading_layer()}. Load average at start: {load[0]:.2f}.",
        "",
        f"GB/s is weight bytes over the {args.threads}-thread wall time (median, and best of "
        f"{args.repeat}); the last GB/s column is one thread's CPU time (best), which time "
        "spent preempted by other jobs does not inflate. The same weight called back to back "
        "stays in the (large, virtualized) L3 cache; the DRAM columns cycle through copies "
        "totalling 1 GiB so that every call reads its weight from memory (best of 3 passes).",
        "",
        "| matrix | kernel | weight MB | median ms | GB/s | % of bw | best GB/s | best % | "
        "1-thread CPU GB/s | DRAM GB/s | DRAM % of bw | vs f32 (median) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for shape, kind, nbytes, ts, speed, t1, cold in rows:
        t, tb = statistics.median(ts), min(ts)
        gbs, gbb = nbytes / t / 1e9, nbytes / tb / 1e9
        lines.append(
            f"| {shape} | {kind} | {nbytes / 1e6:.2f} | {t * 1e3:.3f} | {gbs:.1f} | "
            f"{100 * gbs / bw:.0f}% | {gbb:.1f} | {100 * gbb / bw:.0f}% | "
            f"{nbytes / t1 / 1e9:.1f} | {cold:.1f} | {100 * cold / bw:.0f}% | {speed:.2f}x |"
        )
    lines += [
        "",
        "Prefill, 4096x4096: `QTensor.matmul_t(x)` for x of M rows (tiles of rows decoded by",
        "numba, multiplied by BLAS) against float32 BLAS `x @ W.T`:",
        "",
        "| kernel | M | median ms | f32 BLAS ms | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for qtype, m, tq, tf in prefill:
        lines.append(f"| {qtype} | {m} | {tq * 1e3:.2f} | {tf * 1e3:.2f} | {tf / tq:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_append:
        path = os.path.join(ROOT, "bench", "RESULTS.md")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(
                    "# Benchmark results\n\nAppend-only log written by the scripts in bench/. "
                    "Each entry names the command that produced it.\n"
                )
        with open(path, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
