"""ember convert between GGUF and Hugging Face folders, checked against transformers and gguf."""

import json
import shutil

import numpy as np
import pytest

import ember
from ember.cli.main import main
from ember.io import open_gguf, save_gguf
from ember.models import AutoModelForCausalLM
from ember.models.hub import default_model_path

SMOL = default_model_path()
PROMPT_IDS = [1, 504, 3575, 282, 4649, 314, 30, 2, 198]  # awkward: bos, text, eos, newline


def smol_tokenizer_metadata():
    """The bundled SmolLM2 GGUF's tokenizer.* metadata and value types."""
    f = open_gguf(SMOL)
    keys = [k for k in f.metadata if k.startswith("tokenizer.")]
    return {k: f.metadata[k] for k in keys}, {k: f.metadata_types[k] for k in keys}


def write_tiny_llama_gguf(path, arch="llama", bias=False, tied=False, seed=0):
    """A random llama-family GGUF (2 layers, GQA 4/2 heads of 16) with SmolLM2's vocabulary."""
    rng = np.random.default_rng(seed)
    h, nh, nkv, hd, ff, vocab, layers = 64, 4, 2, 16, 96, 49152, 2
    tok_meta, tok_types = smol_tokenizer_metadata()
    a = arch
    meta = {
        "general.architecture": a,
        f"{a}.block_count": layers,
        f"{a}.context_length": 128,
        f"{a}.embedding_length": h,
        f"{a}.feed_forward_length": ff,
        f"{a}.attention.head_count": nh,
        f"{a}.attention.head_count_kv": nkv,
        f"{a}.rope.freq_base": 10000.0,
        f"{a}.rope.dimension_count": hd,
        f"{a}.attention.layer_norm_rms_epsilon": 1e-5,
        **tok_meta,
    }

    def w(*shape, scale=0.08):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    tensors = {"token_embd.weight": w(vocab, h, scale=0.5), "output_norm.weight": 1 + w(h)}
    if not tied:
        tensors["output.weight"] = w(vocab, h)
    for i in range(layers):
        b = f"blk.{i}."
        tensors.update(
            {
                b + "attn_norm.weight": 1 + w(h),
                b + "ffn_norm.weight": 1 + w(h),
                b + "attn_q.weight": w(nh * hd, h),
                b + "attn_k.weight": w(nkv * hd, h),
                b + "attn_v.weight": w(nkv * hd, h),
                b + "attn_output.weight": w(h, nh * hd),
                b + "ffn_gate.weight": w(ff, h),
                b + "ffn_up.weight": w(ff, h),
                b + "ffn_down.weight": w(h, ff),
            }
        )
        if bias:
            tensors.update(
                {
                    b + "attn_q.bias": w(nh * hd, scale=0.5),
                    b + "attn_k.bias": w(nkv * hd, scale=0.5),
                    b + "attn_v.bias": w(nkv * hd, scale=0.5),
                }
            )
            if arch == "llama":  # llama's attention_bias covers o_proj too; qwen2's does not
                tensors[b + "attn_output.bias"] = w(h, scale=0.5)
    save_gguf(path, meta, tensors, metadata_types=tok_types)
    return path


def ember_logits(path, ids=PROMPT_IDS):
    """Logits of one forward over ids with ember's model of a file or folder."""
    model = AutoModelForCausalLM.from_pretrained(path)
    with ember.no_grad():
        return model(ember.tensor([ids])).numpy()[0]


def transformers_logits(folder, ids=PROMPT_IDS):
    """Logits of the same forward with transformers' model of a folder (float32)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


@pytest.fixture(scope="module")
def smol_hf(tmp_path_factory):
    """The bundled SmolLM2 Q4_1 GGUF exported to a Hugging Face folder (float32)."""
    out = tmp_path_factory.mktemp("smol") / "SmolLM2-hf"
    assert main(["convert", str(SMOL), str(out)]) == 0
    return out


@pytest.mark.parametrize(
    "arch,bias,tied", [("llama", False, False), ("llama", True, True), ("qwen2", True, False)]
)
def test_tiny_gguf_to_folder_gives_transformers_the_same_logits(tmp_path, arch, bias, tied):
    src = write_tiny_llama_gguf(tmp_path / "tiny.gguf", arch, bias, tied)
    out = tmp_path / "tiny-hf"
    assert main(["convert", str(src), str(out)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert "rope_interleaved" not in cfg and "qk_norm" not in cfg  # nothing ember-only
    assert cfg["model_type"] == arch and cfg["tie_word_embeddings"] is tied
    want = ember_logits(src)
    np.testing.assert_allclose(transformers_logits(out), want, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(ember_logits(out), want, atol=1e-4, rtol=1e-4)


def test_smollm2_folder_matches_transformers(smol_hf, float_activations):
    want = ember_logits(SMOL)
    got = transformers_logits(smol_hf)
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=2e-3)
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_smollm2_folder_tokenizer_files_work_in_transformers(smol_hf):
    import transformers

    from ember.generation.tokenizer import Tokenizer

    ours = Tokenizer.from_gguf_metadata(open_gguf(SMOL).metadata)
    theirs = transformers.AutoTokenizer.from_pretrained(smol_hf)
    folder = Tokenizer.from_pretrained(smol_hf)
    texts = ["The capital of France is", "  two  spaces\n\nand 12345 digits, café 東京 🚀", ""]
    for text in texts:
        assert theirs(text).input_ids == ours.encode(text) == folder.encode(text)
    chat = [{"role": "user", "content": "What is 2+2?"}]
    rendered = theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert rendered == ours.apply_chat_template(chat) == folder.apply_chat_template(chat)
    assert theirs.eos_token == "<|im_end|>" and theirs.bos_token == "<|im_start|>"
    gen = transformers.GenerationConfig.from_pretrained(smol_hf)
    assert gen.eos_token_id == [2, 0] and gen.bos_token_id == 1
    assert folder.eos_token_ids == ours.eos_token_ids


def test_ember_generate_runs_on_the_exported_folder(smol_hf, capsys, float_activations):
    args = ["--max-tokens", "8", "--raw", "The capital of France is"]
    assert main(["generate", "--model", str(SMOL), *args]) == 0
    from_gguf = capsys.readouterr().out
    assert main(["generate", "--model", str(smol_hf), *args]) == 0
    assert capsys.readouterr().out == from_gguf and from_gguf.strip()


def _tiny_transformers_folder(path, model_type, tokenizer_from, tied, bias, vocab_size=49152):
    """A random transformers model saved with save_pretrained, plus a tokenizer's files."""
    import torch
    import transformers

    torch.manual_seed(0)
    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tied,
        rms_norm_eps=1e-5,
    )
    if model_type == "llama":
        config = transformers.LlamaConfig(attention_bias=bias, head_dim=16, **kwargs)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.Qwen2Config(**kwargs)
        model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():  # biases and norms are 0/1 at init: make them matter
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_from / name, path / name)
    return path


@pytest.mark.parametrize(
    "model_type,tied,bias", [("llama", False, False), ("llama", True, True), ("qwen2", True, True)]
)
def test_transformers_folder_to_gguf_gives_ember_the_same_logits(
    smol_hf, tmp_path, model_type, tied, bias
):
    import gguf

    folder = _tiny_transformers_folder(tmp_path / "hf", model_type, smol_hf, tied, bias)
    out = tmp_path / "tiny.gguf"
    assert main(["convert", str(folder), str(out)]) == 0
    want = transformers_logits(folder)
    np.testing.assert_allclose(ember_logits(out), want, atol=1e-4, rtol=1e-4)

    # the structure, as the official gguf package reads it
    r = gguf.GGUFReader(out)
    arch = "llama" if model_type == "llama" else "qwen2"
    field = {k: f.contents() for k, f in r.fields.items()}
    assert field["general.architecture"] == arch
    assert field[f"{arch}.block_count"] == 2 and field[f"{arch}.embedding_length"] == 64
    assert field[f"{arch}.attention.head_count"] == 4
    assert field[f"{arch}.attention.head_count_kv"] == 2
    assert field[f"{arch}.rope.dimension_count"] == 16
    assert field[f"{arch}.context_length"] == 128
    assert field["tokenizer.ggml.model"] == "gpt2" and field["tokenizer.ggml.pre"] == "smollm"
    smol = gguf.GGUFReader(SMOL)
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
        assert field[key] == smol.fields[key].contents()
    assert r.fields["tokenizer.ggml.token_type"].types[-1] == gguf.GGUFValueType.INT32
    tensors = {t.name: t for t in r.tensors}
    assert ("output.weight" in tensors) is not tied
    assert ("blk.0.attn_q.bias" in tensors) is bias
    assert "blk.1.attn_output.bias" not in tensors or model_type == "llama"
    q = tensors["blk.0.attn_q.weight"]
    assert q.tensor_type == gguf.GGMLQuantizationType.F32 and list(q.shape) == [64, 64]
    assert list(tensors["blk.1.attn_k.weight"].shape) == [64, 32]  # ggml order: (in, out)
    assert list(tensors["blk.0.ffn_down.weight"].shape) == [96, 64]
    assert not any(name.startswith("model.") for name in tensors)


def test_folder_round_trip_through_gguf_keeps_the_model(smol_hf, tmp_path, float_activations):
    out = tmp_path / "back.gguf"
    assert main(["convert", str(smol_hf), str(out)]) == 0
    src, back = open_gguf(SMOL), open_gguf(out)
    for key in ("llama.block_count", "llama.rope.freq_base", "tokenizer.ggml.pre"):
        assert back.metadata[key] == src.metadata[key]
    assert back.metadata["tokenizer.chat_template"] == src.metadata["tokenizer.chat_template"]
    np.testing.assert_allclose(ember_logits(out), ember_logits(SMOL), atol=2e-3, rtol=2e-3)


def test_quantize_reports_what_stayed_in_float(smol_hf, tmp_path, capsys):
    out = tmp_path / "q4k.gguf"
    assert main(["convert", str(smol_hf), str(out), "--quantize", "q4_k"]) == 0
    text = capsys.readouterr().out
    g = open_gguf(out)
    kept = [n for n, t in g.tensors.items() if t.qtype == "F32"]
    assert g.tensors["blk.0.ffn_down.weight"].qtype == "Q4_K"  # rows of 1536 = 6 blocks
    assert g.tensors["blk.0.attn_q.weight"].qtype == "F32"  # rows of 576: not whole blocks
    assert len(kept) == 242 and "Q4_K x30" in text
    assert "rows of 576 values do not split into Q4_K blocks of 256 (181)" in text
    assert "1-D (norms, biases)" in text and "blk.*.attn_norm.weight (30)" in text
    assert g.metadata["general.file_type"] == 14 and g.metadata["general.quantization_version"]


def _refused(capsys, argv, words):
    assert main(["convert", *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("ember convert: error: ") and len(err.splitlines()) == 1, err
    assert words in err, err


def test_what_cannot_be_written_faithfully_is_refused(smol_hf, tmp_path, capsys):
    import tokenizers

    from ember.io import load_safetensors, save_safetensors

    gpt2 = write_tiny_llama_gguf(tmp_path / "gpt2.gguf", arch="gpt2")
    _refused(capsys, [str(gpt2), str(tmp_path / "o1")], "GGUF architecture 'gpt2'")

    folder = _tiny_transformers_folder(tmp_path / "hf", "llama", smol_hf, False, False)
    capsys.readouterr()  # transformers' own progress bars
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    _refused(capsys, [str(folder), str(tmp_path / "o2.gguf")], "model_type 'gpt2'")
    (folder / "config.json").write_text(json.dumps(cfg))

    spec = json.loads((smol_hf / "tokenizer.json").read_text())
    odd = json.loads(json.dumps(spec))
    odd["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "[a-m]+"
    (folder / "tokenizer.json").write_text(json.dumps(odd))
    _refused(capsys, [str(folder), str(tmp_path / "o3.gguf")], "no llama.cpp pre-tokenizer")
    wordpiece = tokenizers.Tokenizer(tokenizers.models.WordPiece({"[UNK]": 0}, unk_token="[UNK]"))
    (folder / "tokenizer.json").write_text(wordpiece.to_str())
    _refused(capsys, [str(folder), str(tmp_path / "o4.gguf")], "tokenizer model 'WordPiece'")
    (folder / "tokenizer.json").unlink()
    _refused(capsys, [str(folder), str(tmp_path / "o5.gguf")], "no tokenizer.json")

    shutil.copy(smol_hf / "tokenizer.json", folder / "tokenizer.json")
    weights = load_safetensors(folder / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_safetensors(weights, folder / "model.safetensors")
    _refused(capsys, [str(folder), str(tmp_path / "o6.gguf")], "model.layers.1.mlp.up_proj")
    assert not list(tmp_path.glob("o*"))
