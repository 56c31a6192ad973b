import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import ember
from ember.errors import ShapeError
from tests.helpers import FLOATS, check, gradcheck

LOW = (ember.float16, ember.bfloat16)
INTS = (ember.int64, ember.int32, ember.int16, ember.int8, ember.uint8)
ALL = FLOATS + LOW + INTS + (ember.bool,)


def is_torch(x) -> bool:
    return isinstance(x, torch.Tensor)


def no_bool_0d(dtypes, shapes):
    """tests.helpers.rand_array gives a numpy scalar (not an array) for bool 0-d; skip that one."""
    return tuple(d for d in dtypes if d is not ember.bool or () not in shapes)


def pad(x, *a, **k):
    return TF.pad(x, *a, **k) if is_torch(x) else ember.pad(x, *a, **k)


# ------------------------------------------------------------------ views (all dtypes)
VIEWS = [
    ("reshape", lambda x: x.reshape(4, -1), [(2, 3, 4)]),
    ("reshape_0d", lambda x: x.reshape(1, 1), [()]),
    ("reshape_empty", lambda x: x.reshape(3, 0, 1), [(0, 3)]),
    ("flatten", lambda x: x.flatten(1), [(2, 3, 4)]),
    ("flatten_mid", lambda x: x.flatten(-3, -2), [(2, 3, 4, 1)]),
    ("flatten_0d", lambda x: x.flatten(), [()]),
    ("ravel", lambda x: x.ravel(), [(3, 4)]),
    ("unflatten", lambda x: x.unflatten(1, (2, -1)), [(3, 4)]),
    ("permute", lambda x: x.permute(2, 0, 1), [(2, 3, 4)]),
    ("permute_neg", lambda x: x.permute((-1, 0, 1)), [(2, 3, 4)]),
    ("transpose", lambda x: x.transpose(0, -1), [(2, 3, 4)]),
    ("t", lambda x: x.t(), [(3, 5)]),
    ("t_1d", lambda x: x.t(), [(5,)]),
    ("mT", lambda x: x.mT, [(2, 3, 4)]),
    ("T", lambda x: x.T, [(3, 4)]),
    ("movedim", lambda x: x.movedim((0, 1), (-1, 0)), [(2, 3, 4)]),
    ("swapaxes", lambda x: x.swapaxes(1, 2), [(2, 3, 4)]),
    ("expand", lambda x: x.expand(2, -1, 4), [(3, 1)]),
    ("expand_0d", lambda x: x.expand(2, 3), [()]),
    ("broadcast_to", lambda x: x.broadcast_to((2, 3, 4)), [(3, 1)]),
    ("squeeze", lambda x: x.squeeze(), [(1, 3, 1, 2)]),
    ("squeeze_dim", lambda x: x.squeeze(-2), [(1, 3, 1, 2)]),
    ("squeeze_dims", lambda x: x.squeeze((0, 1)), [(1, 3, 1, 2)]),
    ("squeeze_0d", lambda x: x.squeeze(0), [()]),
    ("unsqueeze", lambda x: x.unsqueeze(-1), [(2, 3)]),
    ("unsqueeze_0d", lambda x: x.unsqueeze(0), [()]),
    ("narrow", lambda x: x.narrow(1, 1, 2), [(3, 4)]),
    ("narrow_neg", lambda x: x.narrow(-1, -3, 2), [(3, 4)]),
    ("select", lambda x: x.select(1, -1), [(3, 4, 2)]),
    ("split_int", lambda x: x.split(2, 1), [(3, 5)]),
    ("split_list", lambda x: x.split([1, 0, 4], -1), [(3, 5)]),
    ("chunk", lambda x: x.chunk(3, 0), [(7, 2)]),
    ("chunk_uneven", lambda x: x.chunk(4), [(6,)]),
    ("chunk_empty", lambda x: x.chunk(2), [(0, 3)]),
    ("tensor_split_n", lambda x: x.tensor_split(3, 1), [(2, 7)]),
    ("tensor_split_idx", lambda x: x.tensor_split([1, 4, 9], 1), [(2, 7)]),
    ("unbind", lambda x: x.unbind(1), [(2, 3)]),
    ("diagonal", lambda x: x.diagonal(), [(3, 4)]),
    ("diagonal_off", lambda x: x.diagonal(1, -1, 0), [(3, 4, 2)]),
    ("diagonal_neg", lambda x: x.diagonal(-2), [(4, 3)]),
    ("diagonal_out", lambda x: x.diagonal(7), [(4, 3)]),
    ("clone", lambda x: x.clone(), [(3, 4)]),
    ("contiguous", lambda x: x.contiguous(), [(3, 4)]),
    ("atleast_1d", lambda m_x: (torch if is_torch(m_x) else ember).atleast_1d(m_x), [()]),
    ("atleast_2d", lambda m_x: (torch if is_torch(m_x) else ember).atleast_2d(m_x), [(3,)]),
    ("atleast_3d", lambda m_x: (torch if is_torch(m_x) else ember).atleast_3d(m_x), [(3, 2)]),
]


@pytest.mark.parametrize("name,f,shapes", VIEWS, ids=[v[0] for v in VIEWS])
def test_views(name, f, shapes):
    check(f, None, shapes, dtypes=no_bool_0d(ALL, shapes))


def test_view_and_view_errors():
    check(lambda x: x.view(2, -1), None, [(4, 3)], dtypes=ALL, contig_variants=False)
    check(lambda x: x.view(-1), None, [()], dtypes=FLOATS)
    x = ember.zeros(3, 4).t()
    with pytest.raises(ShapeError, match="view"):
        x.view(12)
    assert x.reshape(12).shape == (12,)
    assert ember.zeros(4).view(ember.int32).shape == (4,)
    with pytest.raises(ShapeError, match="invalid for input of size"):
        ember.zeros(2, 3).reshape(4, -1)
    with pytest.raises(ShapeError):
        ember.zeros(2, 3).reshape(-1, -1)
    with pytest.raises(ShapeError, match="invalid"):
        ember.zeros(0, 3).reshape(-1, 0)


VIEW_WRITES = [
    ("reshape", lambda x: x.reshape(6, 2)),
    ("view", lambda x: x.view(-1)),
    ("permute", lambda x: x.permute(2, 1, 0)),
    ("transpose", lambda x: x.transpose(0, 1)),
    ("squeeze_unsqueeze", lambda x: x.unsqueeze(1).squeeze(1)),
    ("narrow", lambda x: x.narrow(2, 1, 1)),
    ("select", lambda x: x.select(0, 1)),
    ("split", lambda x: x.split(1, 1)[2]),
    ("chunk", lambda x: x.chunk(2, 0)[1]),
    ("unbind", lambda x: x.unbind(2)[1]),
    ("diagonal", lambda x: x.diagonal(0, 1, 2)),
    ("flatten", lambda x: x.flatten(0, 1)),
    ("movedim", lambda x: x.movedim(0, -1)),
    ("getitem", lambda x: x[1:, None, ..., 1]),
]


@pytest.mark.parametrize("name,f", VIEW_WRITES, ids=[v[0] for v in VIEW_WRITES])
def test_views_share_memory(name, f):
    base = np.arange(12.0).reshape(2, 3, 2)
    e, t = ember.tensor(base), torch.tensor(base)
    ve, vt = f(e), f(t)
    assert np.shares_memory(ve.numpy(), e.numpy())
    ve.mul_(-1)
    vt.mul_(-1)
    np.testing.assert_array_equal(e.numpy(), t.numpy())
    e2 = ember.tensor(base)
    f(e2)[...] = 7.0
    t2 = torch.tensor(base)
    f(t2)[...] = 7.0
    np.testing.assert_array_equal(e2.numpy(), t2.numpy())


COPIES = [
    ("flip", lambda x: x.flip(0)),
    ("roll", lambda x: x.roll(1, 0)),
    ("repeat", lambda x: x.repeat(1, 1, 1)),
    ("tril", lambda x: x.tril()),
    ("cat", lambda x: (torch if is_torch(x) else ember).cat([x])),
    ("stack", lambda x: (torch if is_torch(x) else ember).stack([x])),
    ("clone", lambda x: x.clone()),
    ("fancy", lambda x: x[[0, 1]]),
    ("mask", lambda x: x[x > 3]),
    ("pad", lambda x: pad(x, (0, 0))),
]


@pytest.mark.parametrize("name,f", COPIES, ids=[v[0] for v in COPIES])
def test_copies_do_not_share_memory(name, f):
    e = ember.arange(12.0).reshape(2, 3, 2)
    assert not np.shares_memory(f(e).numpy(), e.numpy())


# ------------------------------------------------------------------ joining
def _mod(x):
    return torch if is_torch(x) else ember


JOIN = [
    ("cat0", lambda a, b: _mod(a).cat([a, b]), [(2, 3), (4, 3)]),
    ("cat_neg", lambda a, b: _mod(a).cat((a, b), dim=-1), [(2, 3), (2, 1)]),
    ("cat_empty", lambda a, b: _mod(a).cat([a, b], 1), [(2, 0), (2, 3)]),
    ("cat_legacy_empty", lambda a, b: _mod(a).cat([a, b]), [(0,), (2, 3)]),
    ("concat", lambda a, b: _mod(a).concat([a, b, a], 0), [(1, 3), (2, 3)]),
    ("stack", lambda a, b: _mod(a).stack([a, b], 1), [(2, 3), (2, 3)]),
    ("stack_neg", lambda a, b: _mod(a).stack([a, b], -1), [(2, 3), (2, 3)]),
    ("stack_0d", lambda a, b: _mod(a).stack([a, b]), [(), ()]),
    ("hstack", lambda a, b: _mod(a).hstack([a, b]), [(2, 3), (2, 1)]),
    ("hstack_1d", lambda a, b: _mod(a).hstack([a, b]), [(3,), ()]),
    ("vstack", lambda a, b: _mod(a).vstack([a, b]), [(3,), (2, 3)]),
    ("dstack", lambda a, b: _mod(a).dstack([a, b]), [(3,), (1, 3)]),
    ("column_stack", lambda a, b: _mod(a).column_stack([a, b]), [(3,), (3, 2)]),
    ("meshgrid_ij", lambda a, b: _mod(a).meshgrid(a, b, indexing="ij"), [(3,), (4,)]),
    ("meshgrid_xy", lambda a, b: _mod(a).meshgrid(a, b, indexing="xy"), [(3,), (4,)]),
    ("meshgrid_0d", lambda a, b: _mod(a).meshgrid([a, b], indexing="xy"), [(), (2,)]),
]


@pytest.mark.parametrize("name,f,shapes", JOIN, ids=[v[0] for v in JOIN])
def test_join(name, f, shapes):
    check(f, None, shapes, dtypes=no_bool_0d(FLOATS + LOW + (ember.int32, ember.bool), shapes))


def test_join_promotes_and_errors():
    a, b = ember.zeros(2, 3, dtype=ember.int32), ember.ones(1, 3, dtype=ember.float16)
    assert ember.cat([a, b]).dtype is ember.float16
    assert ember.stack([a, a.to(ember.uint8)]).dtype is ember.int32
    m = ember.meshgrid(ember.arange(2), ember.arange(3), ember.arange(4), indexing="xy")
    assert [tuple(g.shape) for g in m] == [(3, 2, 4)] * 3
    with pytest.raises(ShapeError, match="must match except in dimension 0"):
        ember.cat([ember.zeros(2, 3), ember.zeros(1, 4)])
    with pytest.raises(ShapeError, match="zero-dimensional"):
        ember.cat([ember.tensor(1.0), ember.tensor(2.0)])
    with pytest.raises(ShapeError, match="non-empty"):
        ember.cat([])
    with pytest.raises(ShapeError, match="equal-size"):
        ember.stack([ember.zeros(2), ember.zeros(3)])
    with pytest.raises(IndexError):
        ember.stack([ember.zeros(2)], 3)
    x, y = ember.ones(2, 3, requires_grad=True), ember.ones(1, 3)
    ember.cat([x, y]).sum().backward()
    assert x.grad.tolist() == [[1.0] * 3] * 2


# ------------------------------------------------------------------ copying rearrangements
REARRANGE = [
    ("flip", lambda x: x.flip((0, -1)), [(3, 4, 2)]),
    ("flip_0d", lambda x: x.flip(0), [()]),
    ("fliplr", lambda x: x.fliplr(), [(3, 4)]),
    ("flipud", lambda x: x.flipud(), [(3,)]),
    ("roll_flat", lambda x: x.roll(2), [(3, 4)]),
    ("roll_dims", lambda x: x.roll((1, -3), (0, 1)), [(3, 4)]),
    ("roll_big", lambda x: x.roll(7, -1), [(3, 4)]),
    ("roll_empty", lambda x: x.roll(1, 0), [(0, 4)]),
    ("rot90", lambda x: x.rot90(1, (0, 1)), [(3, 4)]),
    ("rot90_k2", lambda x: x.rot90(2, (1, 2)), [(2, 3, 4)]),
    ("rot90_k3", lambda x: x.rot90(-1, (0, 1)), [(3, 4)]),
    ("repeat", lambda x: x.repeat(2, 1, 3), [(3, 2)]),
    ("repeat_0d", lambda x: x.repeat(2, 2), [()]),
    ("repeat_zero", lambda x: x.repeat(0, 2), [(3,)]),
    ("tile", lambda x: x.tile((2,)), [(2, 3)]),
    ("tile_more", lambda x: x.tile((2, 1, 2)), [(2, 3)]),
    ("repeat_interleave", lambda x: x.repeat_interleave(2), [(2, 3)]),
    ("repeat_interleave_dim", lambda x: x.repeat_interleave(3, dim=-1), [(2, 3)]),
    ("tril", lambda x: x.tril(), [(4, 3)]),
    ("tril_k", lambda x: x.tril(-1), [(2, 3, 3)]),
    ("triu", lambda x: x.triu(1), [(3, 4)]),
    ("triu_neg", lambda x: x.triu(-2), [(2, 4, 3)]),
    ("diag_vec", lambda x: _mod(x).diag(x), [(3,)]),
    ("diag_vec_k", lambda x: _mod(x).diag(x, -2), [(3,)]),
    ("diag_mat", lambda x: _mod(x).diag(x, 1), [(3, 4)]),
    ("diag_embed", lambda x: _mod(x).diag_embed(x), [(2, 3)]),
    ("diag_embed_dims", lambda x: _mod(x).diag_embed(x, 1, 0, 2), [(2, 3)]),
]


@pytest.mark.parametrize("name,f,shapes", REARRANGE, ids=[v[0] for v in REARRANGE])
def test_rearrange(name, f, shapes):
    dts = FLOATS + LOW + (ember.int64, ember.uint8, ember.bool)
    check(f, None, shapes, dtypes=no_bool_0d(dts, shapes))


def test_repeat_interleave_tensor_repeats():
    r = [2, 0, 3]

    def f(x):
        return x.repeat_interleave(_mod(x).tensor(r), dim=1)

    check(f, None, [(2, 3)])
    gradcheck(f, [(2, 3)])
    rr = ember.repeat_interleave(ember.tensor(r))
    assert rr.tolist() == torch.repeat_interleave(torch.tensor(r)).tolist()


PADS = [
    ((1, 2), "constant", (2, 3)),
    ((1, 2, 0, 3), "constant", (2, 3)),
    ((-1, 2, 1, -1), "constant", (3, 4)),
    ((1, 1, 1, 1, 1, 1), "constant", (2, 3, 4)),
    ((2, 1), "reflect", (2, 4)),
    ((3, 3), "reflect", (1, 2, 4)),
    ((1, 2, 2, 1), "reflect", (1, 3, 4)),
    ((1, 1, 2, 0, 1, 2), "reflect", (1, 2, 3, 4, 3)),
    ((-1, 2), "reflect", (2, 5)),
    ((2, 3), "replicate", (2, 4)),
    ((1, 2, 3, 1), "replicate", (2, 2, 3)),
    ((1, 0, 1, 2, 2, 1), "replicate", (1, 2, 2, 3)),
    ((2, 1), "circular", (1, 2, 4)),
    ((1, 2, 2, 1), "circular", (1, 2, 3, 4)),
    ((4, 1), "circular", (1, 4)),
    ((-1, 2), "circular", (1, 4)),
]


@pytest.mark.parametrize("p,mode,shape", PADS, ids=[f"{m}{p}" for p, m, _ in PADS])
def test_pad(p, mode, shape):
    check(
        lambda x: pad(x, p, mode=mode),
        None,
        [shape],
        dtypes=FLOATS + LOW[: 2 * (mode == "constant")],
    )
    gradcheck(lambda x: ember.pad(x, p, mode=mode), [shape])


def test_pad_value_dtypes_and_errors():
    check(lambda x: pad(x, (1, 2), value=2.5), None, [(3,)], dtypes=FLOATS + INTS + (ember.bool,))
    check(lambda x: pad(x, (1, 1)), None, [(0, 2)], dtypes=FLOATS)
    with pytest.raises(ShapeError, match="divisible by 2"):
        ember.pad(ember.zeros(3), (1,))
    with pytest.raises(ShapeError, match="reflect"):
        ember.pad(ember.zeros(1, 3), (3, 0), mode="reflect")
    with pytest.raises(ShapeError, match="negative size"):
        ember.pad(ember.zeros(2, 3), (-2, -2))
    with pytest.raises(ValueError, match="mode"):
        ember.pad(ember.zeros(2, 3), (1, 1), mode="wrap")


# ------------------------------------------------------------------ gradients and errors
def test_gradcheck_movement():
    gradcheck(lambda x: x.permute(1, 0, 2).reshape(3, -1)[1:, ::2], [(2, 3, 4)])
    gradcheck(lambda x: x.diagonal(1, 0, 2).flip(0), [(3, 2, 4)])
    gradcheck(lambda x: x.repeat(2, 1).roll(1, 0).tril(), [(2, 3)])
    gradcheck(lambda x: ember.stack(x.split(1, 1), -1).sum(1), [(2, 3)])
    gradcheck(lambda x: ember.cat([x[:, :2], x, ember.zeros(0)], 1), [(2, 3)])
    gradcheck(lambda x: ember.diag_embed(x, -1), [(2, 3)])
    gradcheck(lambda x: x.expand(3, 2, 4), [(2, 1)])


ERRORS = [
    (ShapeError, lambda: ember.zeros(2, 3).permute(0, 0)),
    (IndexError, lambda: ember.zeros(2, 3).permute(0, 2)),
    (IndexError, lambda: ember.zeros(2, 3).transpose(0, 2)),
    (IndexError, lambda: ember.zeros(2, 3).unsqueeze(3)),
    (IndexError, lambda: ember.zeros(2, 3).squeeze(2)),
    (ShapeError, lambda: ember.zeros(2, 3).expand(4, 3)),
    (ShapeError, lambda: ember.zeros(2, 3).expand(3)),
    (ShapeError, lambda: ember.zeros(2, 3).narrow(1, 2, 2)),
    (IndexError, lambda: ember.zeros(2, 3).narrow(1, 4, 0)),
    (IndexError, lambda: ember.zeros(2, 3).select(1, 3)),
    (IndexError, lambda: ember.zeros(2, 3).select(1, -4)),
    (ShapeError, lambda: ember.zeros(5).split([2, 2])),
    (ShapeError, lambda: ember.zeros(5).split(0)),
    (ShapeError, lambda: ember.zeros(5).chunk(0)),
    (IndexError, lambda: ember.tensor(1.0).unbind()),
    (ShapeError, lambda: ember.zeros(2, 3).diagonal(0, 1, 1)),
    (ShapeError, lambda: ember.zeros(2, 3).flip((0, 0))),
    (ShapeError, lambda: ember.zeros(2, 3).roll((1, 2), 1)),
    (ShapeError, lambda: ember.zeros(2, 3).repeat(2)),
    (ShapeError, lambda: ember.zeros(3).tril()),
    (ShapeError, lambda: ember.zeros(2, 2, 2).diag()),
    (ShapeError, lambda: ember.zeros(3).fliplr()),
    (ShapeError, lambda: ember.zeros(2, 3).movedim((0, 1), (0, 0))),
    (ShapeError, lambda: ember.zeros(2, 3).repeat_interleave(ember.tensor([1, 2]), dim=1)),
    (ShapeError, lambda: ember.broadcast_tensors(ember.zeros(2, 3), ember.zeros(4))),
    (ShapeError, lambda: ember.zeros(2, 3).unflatten(1, (2, 2))),
    (ShapeError, lambda: ember.zeros(2, 3).flatten(1, 0)),
]


@pytest.mark.parametrize("i", range(len(ERRORS)))
def test_errors(i):
    exc, f = ERRORS[i]
    with pytest.raises(exc):
        f()


def test_broadcast_tensors_and_shapes():
    check(lambda a, b: _mod(a).broadcast_tensors(a, b), None, [(3, 1), (1, 4)])
    assert ember.broadcast_shapes((3, 1), (4,), ()) == torch.broadcast_shapes((3, 1), (4,), ())


def test_meta_shapes():
    m = ember.zeros(2, 3, 4, device="meta")
    assert ember.cat([m, m], 1).shape == (2, 6, 4)
    assert m.repeat(2, 1, 1, 3).shape == (2, 2, 3, 12)
    assert ember.pad(m, (1, 2, 1, 2), mode="reflect").shape == (2, 6, 7)
    assert m.diagonal(0, 0, 2).shape == (3, 2)
    assert [t.shape for t in m.split(2, 2)] == [(2, 3, 2), (2, 3, 2)]
    assert m.flip(0).device == "meta" and m.tril().shape == m.shape
    big = ember.zeros(100_000, 100_000, device="meta")  # 40 GB if anything were allocated
    assert big.clone().shape == big.contiguous().shape == big.flip(1).shape == big.shape
    assert big[:, [1, 2]].shape == (100_000, 2) and big.view(ember.float16).shape == (
        100_000,
        200_000,
    )
    assert (
        ember.cat([big, big]).shape == (200_000, 100_000) and big.repeat(1, 2).shape[1] == 200_000
    )
    assert ember.pad(big, (1, 1), mode="replicate").shape == (100_000, 100_002)
    assert big.masked_fill(ember.ones(1, dtype=ember.bool, device="meta"), 0.0).shape == big.shape
