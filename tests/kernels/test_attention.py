"""Attention kernels (kernels/cpu/attention.py) against their references, and the ops that pick
them: ``varlen_attn`` (ember.ops.attention) and ``scaled_dot_product_attention``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember
from ember.kernels import registry
from ember.kernels.cpu import attention as A
from ember.nn import functional as F
from tests.helpers import check_kernel


def _kernel(op):
    (k,) = registry.kernels(op)
    return k


def _varlen_cases(long: bool = False):
    rng = np.random.default_rng(0)
    cases = []
    lens = [[1, 8, 0, 14], [5], [3, 3, 3], [0, 2]]
    if long:
        lens = [[130, 7, 200], [150, 150], [129]]
    for n in lens:
        cu = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
        for nh, d in ((2, 8), (3, 5)):
            q, k, v = (rng.standard_normal((cu[-1], nh, d)).astype(np.float32) for _ in range(3))
            kw = {"cu_q": cu, "cu_k": cu, "scale": 0.4, "window": (-1, -1), "rep": 1}
            cases.append(((q, k, v), kw))
    # cross attention: other key lengths than query lengths
    cq, ck = np.array([0, 2, 9]), np.array([0, 5, 6])
    q = rng.standard_normal((9, 2, 4)).astype(np.float32)
    k, v = (rng.standard_normal((6, 2, 4)).astype(np.float32) for _ in range(2))
    cases.append(((q, k, v), {"cu_q": cq, "cu_k": ck, "scale": 0.5, "window": (-1, -1), "rep": 1}))
    return cases


def test_varlen_kernel():
    check_kernel(_kernel("varlen_attn"), cases=_varlen_cases(), rtol=2e-5, atol=2e-5)


def test_varlen_kernel_parallel_and_blocked(monkeypatch):
    k = _kernel("varlen_attn")
    check_kernel(k, cases=_varlen_cases(long=True), rtol=2e-5, atol=2e-5)
    monkeypatch.setattr(A, "PARALLEL_VARLEN_WORK", 1)
    check_kernel(k, cases=_varlen_cases(), rtol=2e-5, atol=2e-5)


def test_varlen_reference_matches_torch():
    (q, k, v), kw = _varlen_cases()[0]
    cu = kw["cu_q"]
    got = _kernel("varlen_attn").reference(q, k, v, **kw)
    for b in range(len(cu) - 1):
        s = slice(cu[b], cu[b + 1])
        t = [torch.from_numpy(a[s]).transpose(0, 1) for a in (q, k, v)]
        want = torch.nn.functional.scaled_dot_product_attention(*t, scale=0.4).transpose(0, 1)
        np.testing.assert_allclose(got[s], want.numpy(), atol=1e-5)


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (2, 1)])
@pytest.mark.parametrize("hk", [4, 2])
def test_varlen_op_forward_backward_vs_torch(window, hk):
    rng = np.random.default_rng(1)
    cu = np.array([0, 3, 3, 10, 11])
    t, hq, d = int(cu[-1]), 4, 8
    arrays = [rng.standard_normal((t, h, d)).astype(np.float32) for h in (hq, hk, hk)]
    q, k, v = (ember.tensor(a, requires_grad=True) for a in arrays)
    out = F.varlen_attn(q, k, v, ember.tensor(cu), cu, 11, 11, scale=0.3, window_size=window,
                        enable_gqa=True)  # fmt: skip
    g = rng.standard_normal(out.shape).astype(np.float32)
    (out * ember.tensor(g)).sum().backward()
    qt, kt, vt = (torch.tensor(a, requires_grad=True) for a in arrays)
    outs = []
    for b in range(len(cu) - 1):
        s = slice(cu[b], cu[b + 1])
        n = s.stop - s.start
        rel = np.arange(n)[None, :] - np.arange(n)[:, None]
        ok = np.ones((n, n), bool)
        if window[0] >= 0:
            ok &= rel >= -window[0]
        if window[1] >= 0:
            ok &= rel <= window[1]
        o = torch.nn.functional.scaled_dot_product_attention(
            *(a[s].transpose(0, 1) for a in (qt, kt, vt)), attn_mask=torch.from_numpy(ok),
            scale=0.3, enable_gqa=True,
        )  # fmt: skip
        outs.append(o.transpose(0, 1))
    want = torch.cat(outs)
    (want * torch.from_numpy(g)).sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), atol=1e-5)
    for a, b in ((q, qt), (k, kt), (v, vt)):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), atol=1e-5)


@pytest.mark.parametrize("grad", [False, True])
def test_varlen_op_picks_kernel_only_without_graph(grad, monkeypatch):
    calls = []
    k = _kernel("varlen_attn")
    fn = k.fn
    monkeypatch.setattr(k, "fn", lambda *a, **kw: calls.append(1) or fn(*a, **kw))
    (q, kk, v), kw = _varlen_cases()[0]
    ts = [ember.tensor(a, requires_grad=grad) for a in (q, kk, v)]
    y = F.varlen_attn(*ts, kw["cu_q"], kw["cu_k"], scale=0.4)
    assert len(calls) == (0 if grad else 1)
    np.testing.assert_allclose(y.detach().numpy(), k.reference(q, kk, v, **kw), atol=2e-5)


def test_varlen_op_errors():
    q = ember.randn(5, 2, 4)
    with pytest.raises(ember.errors.ShapeError, match="cu_seq_q"):
        F.varlen_attn(q, q, q, np.array([0, 4]))
    with pytest.raises(ember.errors.ShapeError, match="exceeds"):
        F.varlen_attn(q, q, q, np.array([0, 5]), None, 4, 4)
    with pytest.raises(ember.errors.ShapeError, match="enable_gqa"):
        F.varlen_attn(q, ember.randn(5, 1, 4), ember.randn(5, 1, 4), np.array([0, 5]))


def _sdpa_cases():
    rng = np.random.default_rng(2)
    cases = []
    for b, h, lq, s, d in ((2, 3, 9, 9, 8), (1, 2, 33, 20, 16), (2, 1, 8, 1, 4)):
        q = rng.standard_normal((b, lq, h, d)).astype(np.float32).transpose(0, 2, 1, 3)
        k, v = (rng.standard_normal((b, h, s, d)).astype(np.float32) for _ in range(2))
        kw = {"scale": 0.35, "causal": False, "rep": 1, "dropout_p": 0.0}
        cases.append(((q, k, v), kw))
        mask = rng.random((b, 1, 1, s)) > 0.3
        mask[0, ..., 0] = False
        if b > 1:
            mask[1] = False  # a batch with no key to attend to: zeros
        cases.append(((q, k, v, mask), kw))
    return cases


def test_sdpa_blocked_kernel():
    check_kernel(_kernel("scaled_dot_product_attention"), cases=_sdpa_cases(), atol=2e-5)


def test_sdpa_kernel_conditions_and_op():
    k = _kernel("scaled_dot_product_attention")
    (q, kk, v), kw = _sdpa_cases()[0]
    assert k.applies([q, kk, v], kw)
    assert not k.applies([q, kk, v], {**kw, "causal": True})
    assert not k.applies([q, kk, v], {**kw, "dropout_p": 0.1})
    assert not k.applies([q[:, :, :4], kk, v], kw)  # few queries: the reference
    assert not k.applies([q, kk, v, np.ones((9, 9), bool)], kw)  # not a key-padding mask
    assert not k.applies([q.astype(np.float64), kk, v], kw)
    for args, _kw in _sdpa_cases():
        ts = [ember.tensor(a) for a in args]
        got = F.scaled_dot_product_attention(*ts[:3], attn_mask=ts[3] if len(ts) > 3 else None,
                                             scale=0.35)  # fmt: skip
        tt = [torch.from_numpy(np.ascontiguousarray(a)) for a in args]
        want = torch.nn.functional.scaled_dot_product_attention(
            *tt[:3], attn_mask=tt[3] if len(tt) > 3 else None, scale=0.35
        )
        rows = np.isfinite(want.numpy())  # torch gives NaN where ember's safe softmax gives 0
        np.testing.assert_allclose(got.numpy()[rows], want.numpy()[rows], atol=2e-5)
