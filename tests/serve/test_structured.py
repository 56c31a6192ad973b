"""Structured output: `response_format` json_object / json_schema constrains decoding.

The grammar module on a tiny tokenizer (no model, no server), then the shared server driven by
the openai client on several schemas, greedy and sampled, chat and completions, whole and
streamed: every output must parse and validate. Last, the 400s for schemas it cannot use.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

llguidance = pytest.importorskip("llguidance")

from ember.serve.structured import GrammarError, Matcher, grammar_for, token_table  # noqa: E402

MODEL = "SmolLM2-135M-Instruct.Q4_1"
CHAT = "/v1/chat/completions"


def _validate(obj, schema) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(obj, schema)


# --- the grammar module alone ----------------------------------------------------------------


def _tiny_tokenizer():
    """A byte-level BPE over the 256 byte symbols plus three merges and an <eos>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges = [("{", '"'), ('"', ":"), ("Ġ", '"')]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<eos>"])
    return tok


def test_matcher_masks_and_completes_on_random_logits():
    tok = _tiny_tokenizer()
    n, eos = tok.get_vocab_size(), tok.token_to_id("<eos>")
    table = token_table(tok, n, [eos])
    assert token_table(tok, n, [eos]) is table  # built once, then cached
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 999},
            "b": {"enum": ["x", "yz"]},
            "c": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2},
        },
        "required": ["a", "b", "c"],
        "additionalProperties": False,
    }
    grammar = grammar_for("json_schema", schema)
    rng = np.random.default_rng(0)
    for _ in range(5):
        m = Matcher(table, grammar)
        first = m.mask(np.zeros(n + 4, np.float32))  # logits wider than the vocabulary
        allowed = np.flatnonzero(np.isfinite(first))
        assert {tok.decode([int(i)]) for i in allowed} <= {"{", '{"'} and allowed.size
        out = []
        for _ in range(200):
            row = rng.standard_normal(n).astype(np.float32)
            masked = m.mask(row)
            ok = np.isfinite(masked)
            assert ok.any() and np.array_equal(masked[ok], row[ok])  # the rest untouched
            t = int(rng.choice(np.flatnonzero(ok)))  # any allowed token, not just the argmax
            out.append(t)
            if m.advance(t):
                break
        else:
            pytest.fail(f"no complete JSON in 200 tokens: {tok.decode(out)!r}")
        assert m.accepting and eos not in out
        _validate(json.loads(tok.decode(out)), schema)


def test_json_object_grammar_and_bad_schemas():
    tok = _tiny_tokenizer()
    table = token_table(tok, tok.get_vocab_size(), [tok.token_to_id("<eos>")])
    m = Matcher(table, grammar_for("json_object"))
    assert not m.advance(tok.token_to_id("{"))
    with pytest.raises(GrammarError):
        m.advance(tok.token_to_id("{"))  # '{{' is no JSON: refused, never silently accepted
    for schema in (
        "not an object",
        {"type": "strin"},
        {"type": "object", "dependentSchemas": {}},
        {"minimum": float("nan")},
    ):
        with pytest.raises(GrammarError):
            grammar_for("json_schema", schema)
    with pytest.raises(GrammarError):
        grammar_for("xml")


# --- the server ------------------------------------------------------------------------------

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "student": {"type": "boolean"},
    },
    "required": ["name", "age", "student"],
    "additionalProperties": False,
}
COLOR = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue", "yellow"]},
        "certainty": {"type": "string", "enum": ["low", "medium", "high"]},
    },
    "required": ["color", "certainty"],
    "additionalProperties": False,
}
CITY = {
    "type": "object",
    "properties": {
        "city": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 24},
                "country": {"type": "string", "maxLength": 24},
            },
            "required": ["name", "country"],
            "additionalProperties": False,
        },
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
    },
    "required": ["city", "population"],
    "additionalProperties": False,
}
FRUITS = {
    "type": "object",
    "properties": {
        "fruits": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 12},
                    "count": {"type": "integer", "minimum": 0, "maximum": 99},
                },
                "required": ["name", "count"],
                "additionalProperties": False,
            },
            "minItems": 1,
            "maxItems": 3,
        }
    },
    "required": ["fruits"],
    "additionalProperties": False,
}
CASES = [
    ("person", PERSON, "Describe a person as JSON: name, age and whether they are a student."),
    ("color", COLOR, "What color is the sky? Answer in JSON."),
    ("city", CITY, "Give the capital of France and its population as JSON."),
    ("fruits", FRUITS, "List two fruits with how many you have, as JSON."),
]


def _schema_format(name, schema, strict=True):
    return {
        "type": "json_schema",
        "json_schema": {"name": name, "schema": schema, "strict": strict},
    }


def _check(choice_text, finish, schema) -> None:
    assert finish == "stop", (finish, choice_text)
    obj = json.loads(choice_text)
    _validate(obj, schema)


def _chat_all(client, name, schema, question):
    """The greedy answer and three sampled ones (seeds 7, 8, 9) for one schema."""
    kw = dict(
        model=MODEL,
        messages=[{"role": "user", "content": question}],
        response_format=_schema_format(name, schema),
        max_tokens=80,
    )
    greedy = client.chat.completions.create(**kw, temperature=0)
    sampled = client.chat.completions.create(**kw, temperature=1.0, seed=7, n=3)
    return [greedy, sampled]


def test_chat_json_schema_greedy_and_sampled(client):
    with ThreadPoolExecutor(len(CASES)) as pool:
        results = list(pool.map(lambda c: _chat_all(client, *c), CASES))
    for (_, schema, _), responses in zip(CASES, results):
        for r in responses:
            for c in r.choices:
                _check(c.message.content, c.finish_reason, schema)
                assert r.usage.completion_tokens > 0


def test_chat_json_object(client):
    """Greedy: one JSON object. Sampled: every answer that ends is one; free-form JSON from a
    135M model can ramble past max_tokens at some seeds (about 1 in 6 at temperature 1, and
    which seeds depends on the CPU's rounding), so one of four may end "length" instead."""
    question = "Describe a cat as a small JSON object with a name and an age."
    kw = dict(
        model=MODEL,
        messages=[{"role": "user", "content": question}],
        response_format={"type": "json_object"},
        max_tokens=96,
    )
    greedy = client.chat.completions.create(**kw, temperature=0).choices[0]
    _check(greedy.message.content, greedy.finish_reason, {"type": "object"})
    sampled = client.chat.completions.create(**kw, temperature=1.0, seed=3, n=4).choices
    ended = [c for c in sampled if c.finish_reason == "stop"]
    assert len(ended) >= 3, [(c.finish_reason, c.message.content) for c in sampled]
    for c in ended:
        _check(c.message.content, c.finish_reason, {"type": "object"})
    for c in sampled:
        assert c.message.content.lstrip().startswith("{")


def test_completions_json_schema_and_streams(client):
    kw = dict(
        model=MODEL,
        prompt="A fictional person, as JSON:\n",
        max_tokens=64,
        extra_body={"response_format": _schema_format("person", PERSON, strict=False)},
    )
    for r in (
        client.completions.create(**kw, temperature=0),
        client.completions.create(**kw, temperature=1.0, seed=11, n=2),
    ):
        for c in r.choices:
            _check(c.text, c.finish_reason, PERSON)
    whole = client.completions.create(**kw, temperature=0)
    text = "".join(
        c.choices[0].text for c in client.completions.create(**kw, temperature=0, stream=True)
    )
    assert text == whole.choices[0].text

    ckw = dict(
        model=MODEL,
        messages=[{"role": "user", "content": CASES[3][2]}],
        response_format=_schema_format("fruits", FRUITS),
        max_tokens=80,
        temperature=1.0,
        seed=5,
    )
    whole = client.chat.completions.create(**ckw)
    chunks = list(client.chat.completions.create(**ckw, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "stop"
    _check(streamed, "stop", FRUITS)


def test_max_tokens_before_the_json_ends_is_length(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": CASES[0][2]}],
        response_format=_schema_format("person", PERSON),
        max_tokens=4,
        temperature=0,
        logprobs=True,
    )
    c = r.choices[0]
    assert c.finish_reason == "length" and r.usage.completion_tokens == 4
    assert c.message.content.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(c.message.content)
    assert len(c.logprobs.content) == 4 and all(t.logprob <= 0 for t in c.logprobs.content)


def _err(r, param="response_format"):
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["type"] == "invalid_request_error" and e["param"] == param and e["message"]
    return e


@pytest.mark.parametrize(
    "rf",
    [
        "json",
        {"type": "xml"},
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": "person"},
        {"type": "json_schema", "json_schema": {"schema": PERSON}},
        {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": "yes"}},
        {"type": "json_schema", "json_schema": {"name": "p"}},
        {"type": "json_schema", "json_schema": {"name": "p", "schema": '{"type": "object"}'}},
        {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "strin"}}},
        {
            "type": "json_schema",
            "json_schema": {"name": "p", "schema": {"type": "object", "dependentSchemas": {}}},
        },
        {"type": "json_schema", "json_schema": {"name": "p", "schema": {"minLength": "x"}}},
    ],
)
def test_bad_response_format_is_400(http, rf):
    msg = [{"role": "user", "content": "Hi"}]
    _err(http.post(CHAT, json={"messages": msg, "response_format": rf, "max_tokens": 4}))
    _err(http.post("/v1/completions", json={"prompt": "Hi", "response_format": rf}))


def test_still_serving_after_bad_schemas(http):
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "response_format": {"type": "text"},
        "max_tokens": 4,
        "temperature": 0,
    }
    r = http.post(CHAT, json=body)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
