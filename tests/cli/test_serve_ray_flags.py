"""`ember serve --ray` hands its flags to ember.integrations.ray.run_serve_on_ray."""

import sys
import types

import pytest

from ember.cli.main import main


@pytest.fixture
def calls(monkeypatch):
    got = []
    fake = types.ModuleType("ember.integrations.ray")
    fake.run_serve_on_ray = lambda *a, **kw: got.append((a, kw)) or 0
    monkeypatch.setitem(sys.modules, "ember.integrations.ray", fake)
    return got


def test_flags_reach_run_serve_on_ray(calls):
    argv = ["serve", "--ray", "--replicas", "3", "--num-cpus-per-replica", "0.5",
            "--ray-address", "127.0.0.1:6379", "--port", "8123", "--api-key", "k",
            "--min-replicas", "1", "--max-replicas", "4", "--max-ongoing-requests", "9"]  # fmt: skip
    assert main(argv) == 0
    ((args, kw),) = calls
    assert args == (None, 3, 0.5, "127.0.0.1:6379", "127.0.0.1", 8123)
    assert kw["api_keys"] == ["k"] and kw["min_replicas"] == 1 and kw["max_replicas"] == 4
    assert kw["max_ongoing_requests"] == 9 and kw["prefill_chunk"] == 256


@pytest.mark.parametrize(
    "bad", [["--replicas", "0"], ["--num-cpus-per-replica", "0"], ["--max-replicas", "-1"]]
)
def test_bad_ray_flags_are_one_line_errors(calls, bad, capsys):
    assert main(["serve", "--ray", *bad]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ember serve: error:") and not calls
