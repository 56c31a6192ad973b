"""Learning-rate schedulers against torch: the same lr (and momentum) sequence, step by step."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import ember
from ember import optim
from ember.optim import lr_scheduler as ls

tls = torch.optim.lr_scheduler
N = 40

CASES = [
    ("StepLR", dict(step_size=7, gamma=0.5)),
    ("MultiStepLR", dict(milestones=[3, 10, 10, 25], gamma=0.3)),
    ("ExponentialLR", dict(gamma=0.93)),
    ("CosineAnnealingLR", dict(T_max=12, eta_min=1e-4)),
    ("CosineAnnealingLR", dict(T_max=7)),
    ("LinearLR", dict(start_factor=0.1, total_iters=9)),
    ("LinearLR", dict(start_factor=1.0, end_factor=0.2, total_iters=15)),
    ("ConstantLR", dict(factor=0.25, total_iters=6)),
    ("PolynomialLR", dict(total_iters=20, power=2.0)),
    ("LambdaLR", dict(lr_lambda=lambda e: 0.97**e * (1 + e % 3))),
    ("MultiplicativeLR", dict(lr_lambda=lambda e: 0.9 if e % 2 else 1.05)),
    ("CosineAnnealingWarmRestarts", dict(T_0=5, T_mult=2, eta_min=1e-3)),
    ("OneCycleLR", dict(max_lr=0.5, total_steps=N + 1)),
    ("OneCycleLR", dict(max_lr=[0.3, 0.6], total_steps=N + 1, anneal_strategy="linear")),
    ("OneCycleLR", dict(max_lr=0.4, epochs=4, steps_per_epoch=11, three_phase=True)),
]


def _opts(opt_name: str = "SGD"):
    ew = [ember.zeros(2, requires_grad=True), ember.zeros(3, requires_grad=True)]
    tw = [torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)]
    kw = dict(momentum=0.9) if opt_name == "SGD" else {}

    def groups(w):
        return [{"params": [w[0]], "lr": 0.1}, {"params": [w[1]], "lr": 0.02}]

    return (
        getattr(optim, opt_name)(groups(ew), lr=0.1, **kw),
        getattr(torch.optim, opt_name)(groups(tw), lr=0.1, **kw),
    )


def _momenta(opt):
    return [g["betas"][0] if "betas" in g else g.get("momentum") for g in opt.param_groups]


@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_lr_sequence_matches_torch(name, kw, opt_name):
    eopt, topt = _opts(opt_name)
    es = getattr(ls, name)(eopt, **kw)
    ts = getattr(tls, name)(topt, **kw)
    assert es.get_last_lr() == ts.get_last_lr()
    for i in range(N):
        eopt.step()
        topt.step()
        es.step()
        ts.step()
        assert es.get_last_lr() == pytest.approx(ts.get_last_lr(), rel=1e-12, abs=1e-15), i
        assert [g["lr"] for g in eopt.param_groups] == es.get_last_lr()
        assert _momenta(eopt) == pytest.approx(_momenta(topt), rel=1e-12), i


@pytest.mark.parametrize("name,kw", CASES[:9] + CASES[11:], ids=lambda v: str(v)[:20])
def test_state_dict_resume(name, kw):
    """Stop halfway, rebuild optimizer + scheduler, load both states: the rest is identical."""
    eopt, topt = _opts()
    es = getattr(ls, name)(eopt, **kw)
    ts = getattr(tls, name)(topt, **kw)
    topt.step()
    for _ in range(N // 2):
        es.step()
        ts.step()
    sd = json.loads(json.dumps(_jsonable(es.state_dict())))  # survives a JSON round trip
    osd = copy.deepcopy(eopt.state_dict())
    eopt2, _ = _opts()
    es2 = getattr(ls, name)(eopt2, **kw)
    es2.load_state_dict(sd)
    eopt2.load_state_dict(osd)
    assert es2.get_last_lr() == es.get_last_lr()
    for i in range(N // 2):
        es2.step()
        ts.step()
        assert es2.get_last_lr() == pytest.approx(ts.get_last_lr(), rel=1e-12, abs=1e-15), i


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def test_sequential_lr_warmup_then_cosine():
    eopt, topt = _opts()
    e1, t1 = ls.LinearLR(eopt, 0.01, total_iters=5), tls.LinearLR(topt, 0.01, total_iters=5)
    e2, t2 = ls.CosineAnnealingLR(eopt, T_max=20), tls.CosineAnnealingLR(topt, T_max=20)
    es = ls.SequentialLR(eopt, [e1, e2], milestones=[5])
    ts = tls.SequentialLR(topt, [t1, t2], milestones=[5])
    assert es.get_last_lr() == pytest.approx(ts.get_last_lr())
    topt.step()
    for i in range(N):
        es.step()
        ts.step()
        assert es.get_last_lr() == pytest.approx(ts.get_last_lr(), rel=1e-12, abs=1e-15), i
    sd = es.state_dict()
    assert len(sd["_schedulers"]) == 2


def test_reduce_lr_on_plateau():
    eopt, topt = _opts()
    es = ls.ReduceLROnPlateau(eopt, mode="max", factor=0.5, patience=2, cooldown=1, min_lr=1e-3)
    ts = tls.ReduceLROnPlateau(topt, mode="max", factor=0.5, patience=2, cooldown=1, min_lr=1e-3)
    metrics = [0.1, 0.2, 0.2, 0.19, 0.2, 0.18, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3] * 2
    for m in metrics:
        es.step(m)
        ts.step(m)
        assert es.get_last_lr() == pytest.approx(ts.get_last_lr())
    assert es.get_last_lr()[1] == 1e-3


def test_errors():
    eopt, _ = _opts()
    with pytest.raises(TypeError):
        ls.StepLR(object(), step_size=2)
    with pytest.raises(ValueError):
        ls.OneCycleLR(eopt, max_lr=0.1)
    with pytest.raises(ValueError):
        ls.LinearLR(eopt, start_factor=0.0)
    with pytest.raises(KeyError):
        _, fresh = None, _opts()[0]
        ls.StepLR(fresh, step_size=2, last_epoch=3)
    s = ls.OneCycleLR(eopt, max_lr=0.1, total_steps=2)
    s.step()
    s.step()
    with pytest.raises(ValueError):
        s.step()
