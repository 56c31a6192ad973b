"""Shared by the benchmarks: timing, BLAS info, appending results to bench/RESULTS.md."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")

# environment variables that change which kernels run, recorded with every result
ENV_RECORDED = (
    "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "EMBER_SGEMM_ISA", "ONEDNN_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
)  # fmt: skip


def set_threads(threads: int) -> None:
    """The same thread count for ember, numba and torch, numba's OpenMP layer started first.

    numba's OpenMP layer shares libgomp with torch: starting it (ember does when its first kernel
    loads) resets the process's OpenMP thread count, torch's included, to all cores. So numba is
    started here, then torch's count is set; benches check it still holds at the end.
    """
    import torch

    import ember

    try:
        from ember.kernels.cpu import numba_or_none
    except ImportError:  # a tree from before the kernels moved (before/after runs)
        from ember.backends.cpu.kernels import numba_or_none

    ember.set_num_threads(threads)
    numba_or_none()
    torch.set_num_threads(threads)


def timeit(fn, repeat: int = 5, warmup: int = 1) -> float:
    """Median wall time of fn() in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def blas_info() -> str:
    """Which BLAS libraries and kernels are loaded (numpy's and torch's), via threadpoolctl."""
    from threadpoolctl import threadpool_info

    parts = []
    for d in threadpool_info():
        if d.get("user_api") == "blas":
            parts.append(f"{Path(d['filepath']).name} {d.get('internal_api')} {d.get('version')} "
                         f"{d.get('architecture')} threads={d.get('num_threads')}")  # fmt: skip
    return "; ".join(parts) or "no BLAS found"


def cpu_name() -> str:
    """The CPU's model name and its widest SIMD features (the kernels pick their path by them)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    simd = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16") if f in flags]
    return f"{name} ({' '.join(simd) or 'no AVX2'})"


def append(title: str, table: str) -> None:
    """Append a section with the command line, machine, BLAS and the table to RESULTS.md."""
    if not RESULTS.exists():
        RESULTS.write_text(
            "# Benchmark results\n\nEach section: the command, the machine, the BLAS kernels, the table.\n"
        )
    cmd = " ".join(shlex.quote(a) for a in ["python", *sys.argv])
    env = " ".join(f"{k}={os.environ[k]}" for k in ENV_RECORDED if k in os.environ)
    with RESULTS.open("a") as f:
        f.write(f"\n## {title} ({datetime.date.today()})\n\n")
        f.write(
            f"- command: `{cmd}`\n- machine: {platform.machine()}, {os.cpu_count()} cores, "
            f"{cpu_name()}; env: {env or '-'}\n"
        )
        f.write(f"- BLAS: {blas_info()}\n\n{table}\n")
