"""ONNX control flow: If and Loop, their subgraphs run on the enclosing graph's values."""

from __future__ import annotations

import ember
from ember.errors import ShapeError
from ember.onnx._registry import Attrs, op, scalar

MAX_TRIPS = (
    1 << 20
)  # a Loop that would run longer (hostile trip count or a condition never false) stops


@op("If")
def _if(a: Attrs, cond):
    branch = a.get("then_branch") if bool(scalar(cond)) else a.get("else_branch")
    return tuple(branch.run({}, a.get("__scope__")))


@op("Loop")
def _loop(a: Attrs, trips=None, cond=None, *carried):
    body = a.get("body")
    scope = a.get("__scope__")
    n = int(scalar(trips)) if trips is not None else None
    go = bool(scalar(cond)) if cond is not None else True
    names = body.inputs
    if len(names) != 2 + len(carried):
        raise ShapeError(
            f"ONNX {a.where()}: body takes {len(names)} inputs for {len(carried)} carried values"
        )
    state = list(carried)
    scans: list[list] = []
    i = 0
    while go and (n is None or i < n):
        if i >= MAX_TRIPS:
            raise ShapeError(f"ONNX {a.where()}: more than {MAX_TRIPS} iterations")
        feeds = {names[0]: ember.tensor(i, dtype=ember.int64), names[1]: ember.tensor(go)}
        feeds.update(zip(names[2:], state))
        out = body.run(feeds, scope)
        go = bool(scalar(out[0]))
        state = list(out[1 : 1 + len(state)])
        extra = out[1 + len(state) :]
        if not scans:
            scans = [[] for _ in extra]
        for lst, v in zip(scans, extra):
            lst.append(v)
        i += 1
    stacked = [ember.stack(lst) if lst else ember.zeros((0,), dtype=ember.float32) for lst in scans]
    n_scan = len(body.outputs) - 1 - len(state)
    while len(stacked) < n_scan:
        stacked.append(ember.zeros((0,), dtype=ember.float32))
    return tuple(state) + tuple(stacked)
