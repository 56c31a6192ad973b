"""The bundled SmolLM2-135M-Instruct (GGUF Q4_1 + Q8_0): real weights, real answers."""

import numpy as np
import pytest
import torch

import ember
from ember.generation.generate import generate, generate_tokens
from ember.generation.tokenizer import Tokenizer
from ember.models import AutoModelForCausalLM
from ember.models.hub import default_model_path


@pytest.fixture(scope="module")
def smol():
    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(path)
    return model, Tokenizer.from_gguf_metadata(model.gguf_metadata), path


def test_weights_stay_quantized_and_mapped(smol):
    from ember.quant import QTensor

    model, _, _ = smol
    w = model.model.layers[0].self_attn.q_proj.weight
    assert isinstance(w, QTensor) and w.qtype == "Q4_1"
    assert (
        isinstance(model.lm_head.weight, QTensor)
        and model.lm_head.weight is model.model.embed_tokens.weight
    )
    assert not w.data.flags.owndata  # a view into the memory map, never copied


def test_capital_of_france(smol):
    # "What is the capital of France?" is a near tie for this model ("The" 0.08 logits above "L"
    # with float activations); with int8 activations, as llama.cpp's own Q8_1 products also have,
    # both ember and llama.cpp answer "L'Étoile, ...". This wording leads by over a logit at
    # every step of the answer on either path.
    model, tok, _ = smol
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Name the capital of France."}], add_generation_prompt=True
    )
    answer = generate(model, tok, prompt, max_new_tokens=24, add_special_tokens=False)
    assert "Paris" in answer, answer


@pytest.mark.parametrize("activations", ["float", "int8"])
def test_logits_match_float_reference_from_the_same_gguf(smol, activations, request):
    """Float activations: the same dequantized weights, so only float32 summation order differs.
    int8 activations (the default Q4_1 decode kernels): on this prompt llama.cpp's logits (Q8
    activations) differ from the float32 reference by up to 1.64 with the argmax equal at 9 of
    10 positions (measured, llama-cpp-python 0.3.36); ember is held to 2.0 and 9 of 10."""
    import transformers

    if activations == "float":
        request.getfixturevalue("float_activations")
    model, tok, path = smol
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    ids = tok.encode("The quick brown fox jumps over the lazy dog because")
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    with ember.no_grad():
        got = model(ember.tensor([ids]))[0].numpy()
    if activations == "float":
        np.testing.assert_allclose(got, want, atol=2e-3, rtol=2e-3)
        assert (got.argmax(-1) == want.argmax(-1)).all()
    else:
        assert np.abs(got - want).max() < 2.0
        assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9


def test_streaming_pieces_join_to_the_full_text(smol):
    from ember.generation.generate import stream_text

    model, tok, _ = smol
    pieces = list(stream_text(model, tok, "Once upon a time", 20))
    ids = [
        s[0]
        for s in generate_tokens(
            model, tok.encode("Once upon a time"), 20, stop_token_ids=tok.eos_token_ids
        )
    ]
    ids = [i for i in ids if i not in tok.eos_token_ids]
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True)
    assert len(pieces) > 1
