"""RNN, LSTM, GRU and their cells vs torch: names, gate order, states, grads of everything."""

import numpy as np
import pytest
import torch

import ember
from ember import nn
from tests.helpers import assert_close
from tests.nn.common import check_module, rnd, sync

F64 = ember.float64


def _pair(name, *args, **kwargs):
    return getattr(nn, name)(*args, **kwargs).double(), getattr(torch.nn, name)(
        *args, **kwargs
    ).double()


@pytest.mark.parametrize("name", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"num_layers": 2},
        {"batch_first": True},
        {"bidirectional": True},
        {"num_layers": 2, "bidirectional": True, "batch_first": True},
        {"bias": False},
    ],
)
def test_recurrent_matches_torch(name, kwargs):
    e, t = _pair(name, 3, 4, **kwargs)
    assert list(e.state_dict()) == list(t.state_dict())
    assert [tuple(p.shape) for p in e.parameters()] == [tuple(p.shape) for p in t.parameters()]
    assert repr(e) == repr(t)
    x = rnd(2, 5, 3) if kwargs.get("batch_first") else rnd(5, 2, 3)
    check_module(e, t, [x])


@pytest.mark.parametrize("name", ["LSTM", "GRU", "RNN"])
def test_initial_states_and_unbatched(name):
    e, t = _pair(name, 3, 4, num_layers=2, bidirectional=True)
    D = 4
    h0 = rnd(D, 2, 4, seed=7)
    if name == "LSTM":
        c0 = rnd(D, 2, 4, seed=8)
        sync(t, e)
        xs = [rnd(6, 2, 3), h0, c0]
        e_in = [ember.from_numpy(a.copy()).requires_grad_() for a in xs]
        t_in = [torch.from_numpy(a.copy()).requires_grad_() for a in xs]
        oe, (he, ce) = e(e_in[0], (e_in[1], e_in[2]))
        ot, (ht, ct) = t(t_in[0], (t_in[1], t_in[2]))
        for a, b, w in ((oe, ot, "out"), (he, ht, "h"), (ce, ct, "c")):
            assert_close(a, b, F64, w)
        (ot.sum() + (ht * 2).sum() + (ct * 3).sum()).backward()
        (oe.sum() + (he * 2).sum() + (ce * 3).sum()).backward()
        for i in range(3):
            assert_close(e_in[i].grad, t_in[i].grad, F64, f"grad {i}")
        check_module(e, t, [rnd(6, 3)])  # unbatched, zero states
    else:
        check_module(e, t, [rnd(6, 2, 3), h0])
        e.zero_grad()
        t.zero_grad()
        check_module(e, t, [rnd(6, 3), rnd(D, 4, seed=3)])  # unbatched with a state


def test_rnn_relu_and_dropout():
    e, t = _pair("RNN", 3, 5, nonlinearity="relu")
    assert repr(e) == repr(t)
    check_module(e, t, [rnd(4, 2, 3)])
    d = nn.LSTM(3, 4, num_layers=2, dropout=0.5)
    x = ember.randn(5, 2, 3)
    d.eval()
    a = d(x)[0].detach().numpy()
    np.testing.assert_array_equal(a, d(x)[0].detach().numpy())
    d.train()
    assert not np.allclose(a, d(x)[0].detach().numpy())


def test_float32_lstm_and_errors():
    e, t = nn.LSTM(4, 6, batch_first=True), torch.nn.LSTM(4, 6, batch_first=True)
    check_module(
        e, t, [rnd(3, 7, 4, dtype=ember.float32)], dtype=ember.float32, atol=1e-5, rtol=1e-4
    )
    with pytest.raises(ember.errors.ShapeError):
        e(ember.randn(3, 7, 5))
    with pytest.raises(ember.errors.ShapeError):
        e(ember.randn(3, 7, 4), (ember.zeros(2, 3, 6), ember.zeros(1, 3, 6)))
    m = nn.GRU(4, 6).to("meta")
    out, h = m(ember.randn(5, 2, 4, device="meta"))
    assert out.shape == (5, 2, 6) and h.shape == (1, 2, 6)


@pytest.mark.parametrize("name", ["LSTMCell", "GRUCell", "RNNCell"])
def test_cells(name):
    e, t = _pair(name, 3, 4)
    assert list(e.state_dict()) == list(t.state_dict())
    check_module(e, t, [rnd(2, 3)])
    e.zero_grad()
    t.zero_grad()
    if name == "LSTMCell":
        sync(t, e)
        xs = [rnd(2, 3), rnd(2, 4, seed=1), rnd(2, 4, seed=2)]
        ei = [ember.from_numpy(a.copy()).requires_grad_() for a in xs]
        ti = [torch.from_numpy(a.copy()).requires_grad_() for a in xs]
        he, ce = e(ei[0], (ei[1], ei[2]))
        ht, ct = t(ti[0], (ti[1], ti[2]))
        assert_close(he, ht, F64, "h")
        assert_close(ce, ct, F64, "c")
        (ht.sum() + (ct * ct).sum()).backward()
        (he.sum() + (ce * ce).sum()).backward()
        for i in range(3):
            assert_close(ei[i].grad, ti[i].grad, F64, f"grad {i}")
    else:
        check_module(e, t, [rnd(2, 3), rnd(2, 4, seed=1)])
        e.zero_grad()
        t.zero_grad()
        check_module(e, t, [rnd(3), rnd(4, seed=1)])
