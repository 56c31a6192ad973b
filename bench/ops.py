"""Core ops, ember vs torch side by side in one process on the same inputs.

    .venv/bin/python bench/ops.py [--repeat N] [--no-append]

Prints a table (ember ms, torch ms, ratio ember/torch; < 1 means ember is faster) and appends it,
with the command line and both BLAS back-ends (threadpoolctl), to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_info, threadpool_limits

import ember

THREADS = 2  # default; --threads changes it
RESULTS = Path(__file__).with_name("RESULTS.md")


def timeit(fn, repeat: int, min_time: float = 0.002) -> float:
    """Best (min) seconds per call over `repeat` short rounds (>= min_time each).

    Short rounds and the minimum keep the figure honest on a shared machine: a round that a
    descheduled BLAS thread stalls is simply not the best one (timeit's advice).
    """
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    n = max(1, int(min_time / one))
    rounds = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n)
    return float(min(rounds))


def blas_info() -> str:
    """One line per BLAS/OpenMP library loaded in this process (threadpoolctl)."""
    rows = []
    for d in threadpool_info():
        owner = (
            "torch"
            if "torch" in d["filepath"]
            else "numpy"
            if "numpy" in d["filepath"]
            else "other"
        )
        rows.append(
            f"{owner}: {d['internal_api']} {d.get('version') or ''} {d.get('architecture') or ''} "
            f"threads={d['num_threads']}".replace("  ", " ")
        )
    cfg = torch.__config__.show()
    torch_blas = "mkl" if "BLAS_INFO=mkl" in cfg else "see torch.__config__"
    mkldnn = torch.backends.mkldnn.is_available()
    rows.append(
        f"torch: BLAS_INFO={torch_blas}, mkldnn={mkldnn}, threads={torch.get_num_threads()}"
    )
    return "; ".join(rows)


def cases(rng: np.random.Generator) -> list:
    """(name, ember thunk, torch thunk, unit) for every benchmarked op."""

    def pair(*shapes):
        arrs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        return [ember.from_numpy(a) for a in arrs], [torch.from_numpy(a) for a in arrs]

    out = []
    (a, b), (ta, tb) = pair((64, 512), (512, 2048))
    out.append(("matmul (64x512)@(512x2048)", lambda: a @ b, lambda: ta @ tb))
    (xl, wl), (txl, twl) = pair((1, 576), (1536, 576))
    out.append(
        (
            "linear 1x576 -> 1536 (decode)",
            lambda: ember.linear(xl, wl),
            lambda: torch.nn.functional.linear(txl, twl),
        )
    )
    (x, w), (tx, tw) = pair((1, 3, 224, 224), (64, 3, 7, 7))
    out.append(
        (
            "conv2d stem 1x3x224x224 64@7x7 s2 p3",
            lambda: ember.conv2d(x, w, stride=2, padding=3),
            lambda: torch.nn.functional.conv2d(tx, tw, stride=2, padding=3),
        )
    )
    (x2, w2), (tx2, tw2) = pair((1, 64, 56, 56), (64, 64, 3, 3))
    out.append(
        (
            "conv2d 3x3 1x64x56x56 -> 64 p1",
            lambda: ember.conv2d(x2, w2, padding=1),
            lambda: torch.nn.functional.conv2d(tx2, tw2, padding=1),
        )
    )
    (s,), (ts,) = pair((64, 1024))
    if hasattr(ember, "softmax"):
        out.append(
            (
                "softmax (64, 1024) dim=-1",
                lambda: ember.softmax(s, -1),
                lambda: torch.softmax(ts, -1),
            )
        )
    else:
        out.append(("softmax (64, 1024) dim=-1", None, None))
    if hasattr(ember, "mean") and hasattr(ember, "var"):

        def ln_e():
            return ember.mean(s, -1, keepdim=True), ember.var(s, -1, keepdim=True)

        def ln_t():
            return torch.mean(ts, -1, keepdim=True), torch.var(ts, -1, keepdim=True)

        out.append(("mean+var (64, 1024) dim=-1", ln_e, ln_t))
    else:
        out.append(("mean+var (64, 1024) dim=-1", None, None))
    (e,), (te,) = pair((1024, 1024))
    out.append(
        (
            "(x*2+1).exp().sin() 1024x1024",
            lambda: (e * 2 + 1).exp().sin(),
            lambda: (te * 2 + 1).exp().sin(),
        )
    )
    (p, q), (tp, tq) = pair((2,), (2,))
    out.append(("dispatch: x + y on 2 elements [us]", lambda: p + q, lambda: tp + tq, "us"))
    return out


def main() -> None:
    """Run the cases, print the table, append it to bench/RESULTS.md."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--repeat", type=int, default=50, help="timing rounds per op (the best is kept)"
    )
    ap.add_argument("--no-append", action="store_true", help="print only; leave RESULTS.md alone")
    ap.add_argument("--threads", type=int, default=THREADS, help="BLAS/torch threads on both sides")
    args = ap.parse_args()
    from _common import set_threads

    set_threads(args.threads)
    rng = np.random.default_rng(0)
    lines = ["| op (best of rounds) | ember | torch | ember/torch |", "|---|---:|---:|---:|"]
    load0 = os.getloadavg()[0]
    with threadpool_limits(limits=args.threads, user_api="blas"), ember.no_grad(), torch.no_grad():
        blas = blas_info()
        for case in cases(rng):
            name, fe, ft = case[:3]
            unit = case[3] if len(case) > 3 else "ms"
            if fe is None:
                lines.append(f"| {name} | n/a (not in ember yet) | | |")
                continue
            te = timeit(fe, args.repeat)
            time.sleep(0.2)  # let OpenBLAS's spinning threads park before torch's OpenMP pool runs
            tt = timeit(ft, args.repeat)
            time.sleep(0.2)
            k = 1e6 if unit == "us" else 1e3
            lines.append(f"| {name} | {te * k:.3f} {unit} | {tt * k:.3f} {unit} | {te / tt:.2f} |")
    exe = Path(sys.executable)
    try:
        exe = exe.relative_to(Path.cwd())
    except ValueError:
        pass
    cmd = " ".join([str(exe), *sys.argv])
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    head = (
        f"### bench/ops.py — {stamp}\n\n`{cmd}`\n\n"
        f"{platform.machine()}, {os.cpu_count()} cores, {args.threads} threads; "
        f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f} (shared machine: BLAS timings with "
        f"threads > 1 degrade badly when the load exceeds the cores); numpy {np.__version__}, "
        f"torch {torch.__version__}\n\nBLAS: {blas}\n"
    )
    table = "\n".join(lines)
    print(head)
    print(table)
    if not args.no_append:
        if not RESULTS.exists():
            RESULTS.write_text(
                "# Benchmark results\n\nAppend-only: each bench/ script adds a dated section.\n"
            )
        with RESULTS.open("a") as f:
            f.write("\n" + head + "\n" + table + "\n")


if __name__ == "__main__":
    main()
