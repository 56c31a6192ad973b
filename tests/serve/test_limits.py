"""Servers with one slot and a one-sequence queue: 429 with Retry-After, --timeout, and a
SIGTERM that ends a running stream cleanly and exits 0 (this module's last test)."""

from __future__ import annotations

import json
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from tests.serve.conftest import start_server

CHAT = "/v1/chat/completions"
LONG = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 4000}
LONG |= {"ignore_eos": True, "temperature": 1.0, "seed": 3}
TIMEOUT_S = 5


def _one_slot(tmp_path_factory, timeout_s: int):
    """A server with one running slot and a one-sequence queue, warmed up."""
    flags = ["--max-running", "1", "--max-queue", "1", "--timeout", str(timeout_s)]
    s = start_server(tmp_path_factory, *flags, "--shutdown-grace", "0")
    try:
        # one short answer first: the kernels' first compile stays out of the time budgets
        # the tests count on
        r = httpx.post(s.url + CHAT, json={**LONG, "max_tokens": 2}, timeout=120)
        assert r.status_code == 200, r.text
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    yield from _one_slot(tmp_path_factory, TIMEOUT_S)


@pytest.fixture(scope="module")
def patient(tmp_path_factory):
    """No --timeout to race: on a loaded machine 5 s can pass before the third request."""
    yield from _one_slot(tmp_path_factory, 600)


def _wait_idle(url: str) -> None:
    """Until the engine has dropped every sequence (a closed stream goes at its next step)."""
    deadline = time.monotonic() + 60
    while True:
        text = httpx.get(url + "/metrics").text
        busy = re.findall(r"^ember_num_requests_(?:running|waiting) (\S+)$", text, re.M)
        if [float(x) for x in busy] == [0.0, 0.0]:
            return
        assert time.monotonic() < deadline, "closed streams kept their slots"
        time.sleep(0.05)


def _wait_running(url: str) -> None:
    """Until one sequence runs."""
    deadline = time.monotonic() + 60
    while "ember_num_requests_running 1" not in httpx.get(url + "/metrics").text:
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.02)


def _first_data(lines) -> str:
    for line in lines:
        if line.startswith("data: "):
            return line
    raise AssertionError("the stream ended before any data")


def test_queue_full_gets_429_with_retry_after(patient):
    with (
        httpx.Client(base_url=patient.url, timeout=60) as a,
        httpx.Client(base_url=patient.url, timeout=60) as b,
    ):
        with a.stream("POST", CHAT, json={**LONG, "stream": True}) as running:
            # keep the line iterator: a dropped one is closed at once, and closing it closes
            # the connection, which cancels the request and frees its slot
            lines = running.iter_lines()
            _first_data(lines)  # it holds the only slot
            with b.stream("POST", CHAT, json={**LONG, "stream": True}) as queued:
                assert queued.status_code == 200  # submitted: it waits in the queue
                r = httpx.post(patient.url + CHAT, json={**LONG, "max_tokens": 5}, timeout=60)
                assert r.status_code == 429, r.text
                assert int(r.headers["retry-after"]) >= 1
                e = r.json()["error"]
                assert e["code"] == "rate_limit_exceeded" and e["message"]
                assert _first_data(lines)  # the first stream ran on all along
    # both streams are gone: their slots come back and the server answers again
    _wait_idle(patient.url)
    ok = httpx.post(patient.url + CHAT, json={**LONG, "max_tokens": 3}, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def test_timeout_ends_runaway_requests(small):
    """One request runs and one waits behind it: both end at --timeout, with an error."""
    _wait_idle(small.url)

    def plain():
        return httpx.post(small.url + CHAT, json=LONG, timeout=60)

    def streamed():
        with httpx.stream("POST", small.url + CHAT, json={**LONG, "stream": True}, timeout=60) as r:
            return [line for line in r.iter_lines() if line]

    with ThreadPoolExecutor(2) as pool:
        fa = pool.submit(plain)
        _wait_running(small.url)  # the plain one holds the slot, so the stream queues
        fb = pool.submit(streamed)
        r, lines = fa.result(), fb.result()
    assert r.status_code == 408, r.text
    assert r.json()["error"]["type"] == "timeout_error"
    if lines[-1] == "data: [DONE]":  # the stream had started: an error event, then [DONE]
        err = json.loads(lines[-2].removeprefix("data: "))
    else:  # it timed out still queued, before its stream began: a plain 408 error body
        err = json.loads(lines[-1])
    assert err["error"]["type"] == "timeout_error"


def test_sigterm_ends_streams_and_exits_0(small):
    _wait_idle(small.url)
    with httpx.stream("POST", small.url + CHAT, json={**LONG, "stream": True}, timeout=60) as r:
        lines = r.iter_lines()
        _first_data(lines)
        small.proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    last = json.loads(rest[-2].removeprefix("data: "))
    assert last["choices"][0]["finish_reason"] == "abort"
    assert small.proc.wait(60) == 0
    with pytest.raises(httpx.TransportError):
        httpx.get(small.url + "/health", timeout=5)
