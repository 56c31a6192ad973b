"""The chat page at GET /: served open (no API key) with a strict CSP, and driven in headless
Chromium (Playwright, with Debian's `chromium`, which `make test` installs): a streamed answer
with its tokens/s, the model list, Stop freeing the slot, a screenshot."""

from __future__ import annotations

import json
import os
import re
import shutil
import time

import httpx
import pytest
from tests.serve.conftest import API_KEY

CHROMIUM_NAMES = ("chromium", "chromium-browser")
TIMEOUT_MS = 120_000  # a loaded 2-core machine


def _chromium() -> str:
    path = os.environ.get("EMBER_CHROMIUM") or next(
        (p for p in map(shutil.which, CHROMIUM_NAMES) if p), None
    )
    if not path:
        pytest.fail(
            "no chromium binary on PATH (or in EMBER_CHROMIUM): run `make test`, which installs "
            "Debian's chromium package"
        )
    return path


def _running(server) -> float:
    text = httpx.get(server.url + "/metrics").text
    m = re.search(r"^ember_num_requests_running (\S+)$", text, re.M)
    assert m, "ember_num_requests_running not in /metrics"
    return float(m.group(1))


# --- plain HTTP --------------------------------------------------------------------------------


def test_page_is_open_html_with_a_csp(server):
    r = httpx.get(server.url + "/")  # no Authorization header, and the server has a key
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'none'"
    assert directives["connect-src"] == "'self'"
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert re.fullmatch(r"'sha256-[A-Za-z0-9+/=]+'", directives["script-src"])
    assert r.headers["x-content-type-options"] == "nosniff"
    assert "<script>" in r.text and "/v1/chat/completions" in r.text
    assert "http://" not in r.text and "https://" not in r.text  # no CDN, nothing external


def test_only_the_page_is_open(server):
    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert httpx.post(server.url + "/").status_code == 405
    assert httpx.get(server.url + "/chat.html").status_code == 404
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": []})
    assert r.status_code == 401


def test_page_is_in_the_package():
    from importlib.resources import files

    assert "<title>ember chat</title>" in files("ember.serve").joinpath(
        "static", "chat.html"
    ).read_text("utf-8")


# --- in the browser ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium from the system (Debian's package), driven by Playwright."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: run `make test` (the test extra has it)")
    path = _chromium()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser, server):
    """The chat page, loaded, with console errors and CSP violations collected."""
    context = browser.new_context(viewport={"width": 1000, "height": 800})
    pg = context.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    # (a 401 is logged as a console error too: only CSP refusals count here)
    pg.on("console", lambda m: "Content Security Policy" in m.text and pg.errors.append(m.text))
    pg.goto(server.url + "/")
    yield pg
    context.close()


def _unlock(pg) -> None:
    """The server has a key: the page asks for it, then fills the model list."""
    pg.locator("#key-row").wait_for(state="visible")
    assert "API key" in pg.inner_text("#status")
    pg.fill("#api_key", API_KEY)
    pg.locator("#api_key").blur()  # its change event reloads the models
    # (waits are locators: the page's CSP forbids the eval behind wait_for_function's strings)
    pg.locator("#model option").first.wait_for(state="attached")


def expect(locator):
    """Playwright's `expect` (imported here: the module's HTTP tests do not need playwright)."""
    from playwright.sync_api import expect as _expect

    return _expect(locator)


def _ask(pg, text: str) -> None:
    pg.fill("#input", text)
    pg.click("#send")


def test_chat_streams_an_answer(page, server, tmp_path):
    pg = page
    sent = []
    pg.on("request", lambda r: r.url.endswith("/v1/chat/completions") and sent.append(r))
    _unlock(pg)
    models = pg.eval_on_selector_all("#model option", "os => os.map(o => o.value)")
    served = httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    chat_ids = [m["id"] for m in served.json()["data"] if "max_model_len" in m]
    assert models == chat_ids and models  # the embedder is not offered for chat

    pg.fill("#temperature", "0")
    pg.fill("#max_tokens", "24")
    pg.fill("#system", "You are a terse assistant.")
    _ask(pg, "What is the capital of France?")
    assert pg.inner_text(".msg.user") == "What is the capital of France?"
    answer = pg.locator(".msg.assistant").last
    pg.wait_for_selector(".msg.assistant[data-done]")
    assert answer.get_attribute("data-done") in ("stop", "length"), answer.inner_text()
    text = answer.locator(".text").inner_text()
    assert text.strip(), "no answer streamed"
    meta = answer.locator(".meta").inner_text()
    assert re.search(r"\d+ tokens · [\d.]+ tokens/s", meta), meta
    assert pg.is_enabled("#send") and pg.is_disabled("#stop")

    body = json.loads(sent[0].post_data)
    assert sent[0].headers["authorization"] == f"Bearer {API_KEY}"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == models[0] and body["temperature"] == 0 and body["max_tokens"] == 24
    assert body["messages"][0] == {"role": "system", "content": "You are a terse assistant."}

    # the same request without the page: greedy, so the same text
    body = {k: v for k, v in body.items() if k != "stream_options"}
    r = httpx.post(
        server.url + "/v1/chat/completions",
        json={**body, "stream": False},
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=120,
    )
    assert r.json()["choices"][0]["message"]["content"].strip() == text.strip()
    assert pg.errors == []
    shot = tmp_path / "chat_page.png"
    pg.screenshot(path=str(shot), full_page=True)
    print(f"\nchat page screenshot: {shot}")


def test_stop_ends_the_stream_and_frees_the_slot(page, server, tmp_path):
    pg = page
    _unlock(pg)

    def endless(route):  # run to max_tokens whatever the model says (vLLM's ignore_eos)
        body = json.loads(route.request.post_data)
        route.continue_(post_data=json.dumps({**body, "ignore_eos": True}))

    pg.route("**/v1/chat/completions", endless)
    pg.fill("#max_tokens", "2000")
    _ask(pg, "Tell me a very long story about a dragon.")
    answer = pg.locator(".msg.assistant").last
    expect(answer.locator(".text")).to_have_text(re.compile(r"\S"), timeout=TIMEOUT_MS)
    assert pg.is_enabled("#stop") and pg.is_disabled("#send")
    assert _running(server) == 1
    pg.click("#stop")
    pg.wait_for_selector(".msg.assistant[data-done]")
    assert answer.get_attribute("data-done") == "stopped"
    assert "stopped" in answer.locator(".meta").inner_text()
    assert answer.locator(".text").inner_text().strip()
    deadline = time.monotonic() + 30
    while _running(server) != 0:  # the server saw the connection close and freed the slot
        assert time.monotonic() < deadline, "the stopped stream still runs on the server"
        time.sleep(0.1)

    pg.unroute("**/v1/chat/completions")
    pg.fill("#max_tokens", "8")
    _ask(pg, "Say hi.")
    expect(pg.locator(".msg.assistant[data-done]")).to_have_count(2, timeout=TIMEOUT_MS)
    second = pg.locator(".msg.assistant").last
    assert second.get_attribute("data-done") in ("stop", "length")
    assert second.locator(".text").inner_text().strip()
    assert pg.errors == []
    shot = tmp_path / "chat_page_stopped.png"
    pg.screenshot(path=str(shot), full_page=True)
    print(f"\nchat page screenshot: {shot}")


def test_no_key_field_without_keys(browser, tmp_path_factory):
    from tests.serve.conftest import start_server

    s = start_server(tmp_path_factory, "--max-running", "1")
    try:
        context = browser.new_context()
        pg = context.new_page()
        pg.set_default_timeout(TIMEOUT_MS)
        pg.goto(s.url + "/")
        pg.locator("#model option").first.wait_for(state="attached")
        expect(pg.locator("#status")).to_have_text("ready")
        assert pg.is_hidden("#key-row")
        context.close()
    finally:
        s.stop()
