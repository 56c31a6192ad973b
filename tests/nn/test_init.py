"""ember.nn.init: fan computations equal torch's, distributions statistically sane, seeded."""

import math

import numpy as np
import pytest
import torch

import ember
from ember.nn import init


@pytest.mark.parametrize("shape", [(3, 4), (8, 3, 5), (16, 4, 3, 3), (2, 6, 1, 2, 3), (5, 0)])
def test_fans_match_torch(shape):
    assert init._calculate_fan_in_and_fan_out(
        ember.empty(shape)
    ) == torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))
    for mode in ("fan_in", "fan_out"):
        assert init._calculate_correct_fan(
            ember.empty(shape), mode
        ) == torch.nn.init._calculate_correct_fan(torch.empty(shape), mode)
    with pytest.raises(ValueError):
        init._calculate_fan_in_and_fan_out(ember.empty(4))
    with pytest.raises(ValueError):
        init._calculate_correct_fan(ember.empty(2, 2), "fan_avg")


@pytest.mark.parametrize(
    "nl,param",
    [
        ("linear", None),
        ("conv2d", None),
        ("sigmoid", None),
        ("tanh", None),
        ("relu", None),
        ("leaky_relu", None),
        ("leaky_relu", 0.2),
        ("selu", None),
        ("conv_transpose2d", None),
    ],
)
def test_gain_matches_torch(nl, param):
    assert init.calculate_gain(nl, param) == pytest.approx(torch.nn.init.calculate_gain(nl, param))


def test_gain_errors():
    with pytest.raises(ValueError):
        init.calculate_gain("swish")
    with pytest.raises(ValueError):
        init.calculate_gain("leaky_relu", "x")


def _stats(t):
    a = t.numpy().astype(np.float64)
    return a.mean(), a.std(), a.min(), a.max()


def test_uniform_normal_constant():
    t = ember.empty(200, 300)
    m, s, lo, hi = _stats(init.uniform_(t, -2.0, 3.0))
    assert abs(m - 0.5) < 0.02 and abs(s - 5 / math.sqrt(12)) < 0.02 and lo >= -2 and hi < 3
    m, s, _, _ = _stats(init.normal_(t, 1.0, 0.5))
    assert abs(m - 1.0) < 0.01 and abs(s - 0.5) < 0.01
    assert np.all(init.constant_(t, 0.25).numpy() == 0.25)
    assert np.all(init.zeros_(t).numpy() == 0) and np.all(init.ones_(t).numpy() == 1)
    np.testing.assert_array_equal(init.eye_(ember.empty(3, 5)).numpy(), np.eye(3, 5))
    with pytest.raises(ValueError):
        init.eye_(ember.empty(2, 2, 2))


def test_xavier_kaiming():
    t = ember.empty(256, 512)
    fan_in, fan_out = 512, 256
    _, s, lo, hi = _stats(init.xavier_uniform_(t, gain=2.0))
    a = 2.0 * math.sqrt(6.0 / (fan_in + fan_out))
    assert -a <= lo and hi <= a and abs(s - a / math.sqrt(3)) < 0.02 * a
    _, s, _, _ = _stats(init.xavier_normal_(t))
    assert abs(s - math.sqrt(2.0 / (fan_in + fan_out))) < 0.02 * s
    _, s, lo, hi = _stats(init.kaiming_uniform_(t, a=math.sqrt(5)))
    bound = (
        math.sqrt(3.0)
        * torch.nn.init.calculate_gain("leaky_relu", math.sqrt(5))
        / math.sqrt(fan_in)
    )
    assert -bound <= lo and hi <= bound and abs(s - bound / math.sqrt(3)) < 0.02 * bound
    _, s, _, _ = _stats(init.kaiming_normal_(t, mode="fan_out", nonlinearity="relu"))
    assert abs(s - math.sqrt(2.0 / fan_out)) < 0.02 * s
    with pytest.warns(UserWarning):
        init.kaiming_uniform_(ember.empty(0, 3))


def test_trunc_normal_orthogonal_dirac_sparse():
    t = ember.empty(300, 200)
    m, s, lo, hi = _stats(init.trunc_normal_(t, mean=0.5, std=1.0, a=-1.0, b=2.0))
    assert lo >= -1.0 and hi <= 2.0
    ref = torch.nn.init.trunc_normal_(torch.empty(300, 200), mean=0.5, std=1.0, a=-1.0, b=2.0)
    assert abs(m - ref.mean().item()) < 0.02 and abs(s - ref.std().item()) < 0.02
    for shape in [(6, 4), (4, 6), (3, 2, 2, 2)]:
        q = (
            init.orthogonal_(ember.empty(*shape), gain=1.5)
            .numpy()
            .reshape(shape[0], -1)
            .astype(np.float64)
        )
        if q.shape[0] <= q.shape[1]:
            np.testing.assert_allclose(q @ q.T, 2.25 * np.eye(q.shape[0]), atol=1e-5)
        else:
            np.testing.assert_allclose(q.T @ q, 2.25 * np.eye(q.shape[1]), atol=1e-5)
    d = init.dirac_(ember.empty(4, 2, 3, 3), groups=2)
    np.testing.assert_array_equal(
        d.numpy(), torch.nn.init.dirac_(torch.empty(4, 2, 3, 3), groups=2).numpy()
    )
    sp = init.sparse_(ember.empty(10, 6), sparsity=0.3).numpy()
    assert np.all((sp == 0).sum(0) >= 3)


def test_seeded_and_in_place_without_grad():
    p = ember.nn.Parameter(ember.empty(4, 4))
    ember.manual_seed(11)
    a = init.normal_(p).numpy(force=True).copy()
    ember.manual_seed(11)
    b = init.normal_(p).numpy(force=True)
    np.testing.assert_array_equal(a, b)
    assert p.requires_grad and p.is_leaf
    g = ember.Generator().manual_seed(3)
    c = init.uniform_(ember.empty(3), generator=g).numpy().copy()
    g.manual_seed(3)
    np.testing.assert_array_equal(c, init.uniform_(ember.empty(3), generator=g).numpy())
    m = ember.empty(3, 3, device="meta")
    assert init.kaiming_uniform_(m) is m
    h = init.normal_(ember.empty(50, 50, dtype=ember.bfloat16))
    assert h.dtype == ember.bfloat16 and abs(float(h.float().std()) - 1.0) < 0.1


def test_meta_modules_draw_no_random_numbers():
    before = ember.get_rng_state()
    enc = ember.nn.TransformerEncoderLayer(512, 8, 2048, device="meta")
    ember.nn.TransformerEncoder(enc, 4)
    ember.nn.LSTM(64, 64, 2, device="meta")
    ember.nn.Embedding(50000, 512, device="meta")
    assert ember.get_rng_state() == before
