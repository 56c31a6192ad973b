"""ember.peft.data.causal_lm_loss (the loss `ember finetune` trains with) vs torch: the labels
shifted left rather than the logits sliced, the same loss and gradient."""

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import ember
from ember.errors import ShapeError
from ember.peft.data import IGNORE, causal_lm_loss
from tests.helpers import assert_close


def _torch_loss(logits, labels):
    """transformers' causal-LM loss: logits[:, :-1] against labels[:, 1:], -100 ignored."""
    v = logits.shape[-1]
    return TF.cross_entropy(
        logits[:, :-1].reshape(-1, v), labels[:, 1:].reshape(-1), ignore_index=IGNORE
    )


@pytest.mark.parametrize("shape", [(1, 9, 11), (3, 6, 17)])
def test_matches_torch_forward_and_grad(shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32) * 3
    lab = rng.integers(0, shape[-1], shape[:2])
    lab[:, ::3] = IGNORE
    lab[0, -1] = IGNORE
    xe = ember.from_numpy(x.copy()).requires_grad_()
    xt = torch.from_numpy(x.copy()).requires_grad_()
    out = causal_lm_loss(xe, ember.from_numpy(lab))
    ref = _torch_loss(xt, torch.from_numpy(lab))
    assert_close(out, ref, ember.float32, "loss")
    out.backward()
    ref.backward()
    assert_close(xe.grad, xt.grad, ember.float32, "grad")
    assert not xe.grad.numpy()[:, -1].any()  # the last position predicts nothing


def test_same_bits_as_slicing_the_logits():
    """The shift moves which rows are ignored, not how any row is computed."""
    from ember.nn import functional as F

    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 30, 300)).astype(np.float32)
    lab = rng.integers(0, 300, (2, 30))
    lab[:, :5] = IGNORE
    got = []
    for fn in (
        lambda lo, la: F.cross_entropy(
            lo[:, :-1].reshape(-1, 300), la[:, 1:].reshape(-1), ignore_index=IGNORE
        ),
        causal_lm_loss,
    ):
        xe = ember.from_numpy(x.copy()).requires_grad_()
        loss = fn(xe, ember.from_numpy(lab))
        loss.backward()
        got.append((loss.detach().numpy(), xe.grad.numpy()))
    np.testing.assert_array_equal(got[0][0], got[1][0])
    np.testing.assert_array_equal(got[0][1], got[1][1])


def test_one_token_sequences_have_no_loss_and_no_gradient():
    xe = ember.from_numpy(np.ones((2, 1, 5), np.float32)).requires_grad_()
    out = causal_lm_loss(xe, ember.from_numpy(np.zeros((2, 1), np.int64)))
    out.backward()
    assert np.isnan(out.item())
    assert not xe.grad.numpy().any()


def test_shapes_are_checked():
    with pytest.raises(ShapeError, match="causal_lm_loss"):
        causal_lm_loss(ember.zeros(2, 3, 5), ember.zeros(2, 4, dtype=ember.int64))
