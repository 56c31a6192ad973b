import numpy as np
import pytest
import torch

import ember
from ember.errors import AutogradError, DTypeError, ShapeError
from tests.helpers import check, gradcheck

ALL_FLOATS = (ember.float32, ember.float64, ember.float16, ember.bfloat16)
INTS = (ember.int64, ember.int32, ember.int16, ember.int8, ember.uint8)


def mm(a, b):
    return a @ b


MATMUL_SHAPES = [
    [(3,), (3,)],
    [(2, 3), (3,)],
    [(3,), (3, 4)],
    [(2, 3), (3, 4)],
    [(5, 2, 3), (3, 4)],
    [(2, 3), (5, 3, 4)],
    [(3,), (5, 3, 4)],
    [(5, 2, 3), (3,)],
    [(2, 1, 2, 3), (5, 3, 4)],
    [(4, 1, 2, 3), (1, 3, 3, 2)],
    [(0, 3), (3, 4)],
    [(2, 0), (0, 4)],
    [(4, 1, 3), (1, 3, 0)],
]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul_broadcasting(shapes):
    check(mm, None, shapes, dtypes=ALL_FLOATS)


def test_matmul_grad_fd():
    for shapes in MATMUL_SHAPES[:10]:
        gradcheck(mm, shapes)


def test_matmul_ints():
    check(mm, None, [(2, 3), (3, 4)], dtypes=INTS, grad=False)
    check(mm, None, [(2, 2, 3), (3,)], dtypes=(ember.int64,), grad=False)


def test_matmul_grad_only_one_side():
    a = ember.randn(4, 2, 3)
    b = ember.randn(3, 5, requires_grad=True)
    (a @ b).sum().backward()
    ta, tb = torch.from_numpy(a.numpy()), torch.from_numpy(b.detach().numpy()).requires_grad_()
    (ta @ tb).sum().backward()
    np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_matmul_errors():
    with pytest.raises(ShapeError, match=r"\(2, 3\).*\(4, 5\)"):
        ember.ones(2, 3) @ ember.ones(4, 5)
    with pytest.raises(ShapeError, match="batch"):
        ember.ones(5, 2, 3) @ ember.ones(4, 3, 2)
    with pytest.raises(ShapeError, match="1-D"):
        ember.matmul(ember.tensor(1.0), ember.ones(3))
    with pytest.raises(DTypeError):
        ember.ones(2, 3) @ ember.ones(3, 2, dtype=ember.float64)
    with pytest.raises(DTypeError):
        ember.ones(2, 3, dtype=ember.bool) @ ember.ones(3, 2, dtype=ember.bool)
    with pytest.raises(ShapeError):
        ember.ones(3, 3).to("meta") @ ember.ones(4, 3).to("meta")


def test_matmul_meta_does_no_compute():
    a, b = ember.ones(64, 512, 2048, device="meta"), ember.ones(2048, 4096, device="meta")
    out = a @ b
    assert out.device == "meta" and tuple(out.shape) == (64, 512, 4096)


def pair(name, tf=None, **kw):
    """(ember fn, torch fn) calling `name` with the same keyword arguments."""
    tf = tf or getattr(torch, name)
    return (lambda *a: getattr(ember, name)(*a, **kw)), (lambda *a: tf(*a, **kw))


FAMILY = [
    (ember.mm, torch.mm, [(2, 3), (3, 4)]),
    (ember.bmm, torch.bmm, [(2, 2, 3), (2, 3, 4)]),
    (ember.mv, torch.mv, [(2, 3), (3,)]),
    (ember.dot, torch.dot, [(5,), (5,)]),
    (ember.vdot, torch.vdot, [(5,), (5,)]),
    (ember.outer, torch.outer, [(4,), (3,)]),
    (lambda a, b: a.mm(b), lambda a, b: a.mm(b), [(2, 3), (3, 4)]),
    (*pair("addmm"), [(4,), (3, 2), (2, 4)]),
    (*pair("addmm", beta=0.5, alpha=2), [(3, 4), (3, 2), (2, 4)]),
    (*pair("addmm", beta=0), [(1, 4), (3, 2), (2, 4)]),
    (*pair("addmv", alpha=3), [(3,), (3, 2), (2,)]),
    (*pair("baddbmm", beta=0.5, alpha=2), [(1, 3, 4), (2, 3, 2), (2, 2, 4)]),
    (*pair("addbmm"), [(3, 4), (2, 3, 2), (2, 2, 4)]),
    (*pair("cross", torch.linalg.cross), [(4, 3), (1, 3)]),
    (*pair("cross", torch.linalg.cross, dim=0), [(3, 2), (3, 2)]),
]


@pytest.mark.parametrize("i", range(len(FAMILY)))
def test_matmul_family(i):
    e, t, shapes = FAMILY[i]
    check(e, t, shapes, dtypes=ALL_FLOATS if i < 6 else (ember.float32, ember.float64))
    gradcheck(e, shapes)


def test_family_shape_errors():
    with pytest.raises(ShapeError):
        ember.mm(ember.ones(2, 3), ember.ones(3))
    with pytest.raises(ShapeError):
        ember.bmm(ember.ones(2, 2, 3), ember.ones(3, 3, 4))
    with pytest.raises(ShapeError):
        ember.dot(ember.ones(3), ember.ones(4))
    with pytest.raises(ShapeError):
        ember.mv(ember.ones(2, 3), ember.ones(2))
    with pytest.raises(ShapeError):
        ember.addmm(ember.ones(5, 4), ember.ones(3, 2), ember.ones(2, 4))


LINEAR = [
    [(2, 5, 3), (4, 3), (4,)],
    [(3,), (4, 3), (4,)],
    [(6, 3), (4, 3)],
    [(0, 3), (4, 3), (4,)],
]


@pytest.mark.parametrize("shapes", LINEAR, ids=str)
def test_linear(shapes):
    check(ember.linear, torch.nn.functional.linear, shapes, dtypes=ALL_FLOATS)


def test_low_precision_long_reductions():
    """float16/bfloat16 products accumulate in float32 and round once: a 96-long sum stays
    within an ulp of the float64 reference (accumulating in the dtype errs by tens of ulps)."""
    low = ALL_FLOATS[2:]
    check(mm, None, [(3, 96), (96, 5)], dtypes=low)
    check(mm, None, [(2, 3, 96), (96,)], dtypes=low)
    check(ember.linear, torch.nn.functional.linear, [(2, 3, 96), (5, 96), (5,)], dtypes=low)


def test_linear_grad_fd_and_errors():
    gradcheck(ember.linear, [(2, 5, 3), (4, 3), (4,)])
    gradcheck(ember.linear, [(3,), (4, 3)])
    with pytest.raises(ShapeError, match=r"\(2, 5\).*\(4, 3\)"):
        ember.linear(ember.ones(2, 5), ember.ones(4, 3))
    with pytest.raises(ShapeError):
        ember.linear(ember.ones(2, 3), ember.ones(4, 3), ember.ones(5))
    with pytest.raises(DTypeError):
        ember.linear(ember.ones(2, 3), ember.ones(4, 3, dtype=ember.float64))


class FakeQTensor:
    """Duck-typed stand-in for ember.quant.QTensor: matmul_t(x) = x @ W.T, shape (out, in)."""

    def __init__(self, w: np.ndarray) -> None:
        self.w = w
        self.shape = w.shape
        self.calls = 0

    def matmul_t(self, x: np.ndarray) -> np.ndarray:
        self.calls += 1
        assert x.dtype == np.float32 and x.ndim == 2
        return x @ self.w.T

    def dequantize(self) -> np.ndarray:
        return self.w


def test_linear_quantized_weight_duck_typed():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    x = rng.standard_normal((2, 5, 3)).astype(np.float32)
    q = FakeQTensor(w)
    xe = ember.from_numpy(x).requires_grad_()
    out = ember.linear(xe, q, ember.from_numpy(b))
    tx = torch.from_numpy(x).requires_grad_()
    tout = torch.nn.functional.linear(tx, torch.from_numpy(w), torch.from_numpy(b))
    np.testing.assert_allclose(out.detach().numpy(), tout.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert q.calls == 1
    out.sum().backward()
    tout.sum().backward()
    np.testing.assert_allclose(xe.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)
    bf = ember.linear(ember.from_numpy(x).bfloat16(), q)
    assert bf.dtype is ember.bfloat16 and tuple(bf.shape) == (2, 5, 4)
    m = ember.linear(ember.from_numpy(x).to("meta"), q)
    assert m.device == "meta" and tuple(m.shape) == (2, 5, 4) and q.calls == 2
    with pytest.raises(ShapeError):
        ember.linear(ember.ones(2, 4), q)

    class MatmulOnly:
        shape = w.shape
        matmul_t = q.matmul_t

    y = ember.linear(ember.ones(2, 3, requires_grad=True), MatmulOnly())
    with pytest.raises(AutogradError):
        y.sum().backward()


EINSUM = [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("ij,jk", [(2, 3), (3, 4)]),
    ("ii->i", [(3, 3)]),
    ("ii", [(3, 3)]),
    ("ij->", [(2, 3)]),
    ("ij->ji", [(2, 3)]),
    ("ba", [(2, 3)]),
    ("...ij,...jk", [(2, 1, 2, 3), (5, 3, 4)]),
    ("...ij,...jk->...ik", [(3, 2, 3), (3, 4)]),
    ("b i j, b j k -> b i k", [(2, 2, 3), (2, 3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("iij,jk->ik", [(3, 3, 2), (2, 4)]),
    ("ij,ij->i", [(3, 1), (3, 4)]),
    ("...,...->...", [(2, 3), (3,)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("i...->...", [(2, 3, 4)]),
]


@pytest.mark.parametrize("eq,shapes", EINSUM, ids=[e[0] for e in EINSUM])
def test_einsum(eq, shapes):
    check(
        lambda *a: ember.einsum(eq, *a), lambda *a: torch.einsum(eq, *a), shapes, dtypes=ALL_FLOATS
    )
    gradcheck(lambda *a: ember.einsum(eq, *a), shapes)


def test_einsum_list_operands_and_errors():
    a, b = ember.randn(2, 3), ember.randn(3, 4)
    np.testing.assert_allclose(ember.einsum("ij,jk", [a, b]).numpy(), (a @ b).numpy(), rtol=1e-6)
    with pytest.raises(ShapeError):
        ember.einsum("ij,jk", a, ember.randn(4, 4))
    with pytest.raises(ShapeError):
        ember.einsum("ijk", a)
    with pytest.raises(ShapeError):
        ember.einsum("ij,jk", a)
    with pytest.raises(DTypeError):
        ember.einsum("ij,jk", a, b.double())


TENSORDOT = [
    (2, [(3, 4, 5), (4, 5, 2)]),
    (0, [(2, 3), (4,)]),
    (([1, 0], [0, 2]), [(3, 4, 5), (4, 2, 3)]),
    (([1], [0]), [(3, 4), (4, 2)]),
]


@pytest.mark.parametrize("dims,shapes", TENSORDOT, ids=str)
def test_tensordot(dims, shapes):
    check(
        lambda a, b: ember.tensordot(a, b, dims=dims),
        lambda a, b: torch.tensordot(a, b, dims=dims),
        shapes,
    )


def test_bilinear():
    check(ember.bilinear, torch.nn.functional.bilinear, [(4, 3), (4, 2), (5, 3, 2), (5,)])


def _spd(a):
    mod = ember if isinstance(a, ember.Tensor) else torch
    return a @ a.mT + 3 * mod.eye(a.shape[-1], dtype=a.dtype, device=a.device)


LINALG = [
    ("det", [(2, 3, 3)], None),
    ("inv", [(2, 3, 3)], None),
    ("solve", [(2, 3, 3), (2, 3, 2)], None),
    ("solve", [(3, 3), (3,)], None),
    ("cholesky", [(2, 3, 3)], _spd),
]


@pytest.mark.parametrize("name,shapes,prep", LINALG, ids=[f"{n}{s}" for n, s, _ in LINALG])
def test_linalg_namespace(name, shapes, prep):
    prep = prep or (lambda a: a)
    e, t = getattr(ember.linalg, name), getattr(torch.linalg, name)
    check(lambda a, *r: e(prep(a), *r), lambda a, *r: t(prep(a), *r), shapes)
    gradcheck(lambda a, *r: e(prep(a), *r), shapes)


def test_linalg_extras():
    check(ember.det, torch.det, [(3, 3)])
    check(ember.inverse, torch.inverse, [(2, 3, 3)])
    a = ember.randn(4, 3)
    q, r = ember.linalg.qr(a)
    tq, tr = torch.linalg.qr(torch.from_numpy(a.numpy()))
    np.testing.assert_allclose(np.abs(q.numpy()), np.abs(tq.numpy()), atol=1e-5)
    np.testing.assert_allclose((q @ r).numpy(), a.numpy(), atol=1e-5)
    assert ember.linalg.matmul is ember.matmul
    with pytest.raises(ShapeError):
        ember.linalg.inv(ember.ones(2, 3))
    with pytest.raises(ValueError):
        ember.linalg.cholesky(-ember.eye(3))


def test_meta_does_no_compute():
    """Shapes far too large for memory: any real compute on meta would raise MemoryError."""
    a = ember.empty(4096, 8192, 8192, device="meta")
    w = ember.empty(16384, 8192, device="meta")
    assert tuple((a @ w.mT).shape) == (4096, 8192, 16384)
    assert tuple(ember.linear(a, w, ember.empty(16384, device="meta")).shape) == (4096, 8192, 16384)
    assert tuple(ember.einsum("bij,bkj->bik", a, a).shape) == (4096, 8192, 8192)
    assert tuple(ember.tensordot(a, w, dims=([2], [1])).shape) == (4096, 8192, 16384)
    assert tuple(ember.bmm(a, a).shape) == (4096, 8192, 8192)
    assert tuple(ember.linalg.inv(a).shape) == (4096, 8192, 8192)
    assert tuple(ember.linalg.det(a).shape) == (4096,)
    v = ember.empty(1 << 40, 3, device="meta")
    assert tuple(ember.cross(v, v).shape) == (1 << 40, 3)


@pytest.mark.parametrize("shape", [(3,), (1, 3), (2, 5, 3)], ids=str)
def test_linear_with_real_qtensor(shape):
    from ember.quant.qtensor import QTensor

    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    q = QTensor.from_float(w, "Q8_0")
    x = ember.from_numpy(rng.standard_normal(shape[:-1] + (64,)).astype(np.float32))
    b = ember.from_numpy(rng.standard_normal(8).astype(np.float32))
    ref = ember.linear(x, ember.from_numpy(q.dequantize()), b)
    out = ember.linear(x, q, b)
    assert tuple(out.shape) == shape[:-1] + (8,)
    # within the int8 step of x (EMBER_QUANT_DOT), against the scale of the terms
    terms = np.abs(x.numpy()) @ np.abs(q.dequantize()).T
    assert (np.abs(out.numpy() - ref.numpy()) <= 0.01 * terms + 1e-5).all()


def test_einsum_result_never_aliases_its_input():
    a = ember.randn(3, 3)
    for eq in ("ij->ji", "ii->i", "ij"):
        ember.einsum(eq, a).zero_()
        assert a.abs().sum().item() > 0, eq
