"""Fixtures shared by the kernel tests."""

from __future__ import annotations

import pytest

import ember
from ember.kernels.cpu import gemm as G


@pytest.fixture
def serial_rows(monkeypatch):
    """One thread, and the rows per pass over the panels each call of the GEMM's calling-thread
    driver was given (a spy on it); skips where the microkernels do not build."""
    if G.panel_width() is None:
        pytest.skip("no microkernels here")
    rows: list[int] = []
    serial = G._state()["serial"]

    def spy(*args):
        rows.append(args[13])
        return serial(*args)

    monkeypatch.setitem(G._STATE, "serial", spy)
    old = ember.get_num_threads()
    ember.set_num_threads(1)
    yield rows
    ember.set_num_threads(old)
