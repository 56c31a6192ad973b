"""scaled_dot_product_attention, MultiheadAttention and the Transformer layers vs torch."""

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import ember
from ember import nn
from ember.nn import functional as F
from tests.helpers import assert_close
from tests.nn.common import check_module, rnd, sync

F64 = ember.float64


def _sdpa_case(qs, ks, vs, mask=None, dtype=F64, atol=None, rtol=None, **kw):
    q, k, v = rnd(*qs, dtype=dtype), rnd(*ks, seed=1, dtype=dtype), rnd(*vs, seed=2, dtype=dtype)
    eq, ek, ev = (ember.from_numpy(a.copy()).requires_grad_() for a in (q, k, v))
    tq, tk, tv = (torch.from_numpy(a.copy()).requires_grad_() for a in (q, k, v))
    em = tm = None
    if mask is not None:
        em, tm = ember.from_numpy(mask.copy()), torch.from_numpy(mask.copy())
    eo = F.scaled_dot_product_attention(eq, ek, ev, attn_mask=em, **kw)
    to = TF.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm, **kw)
    assert_close(eo, to, dtype, "sdpa", atol, rtol)
    w = np.random.default_rng(5).standard_normal(tuple(to.shape)).astype(dtype.np)
    (to * torch.from_numpy(w)).sum().backward()
    (eo * ember.from_numpy(w)).sum().backward()
    for name, a, b in (("q", eq, tq), ("k", ek, tk), ("v", ev, tv)):
        assert_close(a.grad, b.grad, dtype, f"sdpa grad {name}", atol, rtol)
    return eo


def test_sdpa_basic_and_scale():
    _sdpa_case((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 6))
    _sdpa_case((2, 5, 4), (2, 7, 4), (2, 7, 3), scale=0.3)
    _sdpa_case((5, 4), (6, 4), (6, 2))
    _sdpa_case((2, 3, 5, 4), (1, 3, 7, 4), (1, 3, 7, 6))  # broadcast batch
    _sdpa_case((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8), dtype=ember.float32, atol=1e-5, rtol=1e-5)


def test_sdpa_masks():
    rng = np.random.default_rng(3)
    bmask = rng.random((5, 7)) < 0.7
    bmask[:, 0] = True
    _sdpa_case((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 6), mask=bmask)
    fmask = rng.standard_normal((2, 1, 5, 7))
    _sdpa_case((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 6), mask=fmask)
    fully = np.ones((2, 3, 5, 7), bool)
    fully[0, 1, 2] = False  # a row with no key: zeros, as torch
    out = _sdpa_case((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 6), mask=fully)
    assert np.all(out.detach().numpy()[0, 1, 2] == 0)
    neg = np.zeros((5, 7))
    neg[1] = -np.inf
    _sdpa_case((3, 5, 4), (3, 7, 4), (3, 7, 4), mask=neg)


@pytest.mark.parametrize("L,S", [(5, 5), (3, 6), (6, 3)])
def test_sdpa_causal(L, S):
    _sdpa_case((2, 2, L, 4), (2, 2, S, 4), (2, 2, S, 3), is_causal=True)


def test_sdpa_gqa():
    _sdpa_case((2, 6, 5, 4), (2, 2, 7, 4), (2, 2, 7, 3), enable_gqa=True)
    _sdpa_case((1, 4, 3, 4), (1, 1, 3, 4), (1, 1, 3, 4), enable_gqa=True, is_causal=True)
    bmask = np.random.default_rng(1).random((2, 6, 5, 7)) < 0.6
    bmask[..., 0] = True
    _sdpa_case((2, 6, 5, 4), (2, 2, 7, 4), (2, 2, 7, 3), mask=bmask, enable_gqa=True)
    _sdpa_case((2, 6, 5, 4), (2, 3, 7, 4), (2, 3, 7, 3), mask=bmask[:, :1], enable_gqa=True)
    with pytest.raises(ember.errors.ShapeError):
        F.scaled_dot_product_attention(
            ember.randn(1, 6, 2, 4), ember.randn(1, 2, 2, 4), ember.randn(1, 2, 2, 4)
        )


def test_sdpa_grad_mask_and_dropout_and_meta():
    q, k, v = (ember.randn(1, 2, 3, 4, dtype=F64) for _ in range(3))
    m = ember.randn(3, 3, dtype=F64, requires_grad=True)
    tm = torch.from_numpy(m.detach().numpy().copy()).requires_grad_()
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    ref = TF.scaled_dot_product_attention(
        *(torch.from_numpy(t.numpy().copy()) for t in (q, k, v)), attn_mask=tm
    )
    assert_close(out, ref, F64, "grad mask")
    out.sum().backward()
    ref.sum().backward()
    assert_close(m.grad, tm.grad, F64, "mask grad")
    ember.manual_seed(0)
    d1 = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    ember.manual_seed(0)
    d2 = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    np.testing.assert_array_equal(d1.numpy(), d2.numpy())
    assert not np.allclose(d1.numpy(), F.scaled_dot_product_attention(q, k, v).numpy())
    mq = ember.randn(2, 4, 5, 8, device="meta")
    mk = ember.randn(2, 2, 9, 8, device="meta")
    assert F.scaled_dot_product_attention(mq, mk, mk, enable_gqa=True).shape == (2, 4, 5, 8)


def _mha_pair(*args, **kwargs):
    return nn.MultiheadAttention(*args, **kwargs).double(), torch.nn.MultiheadAttention(
        *args, **kwargs
    ).double()


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("batch_first", [False, True])
def test_mha_self_attention(need_weights, batch_first):
    e, t = _mha_pair(8, 2, batch_first=batch_first)
    sync(t, e)
    x = rnd(3, 5, 8) if batch_first else rnd(5, 3, 8)
    kpm = np.zeros((3, 5), bool)
    kpm[1, 3:] = True
    am = np.random.default_rng(0).standard_normal((5, 5))
    for ekw, tkw in [
        ({}, {}),
        ({"key_padding_mask": ember.tensor(kpm)}, {"key_padding_mask": torch.from_numpy(kpm)}),
        ({"attn_mask": ember.from_numpy(am)}, {"attn_mask": torch.from_numpy(am)}),
        (
            {
                "attn_mask": ember.tensor(np.triu(np.ones((5, 5), bool), 1)),
                "key_padding_mask": ember.tensor(kpm),
            },
            {
                "attn_mask": torch.from_numpy(np.triu(np.ones((5, 5), bool), 1)),
                "key_padding_mask": torch.from_numpy(kpm),
            },
        ),
    ]:
        e.zero_grad()
        t.zero_grad()
        x_e = ember.from_numpy(x.copy()).requires_grad_()
        x_t = torch.from_numpy(x.copy()).requires_grad_()
        oe, we = e(x_e, x_e, x_e, need_weights=need_weights, **ekw)
        ot, wt = t(x_t, x_t, x_t, need_weights=need_weights, **tkw)
        assert_close(oe, ot, F64, "mha out")
        if need_weights:
            assert_close(we, wt, F64, "mha weights")
        else:
            assert we is None and wt is None
        (ot * ot).sum().backward()
        (oe * oe).sum().backward()
        assert_close(x_e.grad, x_t.grad, F64, "mha input grad")
        for n, p in t.named_parameters():
            assert_close(dict(e.named_parameters())[n].grad, p.grad, F64, f"mha grad {n}")


def test_mha_variants():
    e, t = _mha_pair(6, 3, kdim=4, vdim=5)
    assert list(e.state_dict()) == list(t.state_dict())
    q, k, v = rnd(4, 2, 6), rnd(7, 2, 4, seed=1), rnd(7, 2, 5, seed=2)
    check_module(e, t, [q, k, v])
    e, t = _mha_pair(6, 2, add_bias_kv=True, add_zero_attn=True)
    assert list(e.state_dict()) == list(t.state_dict())
    kpm = np.zeros((2, 7), bool)
    kpm[0, -2:] = True
    check_module(
        e,
        t,
        [q, rnd(7, 2, 6, seed=1), rnd(7, 2, 6, seed=2)],
        ekw={"key_padding_mask": ember.tensor(kpm)},
        tkw={"key_padding_mask": torch.from_numpy(kpm)},
    )
    e, t = _mha_pair(6, 2, bias=False)
    check_module(
        e,
        t,
        [rnd(4, 6), rnd(5, 6, seed=1), rnd(5, 6, seed=2)],
        ekw={"need_weights": False},
        tkw={"need_weights": False},
    )  # unbatched
    e, t = _mha_pair(8, 4, batch_first=True)
    x = rnd(2, 5, 8)
    check_module(
        e,
        t,
        [x, rnd(2, 3, 8, seed=3), rnd(2, 3, 8, seed=4)],
        ekw={"average_attn_weights": False},
        tkw={"average_attn_weights": False},
    )
    am3 = np.random.default_rng(2).standard_normal((2 * 4, 5, 3))
    check_module(
        e,
        t,
        [x, rnd(2, 3, 8, seed=3), rnd(2, 3, 8, seed=4)],
        ekw={"attn_mask": ember.from_numpy(am3), "need_weights": False},
        tkw={"attn_mask": torch.from_numpy(am3), "need_weights": False},
    )


def test_mha_causal_hint_and_dropout():
    e = nn.MultiheadAttention(8, 2, batch_first=True)
    x = ember.randn(2, 4, 8)
    causal = ember.tensor(np.triu(np.ones((4, 4), bool), 1))
    a = e(x, x, x, is_causal=True, need_weights=False)[0]
    b = e(x, x, x, attn_mask=causal, need_weights=False)[0]
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6)
    d = nn.MultiheadAttention(8, 2, dropout=0.5)
    y = ember.randn(3, 2, 8)
    d.eval()
    r1 = d(y, y, y)[0].detach().numpy()
    np.testing.assert_array_equal(r1, d(y, y, y)[0].detach().numpy())
    d.train()
    assert not np.allclose(r1, d(y, y, y)[0].detach().numpy())


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_transformer_encoder_layer(norm_first, activation, batch_first):
    kw = dict(
        dim_feedforward=16,
        dropout=0.0,
        activation=activation,
        norm_first=norm_first,
        batch_first=batch_first,
    )
    e = nn.TransformerEncoderLayer(8, 2, **kw).double()
    t = torch.nn.TransformerEncoderLayer(8, 2, **kw).double()
    assert list(e.state_dict()) == list(t.state_dict())
    x = rnd(2, 5, 8) if batch_first else rnd(5, 2, 8)
    kpm = np.zeros((2, 5), bool)
    kpm[0, 3:] = True
    check_module(e, t, [x])
    e.zero_grad()
    t.zero_grad()
    check_module(
        e,
        t,
        [x],
        ekw={"src_key_padding_mask": ember.tensor(kpm)},
        tkw={"src_key_padding_mask": torch.from_numpy(kpm)},
    )
    e.eval()
    t.eval()
    with torch.no_grad():
        check_module(e, t, [x], grad=False, atol=1e-8, rtol=1e-8)


@pytest.mark.filterwarnings("ignore:enable_nested_tensor")
def test_transformer_encoder_and_decoder():
    layer_e = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    layer_t = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    e = nn.TransformerEncoder(layer_e, 2, norm=nn.LayerNorm(8)).double()
    t = torch.nn.TransformerEncoder(
        layer_t, 2, norm=torch.nn.LayerNorm(8), enable_nested_tensor=False
    ).double()
    assert list(e.state_dict()) == list(t.state_dict())
    assert e.layers[0].linear1.weight is not e.layers[1].linear1.weight
    mask = np.triu(np.full((5, 5), -np.inf), 1)
    check_module(
        e,
        t,
        [rnd(5, 3, 8)],
        ekw={"mask": ember.from_numpy(mask)},
        tkw={"mask": torch.from_numpy(mask)},
    )
    de = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, norm_first=True).double()
    dt = torch.nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, norm_first=True).double()
    assert list(de.state_dict()) == list(dt.state_dict())
    check_module(de, dt, [rnd(4, 2, 8), rnd(6, 2, 8, seed=1)])
    te = nn.Transformer(8, 2, 1, 1, 16, dropout=0.0).double()
    tt = torch.nn.Transformer(8, 2, 1, 1, 16, dropout=0.0).double()
    assert list(te.state_dict()) == list(tt.state_dict())
    sq = nn.Transformer.generate_square_subsequent_mask(4, dtype=F64)
    np.testing.assert_array_equal(
        sq.numpy(), torch.nn.Transformer.generate_square_subsequent_mask(4).numpy()
    )
    check_module(
        te,
        tt,
        [rnd(5, 2, 8), rnd(4, 2, 8, seed=1)],
        ekw={"tgt_mask": sq},
        tkw={"tgt_mask": torch.from_numpy(sq.numpy())},
    )
