"""A light `import ember`: which modules it loads (never how long it takes; bench/import_time.py
times it), and that what it leaves out loads on first use."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

HEAVY = (
    "ml_dtypes", "torch", "numba", "llvmlite", "scipy", "transformers", "tokenizers", "jinja2",
    "safetensors", "gguf", "pyarrow", "polars", "pandas", "matplotlib", "tqdm", "PIL", "sklearn",
    "cupy", "onnx", "onnxruntime", "starlette", "uvicorn", "threadpoolctl",
)  # fmt: skip
LAZY_EMBER = (
    "ember.nn", "ember.optim", "ember.data", "ember.utils", "ember.io", "ember.models",
    "ember.generation", "ember.serve", "ember.train", "ember.quant", "ember.serialization",
    "ember.kernels.cpu",
)  # fmt: skip


def _run(code: str) -> dict:
    """Run code in a fresh interpreter; it prints one JSON object as its last line."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_ember_loads_no_heavy_package_and_no_lazy_subpackage():
    got = _run(
        f"""
        import sys, json
        import ember
        print(json.dumps([m for m in {HEAVY + LAZY_EMBER!r} if m in sys.modules]))
        """
    )
    assert got == [], f"import ember pulled in {got}"


def test_float32_work_needs_no_ml_dtypes():
    got = _run(
        """
        import sys, json
        import ember
        x = ember.randn(4, 5)
        y = (x @ x.T).softmax(-1).sum(0) + ember.arange(4).float()
        z = ember.gather(x, 1, ember.tensor([[0], [1], [2], [3]]))
        w = x.half().float().mean(), x.max(), ember.cat([x, x]).cumsum(0), ember.where(x > 0, x, 0)
        repr(y), z.tolist(), y.is_floating_point(), ember.float16.itemsize
        print(json.dumps({"ml_dtypes": "ml_dtypes" in sys.modules,
                          "bf16_itemsize": ember.bfloat16.itemsize,
                          "f8_itemsize": ember.float8_e4m3fn.itemsize}))
        """
    )
    assert got == {"ml_dtypes": False, "bf16_itemsize": 2, "f8_itemsize": 1}


def test_bfloat16_and_float8_load_ml_dtypes_on_first_use():
    got = _run(
        """
        import sys, json, pickle
        import ember
        before = "ml_dtypes" in sys.modules
        same = pickle.loads(pickle.dumps(ember.bfloat16)) is ember.bfloat16
        t = ember.ones(3, dtype=ember.bfloat16) * 2
        print(json.dumps({"before": before, "after": "ml_dtypes" in sys.modules, "pickle": same,
                          "np": t.numpy().dtype.name, "dtype": repr(t.dtype),
                          "values": t.float().tolist(),
                          "f8": ember.float8_e5m2.np.name,
                          "f8_back": repr(ember.dtypes.get_dtype(ember.float8_e5m2.np))}))
        """
    )
    assert got == {
        "before": False,
        "after": True,
        "pickle": True,
        "np": "bfloat16",
        "dtype": "ember.bfloat16",
        "values": [2.0, 2.0, 2.0],
        "f8": "float8_e5m2",
        "f8_back": "ember.float8_e5m2",
    }


def test_numpy_arrays_of_ml_dtypes_made_before_ember_uses_them():
    got = _run(
        """
        import json
        import ml_dtypes, numpy as np
        import ember
        a = np.arange(3, dtype=np.float32).astype(ml_dtypes.bfloat16)
        t = ember.from_numpy(a)
        print(json.dumps({"dtype": repr(t.dtype), "shares": np.shares_memory(t.numpy(), a),
                          "get": repr(ember.dtypes.get_dtype(ml_dtypes.float8_e4m3fn)),
                          "tensor": repr(ember.tensor(a).dtype)}))
        """
    )
    assert got == {
        "dtype": "ember.bfloat16",
        "shares": True,
        "get": "ember.float8_e4m3fn",
        "tensor": "ember.bfloat16",
    }


def test_lazy_subpackages_load_on_first_use():
    got = _run(
        """
        import sys, json
        import ember
        lin = ember.nn.Linear(2, 3)
        from ember import optim
        import ember.data
        from ember.utils.data import DataLoader
        print(json.dumps({"nn": type(lin).__module__, "optim": optim.__name__,
                          "data": DataLoader is ember.data.DataLoader,
                          "dir": all(n in dir(ember) for n in ("nn", "optim", "data", "load"))}))
        """
    )
    assert got == {
        "nn": "ember.nn.layers.linear",
        "optim": "ember.optim",
        "data": True,
        "dir": True,
    }
