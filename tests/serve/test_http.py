"""The shared server over raw HTTP: every error path, API keys, tokenize/detokenize, metrics,
health, and a client that disconnects mid-stream."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from tests.serve.conftest import API_KEY

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "Hi"}]


def _err(r: httpx.Response, status: int, param: str | None = "any") -> dict:
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["message"]
    if param != "any":
        assert e["param"] == param, e
    return e


def _metric(http, name: str) -> float:
    text = http.get("/metrics").text
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"messages": []}, 400, "messages"),
        ({"messages": "hello"}, 400, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400, None),
        ({"messages": [{"role": "user", "content": 5}]}, 400, None),
        ({"messages": MSG, "model": "gpt-17"}, 404, "model"),
        ({"messages": MSG, "temperature": "hot"}, 400, "temperature"),
        ({"messages": MSG, "temperature": 2.5}, 400, "temperature"),
        ({"messages": MSG, "temperature": -0.1}, 400, "temperature"),
        ({"messages": MSG, "top_p": 0}, 400, "top_p"),
        ({"messages": MSG, "top_p": 1.5}, 400, "top_p"),
        ({"messages": MSG, "max_tokens": -1}, 400, "max_tokens"),
        ({"messages": MSG, "max_tokens": 0}, 400, "max_tokens"),
        ({"messages": MSG, "max_tokens": 10**6}, 400, "max_tokens"),
        ({"messages": MSG, "max_completion_tokens": 8190}, 400, "max_completion_tokens"),
        ({"messages": MSG, "max_tokens": 1.5}, 400, "max_tokens"),
        ({"messages": MSG, "n": 5}, 400, "n"),
        ({"messages": MSG, "n": 0}, 400, "n"),
        ({"messages": MSG, "n": True}, 400, "n"),
        ({"messages": MSG, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        ({"messages": MSG, "stop": 3}, 400, "stop"),
        ({"messages": MSG, "seed": "x"}, 400, "seed"),
        ({"messages": MSG, "presence_penalty": 3}, 400, "presence_penalty"),
        ({"messages": MSG, "top_logprobs": 2}, 400, "top_logprobs"),
        ({"messages": MSG, "logprobs": True, "top_logprobs": 50}, 400, "top_logprobs"),
        ({"messages": MSG, "stream_options": {"include_usage": True}}, 400, "stream_options"),
        ({"messages": MSG, "response_format": {"type": "xml"}}, 400, "response_format"),
        ({"messages": MSG, "tools": [{"type": "function"}]}, 400, "tools"),
        ([1, 2], 400, None),
    ],
)
def test_chat_bad_input(http, body, status, param):
    _err(http.post(CHAT, json=body), status, param)


@pytest.mark.parametrize(
    "body, param",
    [
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [1, "a"]}, "prompt"),
        ({"prompt": [10**9]}, "prompt"),
        ({"prompt": "x", "logprobs": 9}, "logprobs"),
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": ["a", "b", "c"], "n": 2}, "prompt"),  # 6 sequences, --max-n 4
    ],
)
def test_completion_bad_input(http, body, param):
    _err(http.post("/v1/completions", json=body), 400, param)


def test_malformed_json_and_non_json(http):
    for content in (b"{not json", b'{"messages": [}', b"\xff\xfe", b"", b'{"temperature": NaN}'):
        _err(http.post(CHAT, content=content), 400)


def test_prompt_past_the_context_window(http):
    words = "hello " * 9000  # > 8192 tokens, < the 100 kB body limit
    e = _err(http.post(CHAT, json={"messages": [{"role": "user", "content": words}]}), 400)
    assert e["code"] == "context_length_exceeded"
    e = _err(http.post("/v1/completions", json={"prompt": "hi " * 8100, "max_tokens": 200}), 400)
    assert e["code"] == "context_length_exceeded"


def test_body_over_the_limit(http):
    big = {"messages": [{"role": "user", "content": "x" * 200_000}]}
    _err(http.post(CHAT, json=big), 413)

    def chunks():  # no Content-Length: the limit holds while reading
        for _ in range(30):
            yield b" " * 10_000

    _err(http.post(CHAT, content=chunks()), 413)


def test_unknown_route_and_method(http):
    _err(http.get("/v1/nothing"), 404)
    _err(http.get(CHAT), 405)
    _err(http.get("/v1/models/nope"), 404, "model")


def test_embeddings_bad_input(http):
    _err(http.post("/v1/embeddings", json={"input": []}), 400, "input")
    _err(http.post("/v1/embeddings", json={"input": [""]}), 400, "input")
    _err(http.post("/v1/embeddings", json={"input": [[1, 2]]}), 400, "input")
    _err(http.post("/v1/embeddings", json={"input": "x", "model": "nope"}), 404, "model")
    _err(http.post("/v1/embeddings", json={"input": "x", "encoding_format": "hex"}), 400)


def test_still_serving_after_the_errors(http):
    r = http.post(CHAT, json={"messages": MSG, "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_api_key_is_required_and_no_work_is_done(server, http):
    before = _metric(http, "ember_prompt_tokens_total")
    body = {"messages": MSG, "max_tokens": 3}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {API_KEY}"}):
        e = _err(httpx.post(server.url + CHAT, json=body, headers=headers), 401)
        assert e["type"] == "authentication_error" and e["code"] == "invalid_api_key"
    _err(httpx.get(server.url + "/v1/models"), 401)
    _err(httpx.post(server.url + "/tokenize", json={"prompt": "x"}), 401)
    _err(httpx.post(server.url + "/v1/embeddings", json={"input": "x"}), 401)
    assert _metric(http, "ember_prompt_tokens_total") == before
    assert httpx.get(server.url + "/health").status_code == 200  # open, as in vLLM
    ok = httpx.post(server.url + CHAT, json=body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert ok.status_code == 200


def test_tokenize_and_detokenize(http):
    r = http.post("/tokenize", json={"prompt": "Hello, world!"}).json()
    assert r["count"] == len(r["tokens"]) > 0 and r["max_model_len"] == 8192
    assert (
        http.post("/detokenize", json={"tokens": r["tokens"]}).json()["prompt"] == "Hello, world!"
    )
    chat = http.post("/tokenize", json={"messages": MSG}).json()
    text = http.post("/detokenize", json={"tokens": chat["tokens"]}).json()["prompt"]
    assert text.endswith("<|im_start|>assistant\n") and "Hi" in text
    _err(http.post("/tokenize", json={"prompt": 5}), 400, "prompt")
    _err(http.post("/detokenize", json={"tokens": ["a"]}), 400, "tokens")
    _err(http.post("/detokenize", json={"tokens": [-1]}), 400, "tokens")


def test_health(http):
    assert http.get("/health").json() == {"status": "ok"}


def test_metrics_text_format(http):
    http.post(CHAT, json={"messages": MSG, "max_tokens": 4, "temperature": 0})
    http.post(CHAT, json={"messages": []})
    text = http.get("/metrics").text
    name, label = r"[a-zA-Z_:][a-zA-Z0-9_:]*", r'[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"'
    sample = re.compile(rf"^{name}(\{{{label}(,{label})*\}})? [-+0-9.eInf]+$")
    for line in text.strip().splitlines():
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or sample.match(line), line
    assert re.search(
        r'ember_requests_total\{endpoint="/v1/chat/completions",status="200"\} [1-9]', text
    )
    assert re.search(
        r'ember_requests_total\{endpoint="/v1/chat/completions",status="400"\} [1-9]', text
    )
    assert _metric(http, "ember_generation_tokens_total") >= 4
    for hist in ("time_to_first_token", "inter_token_latency", "e2e_request_latency"):
        name = f"ember_{hist}_seconds"
        buckets = [
            float(v) for v in re.findall(rf'^{name}_bucket\{{le="[^"]+"\}} (\S+)$', text, re.M)
        ]
        assert buckets == sorted(buckets) and buckets[-1] == _metric(http, f"{name}_count") > 0
    for gauge in ("ember_num_requests_running", "ember_num_requests_waiting"):
        assert _metric(http, gauge) >= 0


def test_disconnect_mid_stream_frees_the_slot(server, http):
    body = {"messages": MSG, "max_tokens": 4000, "stream": True, "temperature": 1.0, "seed": 1}
    with httpx.Client(base_url=server.url, headers=http.headers, timeout=60) as c:
        with c.stream("POST", CHAT, json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert any(g.startswith("data: ") for g in got)
            assert _metric(http, "ember_num_requests_running") >= 1
    # the connection is closed; the engine drops the sequence at its next step
    deadline = time.monotonic() + 60
    while _metric(http, "ember_num_requests_running") > 0:
        assert time.monotonic() < deadline, "the disconnected stream kept its slot"
        time.sleep(0.1)
    tokens = _metric(http, "ember_generation_tokens_total")
    time.sleep(0.5)
    assert _metric(http, "ember_generation_tokens_total") == tokens  # nothing runs any more
