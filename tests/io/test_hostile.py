"""Small hostile files must fail fast with a FormatError naming the limit, never allocate or
loop without bound (issue 12, part 1). Each case here made a reader run for tens of seconds,
allocate gigabytes, recurse past Python's limit or crash before it was bounded."""

from __future__ import annotations

import json
import pickle
import struct
import subprocess
import sys
import time
import tracemalloc

import numpy as np
import pytest
import torch

from ember.errors import FormatError
from ember.io import load_torch

from .torch_files import FakeStorage, FakeTensor, dumps, legacy_checkpoint, zip_checkpoint

P2 = b"\x80\x02"  # PROTO 2


def put(i: int) -> bytes:
    return b"q" + bytes([i]) if i < 256 else b"r" + struct.pack("<I", i)


def get(i: int) -> bytes:
    return b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i)


def write_zip(tmp_path, pickle_bytes: bytes, storages: dict | None = None):
    path = tmp_path / "hostile.pt"
    path.write_bytes(zip_checkpoint(pickle_bytes, storages or {}))
    return path


def laughs(levels: int = 30, fan: int = 10, opener: bytes = b"]", closer: bytes = b"l") -> bytes:
    """List i holds `fan` references to list i-1: ~1 KB of pickle, fan**levels leaves."""
    out = [P2, opener, put(0)]
    for i in range(1, levels + 1):
        out += [b"(", get(i - 1) * fan, closer, put(i)]
    return b"".join(out) + b"."


def fails_fast(load, match: str, seconds: float = 5.0):
    t = time.perf_counter()
    with pytest.raises(FormatError, match=match):
        load()
    assert time.perf_counter() - t < seconds  # generous: before the bounds this took 30 s+


# --------------------------------------------------------------------------- pickles


@pytest.mark.parametrize("opener,closer", [(b"]", b"l"), (b")", b"t")], ids=["lists", "tuples"])
def test_billion_laughs_list_dag_is_refused(tmp_path, opener, closer):
    path = write_zip(tmp_path, laughs(opener=opener, closer=closer))
    assert path.stat().st_size < 2000
    fails_fast(lambda: load_torch(path), r"more than 1000000 objects")


def test_billion_laughs_through_dicts_is_refused(tmp_path):
    # dict i maps a key to each of `fan` references to dict i-1
    out = [P2, b"}", put(0)]
    for i in range(1, 31):
        out += [b"}(", b"".join(b"K" + bytes([k]) + get(i - 1) for k in range(10)), b"u", put(i)]
    path = write_zip(tmp_path, b"".join(out) + b".")
    fails_fast(lambda: load_torch(path), r"more than 1000000 objects")


def test_moderate_sharing_still_loads(tmp_path):
    shared = [1, 2, 3]
    obj = {"a": shared, "b": shared, "c": [shared] * 100}
    path = write_zip(tmp_path, dumps(obj))
    assert load_torch(path) == obj


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_deeply_nested_lists_are_refused(tmp_path, legacy):
    n = 200_000
    deep = P2 + b"]" * n + b"a" * (n - 1) + b"."  # each list appended into the one below it
    path = tmp_path / "deep.pt"
    path.write_bytes(zip_checkpoint(deep, {}) if not legacy else legacy_checkpoint(deep, {}))
    fails_fast(lambda: load_torch(path), r"nested more than 100 deep")


def test_nesting_up_to_the_limit_loads(tmp_path):
    obj: list = []
    for _ in range(98):
        obj = [obj]
    assert load_torch(write_zip(tmp_path, dumps({"x": obj}))) == {"x": obj}


@pytest.mark.parametrize(
    "raw",
    [
        P2 + b"]" + put(0) + get(0) + b"a.",  # L = [L]
        P2 + b"}" + put(0) + b"X\x01\x00\x00\x00k" + get(0) + b"s.",  # d = {"k": d}
        P2 + b"]" + put(0) + b"}X\x01\x00\x00\x00k" + get(0) + b"sa.",  # L = [{"k": L}]
    ],
    ids=["list", "dict", "through-dict"],
)
def test_self_references_are_refused(tmp_path, raw):
    fails_fast(lambda: load_torch(write_zip(tmp_path, raw)), r"contains itself")


def test_deep_tuple_as_dict_key_does_not_crash(tmp_path):
    # Hashing a tuple 200k deep recursed in C and crashed the interpreter (SIGSEGV): a child
    # process tells a crash from a clean refusal.
    n = 200_000
    path = write_zip(tmp_path, P2 + b"})" + b"\x85" * n + b"K\x01s.")
    code = (
        "import sys\nfrom ember.io import load_torch\nfrom ember.errors import FormatError\n"
        f"try:\n    load_torch({str(path)!r})\nexcept FormatError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "nested more than 100 deep" in out.stdout


def test_hashing_one_big_tuple_many_times_is_bounded(tmp_path):
    # a 100k-item tuple used as a dict key 2000 times: 2e8 steps of hashing from 210 KB
    n, uses = 100_000, 2000
    raw = P2 + b"}(" + b"K\x00" * n + b"t" + put(1) + b"0"  # the tuple, memoised, popped
    raw += (get(1) + b"K\x01s") * uses + b"."  # d[t] = 1, again and again
    fails_fast(lambda: load_torch(write_zip(tmp_path, raw)), r"hashing .* more than")


def test_sets_and_frozensets_still_load(tmp_path):
    obj = {"s": {1, 2, (3, 4)}, "f": frozenset({"a", (1, (2,))}), "t": {(1, 2): "x"}}
    for proto in (2, 4):
        raw = pickle.dumps(obj, protocol=proto)
        assert load_torch(write_zip(tmp_path, raw)) == obj


@pytest.mark.parametrize("size", [(2**31,), (2**60,), (2**20, 2**20)])
def test_stride_zero_views_past_the_file_are_refused(tmp_path, size):
    # a 1-element storage viewed as 8 GiB (or 4 EiB): anything that copies it materialises that
    st = FakeStorage("0", numel=1)
    t = FakeTensor(st, 0, size, (0,) * len(size))
    path = write_zip(tmp_path, dumps({"t": t}), {"0": b"\0" * 4})
    assert path.stat().st_size < 1000
    fails_fast(lambda: load_torch(path), r"past the limit of \d+ \(4 x the \d+-byte file")


def test_small_stride_zero_views_load_as_torch_does(tmp_path):
    st = FakeStorage("0", numel=2)
    t = FakeTensor(st, 1, (1000, 3), (0, 0))
    path = write_zip(tmp_path, dumps({"t": t}), {"0": np.array([1.5, 2.5], np.float32).tobytes()})
    ours = load_torch(path)["t"]
    ref = torch.load(path, weights_only=True)["t"]
    assert ours.shape == tuple(ref.shape) and np.array_equal(ours, ref.numpy())


def test_huge_zero_size_tensor_is_a_format_error(tmp_path):
    st = FakeStorage("0", numel=1)
    t = FakeTensor(st, 0, (0, 2**61), (1, 1))
    path = write_zip(tmp_path, dumps({"t": t}), {"0": b"\0" * 4})
    with pytest.raises(FormatError, match="too large for any array"):
        load_torch(path)


_WHO_IMPORTS_ML_DTYPES = """
import importlib, importlib.abc, importlib.util, sys
import ember  # whatever ember itself imports is another module's business
MINE = {"ember.io._common", "ember.io._unpickler", "ember.io.torch_pickle", "ember.io.gguf",
        "ember.io.safetensors", "ember.models.whisper.ct2"}
real = sys.modules.pop("ml_dtypes", None)
hits = set()

class Spy(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name != "ml_dtypes":
            return None
        f = sys._getframe()
        while f is not None:
            if f.f_code.co_name == "<module>" and f.f_globals.get("__name__") in MINE:
                hits.add(f.f_globals["__name__"])
            f = f.f_back
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        if real is not None:
            return real
        sys.meta_path.remove(self)
        try:
            return importlib.import_module("ml_dtypes")
        finally:
            sys.meta_path.insert(0, self)

    def exec_module(self, module):
        pass

sys.meta_path.insert(0, Spy())
import ember.io, ember.io.torch_pickle, ember.models.whisper.ct2
print(sorted(hits))
"""


def test_ml_dtypes_is_imported_only_when_used():
    # issue 12 part 9: the readers import ml_dtypes when a bfloat16/float8 tensor needs it
    out = subprocess.run(
        [sys.executable, "-c", _WHO_IMPORTS_ML_DTYPES], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_bfloat16_checkpoints_still_load(tmp_path):
    path = tmp_path / "bf16.pt"
    ref = {"w": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)}
    torch.save(ref, path)
    got = load_torch(path)["w"]
    assert str(got.dtype) == "bfloat16"
    assert np.array_equal(got.astype(np.float32), ref["w"].float().numpy())


# --------------------------------------------------------------------------- vision models


def save_st(path, shapes: dict[str, tuple[int, ...]], dtype: str = "F32") -> None:
    """A safetensors file of zero-size tensors (data_offsets [0, 0] each)."""
    header = {
        k: {"dtype": dtype, "shape": list(s), "data_offsets": [0, 0]} for k, s in shapes.items()
    }
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob)


def peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def test_resnet_class_count_from_a_zero_size_weight(tmp_path):
    from ember.models.vision import ResNet

    shapes = {f"layer{i}.{j}.conv1.weight": (0,) for i in range(1, 5) for j in range(2)}
    shapes["fc.weight"] = (2**16, 0)  # 2**22 here allocated 8 GiB before the check
    path = tmp_path / "r.safetensors"
    save_st(path, shapes)
    assert path.stat().st_size < 1000

    def load():
        with pytest.raises(FormatError, match=r"fc.weight: expected shape \(classes >= 1, 512\)"):
            ResNet.from_pretrained(path)

    assert peak_bytes(load) < 32 * 2**20


def test_resnet_whose_tensors_do_not_fit_fails_before_allocating(tmp_path):
    from ember.models.vision import ResNet

    shapes = {f"layer{i}.{j}.conv1.weight": (0,) for i in range(1, 5) for j in range(2)}
    shapes["fc.weight"] = (2**16, 512)
    path = tmp_path / "r.safetensors"
    header = {
        k: {"dtype": "F32", "shape": list(s), "data_offsets": [0, 0]} for k, s in shapes.items()
    }
    header["fc.weight"]["data_offsets"] = [0, 2**16 * 512 * 4]
    blob = json.dumps(header).encode()
    with open(path, "wb") as f:  # a sparse file: 128 MiB of zeros that take no disk
        f.write(struct.pack("<Q", len(blob)) + blob)
        f.truncate(8 + len(blob) + 2**16 * 512 * 4)

    def load():
        with pytest.raises(FormatError, match=r"checkpoint does not fit ResNet: .*shapes differ"):
            ResNet.from_pretrained(path)

    assert peak_bytes(load) < 32 * 2**20


def test_mobilenet_class_count_from_a_zero_size_weight(tmp_path):
    from ember.models.vision import MobileNetV2

    path = tmp_path / "m.safetensors"
    save_st(path, {"classifier.1.weight": (2**14, 0)})  # 2**22: 20 GiB before the check

    def load():
        with pytest.raises(FormatError, match=r"classifier.1.weight: expected shape"):
            MobileNetV2.from_pretrained(path)

    assert peak_bytes(load) < 32 * 2**20


def test_vit_config_sizes_are_checked_against_the_checkpoint(tmp_path):
    from ember.models.vision import ViTForImageClassification, ViTModel

    save_st(tmp_path / "model.safetensors", {"classifier.weight": (2**14, 0)})
    cfg = {"hidden_size": 8, "num_hidden_layers": 10_000, "num_attention_heads": 2,
           "intermediate_size": 8, "image_size": 16, "patch_size": 8}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for cls in (ViTForImageClassification, ViTModel):
        with pytest.raises(FormatError, match=r"num_hidden_layers 10000 but the checkpoint"):
            cls.from_pretrained(tmp_path)
    cfg["num_hidden_layers"] = 1
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match=r"classifier.weight: expected shape \(classes >= 1, 8\)"):
        ViTForImageClassification.from_pretrained(tmp_path)
    for bad in ({"patch_size": 0}, {"num_attention_heads": 3}, {"hidden_size": "8"}):
        (tmp_path / "config.json").write_text(json.dumps({**cfg, **bad}))
        with pytest.raises(FormatError, match="patch_size|multiple|positive integer"):
            ViTForImageClassification.from_pretrained(tmp_path)


# --------------------------------------------------------------------------- GGUF


@pytest.mark.parametrize("count", [10**9, 10**5])
def test_gguf_block_count_is_checked_before_building(tmp_path, count):
    from ember.models.auto import AutoModelForCausalLM, config_from_gguf

    from .test_strict import write_llama

    path = write_llama(tmp_path, **{"llama.block_count": count})
    assert path.stat().st_size < 16 * 1024
    match = rf"block_count is {count} but the file holds only 12 tensors"
    fails_fast(lambda: AutoModelForCausalLM.from_pretrained(path), match)  # took 35-40 s
    from ember.io import open_gguf

    f = open_gguf(path)
    with pytest.raises(FormatError, match=match):  # what `ember convert` reads the config with
        config_from_gguf(f.metadata, f.tensors)


def test_gguf_huge_zero_size_shape_is_a_format_error(tmp_path):
    from ember.io import open_gguf

    from .test_gguf import build, tinfo

    path = tmp_path / "z.gguf"
    path.write_bytes(build(tis=[tinfo("t", (2**61, 0))]))  # torch-order (0, 2**61) float32
    with pytest.raises(FormatError, match="too large for any array"):  # a raw ValueError before
        open_gguf(path)
    path.write_bytes(build(tis=[tinfo("t", (2**61 - 1, 0))]))
    assert open_gguf(path).tensors["t"].data.shape == (0, 2**61 - 1)


# --------------------------------------------------------------------------- CTranslate2


def ct2_str(s: str) -> bytes:
    b = s.encode() + b"\0"
    return struct.pack("<H", len(b)) + b


def ct2_file(variables: dict, aliases: dict | None = None) -> bytes:
    """A CTranslate2 model.bin (binary version 6) of (dtype id, dims, raw bytes) variables."""
    out = [struct.pack("<I", 6), ct2_str("WhisperSpec"), struct.pack("<II", 1, len(variables))]
    for name, (type_id, dims, raw) in variables.items():
        out += [ct2_str(name), struct.pack("<B", len(dims))]
        out += [struct.pack("<I", d) for d in dims]
        out += [struct.pack("<BI", type_id, len(raw)), raw]
    out.append(struct.pack("<I", len(aliases or {})))
    for a, t in (aliases or {}).items():
        out += [ct2_str(a), ct2_str(t)]
    return b"".join(out)


def f32(*dims):
    return (0, dims, bytes(4 * int(np.prod(dims))))


def tiny_whisper(**extra) -> dict:
    v = {
        "decoder/embeddings/weight": f32(4, 4),
        "encoder/conv1/weight": f32(4, 2, 3),
        "encoder/layer_0/ffn/linear_0/weight": f32(8, 4),
        "decoder/layer_0/ffn/linear_0/weight": f32(8, 4),
        "encoder/position_encodings/encodings": f32(6, 4),
        "decoder/position_encodings/encodings": f32(6, 4),
        "encoder/num_heads": (3, (), struct.pack("<i", 2)),
        "decoder/num_heads": (3, (), struct.pack("<i", 2)),
    }
    v.update(extra)
    return v


def test_ct2_layer_count_is_linear_and_checked_against_the_file():
    from ember.models.whisper.ct2 import parse_ct2, whisper_config_from_ct2

    n = 20_000  # ~700 KB of empty variables: the scan was quadratic (645 KiB -> 8 s)
    empty = {f"encoder/layer_{i}/x": (0, (0,), b"") for i in range(1, n)}
    raw = ct2_file(tiny_whisper(**empty))
    assert len(raw) < 1_000_000
    model = parse_ct2(raw)
    fails_fast(
        lambda: whisper_config_from_ct2(model),
        rf"imply a Whisper model of \d+ weights \({n} encoder and 1 decoder layers",
    )


def test_ct2_alias_chains_resolve_in_one_pass():
    from ember.models.whisper.ct2 import parse_ct2

    n = 20_000  # each alias's chain was walked from scratch: n**2 / 2 steps
    aliases = {f"a{i}": f"a{i + 1}" for i in range(n)}
    aliases[f"a{n}"] = "v"
    t = time.perf_counter()
    model = parse_ct2(ct2_file({"v": f32(2)}, aliases))
    assert time.perf_counter() - t < 5
    assert model.resolve("a0") == "v" and model.resolve(f"a{n // 2}") == "v"
    assert "a0" in model and model["a0"].shape == (2,)
    with pytest.raises(FormatError, match="names no stored variable"):
        parse_ct2(ct2_file({"v": f32(2)}, {"x": "y", "y": "x"}))


def test_ct2_hostile_shapes_are_format_errors():
    from ember.models.whisper.ct2 import parse_ct2, whisper_config_from_ct2

    with pytest.raises(FormatError, match="too large for any array"):  # a raw ValueError before
        parse_ct2(ct2_file({"v": (0, (2**32 - 1, 2**32 - 1, 0), b"")}))
    bad_heads = tiny_whisper(**{"encoder/num_heads": (3, (2,), bytes(8))})
    with pytest.raises(FormatError, match="should hold one number"):
        whisper_config_from_ct2(parse_ct2(ct2_file(bad_heads)))
    zero_width = tiny_whisper(**{"decoder/embeddings/weight": (0, (2**20, 0), b"")})
    with pytest.raises(FormatError, match="should have 2 non-zero dimensions"):
        whisper_config_from_ct2(parse_ct2(ct2_file(zero_width)))
    odd_heads = tiny_whisper(**{"decoder/num_heads": (3, (), struct.pack("<i", 3))})
    with pytest.raises(FormatError, match="num_heads 3 does not divide d_model 4"):
        whisper_config_from_ct2(parse_ct2(ct2_file(odd_heads)))


def test_hf_folder_layer_count_is_checked_before_building(tmp_path):
    from ember.io import save_safetensors
    from ember.models.auto import AutoModelForCausalLM

    cfg = {"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
           "num_hidden_layers": 10**9, "num_attention_heads": 2}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_safetensors({"model.embed_tokens.weight": np.zeros((10, 8), np.float32)},
                     tmp_path / "model.safetensors")  # fmt: skip
    fails_fast(
        lambda: AutoModelForCausalLM.from_pretrained(tmp_path),
        r"num_hidden_layers is 1000000000 but the checkpoint holds only 1 tensors",
    )
    (tmp_path / "config.json").write_text("{NaN")
    with pytest.raises(FormatError, match="not valid JSON"):
        AutoModelForCausalLM.from_pretrained(tmp_path)
