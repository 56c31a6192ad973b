"""The rope op's kernel (kernels.cpu.rope) against its numpy reference and torch, and the op."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember
from ember.kernels import registry
from ember.ops.rope import apply_rotary, apply_rotary_qk
from tests.helpers import check_kernel, gradcheck


def _tables(rng, b, t, half):
    pos = rng.integers(0, 50, (b, t))
    ang = pos[..., None] * (1.0 / 100.0 ** (np.arange(half) / half))
    return (
        np.cos(ang)[:, :, None].astype(np.float32),
        np.sin(ang)[:, :, None].astype(np.float32),
    )


def _cases():
    rng = np.random.default_rng(0)
    cases = []
    # (b, t, heads, d, half, cos batch): full, partial (odd remainder), one shared angle table
    for b, t, h, d, half, cb in [(1, 1, 1, 2, 1, 1), (2, 5, 3, 16, 8, 2), (2, 3, 4, 16, 4, 1),
                                  (1, 7, 2, 6, 3, 1), (3, 2, 5, 10, 2, 3), (2, 0, 3, 8, 4, 1)]:  # fmt: skip
        x = rng.standard_normal((b, t, h, d)).astype(np.float32)
        cos, sin = _tables(rng, cb, t, half)
        for inter in (False, True):
            cases.append(((x, cos, sin), {"interleaved": inter}))
    x = rng.standard_normal((1, 2, 2, 8)).astype(np.float32)
    x[0, 1, 0, 3], x[0, 0, 1, 6] = np.nan, np.inf  # hostile features stay in their pair
    cases.append(((x, *_tables(rng, 1, 2, 4)), {"interleaved": False}))
    return cases


def test_rope_kernel():
    (k,) = registry.kernels("rope")
    check_kernel(k, cases=_cases(), rtol=1e-6, atol=1e-6)


def test_rope_kernel_on_views_of_a_fused_projection():
    rng = np.random.default_rng(1)
    b, t, hq, hk, d = 2, 5, 6, 2, 16
    qkv = rng.standard_normal((b, t, (hq + 2 * hk) * d)).astype(np.float32)
    q = qkv[..., : hq * d].reshape(b, t, hq, d)
    k = qkv[..., hq * d : (hq + hk) * d].reshape(b, t, hk, d)
    cos, sin = _tables(rng, 1, t, 8)
    (kern,) = registry.kernels("rope")
    check_kernel(kern, cases=[((q, cos, sin), {"interleaved": False}),
                              ((k, cos, sin), {"interleaved": True})], atol=1e-6)  # fmt: skip


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_reference_matches_torch(interleaved):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, 3, 12)).astype(np.float32)
    cos, sin = _tables(rng, 2, 4, 4)  # partial: 8 of 12 features rotate
    (k,) = registry.kernels("rope")
    got = k.reference(x, cos, sin, interleaved=interleaved)
    tx, tc, ts = (torch.from_numpy(a) for a in (x, cos, sin))
    rot = tx[..., :8]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        want = torch.stack([x1 * tc - x2 * ts, x2 * tc + x1 * ts], -1).flatten(-2)
    else:
        x1, x2 = rot[..., :4], rot[..., 4:]
        want = torch.cat([x1 * tc - x2 * ts, x2 * tc + x1 * ts], -1)
    want = torch.cat([want, tx[..., 8:]], -1)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("grad", [False, True])
def test_op_picks_kernel_with_and_without_graph(grad, monkeypatch):
    """Rotary defines saved(): the kernel runs in training too, and backward rotates back."""
    calls = []
    (k,) = registry.kernels("rope")
    fn = k.fn
    monkeypatch.setattr(k, "fn", lambda *a, **kw: calls.append(1) or fn(*a, **kw))
    rng = np.random.default_rng(3)
    xa = rng.standard_normal((2, 3, 4, 8)).astype(np.float32)
    c, s = _tables(rng, 1, 3, 4)
    x = ember.from_numpy(xa).requires_grad_(grad)
    cos, sin = ember.from_numpy(c), ember.from_numpy(s)
    y = apply_rotary(x, cos, sin)
    assert len(calls) == 1
    want = apply_rotary(ember.from_numpy(xa.astype(np.float64)), cos.double(), sin.double())
    np.testing.assert_allclose(y.detach().numpy(), want.numpy(), atol=1e-6)
    if grad:
        g = rng.standard_normal(xa.shape).astype(np.float32)
        y.backward(ember.from_numpy(g))
        # the rotation is orthogonal: the gradient is g rotated back
        back = k.reference(g, c, -s, interleaved=False)
        np.testing.assert_allclose(x.grad.numpy(), back, atol=1e-6)


def test_rope_gradient_and_qk_helper():
    rng = np.random.default_rng(4)
    c, s = _tables(rng, 1, 3, 2)
    cos, sin = ember.from_numpy(c.astype(np.float64)), ember.from_numpy(s.astype(np.float64))
    gradcheck(lambda x: apply_rotary(x, cos, sin, True), [(1, 3, 2, 6)])
    q = ember.from_numpy(rng.standard_normal((1, 3, 4, 6)).astype(np.float32))
    k = ember.from_numpy(rng.standard_normal((1, 3, 2, 6)).astype(np.float32))
    qo, ko = apply_rotary_qk(q, k, cos.float(), sin.float())
    np.testing.assert_array_equal(qo.numpy(), apply_rotary(q, cos.float(), sin.float()).numpy())
    np.testing.assert_array_equal(ko.numpy(), apply_rotary(k, cos.float(), sin.float()).numpy())


def _qk_cases():
    rng = np.random.default_rng(5)
    cases = []
    for b, t, hq, hk, d, half, cb in [(1, 1, 3, 1, 8, 4, 1), (2, 5, 4, 2, 16, 8, 2),
                                      (1, 3, 2, 2, 10, 3, 1), (2, 0, 2, 1, 8, 4, 1)]:  # fmt: skip
        q = rng.standard_normal((b, t, hq, d)).astype(np.float32)
        k = rng.standard_normal((b, t, hk, d)).astype(np.float32)
        cos, sin = _tables(rng, cb, t, half)
        for inter in (False, True):
            cases.append(((q, k, cos, sin), {"interleaved": inter}))
    return cases


def test_rope_qk_kernel():
    (k,) = registry.kernels("rope_qk")
    assert check_kernel(k, cases=_qk_cases(), rtol=1e-6, atol=1e-6)


def test_rope_qk_kernel_reads_views_of_one_stacked_projection():
    rng = np.random.default_rng(6)
    b, t, hq, hk, d = 1, 1, 9, 3, 16
    qkv = rng.standard_normal((b, t, (hq + 2 * hk) * d)).astype(np.float32)
    q = qkv[..., : hq * d].reshape(b, t, hq, d)
    k = qkv[..., hq * d : (hq + hk) * d].reshape(b, t, hk, d)
    cos, sin = _tables(rng, 1, t, 8)
    (kern,) = registry.kernels("rope_qk")
    for inter in (False, True):
        got = kern.fn(q, k, cos, sin, interleaved=inter)
        (one,) = registry.kernels("rope")
        want = np.concatenate([one.fn(q, cos, sin, interleaved=inter),
                               one.fn(k, cos, sin, interleaved=inter)], axis=2)  # fmt: skip
        np.testing.assert_array_equal(got, want)  # the same rotation, bit for bit


@pytest.mark.parametrize("grad", [False, True])
def test_apply_rotary_qk_one_op_without_a_graph(grad, monkeypatch):
    """No graph: one rope_qk op, q and k views of its output; with one: two Rotary ops."""
    from ember.autograd import Function

    ops = []
    orig = Function.apply.__func__
    monkeypatch.setattr(Function, "apply", classmethod(
        lambda cls, *a, **kw: ops.append(cls.__name__) or orig(cls, *a, **kw)))  # fmt: skip
    rng = np.random.default_rng(7)
    c, s = _tables(rng, 1, 3, 4)
    cos, sin = ember.from_numpy(c), ember.from_numpy(s)
    qa = rng.standard_normal((2, 3, 4, 8)).astype(np.float32)
    ka = rng.standard_normal((2, 3, 2, 8)).astype(np.float32)
    q, k = ember.from_numpy(qa).requires_grad_(grad), ember.from_numpy(ka).requires_grad_(grad)
    qo, ko = apply_rotary_qk(q, k, cos, sin, True)
    assert ops == (["Rotary", "Rotary"] if grad else ["RotaryQK"])
    (ref,) = registry.kernels("rope")
    np.testing.assert_allclose(qo.detach().numpy(), ref.reference(qa, c, s, interleaved=True),
                               atol=1e-6)  # fmt: skip
    np.testing.assert_allclose(ko.detach().numpy(), ref.reference(ka, c, s, interleaved=True),
                               atol=1e-6)  # fmt: skip
    if grad:
        (qo.sum() + ko.sum()).backward()
        assert q.grad is not None and k.grad is not None


def test_apply_rotary_qk_reference_and_meta(monkeypatch):
    """EMBER_KERNELS=reference: the op's numpy forward; on the meta device: shapes only."""
    from ember import config

    rng = np.random.default_rng(8)
    c, s = _tables(rng, 1, 2, 3)
    qa = rng.standard_normal((1, 2, 3, 8)).astype(np.float32)
    ka = rng.standard_normal((1, 2, 1, 8)).astype(np.float32)
    args = (ember.from_numpy(c), ember.from_numpy(s))
    fast = apply_rotary_qk(ember.from_numpy(qa), ember.from_numpy(ka), *args)
    monkeypatch.setattr(config, "KERNELS", "reference")
    slow = apply_rotary_qk(ember.from_numpy(qa), ember.from_numpy(ka), *args)
    for a, b in zip(fast, slow):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-6)
    qm, km = apply_rotary_qk(
        ember.empty(1, 2, 3, 8, device="meta"), ember.empty(1, 2, 1, 8, device="meta"),
        ember.empty(1, 2, 1, 3, device="meta"), ember.empty(1, 2, 1, 3, device="meta"),
    )  # fmt: skip
    assert tuple(qm.shape) == (1, 2, 3, 8) and tuple(km.shape) == (1, 2, 1, 8)
    assert qm.device.type == "meta"
