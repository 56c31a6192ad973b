"""ResNet-50 inference latency: ember (fused, channels-last) vs torch eager (NCHW and channels_last)
vs onnxruntime, random weights, eval mode, float32, 224x224, the same inputs in one process.

ember runs `optimize_for_inference(resnet50(weights=twin.state_dict()))`; torch runs a twin with
torchvision's module tree (tests/models/vision/twins.py; torchvision is not installable next to
torch 2.13 here); onnxruntime runs that twin exported to ONNX (skipped if onnx/onnxruntime are
missing: `pip install ember[bench]`). All use --threads threads (ember.set_num_threads,
torch.set_num_threads, ORT intra-op threads). Engines take turns (one untimed call, then one
timed call each, so no engine is timed while the previous one's spinning threads still hold a
core) so that load from other jobs hits them alike; the median and best of --repeat timed calls
are reported, with ratios to torch eager, and the table and the command go to bench/RESULTS.md.

    .venv/bin/python bench/vision.py [--batch 1 8] [--threads 2] [--repeat 15] [--no-append]
    .venv/bin/python bench/vision.py --zoo        # every zoo model at batch 1, ember vs torch

"cpu ms" is the process CPU time per call (all threads): on a loaded machine it shows the work
done, while wall time also counts waiting for preempted threads (and spinning thread pools).
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


def build_engines(threads: int, size: int, batches: list[int]) -> dict:
    """name -> (callable(x_numpy) -> logits numpy) for every engine available."""
    import torch
    from _common import set_threads
    from tests.models.vision import twins

    import ember
    from ember.inference import optimize_for_inference
    from ember.models.vision import resnet50

    set_threads(threads)
    torch.manual_seed(0)
    tm = twins.randomize_bn(twins.resnet("resnet50")).eval()
    em = optimize_for_inference(resnet50(weights=twins.to_numpy_state(tm)), inplace=True)
    tcl = twins.randomize_bn(twins.resnet("resnet50")).eval()
    tcl.load_state_dict(tm.state_dict())
    tcl = tcl.to(memory_format=torch.channels_last)

    def run_torch(x):
        with torch.inference_mode():
            return tm(torch.from_numpy(x)).numpy()

    def run_torch_cl(x):
        with torch.inference_mode():
            return tcl(torch.from_numpy(x).to(memory_format=torch.channels_last)).numpy()

    def run_ember(x):
        return em(ember.from_numpy(x)).numpy()

    engines = {"ember": run_ember, "torch eager": run_torch, "torch channels_last": run_torch_cl}
    ort = _onnxruntime(tm, threads, size)
    if ort is not None:
        engines["onnxruntime"] = ort
    return engines


def _onnxruntime(tm, threads: int, size: int):
    try:
        import onnxruntime as ort
        import torch
    except ImportError:
        print("onnxruntime not installed: skipped (pip install ember[bench])", file=sys.stderr)
        return None
    path = os.path.join(tempfile.mkdtemp(prefix="ember-bench-"), "resnet50.onnx")
    x = torch.zeros(1, 3, size, size)
    torch.onnx.export(
        tm, (x,), path, input_names=["x"], output_names=["y"], dynamo=False,
        dynamic_axes={"x": {0: "n"}, "y": {0: "n"}}, opset_version=17,
    )  # fmt: skip
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return lambda a: sess.run(None, {"x": a})[0]


def measure(engines: dict, x: np.ndarray, repeat: int, warmup: int = 2) -> dict:
    """name -> list of seconds, engines interleaved call by call; checks they agree."""
    outs = {}
    for name, fn in engines.items():
        for _ in range(warmup):
            outs[name] = fn(x)
    ref = outs["torch eager"]
    for name, y in outs.items():
        err = float(np.abs(y - ref).max())
        if err > 1e-3 * max(1.0, float(np.abs(ref).max())):
            raise SystemExit(f"{name} disagrees with torch eager: max |diff| {err}")
    times = {name: ([], []) for name in engines}
    for _ in range(repeat):
        for name, fn in engines.items():
            fn(x)  # untimed: lets the previous engine's spinning threads go idle first
            t, c = time.perf_counter(), time.process_time()
            fn(x)
            times[name][0].append(time.perf_counter() - t)
            times[name][1].append(time.process_time() - c)
    return times


def torch_info() -> str:
    """torch's math backends (its BLAS is MKL/oneDNN, not visible to threadpoolctl as numpy's)."""
    import torch

    lines = torch.__config__.parallel_info().splitlines()
    keep = [s.strip() for s in lines if "MKL" in s or "OpenMP" in s or "backend" in s]
    return "; ".join(keep)


def _row(label: str, b: int, name: str, ts: tuple, base: float) -> str:
    wall, cpu = ts
    med = statistics.median(wall)
    return (
        f"| {label} | {b} | {name} | {med * 1e3:.1f} | {min(wall) * 1e3:.1f} | "
        f"{statistics.median(cpu) * 1e3:.1f} | {med / base:.2f}x | {b / med:.1f} |"
    )


HEAD = (
    "| model | batch | engine | median ms | best ms | cpu ms | vs torch eager | images/s |\n"
    + "|---" * 8
    + "|"
)


def resnet50_table(args) -> str:
    """ResNet-50 at each batch size on every engine."""
    engines = build_engines(args.threads, args.size, args.batch)
    rows = []
    for b in args.batch:
        x = np.random.default_rng(b).standard_normal((b, 3, args.size, args.size), np.float32)
        times = measure(engines, x, args.repeat if b == 1 else max(3, args.repeat // 2))
        base = statistics.median(times["torch eager"][0])
        for name, ts in times.items():
            rows.append(_row("resnet50", b, name, ts, base))
            print(rows[-1], flush=True)
    return HEAD + "\n" + "\n".join(rows)


def zoo(args) -> str:
    """Each model of the zoo at batch 1: ember (fused where it applies) vs its torch twin."""
    import torch
    from _common import set_threads
    from tests.models.vision import twins

    import ember
    from ember.inference import optimize_for_inference
    from ember.models.vision import MODELS, ViTForImageClassification, efficientnet_lite0

    set_threads(args.threads)
    x = np.random.default_rng(0).standard_normal((1, 3, args.size, args.size), np.float32)
    rows = []
    for name in ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "mobilenet_v2",
                 "efficientnet_lite0", "vit_b_16"]:  # fmt: skip
        if name.startswith("resnet") or name == "mobilenet_v2":
            torch.manual_seed(0)
            tm = twins.resnet(name) if name.startswith("resnet") else twins.MobileNetV2()
            tm = twins.randomize_bn(tm).eval()
            em = optimize_for_inference(MODELS[name](weights=twins.to_numpy_state(tm)), True)
        elif name == "vit_b_16":
            from transformers import ViTConfig
            from transformers import ViTForImageClassification as HFViT

            tm = HFViT(ViTConfig(num_labels=1000)).eval()
            em = ViTForImageClassification()
            from ember.models.vision.vit import legacy_key

            em.load_state_dict({legacy_key(k): v.numpy() for k, v in tm.state_dict().items()})
            em = optimize_for_inference(em.eval(), True)
        else:
            tm = None
            em = optimize_for_inference(efficientnet_lite0(weights="bundled"), True)

        def run_ember(a, em=em):
            with ember.no_grad():
                return em(ember.from_numpy(a)).numpy()

        engines = {"ember": run_ember}
        if tm is not None:

            def run_torch(a, tm=tm):
                with torch.inference_mode():
                    out = tm(torch.from_numpy(a))
                return (out.logits if hasattr(out, "logits") else out).numpy()

            engines["torch eager"] = run_torch
        times = measure(engines, x, args.repeat) if tm is not None else _alone(run_ember, x, args)
        base = statistics.median(times.get("torch eager", times["ember"])[0])
        for eng, ts in times.items():
            rows.append(_row(name, 1, eng, ts, base))
            print(rows[-1], flush=True)
    return HEAD + "\n" + "\n".join(rows)


def _alone(fn, x, args) -> dict:
    fn(x)
    wall, cpu = [], []
    for _ in range(args.repeat):
        t, c = time.perf_counter(), time.process_time()
        fn(x)
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return {"ember": (wall, cpu)}


def main() -> None:
    """Run the benchmark and print/append the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--zoo", action="store_true", help="every zoo model at batch 1 instead")
    ap.add_argument("--no-append", action="store_true", help="print only, leave RESULTS.md alone")
    args = ap.parse_args()
    import torch
    from _common import append, blas_info

    load0 = os.getloadavg()[0]
    if args.zoo:
        table, what = zoo(args), "zoo models at batch 1"
    else:
        table, what = resnet50_table(args), "ResNet-50"
    from threadpoolctl import threadpool_info

    libs = sorted({os.path.basename(d["filepath"]) for d in threadpool_info()})
    if torch.get_num_threads() != args.threads:
        raise SystemExit(f"torch ended with {torch.get_num_threads()} threads, not {args.threads}")
    notes = (
        f"\n{what}, random weights, eval, float32, {args.size}x{args.size}, {args.threads} "
        f"threads everywhere; ember = optimize_for_inference (BN folded, NHWC, fused epilogues).\n"
        f"- load average (1 min) before/after: {load0:.1f} / {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores\n"
        f"- ember BLAS (threadpoolctl): {blas_info()}\n- torch: {torch_info()}\n"
        f"- thread pools loaded: {', '.join(libs)}\n"
    )
    print(table + notes)
    if not args.no_append:
        title = "vision: " + ("zoo latency" if args.zoo else "ResNet-50 latency")
        append(title + ", ember vs torch", table + "\n" + notes)


if __name__ == "__main__":
    main()
