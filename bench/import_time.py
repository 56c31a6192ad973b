"""Import time: ember vs torch vs numpy, each imported in fresh interpreters, in one run.

Every sample is a new ``python -c`` process that times its own ``import X`` (interpreter start-up
not counted; it is the same for all); rounds alternate between the modules so a busy machine slows
them alike. The table gives the median and the best of the samples in ms, the ratio to torch, and
how many modules the import leaves in ``sys.modules``; a second table says which heavy packages
each import pulled in. The ember tree's bytecode is compiled first, as pip does for an installed
wheel (an editable install under ``PYTHONDONTWRITEBYTECODE=1`` would otherwise compile every
module from source on every import, which triples ember's own share of the time). ``--src PATH`` times another ember tree (its ``src`` folder), for
before/after runs.

    .venv/bin/python bench/import_time.py [--repeat 15] [--src PATH] [--no-append]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from _common import append  # noqa: E402

TARGETS = {  # label -> the import statement timed
    "numpy": "import numpy",
    "ember": "import ember",
    "ember + ember.nn": "import ember, ember.nn",
    "torch": "import torch",
}
HEAVY = ("ml_dtypes", "numba", "llvmlite", "scipy", "torch", "safetensors", "gguf", "jinja2",
         "tokenizers", "threadpoolctl")  # fmt: skip

_PROBE = """
import sys, time, json
t = time.perf_counter()
{stmt}
dt = time.perf_counter() - t
heavy = [m for m in {heavy!r} if m in sys.modules]
print(json.dumps({{"s": dt, "modules": len(sys.modules), "heavy": heavy}}))
"""


def sample(stmt: str, src: str) -> dict:
    """One fresh interpreter: the seconds `stmt` took, its module count, the heavy ones loaded."""
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = _PROBE.format(stmt=stmt, heavy=HEAVY)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15, help="samples per module (default 15)")
    ap.add_argument("--src", default=os.path.join(ROOT, "src"), help="ember's src folder to time")
    ap.add_argument("--no-append", action="store_true", help="print only, leave RESULTS.md")
    args = ap.parse_args()

    import compileall

    compileall.compile_dir(os.path.join(args.src, "ember"), quiet=1)
    runs: dict[str, list[dict]] = {k: [] for k in TARGETS}
    for stmt in TARGETS.values():  # a warm-up each: the OS file cache
        sample(stmt, args.src)
    for _ in range(args.repeat):
        for label, stmt in TARGETS.items():
            runs[label].append(sample(stmt, args.src))

    def ms(label: str, fn) -> float:
        return fn([r["s"] for r in runs[label]]) * 1e3

    torch_med = ms("torch", statistics.median)
    load = f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "?"
    lines = [
        f"Fresh `python -c` per sample, the import statement timed inside it (interpreter start-up "
        f"not counted); {args.repeat} alternating rounds; median (best) in ms; load average at end "
        f"{load}. ember tree: `{os.path.relpath(args.src, ROOT)}`, bytecode compiled. "
        f"Python {sys.version.split()[0]}.",
        "",
        "| import | ms | / torch | modules loaded |",
        "|---|---:|---:|---:|",
    ]
    for label, stmt in TARGETS.items():
        med, best = ms(label, statistics.median), ms(label, min)
        ratio = med / torch_med if torch_med else float("nan")
        mods = runs[label][-1]["modules"]
        lines.append(f"| `{stmt}` | {med:.0f} ({best:.0f}) | {ratio:.2f}x | {mods} |")
    lines += ["", "| import | heavy packages it loads |", "|---|---|"]
    for label, stmt in TARGETS.items():
        lines.append(f"| `{stmt}` | {', '.join(runs[label][-1]['heavy']) or '-'} |")
    table = "\n".join(lines)
    print(table)
    if not args.no_append:
        append("Import time: ember vs torch vs numpy (bench/import_time.py)", table)


if __name__ == "__main__":
    main()
