"""Every optimizer against torch: same init, same data, same loss, parameters compared each step."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import ember
from ember import optim

STEPS = 20
TOL = 1e-6

CASES = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.05, momentum=0.9)),
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1)),
    ("SGD", dict(lr=0.02, momentum=0.5, maximize=True)),
    ("Adam", dict(lr=0.05)),
    ("Adam", dict(lr=0.05, betas=(0.8, 0.95), weight_decay=0.1)),
    ("Adam", dict(lr=0.05, amsgrad=True, eps=1e-6)),
    ("Adam", dict(lr=0.02, amsgrad=True, maximize=True, weight_decay=0.05)),
    ("AdamW", dict(lr=0.05)),
    ("AdamW", dict(lr=0.05, weight_decay=0.3, amsgrad=True)),
    ("AdamW", dict(lr=0.03, weight_decay=0.1, maximize=True)),
    ("RMSprop", dict(lr=0.01)),
    ("RMSprop", dict(lr=0.01, alpha=0.9, centered=True)),
    ("RMSprop", dict(lr=0.01, momentum=0.9, weight_decay=0.05)),
    ("RMSprop", dict(lr=0.01, momentum=0.5, centered=True, eps=1e-4, maximize=True)),
    ("Adagrad", dict(lr=0.1)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.05, initial_accumulator_value=0.3)),
    ("Adagrad", dict(lr=0.1, weight_decay=0.1, eps=1e-6, maximize=True)),
]


def _init(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((3,)),
        "b": rng.standard_normal((2, 3)),
        "c": rng.standard_normal(()),  # a 0-d parameter
        "d": rng.standard_normal((1, 1, 3)),
    }


def _batches(n: int = STEPS, seed: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((5, 2, 3)), rng.standard_normal((5,))) for _ in range(n)]


def _loss(lib, p: dict, x, y):
    """A small non-linear model written with ops both libraries share."""
    h = lib.tanh(x * p["w"] + p["b"]) * p["c"] + p["d"] * x
    out = h.sum(dim=(1, 2)) / 6.0
    return ((out - y) ** 2).sum() / x.shape[0]


def _make(init, groups):
    ep = {
        k: ember.tensor(v.copy(), dtype=ember.float64, requires_grad=True) for k, v in init.items()
    }
    tp = {
        k: torch.tensor(v.copy(), dtype=torch.float64, requires_grad=True) for k, v in init.items()
    }
    if groups is None:
        return ep, tp, list(ep.values()), list(tp.values())

    def split(p):
        return [{"params": [p[k] for k in names], **opts} for names, opts in groups]

    return ep, tp, split(ep), split(tp)


def _step_both(eopt, topt, ep, tp, x, y):
    eopt.zero_grad()
    el = _loss(ember, ep, ember.tensor(x), ember.tensor(y))
    el.backward()
    eopt.step()
    topt.zero_grad()
    tl = _loss(torch, tp, torch.tensor(x), torch.tensor(y))
    tl.backward()
    topt.step()
    return el.item(), tl.item()


def _compare(ep, tp, step):
    for k in ep:
        np.testing.assert_allclose(
            ep[k].detach().numpy(),
            tp[k].detach().numpy(),
            rtol=0,
            atol=TOL,
            err_msg=f"{k} @ {step}",
        )


@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_trajectory_matches_torch(name, kw):
    ep, tp, eparams, tparams = _make(_init(), None)
    eopt = getattr(optim, name)(eparams, **kw)
    topt = getattr(torch.optim, name)(tparams, **kw)
    for i, (x, y) in enumerate(_batches()):
        el, tl = _step_both(eopt, topt, ep, tp, x, y)
        assert abs(el - tl) < 1e-6 * max(1.0, abs(tl)) and tl < 100
        _compare(ep, tp, i)
    # the parameters really moved
    assert max(np.abs(ep[k].detach().numpy() - v).max() for k, v in _init().items()) > 1e-3


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad"])
def test_param_groups_and_state_dict_resume(name):
    base = {"SGD": dict(lr=0.05, momentum=0.9)}.get(name, dict(lr=0.03))
    groups = [
        (["w", "b"], {}),
        (["c"], {"lr": 0.01, "weight_decay": 0.1}),
    ]
    ep, tp, egroups, tgroups = _make(_init(3), groups)
    eopt = getattr(optim, name)(egroups, **base)
    topt = getattr(torch.optim, name)(tgroups, **base)
    # a third group added later, with its own options
    eopt.add_param_group({"params": [ep["d"]], "lr": 0.02})
    topt.add_param_group({"params": [tp["d"]], "lr": 0.02})
    batches = _batches(STEPS, seed=7)
    for x, y in batches[:10]:
        _step_both(eopt, topt, ep, tp, x, y)
    _compare(ep, tp, 10)

    sd = eopt.state_dict()
    tsd = topt.state_dict()
    assert [g["params"] for g in sd["param_groups"]] == [g["params"] for g in tsd["param_groups"]]
    assert sorted(sd["state"]) == sorted(tsd["state"])
    for i, st in sd["state"].items():
        assert set(st) == set(tsd["state"][i])
        for key, v in st.items():
            np.testing.assert_allclose(np.asarray(v), tsd["state"][i][key].numpy(), atol=TOL)
    for g, tg in zip(sd["param_groups"], tsd["param_groups"]):
        for key, v in g.items():
            if key in tg:
                assert v == tg[key], key

    # a fresh optimizer on the same params, loaded from a deep copy, continues the same path
    fresh = getattr(optim, name)([{"params": [ep["w"]]}], lr=123.0)
    fresh.add_param_group({"params": [ep["b"]]})
    fresh.add_param_group({"params": [ep["c"]]})
    fresh.add_param_group({"params": [ep["d"]]})
    with pytest.raises(ValueError):
        fresh.load_state_dict({"state": {}, "param_groups": sd["param_groups"][:2]})
    fresh2 = getattr(optim, name)(egroups, **base)
    fresh2.add_param_group({"params": [ep["d"]], "lr": 0.5})
    fresh2.load_state_dict(copy.deepcopy(sd))
    assert [g["lr"] for g in fresh2.param_groups] == [g["lr"] for g in topt.param_groups]
    for x, y in batches[10:]:
        _step_both(fresh2, topt, ep, tp, x, y)
    _compare(ep, tp, STEPS)


def test_zero_grad_and_errors():
    w = ember.tensor([1.0, 2.0], requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    (w * w).sum().backward()
    opt.zero_grad(set_to_none=False)
    assert w.grad is not None and w.grad.tolist() == [0.0, 0.0]
    opt.zero_grad()
    assert w.grad is None
    opt.step()  # no grad: nothing happens
    assert w.tolist() == [1.0, 2.0]
    with pytest.raises(ValueError):
        optim.SGD([], lr=0.1)
    with pytest.raises(ValueError):
        optim.SGD([w], lr=0.1, nesterov=True)
    with pytest.raises(ValueError):
        optim.Adam([w], lr=-1.0)
    with pytest.raises(ValueError):
        optim.SGD([w, w], lr=0.1)
    with pytest.raises(ValueError):
        opt.add_param_group({"params": [w]})
    with pytest.raises(TypeError):
        optim.SGD(w, lr=0.1)


def test_closure_and_float32_update_in_place():
    w = ember.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True)
    arr = w._data
    opt = optim.Adam([w], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (w * w).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert float(loss) == 55.0
    assert w._data is arr  # the parameter's array is updated in place
    assert w.dtype == ember.float32 and opt.state[w]["exp_avg"].dtype == ember.float32
    m = opt.state[w]["exp_avg"]._data
    opt.step(closure)
    assert opt.state[w]["exp_avg"]._data is m  # no per-step reallocation of state
    assert opt.state[w]["step"] == 2


def test_read_only_parameter_array_is_copied_once():
    a = np.ones(3)
    a.flags.writeable = False
    w = ember.Tensor._wrap(a).requires_grad_()
    opt = optim.SGD([w], lr=0.5)
    (w * 2.0).sum().backward()
    opt.step()
    assert w.tolist() == [0.0, 0.0, 0.0] and a.tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "name,kw",
    [
        ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)),
        ("Adam", dict(lr=0.01, amsgrad=True)),
        ("AdamW", dict(lr=0.01)),
        ("RMSprop", dict(lr=0.005, centered=True, momentum=0.5)),
        ("Adagrad", dict(lr=0.05, lr_decay=0.01)),
    ],
)
def test_mlp_trajectory_matches_torch(name, kw):
    """nn.Linear -> tanh -> nn.Linear with cross-entropy: the nn modules, as users train them."""
    from ember import nn
    from ember.nn import functional as F

    ember.manual_seed(0)
    em = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()
    tm = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).double()
    tm.load_state_dict({k: torch.tensor(v.numpy()) for k, v in em.state_dict().items()})
    eopt = getattr(optim, name)(em.parameters(), **kw)
    topt = getattr(torch.optim, name)(tm.parameters(), **kw)
    rng = np.random.default_rng(5)
    for step in range(STEPS):
        x, y = rng.standard_normal((9, 5)), rng.integers(0, 3, 9)
        eopt.zero_grad()
        F.cross_entropy(em(ember.tensor(x)), ember.tensor(y)).backward()
        eopt.step()
        topt.zero_grad()
        torch.nn.functional.cross_entropy(tm(torch.tensor(x)), torch.tensor(y)).backward()
        topt.step()
        for (k, a), b in zip(em.state_dict().items(), tm.state_dict().values()):
            np.testing.assert_allclose(
                a.numpy(), b.numpy(), rtol=0, atol=TOL, err_msg=f"{k} @ {step}"
            )
