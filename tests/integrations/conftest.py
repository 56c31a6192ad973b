"""A real local Ray cluster for the integration tests: a head and a second node, loopback.

`RayCluster.start()` runs `ray start --head` and `ray start --address` (one CPU each, a small
object store), each in a session of its own, so that `stop()` can end exactly the processes
this cluster started (by process group, never by name) even when a test failed.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.serve.conftest import free_port  # noqa: F401 - the ray tests import it from here

BIN = Path(sys.executable).parent
OBJECT_STORE_BYTES = 100 * 1024 * 1024  # Ray's minimum is ~75 MB


def _group_members(pgids: set[int]) -> list[int]:
    """Live processes in these process groups, and their descendants (Ray's workers start
    process groups of their own under the raylet)."""
    parent, group = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":  # zombies are gone already
            parent[int(d)], group[int(d)] = int(fields[1]), int(fields[2])
    ours = {p for p, g in group.items() if g in pgids}
    grew = True
    while grew:
        more = {p for p, pp in parent.items() if pp in ours and p not in ours}
        ours |= more
        grew = bool(more)
    return sorted(ours)


class RayCluster:
    """Two Ray nodes on this machine."""

    def __init__(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: unix socket paths
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.pgids: set[int] = set()
        self.env = {
            **os.environ,
            "RAY_USAGE_STATS_ENABLED": "0",
            # Ray's memory monitor counts the whole machine's memory: on a shared test machine it
            # would kill these workers for other processes' use; the kernel's OOM killer stays
            "RAY_memory_monitor_refresh_ms": "0",
            # token authentication between the nodes and every driver, with a token of its own
            # (not ~/.ray/auth_token, which a local `ray.init()` may have written)
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32),
            "TOKENIZERS_PARALLELISM": "false",
            "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
        }

    def _ray_start(self, *flags: str) -> None:
        cmd = [str(BIN / "ray"), "start", "--num-cpus=1", "--node-ip-address=127.0.0.1"]
        cmd += [f"--object-store-memory={OBJECT_STORE_BYTES}", "--disable-usage-stats", *flags]
        proc = subprocess.Popen(
            cmd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pgids.add(proc.pid)
        out, _ = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.decode(errors='replace')}")

    def start(self) -> RayCluster:
        """Head, then the second node; returns once both are up."""
        self._ray_start(
            "--head",
            f"--port={self.port}",
            "--include-dashboard=false",
            f"--temp-dir={self.tmp}",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
        )
        self._ray_start(f"--address={self.address}", f"--dashboard-agent-listen-port={free_port()}")
        return self

    def stop(self) -> None:
        """SIGTERM, then SIGKILL, every process of this cluster's sessions."""
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            for pid in _group_members(self.pgids):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while _group_members(self.pgids) and time.monotonic() < deadline:
                time.sleep(0.2)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def alive(self) -> list[int]:
        """The pids still running in this cluster's sessions."""
        return _group_members(self.pgids)


@pytest.fixture(scope="module")
def ray_cluster():
    """A started two-node cluster, stopped at the end of the module whatever happened."""
    pytest.importorskip("ray.serve")
    cluster = RayCluster()
    try:
        yield cluster.start()
    finally:
        cluster.stop()
