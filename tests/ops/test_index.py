import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import ember
from ember.errors import DTypeError, ShapeError, UnsupportedError
from tests.helpers import FLOATS, check, gradcheck

LOW = (ember.float16, ember.bfloat16)
INTS = (ember.int64, ember.int32, ember.int16, ember.int8, ember.uint8)
ALL = FLOATS + LOW + INTS + (ember.bool,)


def is_torch(x) -> bool:
    return isinstance(x, torch.Tensor)


def mod(x):
    return torch if is_torch(x) else ember


def T(x, v, dtype=None):
    """An index (or value) tensor from v, in x's library and on x's device."""
    if is_torch(x):
        return torch.tensor(v, dtype=getattr(torch, dtype) if dtype else None)
    return ember.tensor(v, dtype=dtype, device=x.device)


# ------------------------------------------------------------------ getitem
GETITEM = [
    ("int", lambda x: x[1]),
    ("neg_int", lambda x: x[-1, -2]),
    ("slice", lambda x: x[1:, :2]),
    ("slice_step", lambda x: x[::2, 1::2]),
    ("slice_clamp", lambda x: x[-100:100, 5:]),
    ("ellipsis", lambda x: x[..., 1]),
    ("none", lambda x: x[None, :, None]),
    ("none_ellipsis", lambda x: x[..., None, 0]),
    ("true", lambda x: x[True]),
    ("false", lambda x: x[False]),
    ("list", lambda x: x[[0, 2, 0]]),
    ("tensor", lambda x: x[T(x, [[1, 0], [2, 2]])]),
    ("int32_tensor", lambda x: x[:, T(x, [0, -1], "int32")]),
    ("0d_tensor", lambda x: x[T(x, 1)]),
    ("0d_tensor_mixed", lambda x: x[:, T(x, 1), [0, 1]]),
    ("int_then_adv", lambda x: x[1, :, [1, 0]]),
    ("adv_split", lambda x: x[[0, 1], :, [1, 0]]),
    ("adv_adjacent", lambda x: x[:, [0, 1], [1, 0]]),
    ("adv_broadcast", lambda x: x[T(x, [[0], [2]]), :, T(x, [1, 0])]),
    ("adv_and_slice", lambda x: x[1:, [2, 0], ::2]),
    ("adv_none", lambda x: x[None, 1, None, [0, 1], None]),
    ("numpy_index", lambda x: x[np.array([2, 1])] if not is_torch(x) else x[torch.tensor([2, 1])]),
    ("empty_list", lambda x: x[[]]),
    ("ellipsis_adv", lambda x: x[..., [1, 1, 0]]),
]


@pytest.mark.parametrize("name,f", GETITEM, ids=[g[0] for g in GETITEM])
def test_getitem(name, f):
    check(f, None, [(3, 4, 2)], dtypes=ALL)


MASKS = [
    ("mask_full", lambda x: x[x > 0]),
    ("mask_dim1", lambda x: x[:, T(x, [True, False, True, True])]),
    ("mask_2d", lambda x: x[T(x, [[True, False, True, True], [False] * 4, [True] * 4])]),
    ("mask_list", lambda x: x[[True, False, True]]),
    ("mask_and_int", lambda x: x[T(x, [True, False, True]), 1]),
    ("mask_and_adv", lambda x: x[T(x, [True, False, True]), :, T(x, [1, 0])]),
    ("mask_uint8", lambda x: x[(x > 0).to(mod(x).uint8)] if x.ndim else x),
    ("mask_0d", lambda x: x[T(x, True)]),
]


@pytest.mark.filterwarnings("ignore:indexing with dtype torch.uint8")
@pytest.mark.parametrize("name,f", MASKS, ids=[g[0] for g in MASKS])
def test_getitem_masks(name, f):
    check(f, None, [(3, 4, 2)], dtypes=FLOATS + LOW + (ember.int64, ember.bool), meta=False)


def test_getitem_0d_and_empty():
    check(lambda x: x[()], None, [()], dtypes=FLOATS + INTS)
    check(lambda x: x[...], None, [()], dtypes=FLOATS)
    check(lambda x: x[None], None, [()], dtypes=FLOATS)
    check(lambda x: x[1:, [0, 0]], None, [(0, 3)])
    check(lambda x: x[:, T(x, [], "int64")], None, [(2, 3)])
    check(lambda x: x[x > 5], None, [(0, 3)], meta=False)


def test_getitem_views_and_copies():
    x = ember.arange(24.0).reshape(2, 3, 4)
    v = x[1, 1:, ::2]
    assert np.shares_memory(v.numpy(), x.numpy())
    v[...] = -1
    assert x[1, 2, 2].item() == -1 and x[1, 0, 0].item() == 12
    w = x[T(x, 1)]
    assert np.shares_memory(w.numpy(), x.numpy()), "a 0-d int tensor selects (a view), as in torch"
    a = x[[0, 1]]
    assert not np.shares_memory(a.numpy(), x.numpy())
    assert x[1].is_contiguous() and not x[:, 1].is_contiguous()


def test_getitem_grad_accumulates_repeats():
    gradcheck(lambda x: x[[0, 0, 2], 1:], [(3, 4)])
    gradcheck(lambda x: x[:, T(x, [[1, 1], [0, 1]]), ::2], [(2, 3, 4)])
    gradcheck(lambda x: x[x.detach() > 0], [(3, 4)])
    gradcheck(lambda x: x[1:, None, ..., 0], [(3, 4)])


GETITEM_ERRORS = [
    (IndexError, "out of bounds for dimension 0 with size 3", lambda x: x[3]),
    (IndexError, "out of bounds for dimension 1 with size 4", lambda x: x[0, -5]),
    (IndexError, "out of bounds for dimension 1 with size 4", lambda x: x[:, [0, 4]]),
    (IndexError, "out of bounds", lambda x: x[ember.tensor([-4])]),
    (IndexError, "too many indices", lambda x: x[0, 0, 0, 0]),
    (IndexError, "single ellipsis", lambda x: x[..., ...]),
    (IndexError, "long, int, byte or bool", lambda x: x[ember.tensor([0.0])]),
    (IndexError, "valid indices", lambda x: x[1.0]),
    (IndexError, "valid indices", lambda x: x["a"]),
    (IndexError, "shape of the mask", lambda x: x[ember.tensor([True, False])]),
    (IndexError, "could not be broadcast", lambda x: x[[0, 1], [0, 1, 2]]),
    (ValueError, "negative slice steps", lambda x: x[::-1]),
    (ValueError, "step cannot be zero", lambda x: x[:, ::0]),
]


@pytest.mark.parametrize("i", range(len(GETITEM_ERRORS)))
def test_getitem_errors(i):
    exc, msg, f = GETITEM_ERRORS[i]
    with pytest.raises(exc, match=msg):
        f(ember.zeros(3, 4, 2))


# ------------------------------------------------------------------ setitem / index_put
def _set(idx, value):
    def f(x, *v):
        y = x.clone()
        y[idx(y) if callable(idx) else idx] = v[0] if v else value
        return y

    return f


SETITEM = [
    ("int_scalar", _set(1, 2.5), [(3, 4)]),
    ("slice_scalar", _set((slice(1, None), slice(None, None, 2)), 3.0), [(3, 4)]),
    ("ellipsis_vec", _set((Ellipsis, 1), None), [(3, 4), (3,)]),
    ("slice_tensor", _set((slice(None), slice(1, 3)), None), [(3, 4), (3, 2)]),
    ("broadcast", _set(slice(None), None), [(3, 4), (4,)]),
    ("leading_ones", _set(0, None), [(3, 4), (1, 1, 4)]),
    ("adv_list", _set([2, 0], None), [(3, 4), (2, 4)]),
    ("adv_int_mixed", _set((1, slice(None), [1, 0]), None), [(2, 3, 4), (3, 2)]),
    ("adv_tensor", _set(lambda x: (T(x, [[0], [2]]), T(x, [1, 3])), None), [(3, 4), (2, 2)]),
    ("adv_broadcast_val", _set(lambda x: (slice(None), T(x, [0, 3])), None), [(3, 4), (1,)]),
    ("none", _set((None, 1), None), [(3, 4), (1, 4)]),
    ("0d", _set((), None), [(), ()]),
]


@pytest.mark.parametrize("name,f,shapes", SETITEM, ids=[s[0] for s in SETITEM])
def test_setitem(name, f, shapes):
    dts = FLOATS + LOW + (INTS if len(shapes) == 1 else ())
    check(f, None, shapes, dtypes=dts)


def test_setitem_masks_and_dtypes():
    check(_set(lambda x: x > 0, 0.0), None, [(3, 4)], meta=False, dtypes=FLOATS + LOW)
    check(_set(lambda x: x.detach() > 0, None), None, [(3, 4), ()], meta=False)
    check(_set(lambda x: (T(x, [True, False, True]), 1), None), None, [(3, 4), (2,)], meta=False)
    x = ember.zeros(3, dtype=ember.int64)
    x[0] = 1.7
    x[1:] = ember.tensor([2.5, 3.5])
    assert x.tolist() == [1, 2, 3]
    u = ember.zeros(2, dtype=ember.uint8)
    u[0] = -1
    assert u.tolist() == [255, 0]
    b = ember.zeros(2, dtype=ember.bool)
    b[1] = 2
    assert b.tolist() == [False, True]
    h = ember.zeros(2, dtype=ember.bfloat16)
    h[[1]] = 1.5
    assert h.float().tolist() == [0.0, 1.5]


def test_setitem_in_place_views_see_it():
    x = ember.zeros(3, 4)
    row = x[1]
    x[1, [0, 2]] = 5.0
    assert row.tolist() == [5.0, 0.0, 5.0, 0.0]
    row[1:3] = 7.0
    assert x[1].tolist() == [5.0, 7.0, 7.0, 0.0]
    x[:, 3] = ember.arange(3.0)
    assert x[:, 3].tolist() == [0.0, 1.0, 2.0]
    x[x > 6] = -1.0
    assert x[1].tolist() == [5.0, -1.0, -1.0, 1.0]


def test_setitem_autograd():
    w = ember.ones(3, requires_grad=True)
    with pytest.raises(ember.errors.AutogradError):
        w[0] = 2.0
    with ember.no_grad():
        w[0] = 2.0
    assert w.tolist() == [2.0, 1.0, 1.0] and w.is_leaf
    a = ember.tensor([1.0, 2.0, 3.0], requires_grad=True)
    v = ember.tensor([10.0, 20.0], requires_grad=True)
    ta = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    tv = torch.tensor([10.0, 20.0], requires_grad=True)
    ys = []
    for m, p, q in ((ember, a, v), (torch, ta, tv)):
        y = p * 2
        y[[2, 0]] = q * q
        y[1] = 0.5
        (y * m.tensor([1.0, 2.0, 3.0])).sum().backward()
        ys.append(y)
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy())
    np.testing.assert_allclose(v.grad.numpy(), tv.grad.numpy())
    np.testing.assert_allclose(ys[0].detach().numpy(), ys[1].detach().numpy())
    z = ember.zeros(2, 3)
    z[0] = v.sum() * ember.ones(3)
    assert z.requires_grad and not z.is_leaf


def test_setitem_errors():
    x = ember.zeros(3, 4)
    with pytest.raises(ShapeError, match="cannot be broadcast"):
        x[0] = ember.ones(3)
    with pytest.raises(ShapeError, match="cannot be broadcast"):
        x[[0, 1]] = ember.ones(3, 4)
    with pytest.raises(IndexError):
        x[3] = 1.0
    with pytest.raises(UnsupportedError, match="read-only"):
        ember.zeros(3, 1).expand(3, 4)[0, 0] = 1.0
    m = ember.zeros(3, 4, device="meta")
    m[1:, [0, 1]] = ember.ones(2, 2, device="meta")
    with pytest.raises(ShapeError):
        m[0] = ember.ones(3, device="meta")


def test_index_put():
    def f(x, v):
        return mod(x).index_put(x, (T(x, [0, 2, 0]), T(x, [1, 1, 1])), v, accumulate=True)

    check(f, None, [(3, 4), (3,)])
    check(lambda x, v: mod(x).index_put(x, (T(x, [1, 2]),), v), None, [(3, 4), (4,)])
    x = ember.zeros(3)
    x.index_put_((ember.tensor([0, 0, 1]),), ember.tensor([1.0, 2.0, 3.0]), accumulate=True)
    assert x.tolist() == [3.0, 3.0, 0.0]


# ------------------------------------------------------------------ gather / scatter family
RNG = np.random.default_rng(0)
G_IDX = RNG.integers(-3, 3, (2, 5)).tolist()
PERM = np.stack([RNG.permutation(4)[:3] for _ in range(2)]).tolist()

GATHER = [
    ("gather", lambda x: x.gather(1, T(x, np.abs(G_IDX).tolist())), [(3, 4)]),
    ("gather_dim0", lambda x: x.gather(0, T(x, [[2, 0, 1, 1]])), [(3, 4)]),
    ("gather_small", lambda x: x.gather(-1, T(x, [[0], [3]])), [(3, 4)]),
    ("gather_0d", lambda x: x.gather(0, T(x, 0)), [()]),
    (
        "gather_empty",
        lambda x: x.gather(1, T(x, np.zeros((2, 0), int).tolist(), "int64")),
        [(3, 4)],
    ),
    ("scatter", lambda x, s: x.scatter(1, T(x, PERM), s), [(2, 4), (2, 3)]),
    ("scatter_big_src", lambda x, s: x.scatter(0, T(x, [[1, 0]]), s), [(2, 4), (3, 5)]),
    ("scatter_value", lambda x: x.scatter(1, T(x, PERM), 2.5), [(2, 4)]),
    (
        "scatter_add",
        lambda x, s: x.scatter_add(1, T(x, np.abs(G_IDX).tolist()), s),
        [(2, 4), (2, 5)],
    ),
    (
        "scatter_add_dim0",
        lambda x, s: x.scatter_add(0, T(x, [[0, 0], [0, 1]]), s),
        [(2, 3), (2, 2)],
    ),
    ("index_select", lambda x: x.index_select(1, T(x, [3, 0, 3])), [(2, 4)]),
    ("index_select_neg_dim", lambda x: x.index_select(-2, T(x, [1])), [(2, 4)]),
    ("index_select_0d", lambda x: x.index_select(0, T(x, [0])), [()]),
    ("index_add", lambda x, s: x.index_add(1, T(x, [0, 2, 0]), s, alpha=2), [(2, 4), (2, 3)]),
    ("index_copy", lambda x, s: x.index_copy(0, T(x, [2, 0]), s), [(3, 2), (2, 2)]),
    ("index_fill", lambda x: x.index_fill(1, T(x, [0, 2]), -1.5), [(2, 4)]),
    ("index_fill_t", lambda x, v: x.index_fill(0, T(x, [1]), v), [(2, 4), ()]),
    ("take", lambda x: x.take(T(x, [[0, 5], [-1, 5]])), [(2, 3)]),
    ("take_along_dim", lambda x: mod(x).take_along_dim(x, T(x, [[0], [2]]), 1), [(2, 3)]),
    ("take_along_bcast", lambda x: mod(x).take_along_dim(x, T(x, [[[0]], [[1]]]), 2), [(1, 2, 3)]),
    ("take_along_flat", lambda x: mod(x).take_along_dim(x, T(x, [5, 0, 0])), [(2, 3)]),
    ("put", lambda x, s: x.put(T(x, [0, 4]), s), [(2, 3), (2,)]),
    ("put_acc", lambda x, s: x.put(T(x, [1, 1, 2]), s, accumulate=True), [(2, 3), (3,)]),
]


@pytest.mark.parametrize("name,f,shapes", GATHER, ids=[g[0] for g in GATHER])
def test_gather_scatter(name, f, shapes):
    dts = FLOATS + (ember.float16, ember.int64) + (() if () in shapes else (ember.bool,))
    if name.startswith(("scatter_add", "index_add", "put_acc")):
        dts = FLOATS + (ember.float16, ember.int64)
    if name.startswith("index_fill"):
        dts = FLOATS + (ember.int64,)
    check(f, None, shapes, dtypes=dts, grad=name != "scatter_big_src")  # torch's grad fails there


REDUCE = ["sum", "prod", "mean", "amax", "amin"]


@pytest.mark.parametrize("reduce", REDUCE)
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    idx = [[0, 0, 2, 0], [1, 2, 2, 1]]

    def f(x, s):
        return x.scatter_reduce(1, T(x, idx), s, reduce, include_self=include_self)

    check(f, None, [(2, 3), (2, 4)])
    check(f, None, [(2, 3), (2, 4)], dtypes=(ember.int64,))
    gradcheck(f, [(2, 3), (2, 4)])


def test_scatter_reduce_prod_zeros_and_ties():
    for xv, sv in [([0.0, 2.0], [3.0, 0.0, 5.0]), ([1.0, 2.0], [2.0, 2.0, 1.0])]:
        for red in ("prod", "amax", "amin"):
            xs = [ember.tensor(xv, requires_grad=True), torch.tensor(xv, requires_grad=True)]
            ss = [ember.tensor(sv, requires_grad=True), torch.tensor(sv, requires_grad=True)]
            for x, s in zip(xs, ss):
                x.scatter_reduce(0, T(x, [0, 1, 1]), s, red).sum().backward()
            np.testing.assert_allclose(xs[0].grad.numpy(), xs[1].grad.numpy(), err_msg=red)
            np.testing.assert_allclose(ss[0].grad.numpy(), ss[1].grad.numpy(), err_msg=red)


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
def test_scatter_multiply_and_grads():
    def f(x, s):
        return x.scatter(1, T(x, [[0, 0, 1]]), s, reduce="multiply")

    check(f, None, [(1, 3), (1, 3)], grad=False)
    check(
        lambda x, s: x.scatter(1, T(x, [[1, 1, 0]]), s, reduce="add"),
        None,
        [(1, 3), (1, 3)],
        grad=False,
    )
    gradcheck(
        lambda x, s: x.scatter(1, ember.tensor([[1, 1, 0]]), s, reduce="add"), [(1, 3), (1, 3)]
    )
    gradcheck(lambda x, s: x.scatter(1, ember.tensor(PERM), s), [(2, 4), (2, 3)])
    gradcheck(lambda x, s: x.scatter(0, ember.tensor([[1, 0]]), s), [(2, 4), (3, 5)])
    gradcheck(lambda x, s: x.index_add(0, ember.tensor([1, 1]), s), [(3, 2), (2, 2)])
    gradcheck(lambda x: x.take(ember.tensor([[0, 0], [3, 1]])), [(2, 2)])
    gradcheck(lambda x: x.gather(0, ember.tensor([[1, 1, 0]])), [(2, 3)])


INDEX_ERRORS = [
    (IndexError, "out of bounds", lambda x: x.gather(1, ember.tensor([[4]]))),
    (DTypeError, "integer", lambda x: x.gather(1, ember.tensor([[0.0]]))),
    (ShapeError, "as many dims", lambda x: x.gather(1, ember.tensor([0]))),
    (ShapeError, "size does not match", lambda x: x.gather(1, ember.tensor([[0]] * 4))),
    (IndexError, "out of bounds", lambda x: x.scatter(0, ember.tensor([[3]]), 1.0)),
    (IndexError, "out of bounds", lambda x: x.index_select(0, ember.tensor([-4]))),
    (IndexError, "vector", lambda x: x.index_select(0, ember.tensor([[0]]))),
    (DTypeError, "integer", lambda x: x.index_select(0, ember.tensor([True]))),
    (ShapeError, "source shape", lambda x: x.index_add(0, ember.tensor([0]), ember.ones(2, 4))),
    (IndexError, "out of range", lambda x: x.take(ember.tensor([12]))),
    (ShapeError, "same size", lambda x: x.put(ember.tensor([0]), ember.ones(2))),
    (ValueError, "reduce", lambda x: x.scatter_reduce(0, ember.tensor([[0]]), x, "max")),
    (DTypeError, "boolean", lambda x: x.masked_fill(ember.tensor([1, 0, 1, 0]), 1.0)),
    (ShapeError, "0-dimensional", lambda x: x.masked_fill(x > 0, ember.ones(1))),
    (ShapeError, "broadcast", lambda x: x.masked_fill(ember.ones(3, dtype=ember.bool), 1.0)),
    (ShapeError, "fewer", lambda x: x.masked_scatter(x > -1, ember.ones(3))),
]


@pytest.mark.parametrize("i", range(len(INDEX_ERRORS)))
def test_index_op_errors(i):
    exc, msg, f = INDEX_ERRORS[i]
    with pytest.raises(exc, match=msg):
        f(ember.zeros(3, 4))


# ------------------------------------------------------------------ masked ops, nonzero
MASKED = [
    ("masked_fill", lambda x: x.masked_fill(x > 0, -2.0), [(3, 4)]),
    ("masked_fill_bcast", lambda x: x.masked_fill(T(x, [True, False, False, True]), 7), [(3, 4)]),
    ("masked_fill_grow", lambda x: x.masked_fill(T(x, [[True], [False]]), 1), [(3,)]),
    ("masked_fill_t", lambda x, v: x.masked_fill(x.detach() > 0, v), [(3, 4), ()]),
    ("masked_select", lambda x: x.masked_select(x > 0), [(3, 4)]),
    ("masked_select_bcast", lambda x: x.masked_select(T(x, [[True], [False]])), [(3,)]),
    ("masked_scatter", lambda x, s: x.masked_scatter(x.detach() > 0, s), [(3, 4), (13,)]),
    (
        "masked_scatter_b",
        lambda x, s: x.masked_scatter(T(x, [True, False, True]), s),
        [(2, 3), (2, 3)],
    ),
]


@pytest.mark.parametrize("name,f,shapes", MASKED, ids=[m[0] for m in MASKED])
def test_masked(name, f, shapes):
    dts = FLOATS + LOW + ((ember.int64,) if len(shapes) == 1 else ())
    check(f, None, shapes, dtypes=dts, meta=name.startswith("masked_fill"))


def test_masked_fill_dtype_and_inplace():
    x = ember.zeros(2, 3, dtype=ember.int64).masked_fill(ember.ones(3, dtype=ember.bool), 1.7)
    assert x.dtype is ember.int64 and x.tolist() == [[1] * 3] * 2
    y = ember.zeros(2, 3)
    v = y[0]
    y.masked_fill_(ember.tensor([True, False, True]), 4.0)
    assert v.tolist() == [4.0, 0.0, 4.0]


def test_nonzero_argwhere_where():
    for shape in [(3, 4), (5,), (), (0, 3)]:
        a = np.random.default_rng(1).integers(0, 2, shape)
        e, t = ember.tensor(a), torch.tensor(a)
        assert ember.nonzero(e).tolist() == torch.nonzero(t).tolist()
        assert tuple(ember.nonzero(e).shape) == tuple(torch.nonzero(t).shape)
        assert [i.tolist() for i in e.nonzero(as_tuple=True)] == [
            i.tolist() for i in t.nonzero(as_tuple=True)
        ]
        assert ember.argwhere(e).tolist() == torch.argwhere(t).tolist()
        if shape:
            assert [i.tolist() for i in ember.where(e > 0)] == [
                i.tolist() for i in torch.where(t > 0)
            ]
        assert ember.nonzero(e).dtype is ember.int64
    with pytest.raises(UnsupportedError):
        ember.nonzero(ember.zeros(3, device="meta"))
    with pytest.raises(UnsupportedError):
        ember.zeros(3, device="meta").masked_select(ember.ones(3, dtype=ember.bool, device="meta"))
    with pytest.raises(UnsupportedError):
        ember.zeros(3, device="meta")[ember.ones(3, dtype=ember.bool, device="meta")]


# ------------------------------------------------------------------ one_hot, embedding
def test_one_hot():
    a = [[0, 3], [1, 1]]
    assert ember.one_hot(ember.tensor(a)).tolist() == TF.one_hot(torch.tensor(a)).tolist()
    e, t = ember.one_hot(ember.tensor(a), 5), TF.one_hot(torch.tensor(a), 5)
    assert e.tolist() == t.tolist() and e.dtype is ember.int64
    assert ember.one_hot(ember.tensor(2), 3).tolist() == [0, 0, 1]
    assert ember.one_hot(ember.tensor([1, 0], device="meta"), 4).shape == (2, 4)
    with pytest.raises(ShapeError):
        ember.one_hot(ember.tensor([0, 3]), 2)
    with pytest.raises(ShapeError):
        ember.one_hot(ember.tensor([-1]), 2)
    with pytest.raises(DTypeError):
        ember.one_hot(ember.tensor([1.0]))


@pytest.mark.parametrize(
    "kw", [{}, {"padding_idx": 1}, {"padding_idx": -1}, {"scale_grad_by_freq": True}]
)
def test_embedding(kw):
    from ember.ops.index import embedding

    idx = [[1, 4, 1], [0, 4, 4]]

    def f(w):
        return TF.embedding(T(w, idx), w, **kw) if is_torch(w) else embedding(T(w, idx), w, **kw)

    check(f, None, [(5, 3)], dtypes=FLOATS + LOW)
    check(f, None, [(5, 3)], dtypes=FLOATS, seed=1)


def test_embedding_max_norm_and_errors():
    from ember.ops.index import embedding

    w = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32) * 3
    we, wt = ember.tensor(w), torch.tensor(w)
    e = embedding(ember.tensor([0, 2]), we, max_norm=1.0)
    t = TF.embedding(torch.tensor([0, 2]), wt, max_norm=1.0)
    np.testing.assert_allclose(e.numpy(), t.numpy(), rtol=1e-5)
    np.testing.assert_allclose(we.numpy(), wt.numpy(), rtol=1e-5)
    with pytest.raises(IndexError, match="out of range"):
        embedding(ember.tensor([5]), we)
    with pytest.raises(DTypeError):
        embedding(ember.tensor([0.0]), we)
    m = embedding(ember.tensor([[1, 2]], device="meta"), ember.zeros(5, 3, device="meta"))
    assert m.shape == (1, 2, 3)


INPLACE = [
    ("masked_fill_", lambda x, y: x.masked_fill_(x.detach() > 0, 0.5)),
    ("index_fill_", lambda x, y: x.index_fill_(1, T(x, [0, 2]), -1.0)),
    ("index_add_", lambda x, y: x.index_add_(1, T(x, [2, 0, 2]), y[:, :3])),
    ("index_copy_", lambda x, y: x.index_copy_(1, T(x, [3, 1]), y[:, :2])),
    ("scatter_", lambda x, y: x.scatter_(1, T(x, [[1, 3], [0, 2]]), y[:, :2])),
    ("scatter_add_", lambda x, y: x.scatter_add_(1, T(x, [[1, 1], [0, 2]]), y[:, :2])),
    ("masked_scatter_", lambda x, y: x.masked_scatter_(T(x, [True, False, True, False]), y)),
    ("put_", lambda x, y: x.put_(T(x, [7, 0]), y[0, :2])),
    ("tril_", lambda x, y: x.tril_(1)),
    ("t_", lambda x, y: x.t_()),
    ("unsqueeze_", lambda x, y: x.unsqueeze_(1)),
]


@pytest.mark.parametrize("name,f", INPLACE, ids=[i[0] for i in INPLACE])
def test_inplace_methods(name, f):
    def g(a, b):
        x = a * 1.0  # a non-leaf: in-place ops on it are recorded
        out = f(x, b)
        assert out is x
        return x

    check(g, None, [(2, 4), (2, 4)], dtypes=FLOATS)
    base = np.arange(8.0).reshape(2, 4)
    e, t = ember.tensor(base), torch.tensor(base)
    ve, vt = e[:], t[:]
    f(e, ember.ones(2, 4))
    f(t, torch.ones(2, 4, dtype=torch.float64))
    np.testing.assert_array_equal(e.numpy(), t.numpy())
    if name not in ("t_", "unsqueeze_"):
        np.testing.assert_array_equal(ve.numpy(), vt.numpy())
    with pytest.raises(ember.errors.AutogradError):
        f(ember.ones(2, 4, requires_grad=True), ember.ones(2, 4))
