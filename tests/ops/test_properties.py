"""Property tests (hypothesis) for broadcasting, movement chains and indexing, against torch."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ember
from ember.errors import ShapeError

SET = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def lib(x):
    return torch if isinstance(x, torch.Tensor) else ember


def to_np(x) -> np.ndarray:
    return x.detach().numpy()


# ------------------------------------------------------------------ broadcasting
dims = st.lists(st.integers(0, 3), max_size=4).map(tuple)


@st.composite
def shape_pairs(draw):
    """Two shapes that mostly broadcast (one derived from the other) and sometimes do not."""
    a = draw(dims)
    if draw(st.booleans()):
        return a, draw(dims)
    b = [draw(st.sampled_from([s, 1])) for s in a][draw(st.integers(0, len(a))) :]
    lead = draw(st.lists(st.integers(1, 3), max_size=2))
    return a, tuple(lead + b)


@SET
@given(shape_pairs())
def test_broadcast_shapes_property(pair):
    a, b = pair
    try:
        want = np.broadcast_shapes(a, b)
    except ValueError:
        want = None
    if want is None:
        with pytest.raises(ShapeError):
            ember.broadcast_shapes(a, b)
        with pytest.raises(ShapeError):
            ember.broadcast_tensors(ember.zeros(a), ember.zeros(b))
        for op in (ember.add, ember.mul, ember.maximum):
            # ShapeError is a ValueError; elementwise ops must raise one of the two
            with pytest.raises(ValueError):
                op(ember.zeros(a), ember.ones(b))
        return
    assert ember.broadcast_shapes(a, b) == want == torch.broadcast_shapes(a, b)
    ea, eb = ember.broadcast_tensors(ember.zeros(a), ember.ones(b))
    assert ea.shape == eb.shape == want
    for op in (ember.add, ember.mul, ember.maximum, ember.where):
        args = (ember.zeros(a) > 0, ember.zeros(a), ember.ones(b)) if op is ember.where else None
        out = op(*args) if args else op(ember.zeros(a), ember.ones(b))
        assert out.shape == want, op.__name__
        m = (ember.zeros(a, device="meta"), ember.ones(b, device="meta"))
        if op is not ember.where:
            assert op(*m).shape == want
    assert ember.zeros(a).masked_fill(ember.ones(b, dtype=ember.bool), 1.0).shape == want


# ------------------------------------------------------------------ movement chains
VIEW_OPS = ("permute", "transpose", "narrow", "select", "unsqueeze", "squeeze", "diagonal",
            "movedim", "slice")  # fmt: skip
COPY_OPS = ("flip", "reshape", "expand", "roll", "repeat")


@st.composite
def chains(draw, kinds):
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    cur, ops = list(shape), []
    for _ in range(draw(st.integers(1, 5))):
        nd = len(cur)
        k = draw(st.sampled_from(kinds))
        d = draw(st.integers(-nd, nd - 1)) if nd else 0
        if k == "permute" and nd:
            p = draw(st.permutations(range(nd)))
            ops.append((k, (tuple(p),)))
            cur = [cur[i] for i in p]
        elif k == "transpose" and nd:
            e = draw(st.integers(-nd, nd - 1))
            ops.append((k, (d, e)))
            cur[d], cur[e] = cur[e], cur[d]
        elif k == "narrow" and nd:
            start = draw(st.integers(0, cur[d]))
            length = draw(st.integers(0, cur[d] - start))
            ops.append((k, (d, start, length)))
            cur[d] = length
        elif k == "select" and nd and cur[d] > 0:
            ops.append((k, (d, draw(st.integers(-cur[d], cur[d] - 1)))))
            del cur[d]
        elif k == "unsqueeze":
            u = draw(st.integers(-nd - 1, nd))
            ops.append((k, (u,)))
            cur.insert(u % (nd + 1), 1)
        elif k == "squeeze" and nd:
            ops.append((k, (d,)))
            if cur[d] == 1:
                del cur[d]
        elif k == "diagonal" and nd >= 2:
            e = draw(st.sampled_from([i for i in range(-nd, nd) if i % nd != d % nd]))
            off = draw(st.integers(-2, 2))
            ops.append((k, (off, d, e)))
            a, b = cur[d], cur[e]
            n = max(0, min(a, b - off) if off >= 0 else min(a + off, b))
            cur = [s for i, s in enumerate(cur) if i not in (d % nd, e % nd)] + [n]
        elif k == "movedim" and nd:
            e = draw(st.integers(-nd, nd - 1))
            ops.append((k, (d, e)))
            s = cur.pop(d % nd)
            cur.insert(e % nd, s)
        elif k == "slice" and nd:
            a = draw(st.integers(-5, 5))
            b = draw(st.integers(-5, 5))
            step = draw(st.integers(1, 3))
            ops.append((k, (d, slice(a, b, step))))
            cur[d] = len(range(*slice(a, b, step).indices(cur[d])))
        elif k == "flip" and nd:
            ops.append((k, ((d,),)))
        elif k == "roll" and nd:
            ops.append((k, (draw(st.integers(-3, 3)), d)))
        elif k == "reshape":
            n = int(np.prod(cur))
            divs = [q for q in range(1, n + 1) if n % q == 0] or [1]
            q = draw(st.sampled_from(divs))
            new = [q, -1] if n else [0, draw(st.integers(0, 2))]
            ops.append((k, (tuple(new),)))
            cur = [q, n // q] if n else new
        elif k == "expand":
            new = [draw(st.sampled_from([1, 2])) if s == 1 else s for s in cur]
            ops.append((k, (tuple(new),)))
            cur = new
        elif k == "repeat":
            r = [draw(st.integers(1, 2)) for _ in cur]
            ops.append((k, (tuple(r),)))
            cur = [a * b for a, b in zip(cur, r)]
    return tuple(shape), ops


def run_chain(x, ops):
    for k, args in ops:
        if k == "slice":
            d, s = args
            x = x[(slice(None),) * (d % x.ndim) + (s,)]
        else:
            x = getattr(x, k)(*args)
    return x


@SET
@given(chains(VIEW_OPS + COPY_OPS))
def test_movement_chain_matches_torch(case):
    shape, ops = case
    base = np.random.default_rng(len(ops)).normal(size=shape)
    e = ember.tensor(base, requires_grad=True)
    t = torch.tensor(base, requires_grad=True)
    ye, yt = run_chain(e, ops), run_chain(t, ops)
    assert tuple(ye.shape) == tuple(yt.shape)
    np.testing.assert_array_equal(to_np(ye), to_np(yt))
    w = np.random.default_rng(0).normal(size=tuple(yt.shape))
    (ye * ember.tensor(w)).sum().backward()
    (yt * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), atol=1e-12)
    m = run_chain(ember.zeros(shape, device="meta"), ops)
    assert m.shape == ye.shape


@SET
@given(chains(VIEW_OPS))
def test_view_chain_writes_through(case):
    shape, ops = case
    base = np.arange(float(np.prod(shape))).reshape(shape)
    e, t = ember.tensor(base), torch.tensor(base)
    ve, vt = run_chain(e, ops), run_chain(t, ops)
    if ve.numel():
        assert np.shares_memory(ve.numpy(), e.numpy())
    ve[...] = -1.0
    vt[...] = -1.0
    np.testing.assert_array_equal(e.numpy(), t.numpy())
    ve.add_(ember.ones(ve.shape))
    vt.add_(torch.ones(vt.shape, dtype=vt.dtype))
    np.testing.assert_array_equal(e.numpy(), t.numpy())


# ------------------------------------------------------------------ indexing
@st.composite
def index_cases(draw):
    """A shape and an index tuple mixing ints, slices, None, ..., int lists/tensors and masks."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    k = draw(st.integers(0, len(shape)))
    m = draw(st.integers(1, 3))
    unique = draw(st.booleans())
    items = []
    for n in shape[:k]:
        kind = draw(st.sampled_from(["int", "slice", "slice", "list", "tensor", "col", "mask"]))
        if kind == "int":
            items.append(("int", draw(st.integers(-n, n - 1))))
        elif kind == "slice":
            a, b = draw(st.integers(-5, 5) | st.none()), draw(st.integers(-5, 5) | st.none())
            items.append(("slice", slice(a, b, draw(st.integers(1, 3) | st.none()))))
        elif kind == "mask":
            items.append(("mask", draw(st.lists(st.booleans(), min_size=n, max_size=n))))
        else:
            if unique:  # no repeated positions, so value tensors are well defined in setitem
                vals = draw(st.permutations(range(n)))[: min(m, *shape[:k])]
            else:
                vals = draw(st.lists(st.integers(0, n - 1), min_size=m, max_size=m))
            vals = [v - n if draw(st.booleans()) else v for v in vals]
            items.append((kind, vals))
    for _ in range(draw(st.integers(0, 2))):
        items.insert(draw(st.integers(0, len(items))), ("none", None))
    if draw(st.booleans()):  # an Ellipsis that shifts no index onto another dim
        at = draw(st.integers(0, len(items))) if k == len(shape) else len(items)
        items.insert(at, ("ellipsis", None))
    return shape, items, unique


def build(x, items):
    L = lib(x)
    out = []
    for kind, v in items:
        if kind in ("int", "slice"):
            out.append(v)
        elif kind == "none":
            out.append(None)
        elif kind == "ellipsis":
            out.append(Ellipsis)
        elif kind == "list":
            out.append(list(v))
        elif kind == "tensor":
            out.append(L.tensor(v))
        elif kind == "col":
            out.append(L.tensor([[a] for a in v]))
        else:
            out.append(L.tensor(v, dtype=L.bool))
    return tuple(out)


def _torch_or_error(f):
    try:
        return f(), None
    except (IndexError, RuntimeError, ValueError) as err:
        return None, err


@SET
@given(index_cases())
def test_getitem_matches_torch(case):
    shape, items, _ = case
    base = np.random.default_rng(1).normal(size=shape)
    t = torch.tensor(base, requires_grad=True)
    yt, err = _torch_or_error(lambda: t[build(t, items)])
    e = ember.tensor(base, requires_grad=True)
    if err is not None:
        with pytest.raises((IndexError, ValueError)):
            e[build(e, items)]
        return
    ye = e[build(e, items)]
    assert tuple(ye.shape) == tuple(yt.shape), items
    np.testing.assert_array_equal(to_np(ye), to_np(yt))
    w = np.random.default_rng(2).normal(size=tuple(yt.shape))
    (ye * ember.tensor(w)).sum().backward()
    (yt * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), atol=1e-12)
    basic = all(kind in ("int", "slice", "none", "ellipsis") for kind, _ in items)
    if basic and ye.numel():
        assert np.shares_memory(ye.detach().numpy(), e.detach().numpy())
    m = ember.zeros(shape, device="meta")
    if not any(kind == "mask" for kind, _ in items):
        assert m[build(m, items)].shape == ye.shape


@SET
@given(index_cases(), st.booleans())
def test_setitem_matches_torch(case, scalar):
    shape, items, unique = case
    base = np.random.default_rng(3).normal(size=shape)
    t = torch.tensor(base)
    sel, err = _torch_or_error(lambda: t[build(t, items)])
    e = ember.tensor(base)
    if err is not None:
        with pytest.raises((IndexError, ValueError)):
            e[build(e, items)] = 1.0
        return
    if scalar or not unique:
        vt, ve = 2.5, 2.5
    else:
        v = np.random.default_rng(4).normal(size=tuple(sel.shape)[draw_drop(sel) :])
        vt, ve = torch.tensor(v), ember.tensor(v)
    view = e[..., :] if e.ndim else e[...]
    t[build(t, items)] = vt
    e[build(e, items)] = ve
    np.testing.assert_array_equal(e.numpy(), t.numpy())
    np.testing.assert_array_equal(view.numpy(), e.numpy())
    # with grad: the same assignment on a non-leaf copy sends gradients to both sides
    x0 = torch.tensor(base, requires_grad=True)
    x1 = ember.tensor(base, requires_grad=True)
    vv = [ve.clone().requires_grad_() if isinstance(ve, ember.Tensor) else ve]
    vv.append(vt.clone().requires_grad_() if isinstance(vt, torch.Tensor) else vt)
    for x, v in ((x1, vv[0]), (x0, vv[1])):
        y = x * 1.0
        y[build(y, items)] = v
        (y * lib(y).tensor(np.arange(y.numel(), dtype=np.float64).reshape(shape))).sum().backward()
    np.testing.assert_allclose(x1.grad.numpy(), x0.grad.numpy())
    if isinstance(vv[0], ember.Tensor):
        np.testing.assert_allclose(vv[0].grad.numpy(), vv[1].grad.numpy())


def draw_drop(sel) -> int:
    """Broadcast the value over the leading dim when there is one (tests value broadcasting)."""
    return 1 if sel.ndim >= 2 else 0
