"""GGUF files written by `ember convert` load in llama.cpp (llama-cpp-python, the `bench` extra)
and compute what ember and transformers compute."""

import numpy as np
import pytest

import ember
from ember.cli.main import main
from ember.generation.tokenizer import Tokenizer
from ember.io import open_gguf
from ember.models import AutoModelForCausalLM
from tests.cli.test_convert_hf import (
    PROMPT_IDS,
    SMOL,
    _tiny_transformers_folder,
    transformers_logits,
)

llama_cpp = pytest.importorskip("llama_cpp")


def _llama(path, **kwargs):
    return llama_cpp.Llama(
        model_path=str(path), n_ctx=256, n_threads=2, verbose=False, seed=0, **kwargs
    )


@pytest.fixture(scope="module")
def smol_folder_gguf(tmp_path_factory):
    """The bundled SmolLM2 exported to a folder, and that folder converted back to F32 GGUF."""
    root = tmp_path_factory.mktemp("lcpp")
    assert main(["convert", str(SMOL), str(root / "hf")]) == 0
    assert main(["convert", str(root / "hf"), str(root / "smol-f32.gguf")]) == 0
    return root / "hf", root / "smol-f32.gguf"


def test_llamacpp_tokenizes_the_converted_vocabulary_as_ember(smol_folder_gguf):
    _, gguf_path = smol_folder_gguf
    llm = _llama(gguf_path, vocab_only=True)
    ours = Tokenizer.from_gguf_metadata(open_gguf(gguf_path).metadata)
    for text in ["The capital of France is", "  two  spaces\n\n12345 digits, café 東京 🚀"]:
        assert llm.tokenize(text.encode(), add_bos=False) == ours.encode(text)


def test_llamacpp_greedy_tokens_equal_embers(smol_folder_gguf, float_activations):
    _, gguf_path = smol_folder_gguf
    tok = Tokenizer.from_gguf_metadata(open_gguf(gguf_path).metadata)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], tokenize=True
    )
    n = 16
    llm = _llama(gguf_path)
    theirs = []
    for t in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0, reset=True):
        theirs.append(int(t))
        if len(theirs) == n:
            break
    model = AutoModelForCausalLM.from_pretrained(gguf_path)
    ids = list(prompt)
    with ember.no_grad():
        for _ in range(n):
            ids.append(int(model(ember.tensor([ids])).numpy()[0, -1].argmax()))
    assert theirs == ids[len(prompt) :]
    assert "Paris" in tok.decode(theirs)


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_llamacpp_logits_on_a_converted_transformers_model(smol_folder_gguf, tmp_path, model_type):
    folder = _tiny_transformers_folder(tmp_path / "hf", model_type, smol_folder_gguf[0], True, True)
    out = tmp_path / "tiny.gguf"
    assert main(["convert", str(folder), str(out)]) == 0
    llm = _llama(out, logits_all=True)
    llm.eval(PROMPT_IDS)
    got = np.array(llm.scores[: len(PROMPT_IDS)])
    np.testing.assert_allclose(got, transformers_logits(folder), atol=1e-3, rtol=1e-3)


def test_llamacpp_tokenizes_a_converted_byte_fallback_vocabulary_as_the_tokenizer_json(tmp_path):
    from tests.cli.test_convert_vocab import TEXTS, spm_style_folder

    ref = spm_style_folder(tmp_path / "tok")
    folder = _tiny_transformers_folder(tmp_path / "hf", "llama", tmp_path / "tok", True, False, 600)
    out = tmp_path / "spm.gguf"
    assert main(["convert", str(folder), str(out)]) == 0
    assert open_gguf(out).metadata["tokenizer.ggml.model"] == "llama"
    llm = _llama(out, vocab_only=True)
    for text in TEXTS:
        assert llm.tokenize(text.encode(), add_bos=True) == ref.encode(text).ids
