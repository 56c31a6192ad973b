import numpy as np
import pytest
import torch

import ember
from ember.errors import AutogradError


def test_no_graph_without_requires_grad():
    x = ember.ones(3)
    y = (x * 2).exp()
    assert y.grad_fn is None and not y.requires_grad


def test_no_grad_enable_grad_inference_mode():
    w = ember.ones(2, requires_grad=True)
    with ember.no_grad():
        assert not (w * 2).requires_grad
        with ember.enable_grad():
            assert (w * 2).requires_grad
    with ember.inference_mode():
        assert not (w * 2).requires_grad

    @ember.no_grad()
    def f(t):
        return t * 2

    assert not f(w).requires_grad
    assert (w * 2).requires_grad
    with ember.set_grad_enabled(False):
        assert not ember.is_grad_enabled()
    assert ember.is_grad_enabled()


def test_backward_non_scalar_and_accumulation():
    x = ember.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * x
    with pytest.raises(AutogradError, match="scalar"):
        y.backward()
    y.backward(ember.tensor([1.0, 0.1, 0.01]))
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 0.4, 0.06], rtol=1e-6)
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [5.0, 3.4, 3.06], rtol=1e-6)


def test_retain_grad_and_hooks_and_detach():
    x = ember.tensor([1.0, 2.0], requires_grad=True)
    h = x * 2
    h.retain_grad()
    seen = []
    h.register_hook(lambda g: seen.append(g.tolist()))
    (h * h).sum().backward()
    assert h.grad.tolist() == [4.0, 8.0] and seen == [[4.0, 8.0]]
    d = h.detach()
    assert not d.requires_grad and np.shares_memory(d.numpy(), h._data)


def test_backward_twice_raises_unless_retained():
    x = ember.tensor([1.0, 2.0], requires_grad=True)
    y = (x.exp() * 2).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 4 * np.exp([1.0, 2.0]), rtol=1e-6)
    with pytest.raises(AutogradError, match="second time"):
        y.backward()


def test_autograd_grad_function():
    x = ember.tensor([1.0, 2.0], requires_grad=True)
    z = ember.tensor([3.0], requires_grad=True)
    y = (x * x).sum() + z.sum() * 0
    (gx,) = ember.autograd.grad(y, [x], retain_graph=True)
    assert gx.tolist() == [2.0, 4.0] and x.grad is None
    w = ember.tensor([1.0], requires_grad=True)
    with pytest.raises(AutogradError):
        ember.autograd.grad(y, [w])
    assert ember.autograd.grad(y, [w], allow_unused=True) == (None,)


def test_broadcast_grads_reduce_like_torch():
    a = np.random.default_rng(0).standard_normal((4, 1, 3))
    b = np.random.default_rng(1).standard_normal((5, 1))
    ea, eb = ember.tensor(a, requires_grad=True), ember.tensor(b, requires_grad=True)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    (ea * eb + ea).sum().backward()
    (ta * tb + ta).sum().backward()
    np.testing.assert_allclose(ea.grad.numpy(), ta.grad.numpy())
    np.testing.assert_allclose(eb.grad.numpy(), tb.grad.numpy())


def test_requires_grad_only_for_floats():
    with pytest.raises(ember.errors.DTypeError):
        ember.tensor([1, 2], requires_grad=True)


def test_diamond_graph_and_reuse():
    x = ember.tensor(2.0, requires_grad=True)
    a = x * 3
    y = a * a + a.exp() + x
    y.backward()
    expected = 2 * 3 * 6 + 3 * np.exp(6.0) + 1
    np.testing.assert_allclose(x.grad.item(), expected, rtol=1e-6)


def test_inplace_on_non_leaf_keeps_earlier_history():
    x = ember.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    z = y * y  # recorded against y's old value
    y.mul_(3)  # y is rebound; z's history must not change
    (z.sum() + y.sum()).backward()
    tx = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    ty = tx * 2
    tz = ty * ty
    ty = ty * 3
    (tz.sum() + ty.sum()).backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())


def test_setitem_with_grad_reading_itself():
    x = ember.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    y = x * 1
    y[1:] = y[1:] * 3
    y.sum().backward()
    assert x.grad.tolist() == [1.0, 3.0, 3.0, 3.0]


def test_broadcast_mismatch_is_a_shape_error():
    with pytest.raises(ember.errors.ShapeError, match=r"\(3,\).*\(4,\)"):
        ember.ones(3) + ember.ones(4)
