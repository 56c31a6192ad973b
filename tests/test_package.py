import subprocess
import sys


def test_import_ember_is_light():
    code = (
        "import sys, ember\n"
        "heavy = [m for m in ('torch', 'transformers', 'numba', 'scipy', 'matplotlib', 'tqdm', "
        "'gguf', 'tokenizers', 'jinja2', 'PIL', 'sklearn') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import ember pulled in: {out.stdout.strip()}"


def test_public_api_has_docstrings_and_names():
    import ember

    for name in ["tensor", "zeros", "ones", "arange", "linspace", "eye", "rand", "randn", "randint",
                 "manual_seed", "from_numpy", "as_tensor", "no_grad", "enable_grad", "inference_mode",
                 "float32", "bfloat16", "device", "cuda_if_available", "Tensor"]:  # fmt: skip
        obj = getattr(ember, name)
        if callable(obj) and not isinstance(obj, ember.dtype):
            assert obj.__doc__, f"ember.{name} has no docstring"
