"""ember.generation.sampling.token_logprobs against torch's log_softmax and topk."""

import numpy as np
import pytest
import torch

from ember.generation.sampling import token_logprobs


@pytest.mark.parametrize("k", [0, 1, 5, 7])
def test_token_logprobs_match_torch(k):
    rng = np.random.default_rng(k)
    logits = (rng.standard_normal(7) * 4).astype(np.float32)
    ref = torch.log_softmax(torch.from_numpy(logits).double(), -1)
    lp, top = token_logprobs(logits, 3, k)
    assert lp == pytest.approx(float(ref[3]), abs=1e-9)
    vals, ids = torch.topk(ref, k) if k else (torch.empty(0), torch.empty(0, dtype=torch.long))
    assert [i for i, _ in top] == ids.tolist()
    np.testing.assert_allclose([v for _, v in top], vals.numpy(), atol=1e-9)


def test_token_logprobs_large_logits_stay_finite():
    logits = np.array([1000.0, 999.0, -1000.0], np.float32)
    lp, top = token_logprobs(logits, 2, 2)
    assert lp == pytest.approx(-2000.0 - np.log1p(np.exp(-1.0)), rel=1e-6)
    assert [i for i, _ in top] == [0, 1]
    assert top[0][1] == pytest.approx(-np.log1p(np.exp(-1.0)))


def test_token_logprobs_ties_ordered_by_id():
    _, top = token_logprobs(np.zeros(5, np.float32), 0, 3)
    assert [i for i, _ in top] == [0, 1, 2]
    assert all(v == pytest.approx(-np.log(5)) for _, v in top)
