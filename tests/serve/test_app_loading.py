"""The app before its model is ready: /health answers 503 while loading and after a failure."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from starlette.testclient import TestClient  # noqa: E402

from ember.serve.app import ServeConfig, create_app  # noqa: E402


def _wait(cond, what: str) -> None:
    deadline = time.monotonic() + 30
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_health_is_503_while_loading_and_after_a_failed_load():
    release = threading.Event()
    errors: list[str] = []

    def load():
        release.wait(30)
        raise FileNotFoundError("no such model")

    app = create_app(load, ServeConfig(api_keys=frozenset({"k"})), errors.append)
    with TestClient(app) as c:
        r = c.get("/health")
        assert r.status_code == 503 and r.json() == {"status": "loading"}
        r = c.post("/v1/chat/completions", json={}, headers={"Authorization": "Bearer k"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"
        assert r.headers["retry-after"] == "1"
        assert c.get("/metrics").status_code == 200  # answers while loading
        release.set()
        _wait(lambda: errors, "the load error was not reported")
        r = c.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "error"
        assert "no such model" in r.json()["message"] and "no such model" in errors[0]
