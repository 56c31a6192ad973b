"""Losses vs torch.nn.functional, every option, forward and grads; loss modules."""
# ruff: noqa: B023  (the lambdas in loops are called at once)

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import ember
from ember import nn
from ember.nn import functional as F
from tests.helpers import assert_close, check
from tests.nn.common import rnd

F64, F32 = ember.float64, ember.float32


def _ints(shape, high, seed=0, ignore=None, frac=0.25):
    rng = np.random.default_rng(seed)
    t = rng.integers(0, high, shape)
    if ignore is not None:
        t[rng.random(shape) < frac] = ignore
    return t


def _run(efn, tfn, floats, others, dtype=F64, atol=None, rtol=None):
    """floats: arrays that get grads; others: (ember, torch) pairs passed after them."""
    e_in = [ember.from_numpy(a.copy()).requires_grad_() for a in floats]
    t_in = [torch.from_numpy(a.copy()).requires_grad_() for a in floats]
    eo = efn(*e_in, *[o[0] for o in others])
    to = tfn(*t_in, *[o[1] for o in others])
    assert_close(eo, to, dtype, "forward", atol, rtol)
    w = np.random.default_rng(1).standard_normal(tuple(to.shape)).astype(dtype.np)
    (to * torch.from_numpy(w)).sum().backward()
    (eo * ember.from_numpy(w)).sum().backward()
    for i, (a, b) in enumerate(zip(e_in, t_in)):
        assert_close(a.grad, b.grad, dtype, f"grad {i}", atol, rtol)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.15])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shape", [(6, 5), (3, 4, 2, 3), (5,)])
def test_cross_entropy_indices(reduction, smoothing, weighted, shape):
    C = shape[1] if len(shape) > 1 else shape[0]
    tshape = shape[:1] + shape[2:] if len(shape) > 1 else ()
    t = _ints(tshape, C, ignore=-100 if tshape else None)
    t = np.asarray(t)
    w = rnd(C, seed=3, low=0.2, high=2.0)
    wp = (ember.from_numpy(w), torch.from_numpy(w)) if weighted else (None, None)
    kw = dict(reduction=reduction, label_smoothing=smoothing)
    _run(
        lambda x, tt, ww: F.cross_entropy(x, tt, weight=ww, **kw),
        lambda x, tt, ww: TF.cross_entropy(x, tt, weight=ww, **kw),
        [rnd(*shape, low=-3, high=3)],
        [(ember.tensor(t), torch.from_numpy(t)), wp],
    )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_probabilities(reduction, smoothing, weighted):
    x = rnd(4, 5, 3, low=-3, high=3)
    p = np.random.default_rng(2).random((4, 5, 3))
    p /= p.sum(1, keepdims=True)
    w = rnd(5, seed=3, low=0.2, high=2.0) if weighted else None
    ew = ember.from_numpy(w) if weighted else None
    tw = torch.from_numpy(w) if weighted else None
    kw = dict(reduction=reduction, label_smoothing=smoothing)
    # the target gets a gradient too
    _run(
        lambda a, b: F.cross_entropy(a, b, weight=ew, **kw),
        lambda a, b: TF.cross_entropy(a, b, weight=tw, **kw),
        [x, p],
        [],
    )


def test_cross_entropy_options_and_errors():
    x = rnd(4, 3, low=-2, high=2)
    t = np.array([0, 2, 1, 1])
    _run(
        lambda a: F.cross_entropy(a, ember.tensor(t), ignore_index=1),
        lambda a: TF.cross_entropy(a, torch.tensor(t), ignore_index=1),
        [x],
        [],
    )
    x32 = x.astype(np.float32)
    _run(
        lambda a: F.cross_entropy(a, ember.tensor(t)),
        lambda a: TF.cross_entropy(a, torch.tensor(t)),
        [x32],
        [],
        dtype=F32,
        atol=1e-6,
        rtol=1e-5,
    )
    # large logits stay finite (stable log-softmax)
    big = ember.tensor([[1000.0, -1000.0, 0.0]])
    assert np.isfinite(F.cross_entropy(big, ember.tensor([1])).item())
    # all ignored -> nan, as torch
    allign = F.cross_entropy(ember.tensor(x), ember.tensor([-100] * 4))
    assert np.isnan(allign.item())
    assert np.isnan(TF.cross_entropy(torch.tensor(x), torch.tensor([-100] * 4)).item())
    with pytest.raises(IndexError):
        F.cross_entropy(ember.tensor(x), ember.tensor([0, 5, 1, 1]))
    with pytest.raises(ember.errors.ShapeError):
        F.cross_entropy(ember.tensor(x), ember.tensor([0, 1]))
    with pytest.raises(ValueError):
        F.cross_entropy(ember.tensor(x), ember.tensor(t), reduction="avg")
    assert F.cross_entropy(ember.tensor(x), ember.tensor(t), size_average=False).shape == ()
    m = ember.tensor(x).to("meta")
    assert F.cross_entropy(m, ember.tensor(t).to("meta"), reduction="none").shape == (4,)
    # bf16 logits compute in float32: against float64 on the same values, rounded to bf16
    xb = ember.tensor(x).to(ember.bfloat16)
    out = F.cross_entropy(xb, ember.tensor(t))
    ref = TF.cross_entropy(torch.from_numpy(xb.double().numpy()), torch.tensor(t))
    assert_close(out, ref.to(torch.bfloat16), ember.bfloat16, "bf16 cross_entropy")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss(reduction, weighted):
    x = rnd(3, 4, 5, low=-3, high=0)
    t = _ints((3, 5), 4, ignore=-100)
    w = rnd(4, seed=5, low=0.5, high=1.5)
    ew, tw = (ember.from_numpy(w), torch.from_numpy(w)) if weighted else (None, None)
    _run(
        lambda a: F.nll_loss(a, ember.tensor(t), weight=ew, reduction=reduction),
        lambda a: TF.nll_loss(a, torch.from_numpy(t), weight=tw, reduction=reduction),
        [x],
        [],
    )
    x2 = rnd(6, 3, low=-3, high=0)
    t2 = _ints((6,), 3, seed=1)
    _run(
        lambda a: F.nll_loss(a, ember.tensor(t2), ignore_index=2, reduction=reduction),
        lambda a: TF.nll_loss(a, torch.from_numpy(t2), ignore_index=2, reduction=reduction),
        [x2],
        [],
    )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses(reduction):
    a, b = rnd(4, 5, low=-2, high=2), rnd(4, 5, seed=1, low=-2, high=2)
    for ef, tf, kw in [
        (F.mse_loss, TF.mse_loss, {}),
        (F.l1_loss, TF.l1_loss, {}),
        (F.smooth_l1_loss, TF.smooth_l1_loss, {}),
        (F.smooth_l1_loss, TF.smooth_l1_loss, {"beta": 0.5}),
        (F.smooth_l1_loss, TF.smooth_l1_loss, {"beta": 0.0}),
        (F.huber_loss, TF.huber_loss, {}),
        (F.huber_loss, TF.huber_loss, {"delta": 0.3}),
    ]:
        _run(
            lambda x, y: ef(x, y, reduction=reduction, **kw),
            lambda x, y: tf(x, y, reduction=reduction, **kw),
            [a, b],
            [],
        )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_losses(reduction):
    p = rnd(3, 4, low=0.05, high=0.95)
    y = (np.random.default_rng(3).random((3, 4)) < 0.5).astype(np.float64)
    w = rnd(4, seed=2, low=0.5, high=2)
    ew, tw = ember.from_numpy(w), torch.from_numpy(w)
    _run(
        lambda a: F.binary_cross_entropy(a, ember.from_numpy(y), reduction=reduction),
        lambda a: TF.binary_cross_entropy(a, torch.from_numpy(y), reduction=reduction),
        [p],
        [],
    )
    _run(
        lambda a: F.binary_cross_entropy(a, ember.from_numpy(y), weight=ew, reduction=reduction),
        lambda a: TF.binary_cross_entropy(a, torch.from_numpy(y), weight=tw, reduction=reduction),
        [p],
        [],
    )
    logits = rnd(3, 4, low=-30, high=30)
    soft = rnd(3, 4, seed=4, low=0, high=1)
    pw = rnd(4, seed=6, low=0.5, high=3)
    for kw_e, kw_t in [
        ({}, {}),
        ({"weight": ew}, {"weight": tw}),
        ({"pos_weight": ember.from_numpy(pw)}, {"pos_weight": torch.from_numpy(pw)}),
        (
            {"pos_weight": ember.from_numpy(pw), "weight": ew},
            {"pos_weight": torch.from_numpy(pw), "weight": tw},
        ),
    ]:
        _run(
            lambda a, t: F.binary_cross_entropy_with_logits(a, t, reduction=reduction, **kw_e),
            lambda a, t: TF.binary_cross_entropy_with_logits(a, t, reduction=reduction, **kw_t),
            [logits, soft],
            [],
        )
    # clamped logs at 0 and 1, as torch
    edge = ember.tensor([0.0, 1.0, 0.5])
    yt = ember.tensor([1.0, 0.0, 1.0])
    ref = TF.binary_cross_entropy(
        torch.tensor([0.0, 1.0, 0.5]), torch.tensor([1.0, 0.0, 1.0]), reduction="none"
    )
    np.testing.assert_allclose(
        F.binary_cross_entropy(edge, yt, reduction="none").numpy(), ref.numpy(), rtol=1e-6
    )


@pytest.mark.filterwarnings("ignore:reduction")
@pytest.mark.parametrize("reduction", ["mean", "sum", "none", "batchmean"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div(reduction, log_target):
    x = np.log(rnd(4, 6, low=0.05, high=1))
    t = rnd(4, 6, seed=2, low=0.0, high=1)
    if log_target:
        t = np.log(t + 0.1)
    _run(
        lambda a, b: F.kl_div(a, b, reduction=reduction, log_target=log_target),
        lambda a, b: TF.kl_div(a, b, reduction=reduction, log_target=log_target),
        [x, t],
        [],
    )
    if (
        not log_target
    ):  # zero targets contribute 0 (torch's target grad there is nan; ours is finite)
        t[0, :2] = 0.0
        _run(
            lambda a: F.kl_div(a, ember.from_numpy(t), reduction=reduction),
            lambda a: TF.kl_div(a, torch.from_numpy(t), reduction=reduction),
            [x],
            [],
        )


def test_similarity_and_distance():
    a, b = rnd(5, 7), rnd(5, 7, seed=1)
    for dim in (1, -1, 0):
        _run(
            lambda x, y: F.cosine_similarity(x, y, dim=dim),
            lambda x, y: TF.cosine_similarity(x, y, dim=dim),
            [a, b],
            [],
        )
    _run(
        lambda x, y: F.pairwise_distance(x, y), lambda x, y: TF.pairwise_distance(x, y), [a, b], []
    )
    _run(
        lambda x, y: F.pairwise_distance(x, y, p=1.0, keepdim=True),
        lambda x, y: TF.pairwise_distance(x, y, p=1.0, keepdim=True),
        [a, b],
        [],
    )
    for p, dim in [(2.0, 1), (1.0, 0), (3.0, -1)]:
        check(
            lambda x: F.normalize(x, p=p, dim=dim),
            lambda x: TF.normalize(x, p=p, dim=dim),
            [(4, 6)],
            meta=False,
        )
    z = ember.zeros(2, 3)
    assert np.all(F.normalize(z).numpy() == 0)


def test_other_losses():
    a, b = rnd(6), rnd(6, seed=1)
    y = np.sign(rnd(6, seed=2))
    ey, ty = ember.from_numpy(y), torch.from_numpy(y)
    _run(
        lambda x, z: F.margin_ranking_loss(x, z, ey, margin=0.1),
        lambda x, z: TF.margin_ranking_loss(x, z, ty, margin=0.1),
        [a, b],
        [],
    )
    _run(lambda x: F.soft_margin_loss(x, ey), lambda x: TF.soft_margin_loss(x, ty), [a], [])
    _run(lambda x: F.hinge_embedding_loss(x, ey), lambda x: TF.hinge_embedding_loss(x, ty), [a], [])
    u, v = rnd(4, 5), rnd(4, 5, seed=3)
    y4 = np.array([1.0, -1.0, 1.0, -1.0])
    _run(
        lambda x, z: F.cosine_embedding_loss(x, z, ember.from_numpy(y4), margin=0.2),
        lambda x, z: TF.cosine_embedding_loss(x, z, torch.from_numpy(y4), margin=0.2),
        [u, v],
        [],
    )
    w = rnd(4, 5, seed=4)
    _run(
        lambda p, q, r: F.triplet_margin_loss(p, q, r, swap=True),
        lambda p, q, r: TF.triplet_margin_loss(p, q, r, swap=True),
        [u, v, w],
        [],
    )
    lam = rnd(4, 5, seed=5, low=0.1, high=3)
    cnt = np.round(rnd(4, 5, seed=6, low=0, high=5))
    ec, tc = ember.from_numpy(cnt), torch.from_numpy(cnt)
    _run(
        lambda x: F.poisson_nll_loss(x, ec), lambda x: TF.poisson_nll_loss(x, tc), [np.log(lam)], []
    )
    _run(
        lambda x: F.poisson_nll_loss(x, ec, log_input=False, full=True),
        lambda x: TF.poisson_nll_loss(x, tc, log_input=False, full=True),
        [lam],
        [],
    )
    var = rnd(4, 5, seed=7, low=0.5, high=2)
    _run(
        lambda x, s: F.gaussian_nll_loss(x, ember.from_numpy(w), s, full=True),
        lambda x, s: TF.gaussian_nll_loss(x, torch.from_numpy(w), s, full=True),
        [u, var],
        [],
    )
    tgt = (rnd(4, 5, seed=8) > 0).astype(np.float64)
    _run(
        lambda x: F.multilabel_soft_margin_loss(x, ember.from_numpy(tgt)),
        lambda x: TF.multilabel_soft_margin_loss(x, torch.from_numpy(tgt)),
        [u],
        [],
    )


def test_loss_modules():
    x = rnd(4, 3, low=-2, high=2)
    t = np.array([2, 0, 1, 2])
    w = rnd(3, low=0.5, high=1.5)
    cases = [
        (
            nn.CrossEntropyLoss(weight=ember.from_numpy(w), label_smoothing=0.1),
            torch.nn.CrossEntropyLoss(weight=torch.from_numpy(w), label_smoothing=0.1),
            "int",
        ),
        (
            nn.CrossEntropyLoss(ignore_index=0, reduction="sum"),
            torch.nn.CrossEntropyLoss(ignore_index=0, reduction="sum"),
            "int",
        ),
        (nn.NLLLoss(), torch.nn.NLLLoss(), "int"),
        (nn.MSELoss(), torch.nn.MSELoss(), "float"),
        (nn.L1Loss(reduction="none"), torch.nn.L1Loss(reduction="none"), "float"),
        (nn.SmoothL1Loss(beta=0.5), torch.nn.SmoothL1Loss(beta=0.5), "float"),
        (nn.HuberLoss(delta=0.5), torch.nn.HuberLoss(delta=0.5), "float"),
        (
            nn.BCEWithLogitsLoss(pos_weight=ember.from_numpy(w)),
            torch.nn.BCEWithLogitsLoss(pos_weight=torch.from_numpy(w)),
            "prob",
        ),
        (nn.BCELoss(), torch.nn.BCELoss(), "probin"),
        (nn.KLDivLoss(reduction="batchmean"), torch.nn.KLDivLoss(reduction="batchmean"), "prob"),
    ]
    y = rnd(4, 3, seed=1, low=0.05, high=0.95)
    for em, tm, kind in cases:
        assert repr(em) == repr(tm)
        assert list(em.state_dict()) == list(tm.state_dict())
        xin = 1 / (1 + np.exp(-x)) if kind == "probin" else x
        tgt_e = ember.tensor(t) if kind == "int" else ember.from_numpy(y)
        tgt_t = torch.tensor(t) if kind == "int" else torch.from_numpy(y)
        _run(lambda a: em(a, tgt_e), lambda a: tm(a, tgt_t), [xin], [])
