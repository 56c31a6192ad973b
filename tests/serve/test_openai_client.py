"""The shared server driven by the official openai client: chat, completions, streaming,
n and seeds, stop strings, logprobs, embeddings, models, and batching that changes no output."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

MODEL = "SmolLM2-135M-Instruct.Q4_1"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _chat(client, messages=QUESTION, **kw):
    kw.setdefault("max_tokens", 8)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=MODEL, messages=messages, **kw)


def test_models_lists_the_llm_and_the_embedder(client):
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL, "all-MiniLM-L6-v2"]
    assert client.models.retrieve(MODEL).id == MODEL


def test_chat_completion(client, http):
    r = _chat(client)
    c = r.choices[0]
    # (the shared server prefills in 16-token chunks, whose int8-activation products make this
    # model's near tie "The" / "L" go to "L'Étoile..."; a whole-prompt prefill says "Paris")
    assert c.message.role == "assistant" and c.message.content
    assert _chat(client).choices[0].message.content == c.message.content  # greedy: the same
    assert c.finish_reason in ("stop", "length")
    n_prompt = http.post("/tokenize", json={"messages": QUESTION}).json()["count"]
    assert r.usage.prompt_tokens == n_prompt
    assert 0 < r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_matches_the_whole_answer(client):
    whole = _chat(client, max_tokens=12)
    chunks = list(_chat(client, max_tokens=12, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == whole.choices[0].finish_reason and set(finals[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_and_its_stream(client):
    kw = dict(model=MODEL, prompt="The three primary colors are", max_tokens=10, temperature=0)
    r = client.completions.create(**kw)
    assert r.object == "text_completion" and r.choices[0].text
    assert r.usage.completion_tokens == 10 and r.choices[0].finish_reason == "length"
    text = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True))
    assert text == r.choices[0].text


def test_completion_matches_ember_generate(client):
    """The server's greedy text is what ember.generation.generate writes for the same prompt."""
    from ember.generation.generate import generate
    from ember.generation.sampling import SamplingParams
    from ember.generation.tokenizer import Tokenizer
    from ember.models import AutoModelForCausalLM
    from ember.models.hub import default_model_path

    prompt = "Once upon a time, in a small village,"
    model = AutoModelForCausalLM.from_pretrained(default_model_path())
    tok = Tokenizer.from_gguf_metadata(model.gguf_metadata)
    ref = generate(model, tok, prompt, 12, SamplingParams())
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    assert r.choices[0].text == ref


def test_n_choices_and_seeds_are_reproducible(client):
    kw = dict(temperature=1.0, top_p=0.95, max_tokens=4, seed=7)
    a, b = _chat(client, n=3, **kw), _chat(client, n=3, **kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    # choice j is sampled with seed + j: the same as a single choice with that seed
    singles = [_chat(client, **{**kw, "seed": 7 + j}) for j in range(3)]
    assert [s.choices[0].message.content for s in singles] == [c.message.content for c in a.choices]
    assert a.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert a.usage.prompt_tokens == singles[0].usage.prompt_tokens  # the prompt counted once


def test_stop_strings(client):
    full = _chat(client, max_tokens=12).choices[0].message.content
    words = full.split()
    assert len(words) >= 3, full
    stop = " " + words[2]
    r = _chat(client, max_tokens=12, stop=[stop])
    assert r.choices[0].message.content == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in _chat(client, max_tokens=12, stop=stop, stream=True)
    )
    assert streamed == r.choices[0].message.content


def test_chat_logprobs(client):
    r = _chat(client, max_tokens=5, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for t in content:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        assert t.top_logprobs[0].token == t.token  # greedy: the chosen token is the most likely
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob)
        probs = np.exp([x.logprob for x in t.top_logprobs])
        assert probs.sum() <= 1 + 1e-6 and list(probs) == sorted(probs, reverse=True)
    assert "".join(t.token for t in content) == r.choices[0].message.content


def test_completion_logprobs(client):
    r = client.completions.create(
        model=MODEL, prompt="1, 2, 3,", max_tokens=4, temperature=0, logprobs=2
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[0] == 0 and all(len(d) == 2 for d in lp.top_logprobs)


def test_embeddings_match_the_model(client):
    from ember.models.sentence import SentenceTransformer

    texts = ["A cat sits on the mat.", "Stock markets fell sharply today."]
    r = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts)  # base64 by default
    got = np.array([d.embedding for d in r.data], np.float32)
    ref = SentenceTransformer().encode(texts)
    np.testing.assert_allclose(got, ref, atol=1e-5)
    assert r.usage.prompt_tokens > 0
    floats = client.embeddings.create(
        model="all-MiniLM-L6-v2", input=texts[0], encoding_format="float"
    )
    np.testing.assert_allclose(floats.data[0].embedding, ref[0], atol=1e-5)


def test_embeddings_base64_is_little_endian_float32(http):
    r = http.post("/v1/embeddings", json={"input": "hello", "encoding_format": "base64"}).json()
    v = np.frombuffer(base64.b64decode(r["data"][0]["embedding"]), "<f4")
    assert v.shape == (384,) and np.linalg.norm(v) == pytest.approx(1.0, abs=1e-5)


PROMPTS = [
    "Name three fruits.",
    "What is 2 + 2?",
    "Write a haiku about the sea. " * 4,  # several prefill chunks
    "Who wrote Hamlet?",
    "Say hello in French.",
    "What colour is the sky?",
    "List two planets.",
    "What is the boiling point of water?",
]


def _ask(client, i):
    kw = (
        dict(max_tokens=4, temperature=0)
        if i % 2 == 0
        else dict(max_tokens=4, temperature=1.0, seed=i)
    )
    return _chat(client, [{"role": "user", "content": PROMPTS[i]}], **kw).choices[0].message.content


def test_outputs_are_the_same_alone_and_batched_with_seven_others(client):
    """Greedy and seeded answers do not depend on what else runs (the scheduler's promise)."""
    alone = [_ask(client, i) for i in range(len(PROMPTS))]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda i: _ask(client, i), range(len(PROMPTS))))
    assert together == alone
