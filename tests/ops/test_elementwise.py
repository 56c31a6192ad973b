import math

import numpy as np
import pytest
import torch

import ember
from tests.helpers import FLOATS, LOW, check, gradcheck

ALL_FLOATS = (ember.float32, ember.float64, ember.float16, ember.bfloat16)
INTS = (ember.int64, ember.int32, ember.int16, ember.int8, ember.uint8)

UNARY = [
    ("neg", {}, ALL_FLOATS + INTS),
    ("abs", {}, ALL_FLOATS + INTS),
    ("sign", {}, FLOATS + INTS),
    ("exp", {}, ALL_FLOATS),
    ("exp2", {}, FLOATS),
    ("log", {"positive": True}, ALL_FLOATS),
    ("log2", {"positive": True}, FLOATS),
    ("log10", {"positive": True}, FLOATS),
    ("log1p", {"positive": True}, FLOATS),
    ("expm1", {}, FLOATS),
    ("sqrt", {"positive": True}, ALL_FLOATS),
    ("rsqrt", {"positive": True}, FLOATS),
    ("reciprocal", {"positive": True}, FLOATS),
    ("square", {}, FLOATS),
    ("sin", {}, FLOATS),
    ("cos", {}, FLOATS),
    ("tan", {"low": -1.0, "high": 1.0}, FLOATS),
    ("asin", {"low": -0.9, "high": 0.9}, FLOATS),
    ("acos", {"low": -0.9, "high": 0.9}, FLOATS),
    ("atan", {}, FLOATS),
    ("sinh", {}, FLOATS),
    ("cosh", {}, FLOATS),
    ("tanh", {}, ALL_FLOATS),
    ("sigmoid", {}, ALL_FLOATS),
    ("relu", {}, ALL_FLOATS + INTS),
    ("silu", {}, ALL_FLOATS),
    ("erf", {}, FLOATS),
    ("floor", {}, FLOATS),
    ("ceil", {}, FLOATS),
    ("trunc", {}, FLOATS),
    ("frac", {}, FLOATS),
    ("round", {}, FLOATS),
]


@pytest.mark.parametrize("name,kw,dtypes", UNARY, ids=[u[0] for u in UNARY])
@pytest.mark.parametrize("shape", [(3, 5), (), (0, 4), (2, 1, 3)])
def test_unary(name, kw, dtypes, shape):
    tfn = getattr(torch, name, None) or getattr(torch.nn.functional, name)
    check(getattr(ember, name), tfn, [shape], dtypes=dtypes, **kw)


@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "sigmoid", "tanh", "erf", "rsqrt"])
def test_unary_int_input_promotes_to_float(name):
    tfn = getattr(torch, name, None) or getattr(torch.nn.functional, name)
    check(getattr(ember, name), tfn, [(4,)], dtypes=(ember.int64, ember.bool), positive=True)


ACT = [
    (lambda x: ember.gelu(x), lambda x: torch.nn.functional.gelu(x)),
    (
        lambda x: ember.gelu(x, approximate="tanh"),
        lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    ),
    (
        lambda x: ember.softplus(x, beta=2.0, threshold=3.0),
        lambda x: torch.nn.functional.softplus(x, 2.0, 3.0),
    ),
    (lambda x: ember.leaky_relu(x, 0.1), lambda x: torch.nn.functional.leaky_relu(x, 0.1)),
    (lambda x: ember.elu(x, 0.7), lambda x: torch.nn.functional.elu(x, 0.7)),
    (ember.hardswish, torch.nn.functional.hardswish),
    (ember.mish, torch.nn.functional.mish),
    (ember.relu6, torch.nn.functional.relu6),
    (lambda x: ember.clamp(x, -0.5, 0.7), lambda x: torch.clamp(x, -0.5, 0.7)),
    (lambda x: ember.clamp(x, min=0.1), lambda x: torch.clamp(x, min=0.1)),
    (lambda x: ember.round(x, decimals=1), lambda x: torch.round(x, decimals=1)),
]


def test_hardsigmoid():
    # torch computes the 1/6 slope of the float64 backward in float32, so compare f32 only
    check(
        ember.hardsigmoid,
        torch.nn.functional.hardsigmoid,
        [(4, 7)],
        low=-5,
        high=5,
        dtypes=(ember.float32,),
    )
    gradcheck(ember.hardsigmoid, [(3, 4)], low=-5, high=5)


@pytest.mark.parametrize("i", range(len(ACT)))
def test_activations(i):
    e, t = ACT[i]
    check(e, t, [(4, 7)], low=-5, high=5, dtypes=ALL_FLOATS)
    gradcheck(e, [(3, 4)], low=-5, high=5)


_SPECIALS = [0.0, -0.0, 1e-30, -1e-38, 3.9, 4.0, 4.1, -5.0, 1e30, -1e30, np.inf, -np.inf, np.nan]


def _erf_gelu_inputs(rng) -> list[np.ndarray]:
    """float32 arrays of awkward shapes: wide range, special values, 0-d, empty, non-contiguous."""
    big = np.concatenate([rng.standard_normal(3001) * 3, rng.uniform(-12, 12, 3001), _SPECIALS])
    big = rng.permutation(big).astype(np.float32)
    strided = (rng.standard_normal((5, 2, 67)) * 4).astype(np.float32).transpose(2, 0, 1)[::2]
    return [big, big.reshape(1, 15, 401), strided, np.full((), 0.7, np.float32), np.zeros((0, 3))]


@pytest.mark.parametrize("kernels", ["numba", "numpy"])
def test_erf_gelu_float32_accuracy(kernels, monkeypatch):
    from ember.kernels.cpu import special

    if kernels == "numpy":  # the ops' numpy forwards (EMBER_KERNELS=reference, no numba)
        monkeypatch.setattr(ember.config, "KERNELS", "reference")
    rng = np.random.default_rng(3)
    with np.errstate(invalid="ignore"):  # inf * 0 and nan in the references
        _check_erf_gelu_f32(special, _erf_gelu_inputs(rng))


def _check_erf_gelu_f32(special, inputs: list[np.ndarray]) -> None:
    """ember.erf / ember.gelu on float32 arrays against math.erf (float64) and torch."""
    for a in inputs:
        a = a.astype(np.float32, copy=False)
        x, t = ember.from_numpy(a), torch.from_numpy(np.ascontiguousarray(a))
        exact = special.erf_reference(a.astype(np.float64))
        y = ember.erf(x).numpy()
        assert y.dtype == np.float32 and y.shape == a.shape
        np.testing.assert_allclose(y, torch.erf(t).numpy(), atol=1e-6, rtol=0)
        np.testing.assert_allclose(y, exact, atol=5e-7, rtol=0)  # a few float32 ulps of 1
        g = ember.gelu(x).numpy()
        assert g.dtype == np.float32 and g.shape == a.shape
        # |error| <= 1.4e-6 near |x| = 4 (erf's error times |x| / 2), as torch's own (1.2e-6)
        want = special.gelu_reference(a.astype(np.float64))
        np.testing.assert_allclose(g, want, atol=1.5e-6, rtol=3e-7)
        # torch's gelu gives nan at +inf (and inf at 3e38); the limit, and math.erf, give +inf
        tg = torch.nn.functional.gelu(t).numpy()
        tg = np.where(np.isposinf(a), np.inf, tg)
        np.testing.assert_allclose(g, tg, atol=2.5e-6, rtol=3e-7)
        # the ops' numpy forwards: the same float32 formula as the kernels
        np.testing.assert_allclose(special.erf_numpy(a), y, atol=1e-7, rtol=0)
        np.testing.assert_allclose(special.gelu_numpy(a), g, atol=1e-6, rtol=1e-7)


def test_erf_gelu_float64_stay_exact():
    from ember.kernels.cpu import special

    a = np.random.default_rng(4).uniform(-6, 6, (17, 19))
    a[0, :4] = [np.inf, -np.inf, np.nan, 0.0]
    x, t = ember.from_numpy(a), torch.from_numpy(a)
    np.testing.assert_allclose(ember.erf(x).numpy(), torch.erf(t).numpy(), atol=1e-15, rtol=0)
    np.testing.assert_array_equal(ember.erf(x).numpy(), special.erf_reference(a))
    np.testing.assert_allclose(
        ember.gelu(x).numpy(), torch.nn.functional.gelu(t).numpy(), atol=1e-14, rtol=1e-15
    )


BINARY = [
    (lambda a, b: a + b, None),
    (lambda a, b: a - b, None),
    (lambda a, b: a * b, None),
    (lambda a, b: a / b, None),
    (lambda a, b: ember.add(a, b, alpha=2), lambda a, b: torch.add(a, b, alpha=2)),
    (lambda a, b: ember.sub(a, b, alpha=3), lambda a, b: torch.sub(a, b, alpha=3)),
    (ember.maximum, torch.maximum),
    (ember.minimum, torch.minimum),
    (ember.atan2, torch.atan2),
]
SHAPES = [
    [(3, 4), (3, 4)],
    [(3, 1), (1, 4)],
    [(2, 3, 4), (4,)],
    [(), (3,)],
    [(0, 3), (1, 3)],
    [(5,), ()],
]


@pytest.mark.parametrize("i", range(len(BINARY)))
@pytest.mark.parametrize("shapes", SHAPES)
def test_binary(i, shapes):
    e, t = BINARY[i]
    check(e, t, shapes)
    # float16/bfloat16: a broadcast input's grad sums n products already rounded to the dtype;
    # a / b keeps b off 0, where b's grad (-g * a / b**2) has terms far above O(1)
    n = max(math.prod(np.broadcast_shapes(*shapes)) // max(math.prod(s), 1) for s in shapes)
    check(e, t, shapes, dtypes=LOW, reduce=n, **({"low": 0.5} if i == 3 else {}))


def test_binary_grad_fd():
    for e, _ in BINARY:
        gradcheck(e, [(3, 1), (1, 4)])


def test_pow():
    check(lambda a, b: a**b, None, [(3, 4), (3, 4)], positive=True)
    check(lambda a: a**2, None, [(3, 4)], dtypes=ALL_FLOATS + INTS)
    check(lambda a: a**0.5, None, [(3, 4)], positive=True)
    check(lambda a: 2.0**a, None, [(3, 4)])
    check(lambda a: a ** (-1), None, [(3, 4)], positive=True)
    gradcheck(lambda a, b: a**b, [(3,), (3,)], positive=True)


@pytest.mark.parametrize("op", ["__floordiv__", "__mod__", "fmod"])
def test_int_and_float_division(op):
    def f(a, b):
        return getattr(a, op)(b) if op.startswith("__") else getattr(type(a), op)(a, b)

    rng = np.random.default_rng(0)
    for dt, _tdt in [(np.int64, torch.int64), (np.int32, torch.int32), (np.float32, torch.float32)]:
        a = rng.integers(-20, 20, (5, 6)).astype(dt)
        b = rng.choice([-7, -3, -1, 1, 2, 5], (5, 6)).astype(dt)
        r = f(ember.from_numpy(a), ember.from_numpy(b))
        tr = f(torch.from_numpy(a), torch.from_numpy(b))
        np.testing.assert_allclose(r.numpy(), tr.numpy(), rtol=1e-6)
        assert str(r.dtype).split(".")[1] == str(tr.dtype).split(".")[1]


@pytest.mark.parametrize("mode", [None, "trunc", "floor"])
def test_div_rounding_modes(mode):
    rng = np.random.default_rng(1)
    for dt in (np.int64, np.float64):
        a = rng.integers(-20, 20, (7,)).astype(dt)
        b = rng.choice([-3, -2, 2, 3], (7,)).astype(dt)
        r = ember.div(ember.from_numpy(a), ember.from_numpy(b), rounding_mode=mode)
        tr = torch.div(torch.from_numpy(a), torch.from_numpy(b), rounding_mode=mode)
        np.testing.assert_allclose(r.numpy(), tr.numpy())
        assert str(r.dtype).split(".")[1] == str(tr.dtype).split(".")[1]


def test_integer_division_by_zero_raises():
    with pytest.raises(ZeroDivisionError):
        ember.tensor([1, 2]) // ember.tensor([1, 0])


PROMO = [
    ("i64+f", lambda m: m.tensor([1, 2]) + 1.5),
    ("i32+i", lambda m: m.tensor([1, 2], dtype=m.int32) + 3),
    ("u8+i8", lambda m: m.tensor([1], dtype=m.uint8) + m.tensor([1], dtype=m.int8)),
    ("f16+bf16", lambda m: m.tensor([1.0], dtype=m.float16) + m.tensor([1.0], dtype=m.bfloat16)),
    ("f16+f", lambda m: m.tensor([1.0], dtype=m.float16) * 2.5),
    ("i64+0d_f64", lambda m: m.tensor([1, 2]) + m.tensor(1.0, dtype=m.float64)),
    ("f32+0d_f64", lambda m: m.tensor([1.0, 2]) + m.tensor(1.0, dtype=m.float64)),
    ("i8+0d_i64", lambda m: m.tensor([1], dtype=m.int8) + m.tensor(1)),
    ("bool+bool", lambda m: m.tensor([True]) + m.tensor([False])),
    ("bool+i", lambda m: m.tensor([True]) + 2),
    ("bool*f", lambda m: m.tensor([True]) * 2.0),
    ("i/i", lambda m: m.tensor([3]) / m.tensor([2])),
    ("f16+i64", lambda m: m.tensor([1.0], dtype=m.float16) + m.tensor([2])),
    ("u8+bool", lambda m: m.tensor([200], dtype=m.uint8) + m.tensor([True])),
    ("cmp", lambda m: m.tensor([1, 2]) < 1.5),
    ("where", lambda m: m.where(m.tensor([True, False]), m.tensor([1, 2]), 0.5)),
]


@pytest.mark.parametrize("name,f", PROMO, ids=[p[0] for p in PROMO])
def test_type_promotion_matches_torch(name, f):
    e, t = f(ember), f(torch)
    assert str(e.dtype).split(".")[1] == str(t.dtype).split(".")[1]
    np.testing.assert_allclose(e.float().numpy(), t.float().numpy())


def test_comparisons_and_logic():
    rng = np.random.default_rng(2)
    a, b = rng.integers(0, 3, (4, 5)), rng.integers(0, 3, (5,))
    ea, eb, ta, tb = ember.tensor(a), ember.tensor(b), torch.tensor(a), torch.tensor(b)
    for op in [
        "__eq__",
        "__ne__",
        "__lt__",
        "__le__",
        "__gt__",
        "__ge__",
        "__and__",
        "__or__",
        "__xor__",
    ]:
        assert np.array_equal(getattr(ea, op)(eb).numpy(), getattr(ta, op)(tb).numpy()), op
    for op in ["logical_and", "logical_or", "logical_xor"]:
        assert np.array_equal(
            getattr(ember, op)(ea, eb).numpy(), getattr(torch, op)(ta, tb).numpy()
        ), op
    assert np.array_equal((~(ea > 1)).numpy(), (~(ta > 1)).numpy())
    assert np.array_equal((~ea).numpy(), (~ta).numpy())
    x = ember.tensor([1.0, float("nan"), float("inf"), -float("inf")])
    assert x.isnan().tolist() == [False, True, False, False]
    assert x.isinf().tolist() == [False, False, True, True]
    assert ember.isfinite(x).tolist() == [True, False, False, False]


def test_where_grad_and_broadcast():
    check(
        lambda c, a, b: ember.where(c > 0, a, b),
        lambda c, a, b: torch.where(c > 0, a, b),
        [(3, 4), (3, 1), (4,)],
    )


def test_reflected_with_scalars():
    check(lambda a: 1 - a, None, [(3,)])
    check(lambda a: 2 / a, None, [(3,)], positive=True)
    check(lambda a: 3 * a + 1, None, [(3,)])


def test_inplace_ops_and_leaf_guard():
    x = ember.ones(3)
    x.add_(2).mul_(3)
    assert x.tolist() == [9.0, 9.0, 9.0]
    v = x[1:]
    v.zero_()
    assert x.tolist() == [9.0, 0.0, 0.0], "in-place on a view writes through"
    w = ember.ones(3, requires_grad=True)
    with pytest.raises(ember.errors.AutogradError):
        w.add_(1)
    with ember.no_grad():
        w.add_(1)
    assert w.tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(ember.errors.DTypeError):
        ember.tensor([1, 2]).add_(0.5)
    y = w * 2
    y.mul_(3)
    y.sum().backward()
    assert w.grad.tolist() == [6.0, 6.0, 6.0]
