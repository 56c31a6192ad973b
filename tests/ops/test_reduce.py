import math

import numpy as np
import pytest
import torch

import ember
from ember.errors import DTypeError, EmberError, ShapeError, UnsupportedError
from tests.helpers import FLOATS, check, gradcheck

LOW = (ember.float16, ember.bfloat16)
ALL_FLOATS = FLOATS + LOW
INTS = (ember.int64, ember.int32, ember.int16, ember.int8, ember.uint8)
BOOL = (ember.bool,)
F32 = (ember.float32,)
AF, F, I, B = ALL_FLOATS, FLOATS, INTS, BOOL
INF, NAN = math.inf, math.nan


def M(fn, name="op"):
    """One function for both libraries: fn(module, *tensors) with module = torch or ember."""

    def f(*xs):
        return fn(torch if isinstance(xs[0], torch.Tensor) else ember, *xs)

    f.__name__ = name
    return f


# (id, fn(m, x...), shapes, dtypes, extra check() kwargs)
CASES = [
    # sum
    ("sum_all", lambda m, x: m.sum(x), [(3, 5)], AF + I + B, {}),
    ("sum_dim", lambda m, x: x.sum(1), [(3, 5)], AF + I + B, {}),
    ("sum_neg_keep", lambda m, x: x.sum(-1, keepdim=True), [(2, 3, 4)], F, {}),
    ("sum_tuple", lambda m, x: m.sum(x, (0, -1)), [(2, 3, 4)], F + I, {}),
    ("sum_empty_tuple", lambda m, x: m.sum(x, ()), [(2, 3)], F, {}),
    ("sum_none_keep", lambda m, x: m.sum(x, None, keepdim=True), [(2, 3)], F, {}),
    ("sum_0d", lambda m, x: x.sum(0), [()], F + I, {}),
    ("sum_empty", lambda m, x: x.sum(0), [(0, 4)], F + I, {}),
    ("sum_empty_all", lambda m, x: x.sum(), [(0, 4)], F, {}),
    ("sum_dtype", lambda m, x: m.sum(x, 1, dtype=m.float64), [(3, 4)], F32 + (ember.int32,), {}),
    ("sum_dtype_int", lambda m, x: m.sum(x, dtype=m.int32), [(3, 4)], F32, {"grad": False}),
    # mean / nansum / nanmean
    ("mean_all", lambda m, x: x.mean(), [(3, 5)], AF, {}),
    ("mean_tuple_keep", lambda m, x: x.mean((0, 2), keepdim=True), [(2, 3, 4)], AF, {}),
    ("mean_0d", lambda m, x: x.mean(), [()], F, {}),
    ("mean_empty", lambda m, x: x.mean(0), [(0, 3)], F, {}),
    ("mean_int_dtype", lambda m, x: m.mean(x, 1, dtype=m.float32), [(3, 4)], I, {}),
    ("nansum", lambda m, x: m.nansum(m.log(x), 1), [(4, 5)], AF, {"low": -1}),
    ("nansum_all", lambda m, x: m.nansum(m.log(x)), [(4, 5)], F, {"low": -1}),
    ("nansum_int", lambda m, x: m.nansum(x, 0), [(4, 5)], I + B, {}),
    ("nanmean", lambda m, x: m.nanmean(m.log(x), (0, 1)), [(4, 5)], AF, {"low": -1}),
    ("nanmean_keep", lambda m, x: m.nanmean(m.log(x), 0, True), [(4, 5)], F, {"low": -1}),
    # prod
    ("prod_all", lambda m, x: x.prod(), [(3, 4)], AF + I + B, {}),
    ("prod_dim", lambda m, x: x.prod(-1, keepdim=True), [(3, 4)], AF + I, {}),
    ("prod_dtype", lambda m, x: m.prod(x, 0, dtype=m.float64), [(3, 4)], F32, {}),
    ("prod_0d", lambda m, x: m.prod(x, 0), [()], F, {}),
    ("prod_empty", lambda m, x: m.prod(x, 0), [(0, 3)], F + I, {}),
    # max / min / amax / amin / aminmax / arg*
    ("max_all", lambda m, x: x.max(), [(3, 5)], AF + I + B, {}),
    ("min_all", lambda m, x: x.min(), [(3, 5)], AF + I, {}),
    ("max_dim", lambda m, x: m.max(x, 1), [(3, 5)], AF + I, {}),
    ("max_dim_keep", lambda m, x: x.max(-2, keepdim=True), [(2, 3, 4)], F, {}),
    ("min_dim", lambda m, x: m.min(x, 0), [(3, 5)], AF + I, {}),
    ("max_0d", lambda m, x: m.max(x, 0), [()], F, {}),
    ("max_empty_other_dim", lambda m, x: m.max(x, 1), [(0, 3)], F, {}),
    ("maximum", lambda m, x, y: m.max(x, y), [(3, 4), (4,)], F, {}),
    ("minimum", lambda m, x, y: x.min(y), [(3, 4), (3, 1)], F, {}),
    ("amax", lambda m, x: x.amax(), [(3, 5)], AF + I + B, {}),
    ("amax_tuple", lambda m, x: m.amax(x, (0, 2), keepdim=True), [(2, 3, 4)], AF, {}),
    ("amin_dim", lambda m, x: m.amin(x, -1), [(3, 5)], AF + I, {}),
    ("amin_empty_other", lambda m, x: m.amin(x, 1), [(0, 3)], F, {}),
    ("aminmax", lambda m, x: m.aminmax(x), [(3, 5)], F + I, {}),
    ("aminmax_dim", lambda m, x: m.aminmax(x, dim=1, keepdim=True), [(3, 5)], F, {}),
    ("argmax", lambda m, x: x.argmax(), [(3, 5)], AF + I, {"grad": False}),
    ("argmax_dim", lambda m, x: m.argmax(x, 1, keepdim=True), [(3, 5)], AF + I, {}),
    ("argmax_none_keep", lambda m, x: m.argmax(x, keepdim=True), [(3, 5)], F, {}),
    ("argmin_dim", lambda m, x: m.argmin(x, -1), [(2, 3, 4)], F + I, {}),
    ("argmin_0d", lambda m, x: m.argmin(x, 0), [()], F, {}),
    ("argmin_empty_other", lambda m, x: m.argmin(x, 1), [(0, 3)], F, {}),
    # median / nanmedian / mode
    ("median_all", lambda m, x: x.median(), [(3, 5)], AF + I, {}),
    ("median_even", lambda m, x: x.median(), [(4,)], F, {}),
    ("median_dim", lambda m, x: m.median(x, 1), [(3, 6)], AF, {}),
    ("median_dim_keep", lambda m, x: m.median(x, 0, keepdim=True), [(5, 3)], F, {}),
    ("median_0d", lambda m, x: m.median(x, 0), [()], F, {}),
    ("median_empty", lambda m, x: m.median(x), [(0,)], F, {}),
    ("median_nan", lambda m, x: m.median(m.log(x), 1), [(3, 6)], F, {"low": -0.5}),
    ("nanmedian", lambda m, x: m.nanmedian(m.log(x), 1), [(4, 6)], F, {"low": -0.5}),
    ("nanmedian_all", lambda m, x: m.nanmedian(m.log(x)), [(4, 6)], F, {"low": -0.5}),
    ("mode", lambda m, x: m.mode(x, 1), [(3, 8)], I, {}),
    ("mode_float", lambda m, x: m.mode(m.round(x), 0, True), [(9, 3)], F, {}),
    ("mode_default", lambda m, x: x.mode(), [(2, 7)], F, {}),
    # var / std
    ("var_all", lambda m, x: x.var(), [(3, 5)], AF, {}),
    ("var_dim", lambda m, x: m.var(x, 1), [(3, 5)], AF, {}),
    ("var_tuple_keep", lambda m, x: m.var(x, (0, 2), keepdim=True), [(2, 3, 4)], F, {}),
    ("var_correction0", lambda m, x: m.var(x, -1, correction=0), [(3, 5)], F, {}),
    ("var_correction2", lambda m, x: m.var(x, 0, correction=2), [(4, 3)], F, {}),
    ("var_unbiased_pos", lambda m, x: m.var(x, 1, False, True), [(3, 5)], F, {}),
    ("var_unbiased_only", lambda m, x: m.var(x, False), [(3, 5)], F, {}),
    ("var_empty", lambda m, x: m.var(x, 0), [(0, 3)], F, {}),
    ("std_all", lambda m, x: x.std(), [(3, 5)], AF, {}),
    ("std_dim", lambda m, x: m.std(x, (0, 1), unbiased=False), [(3, 5)], F, {}),
    ("std_keep", lambda m, x: x.std(1, keepdim=True, correction=0), [(3, 5)], F, {}),
    ("var_mean", lambda m, x: m.var_mean(x, 1), [(3, 5)], F, {}),
    ("var_mean_all", lambda m, x: m.var_mean(x, correction=0), [(3, 5)], F, {}),
    ("std_mean", lambda m, x: m.std_mean(x, (0, 1), keepdim=True), [(3, 5)], AF, {}),
    # logsumexp
    ("logsumexp", lambda m, x: m.logsumexp(x, 1), [(3, 5)], AF, {}),
    ("logsumexp_tuple", lambda m, x: x.logsumexp((0, 2), keepdim=True), [(2, 3, 4)], F, {}),
    ("logsumexp_big", lambda m, x: m.logsumexp(x, -1), [(3, 5)], F, {"low": 80, "high": 800}),
    ("logsumexp_small", lambda m, x: m.logsumexp(x, -1), [(3, 5)], F, {"low": -800, "high": -80}),
    ("logsumexp_int", lambda m, x: m.logsumexp(x, 0), [(3, 5)], I, {}),
    ("logsumexp_0d", lambda m, x: m.logsumexp(x, 0), [()], F, {}),
    ("logsumexp_empty", lambda m, x: m.logsumexp(x, 0), [(0, 3)], F, {}),
    # softmax / log_softmax
    ("softmax_last", lambda m, x: m.softmax(x, -1), [(3, 7)], AF, {}),
    ("softmax_first", lambda m, x: m.softmax(x, 0), [(3, 4, 5)], AF, {}),
    ("softmax_mid", lambda m, x: x.softmax(1), [(2, 3, 4)], F, {}),
    ("softmax_big", lambda m, x: m.softmax(x, -1), [(3, 5)], F, {"low": 80, "high": 800}),
    ("softmax_dtype", lambda m, x: m.softmax(x, -1, dtype=m.float64), [(3, 5)], F32, {}),
    ("softmax_int_dtype", lambda m, x: m.softmax(x, 0, dtype=m.float32), [(3, 5)], I, {}),
    ("softmax_0d", lambda m, x: m.softmax(x, 0), [()], F, {}),
    ("softmax_empty", lambda m, x: m.softmax(x, 1), [(0, 3)], F, {}),
    ("log_softmax_last", lambda m, x: m.log_softmax(x, -1), [(3, 7)], AF, {}),
    ("log_softmax_first", lambda m, x: x.log_softmax(0), [(3, 4, 2)], AF, {}),
    ("log_softmax_big", lambda m, x: m.log_softmax(x, 1), [(3, 5)], F, {"low": -800, "high": 800}),
    ("log_softmax_dtype", lambda m, x: m.log_softmax(x, 0, dtype=m.float64), [(3, 5)], LOW, {}),
    ("log_softmax_0d", lambda m, x: m.log_softmax(x, -1), [()], F, {}),
    # cumsum / cumprod
    ("cumsum", lambda m, x: m.cumsum(x, 1), [(3, 5)], AF + I + B, {}),
    ("cumsum_neg", lambda m, x: x.cumsum(-3), [(2, 3, 4)], F, {}),
    (
        "cumsum_dtype",
        lambda m, x: m.cumsum(x, 0, dtype=m.float64),
        [(3, 4)],
        F32 + (ember.int32,),
        {},
    ),
    ("cumsum_0d", lambda m, x: m.cumsum(x, 0), [()], F + I, {}),
    ("cumsum_empty", lambda m, x: m.cumsum(x, 0), [(0, 3)], F, {}),
    ("cumprod", lambda m, x: m.cumprod(x, 1), [(3, 5)], F + I, {}),
    ("cumprod_low", lambda m, x: m.cumprod(x, 1), [(3, 5)], LOW, {}),
    ("cumprod_first", lambda m, x: x.cumprod(0), [(4, 3)], F, {}),
    ("cumprod_0d", lambda m, x: m.cumprod(x, 0), [()], F, {}),
    # all / any / count_nonzero
    ("all", lambda m, x: m.all(m.round(x)), [(3, 5)], AF, {}),
    ("all_int", lambda m, x: m.all(x), [(3, 5)], I + B, {"positive": True}),
    ("all_dim", lambda m, x: m.all(x, 1), [(3, 5)], I + B, {}),
    ("all_tuple_keep", lambda m, x: m.all(x, (0, 1), keepdim=True), [(3, 2)], B, {}),
    ("any", lambda m, x: x.any(), [(3, 5)], AF + I + B, {}),
    ("any_dim", lambda m, x: m.any(m.round(x), -1), [(3, 5)], F, {}),
    ("all_empty", lambda m, x: (m.all(x), m.any(x), m.all(x, 0)), [(0, 3)], B + F, {}),
    ("count_nonzero", lambda m, x: m.count_nonzero(m.round(x)), [(3, 5)], AF, {}),
    ("count_nonzero_dim", lambda m, x: m.count_nonzero(x, (0, 1)), [(2, 3, 4)], I + B, {}),
    ("count_nonzero_0d", lambda m, x: m.count_nonzero(x), [()], I, {}),
    # norm
    ("norm", lambda m, x: x.norm(), [(3, 5)], AF, {}),
    ("norm_fro_dim", lambda m, x: m.norm(x, "fro", (0, 1)), [(2, 3, 4)], F, {}),
    ("norm_2_dim_keep", lambda m, x: m.norm(x, 2, -1, keepdim=True), [(3, 5)], AF, {}),
    ("norm_1", lambda m, x: m.norm(x, 1, 0), [(3, 5)], F, {}),
    ("norm_inf", lambda m, x: m.norm(x, INF, 1), [(3, 5)], F, {}),
    ("norm_ninf", lambda m, x: m.norm(x, -INF), [(3, 5)], F, {}),
    ("norm_0", lambda m, x: m.norm(m.round(x), 0, 1), [(3, 5)], F, {}),
    ("norm_3", lambda m, x: m.norm(x, 3, 1), [(3, 5)], F, {}),
    ("norm_1_5", lambda m, x: m.norm(x, 1.5), [(3, 5)], F, {}),
    ("norm_0_5", lambda m, x: m.norm(x, 0.5, 0), [(3, 5)], F, {}),
    ("norm_neg1", lambda m, x: m.norm(x, -1, 1), [(3, 5)], F, {}),
    ("norm_dtype", lambda m, x: m.norm(x, dtype=m.float64), [(3, 5)], F32 + (ember.float16,), {}),
    ("norm_0d", lambda m, x: m.norm(x), [()], F, {}),
    ("norm_empty", lambda m, x: m.norm(x, 2, 0), [(0, 3)], F, {}),
]


@pytest.mark.parametrize("name,fn,shapes,dtypes,kw", CASES, ids=[c[0] for c in CASES])
def test_vs_torch(name, fn, shapes, dtypes, kw):
    check(M(fn, name), None, shapes, dtypes=dtypes, **kw)


GRADS = [
    ("sum", lambda x: ember.sum(x, (0, 2)), [(2, 3, 2)], {}),
    ("mean", lambda x: x.mean(1, keepdim=True), [(3, 4)], {}),
    ("nansum", lambda x: ember.nansum(x, 0), [(3, 4)], {}),
    ("nanmean", lambda x: ember.nanmean(x), [(3, 4)], {}),
    ("prod", lambda x: ember.prod(x, 1), [(3, 4)], {}),
    ("prod_all", lambda x: ember.prod(x), [(2, 3)], {}),
    ("max", lambda x: x.max(), [(3, 4)], {}),
    ("max_dim", lambda x: ember.max(x, 1), [(3, 4)], {}),
    ("min_dim", lambda x: ember.min(x, 0, keepdim=True), [(3, 4)], {}),
    ("amax", lambda x: ember.amax(x, (0, 1)), [(3, 4, 2)], {}),
    ("amin", lambda x: ember.amin(x, -1), [(3, 4)], {}),
    ("aminmax", lambda x: ember.aminmax(x, dim=0), [(3, 4)], {}),
    ("median", lambda x: x.median(), [(3, 5)], {}),
    ("median_dim", lambda x: ember.median(x, 1), [(3, 4)], {}),
    ("nanmedian_dim", lambda x: ember.nanmedian(x, 0), [(3, 4)], {}),
    ("mode", lambda x: ember.mode(x, 1), [(3, 4)], {}),
    ("var", lambda x: ember.var(x, 1), [(3, 4)], {}),
    ("var_c0", lambda x: ember.var(x, correction=0), [(3, 4)], {}),
    ("std", lambda x: ember.std(x, (0, 1), keepdim=True), [(3, 4)], {}),
    ("var_mean", lambda x: ember.var_mean(x, 1)[1], [(3, 4)], {}),
    ("std_mean", lambda x: ember.std_mean(x, 0)[0], [(3, 4)], {}),
    ("logsumexp", lambda x: ember.logsumexp(x, 1), [(3, 4)], {}),
    ("softmax", lambda x: ember.softmax(x, -1), [(3, 4)], {}),
    ("softmax0", lambda x: ember.softmax(x, 0), [(3, 4)], {}),
    ("log_softmax", lambda x: ember.log_softmax(x, 1), [(3, 4)], {}),
    ("cumsum", lambda x: ember.cumsum(x, 1), [(3, 4)], {}),
    ("cumprod", lambda x: ember.cumprod(x, 0), [(4, 3)], {}),
    ("norm2", lambda x: ember.norm(x, dim=1), [(3, 4)], {}),
    ("norm1", lambda x: ember.norm(x, 1), [(3, 4)], {}),
    ("norm_inf", lambda x: ember.norm(x, INF, 0), [(3, 4)], {}),
    ("norm3", lambda x: ember.norm(x, 3, 1), [(3, 4)], {}),
    ("norm_0_5", lambda x: ember.norm(x, 0.5), [(3, 4)], {}),
]


@pytest.mark.parametrize("name,fn,shapes,kw", GRADS, ids=[g[0] for g in GRADS])
def test_gradcheck(name, fn, shapes, kw):
    gradcheck(fn, shapes, **kw)


def _grads(fn, values, weight_seed=1):
    """Value and gradient of fn under ember and torch for one float64 input with given values."""
    a = np.array(values, np.float64)
    w = None
    res = []
    for m in (ember, torch):
        x = (ember.tensor if m is ember else torch.tensor)(a.copy(), dtype=m.float64)
        x.requires_grad_(True)
        out = fn(m, x)
        out = out[0] if isinstance(out, tuple) else out
        if w is None:
            w = np.random.default_rng(weight_seed).standard_normal(tuple(out.shape))
        if out.requires_grad:
            (out * (ember.tensor if m is ember else torch.tensor)(w)).sum().backward()
        res.append(
            (out.detach().numpy().copy(), x.grad.numpy().copy() if x.grad is not None else None)
        )
    (eo, eg), (to, tg) = res
    np.testing.assert_allclose(eo, to, rtol=1e-12, atol=1e-12)
    if eg is not None or tg is not None:
        np.testing.assert_allclose(
            eg, tg if tg is not None else np.zeros_like(a), rtol=1e-12, atol=1e-12
        )


SPECIAL = [
    ("prod_one_zero", lambda m, x: m.prod(x, 1), [[2.0, 0.0, 3.0], [1.0, 2.0, 3.0]]),
    ("prod_two_zeros", lambda m, x: m.prod(x, 1), [[0.0, 0.0, 3.0], [0.0, 2.0, 0.0]]),
    ("prod_all_zero", lambda m, x: m.prod(x), [[0.5, 0.0], [3.0, -1.0]]),
    (
        "cumprod_zeros",
        lambda m, x: m.cumprod(x, 1),
        [[2.0, 0.0, 3.0, 0.0, 5.0], [0.0, 1.0, 2.0, 3.0, 4.0]],
    ),
    ("cumprod_zeros_dim0", lambda m, x: m.cumprod(x, 0), [[2.0, 1.0], [0.0, 3.0], [4.0, 0.0]]),
    ("max_ties", lambda m, x: m.max(x), [1.0, 3.0, 3.0, 2.0]),
    ("max_dim_ties", lambda m, x: m.max(x, 1), [[1.0, 3.0, 3.0], [2.0, 2.0, 1.0]]),
    ("min_dim_ties", lambda m, x: m.min(x, 0), [[1.0, 3.0], [1.0, 3.0]]),
    ("amax_ties", lambda m, x: m.amax(x, 1), [[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]]),
    ("amin_ties", lambda m, x: m.amin(x), [[1.0, 3.0, 1.0], [2.0, 1.0, 2.0]]),
    ("median_ties", lambda m, x: m.median(x), [1.0, 2.0, 2.0, 3.0]),
    ("max_nan", lambda m, x: m.max(x), [1.0, NAN, NAN]),
    ("max_dim_nan", lambda m, x: m.max(x, 0), [1.0, NAN, 3.0, NAN]),
    ("argmin_nan", lambda m, x: m.argmin(x, 0).double(), [1.0, NAN, 0.0]),
    ("norm_zero", lambda m, x: m.norm(x), [0.0, 0.0]),
    ("norm_zero_row", lambda m, x: m.norm(x, dim=1), [[0.0, 0.0], [3.0, 4.0]]),
    ("norm3_zero", lambda m, x: m.norm(x, 3), [0.0, 0.0]),
    ("norm1_zero", lambda m, x: m.norm(x, 1), [0.0, 1.0, -2.0]),
    ("norm_0_5_zero", lambda m, x: m.norm(x, 0.5), [0.0, 1.0, -2.0]),
    ("norm_1_5_zero", lambda m, x: m.norm(x, 1.5), [0.0, 1.0, -2.0]),
    ("norm_neg1_zero", lambda m, x: m.norm(x, -1), [0.0, 1.0, 3.0]),
    ("norm_inf_ties", lambda m, x: m.norm(x, INF), [-3.0, 1.0, 3.0]),
    ("norm_ninf", lambda m, x: m.norm(x, -INF), [-1.0, 1.0, 3.0]),
    ("norm0", lambda m, x: m.norm(x, 0), [0.0, 1.0, 2.0]),
    ("std_zero_var", lambda m, x: m.std(x, 1), [[1.0, 1.0, 1.0], [1.0, 2.0, 4.0]]),
    ("var_one", lambda m, x: m.var(x), [2.0]),
    ("mode_ties", lambda m, x: m.mode(x), [1.0, 2.0, 2.0, 3.0, 3.0, 1.0]),
    ("mode_last_index", lambda m, x: m.mode(x, 0).indices.double(), [3.0, 1.0, 3.0, 1.0]),
    (
        "median_nan_index",
        lambda m, x: m.median(x, 0).indices.double(),
        [1.0, NAN, 0.5, NAN],
    ),
    ("nanmedian_index", lambda m, x: m.nanmedian(x, 0), [1.0, NAN, 0.5, NAN]),
    (
        "nanmedian_all_nan",
        lambda m, x: m.nanmedian(x, 1).values,
        [[NAN, NAN], [1.0, 2.0]],
    ),
    ("logsumexp_ninf", lambda m, x: m.logsumexp(x, 1), [[-INF, -INF], [1.0, -INF]]),
    ("logsumexp_inf", lambda m, x: m.logsumexp(x, 0), [INF, 1.0]),
    ("softmax_ninf", lambda m, x: m.softmax(x, -1), [[-INF, 0.0, 1.0], [2.0, -INF, -INF]]),
    ("log_softmax_ninf", lambda m, x: m.log_softmax(x, -1), [[-INF, 0.0, 1.0]]),
    ("nansum_all_nan", lambda m, x: m.nansum(x, 1), [[NAN, NAN], [1.0, NAN]]),
    ("nanmean_all_nan", lambda m, x: m.nanmean(x, 1), [[NAN, NAN], [1.0, NAN]]),
]


@pytest.mark.parametrize("name,fn,values", SPECIAL, ids=[s[0] for s in SPECIAL])
def test_special_values(name, fn, values):
    with np.errstate(all="ignore"):
        _grads(fn, values)


def test_return_types():
    x = ember.tensor([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]])
    r = x.max(1)
    assert r.values.tolist() == [5.0, 7.0] and r.indices.tolist() == [1, 0]
    assert r.indices.dtype is ember.int64
    v, i = ember.min(x, dim=0, keepdim=True)
    assert v.shape == (1, 3) and i.tolist() == [[0, 1, 0]]
    mm = ember.aminmax(x)
    assert mm.min.item() == 0.0 and mm.max.item() == 7.0
    assert x.median(1).values.tolist() == [2.0, 3.0]
    assert x.mode(0).indices.shape == (3,)
    assert ember.max(x).shape == () and ember.argmax(x).item() == 3


def test_int_promotion_and_dtypes():
    assert ember.tensor([1, 2], dtype=ember.int32).sum().dtype is ember.int64
    assert ember.tensor([True, True]).sum().item() == 2
    assert ember.tensor([1, 2], dtype=ember.uint8).prod().dtype is ember.int64
    assert ember.tensor([1, 2], dtype=ember.int8).cumsum(0).dtype is ember.int64
    assert ember.tensor([1, 2], dtype=ember.uint8).all().dtype is ember.uint8
    x = ember.ones(4, 8, dtype=ember.float32)
    for f in (ember.softmax, ember.log_softmax, ember.cumsum):
        assert f(x, -1).dtype is ember.float32
    # an integer-valued result does not carry a gradient
    y = ember.ones(3, requires_grad=True)
    assert not ember.sum(y, dtype=ember.int64).requires_grad


def test_softmax_large_last_dim_and_views():
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((4, 3, 257)) * 30).astype(np.float32)
    e = ember.from_numpy(a)
    t = torch.from_numpy(a)
    np.testing.assert_allclose(
        ember.softmax(e, -1).numpy(), torch.softmax(t, -1).numpy(), atol=1e-6, rtol=1e-5
    )
    ev = ember.from_numpy(a.transpose(2, 0, 1))
    tv = t.permute(2, 0, 1)
    np.testing.assert_allclose(
        ember.log_softmax(ev, 0).numpy(), torch.log_softmax(tv, 0).numpy(), atol=1e-5, rtol=1e-5
    )
    assert ember.softmax(e, -1).sum(-1).numpy() == pytest.approx(1.0, abs=1e-5)
    assert a.std() > 1  # the input is untouched by the in-place work
    np.testing.assert_array_equal(a, e.numpy())


ERRORS = [
    (lambda x: x.sum(2), IndexError),
    (lambda x: x.sum((0, -2)), ShapeError),
    (lambda x: x.mean(-3), IndexError),
    (lambda x: x.amax((0, 5)), IndexError),
    (lambda x: x.max(2), IndexError),
    (lambda x: x.argmax(-3), IndexError),
    (lambda x: x.softmax(2), IndexError),
    (lambda x: x.cumsum(2), IndexError),
    (lambda x: x.var(3), IndexError),
    (lambda x: x.norm(dim=4), IndexError),
    (lambda x: x.all(2), IndexError),
    (lambda x: x.median(2), IndexError),
    (lambda x: x.sum(1.5), TypeError),
    (lambda x: ember.softmax(x, None), TypeError),
    (lambda x: ember.norm(x, "nuc"), UnsupportedError),
    (lambda x: ember.norm(x, "bad"), ValueError),
    (lambda x: ember.var(x, unbiased=True, correction=1), ValueError),
    (lambda x: ember.aminmax(x, dim=(0, 1)), TypeError),
    (lambda x: x.long().mean(), DTypeError),
    (lambda x: x.long().nanmean(), DTypeError),
    (lambda x: x.int().var(), DTypeError),
    (lambda x: x.int().std(0), DTypeError),
    (lambda x: x.long().norm(), DTypeError),
    (lambda x: x.long().softmax(0), DTypeError),
    (lambda x: x.long().log_softmax(0), DTypeError),
    (lambda x: x.bool().argmax(), DTypeError),
]


@pytest.mark.parametrize("i", range(len(ERRORS)))
def test_errors(i):
    fn, exc = ERRORS[i]
    with pytest.raises(exc):
        fn(ember.ones(2, 3))


EMPTY = [
    lambda x: x.max(),
    lambda x: x.min(),
    lambda x: x.max(0),
    lambda x: x.amax(),
    lambda x: x.amin(0),
    lambda x: x.argmax(),
    lambda x: x.argmin(0),
    lambda x: ember.aminmax(x),
    lambda x: x.median(0),
    lambda x: x.mode(0),
    lambda x: x.norm(INF),
    lambda x: x.norm(-INF, 0),
]


@pytest.mark.parametrize("i", range(len(EMPTY)))
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_empty_without_identity(i, device):
    x = ember.ones(0, 3, device=device)
    with pytest.raises(ShapeError, match="no identity") as ei:
        EMPTY[i](x)
    assert isinstance(ei.value, EmberError)


def test_meta_large_is_shape_only():
    x = ember.ones(1 << 20, 1 << 12, device="meta")
    assert x.sum(1).shape == (1 << 20,) and x.sum(1).device == "meta"
    assert x.softmax(-1).shape == x.shape
    r = x.max(0)
    assert r.values.shape == (1 << 12,) and r.indices.dtype is ember.int64
    assert x.var((0, 1), keepdim=True).shape == (1, 1)
    assert x.argmax().shape == () and x.norm(dim=0).shape == (1 << 12,)
    assert x.cumsum(0).shape == x.shape and x.all().dtype is ember.bool


def test_backward_through_chain():
    """A softmax-attention-like chain: grads match torch end to end."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 5, 6))
    e = ember.from_numpy(a.copy()).requires_grad_()
    t = torch.from_numpy(a.copy()).requires_grad_()
    for m, x in ((ember, e), (torch, t)):
        s = m.softmax(x, -1)
        out = (s * x).sum(-1).logsumexp(-1) + x.var(1).amax(-1) + m.norm(x, dim=(1, 2))
        out.sum().backward()
    np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), rtol=1e-10, atol=1e-10)
