"""The per-thread workspace the attention kernel keeps its buffers in."""

from __future__ import annotations

import numpy as np

from ember.kernels.cpu.workspace import Workspace


def test_workspace_reuses_by_name_and_shape():
    ws = Workspace(max_buffers=3)
    a = ws("a", (4, 5))
    assert ws("a", (4, 5)) is a and ws("a", (4, 5), np.float64) is not a
    assert ws("a", (5, 4)).shape == (5, 4)
    ws("b", (1,))
    ws("c", (1,))
    ws("d", (2,))  # a fourth name: the workspace starts over
    assert ws.nbytes() == 8
