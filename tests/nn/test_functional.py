"""ember.nn.functional: fused norms, dropout, activations' torch signatures; utils (clipping)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import ember
from ember import nn
from ember.nn import functional as F
from tests.helpers import TORCH_DT, assert_close, check, gradcheck


def _t(a):
    return torch.from_numpy(np.array(a))


@pytest.mark.parametrize(
    "shape,ns", [((4, 6), (6,)), ((2, 3, 4, 5), (4, 5)), ((3, 3), (3,)), ((0, 4), (4,))]
)
def test_layer_norm(shape, ns):
    check(lambda x: F.layer_norm(x, ns), lambda x: TF.layer_norm(x, ns), [shape])
    check(
        lambda x, w, b: F.layer_norm(x, ns, w, b, 1e-3),
        lambda x, w, b: TF.layer_norm(x, ns, w, b, 1e-3),
        [shape, ns, ns],
    )
    check(lambda x, w: F.layer_norm(x, ns, w), lambda x, w: TF.layer_norm(x, ns, w), [shape, ns])
    check(
        lambda x, w, b: F.layer_norm(x, ns, w, b),
        lambda x, w, b: TF.layer_norm(x, ns, w, b),
        [shape, ns, ns],
        dtypes=(ember.float16, ember.bfloat16),
    )


def test_norm_gradcheck_and_errors():
    gradcheck(lambda x, w, b: F.layer_norm(x, (5,), w, b), [(3, 5), (5,), (5,)])
    gradcheck(lambda x, w: F.rms_norm(x, (5,), w, 1e-3), [(3, 5), (5,)])
    gradcheck(lambda x, w, b: F.group_norm(x, 2, w, b), [(2, 4, 3), (4,), (4,)])
    gradcheck(lambda x: F.batch_norm(x, None, None, training=True), [(4, 3, 2)])
    with pytest.raises(ember.errors.ShapeError):
        F.layer_norm(ember.randn(3, 4), (5,))
    with pytest.raises(ember.errors.ShapeError):
        F.rms_norm(ember.randn(3, 4), (4,), ember.ones(3))
    with pytest.raises(ember.errors.ShapeError):
        F.group_norm(ember.randn(2, 5, 3), 2)
    with pytest.raises(ember.errors.ShapeError):
        F.batch_norm(ember.randn(2, 3), None, None, training=False)


@pytest.mark.parametrize("shape,ns", [((4, 6), (6,)), ((2, 3, 4, 5), (4, 5))])
def test_rms_norm(shape, ns):
    check(lambda x: F.rms_norm(x, ns), lambda x: TF.rms_norm(x, ns), [shape])
    check(
        lambda x, w: F.rms_norm(x, ns, w, 1e-4),
        lambda x, w: TF.rms_norm(x, ns, w, 1e-4),
        [shape, ns],
    )
    check(
        lambda x, w: F.rms_norm(x, ns, w),
        lambda x, w: TF.rms_norm(x, ns, w),
        [shape, ns],
        dtypes=(ember.float16, ember.bfloat16),
    )


def test_rms_norm_default_eps_is_compute_type_eps():
    """eps defaults to the epsilon of the type it computes in (float32 for float16/bfloat16),
    as torch's; the reference is float64 with that eps, rounded to the dtype."""
    x = np.full((1, 4), 1e-3, np.float32)
    x[0, 1] = 3e-3
    for edt, compute in (
        (ember.bfloat16, torch.float32),
        (ember.float16, torch.float32),
        (ember.float64, torch.float64),
    ):
        xe = ember.from_numpy(x).to(edt)
        ref = TF.rms_norm(_t(xe.double().numpy()), (4,), eps=torch.finfo(compute).eps)
        assert_close(F.rms_norm(xe, (4,)), ref.to(TORCH_DT[edt]), edt, f"rms_norm {edt}")


@pytest.mark.parametrize(
    "shape,groups", [((2, 6, 5), 3), ((3, 4, 2, 3), 2), ((2, 4, 3), 4), ((1, 6, 7), 1), ((3, 6), 2)]
)
def test_group_norm(shape, groups):
    C = shape[1]
    check(
        lambda x, w, b: F.group_norm(x, groups, w, b),
        lambda x, w, b: TF.group_norm(x, groups, w, b),
        [shape, (C,), (C,)],
    )
    check(
        lambda x: F.group_norm(x, groups, eps=0.1),
        lambda x: TF.group_norm(x, groups, eps=0.1),
        [shape],
    )


@pytest.mark.parametrize("shape", [(5, 3), (4, 3, 6), (2, 3, 4, 5)])
def test_batch_norm_functional(shape):
    C = shape[1]
    rng = np.random.default_rng(0)
    rm, rv = rng.standard_normal(C), rng.random(C) + 0.5
    er, ev, tr, tv = ember.tensor(rm), ember.tensor(rv), _t(rm), _t(rv)
    check(
        lambda x, w, b: F.batch_norm(x, er, ev, w, b, training=True, momentum=0.2),
        lambda x, w, b: TF.batch_norm(x, tr, tv, w, b, training=True, momentum=0.2),
        [shape, (C,), (C,)],
        dtypes=(ember.float64,),
        contig_variants=False,
        meta=False,
    )
    np.testing.assert_allclose(er.numpy(), tr.numpy(), rtol=1e-12)
    np.testing.assert_allclose(ev.numpy(), tv.numpy(), rtol=1e-12)
    check(
        lambda x, w, b: F.batch_norm(x, ember.tensor(rm), ember.tensor(rv), w, b),
        lambda x, w, b: TF.batch_norm(x, _t(rm), _t(rv), w, b),
        [shape, (C,), (C,)],
        dtypes=(ember.float64,),
    )
    check(
        lambda x: F.batch_norm(x, None, None, training=True),
        lambda x: TF.batch_norm(x, None, None, training=True),
        [shape],
    )


def test_instance_norm_functional():
    rm, rv = np.zeros(3), np.ones(3)
    er, ev, tr, tv = ember.tensor(rm), ember.tensor(rv), _t(rm), _t(rv)
    check(
        lambda x, w, b: F.instance_norm(x, er, ev, w, b),
        lambda x, w, b: TF.instance_norm(x, tr, tv, w, b),
        [(2, 3, 5), (3,), (3,)],
        dtypes=(ember.float64,),
        contig_variants=False,
        meta=False,
    )
    np.testing.assert_allclose(er.numpy(), tr.numpy(), rtol=1e-12)
    np.testing.assert_allclose(ev.numpy(), tv.numpy(), rtol=1e-12)


def test_norms_on_meta_cost_nothing():
    x = ember.empty(4, 1024, 4096, device="meta")  # 64 MiB of float32 if it were real
    w = ember.ones(4096, device="meta")
    assert F.layer_norm(x, (4096,), w, w).shape == x.shape
    assert F.rms_norm(x, (4096,), w).shape == x.shape
    assert F.group_norm(ember.empty(2, 8, 1 << 20, device="meta"), 2).shape == (2, 8, 1 << 20)
    assert F.dropout(x, 0.1).shape == x.shape
    assert nn.LayerNorm(4096, device="meta")(x).device == "meta"


def test_activation_signatures():
    x = np.linspace(-3, 3, 24).reshape(4, 6)
    for name, kw in [
        ("relu", {}),
        ("relu6", {}),
        ("leaky_relu", {"negative_slope": 0.1}),
        ("elu", {"alpha": 0.5}),
        ("selu", {}),
        ("celu", {"alpha": 2.0}),
        ("gelu", {"approximate": "tanh"}),
        ("silu", {}),
        ("mish", {}),
        ("hardswish", {}),
        ("hardsigmoid", {}),
        ("hardtanh", {"min_val": -2.0, "max_val": 0.5}),
        ("logsigmoid", {}),
        ("softsign", {}),
        ("tanhshrink", {}),
        ("softshrink", {"lambd": 0.7}),
        ("hardshrink", {"lambd": 0.7}),
        ("softplus", {"beta": 2, "threshold": 3}),
        ("sigmoid", {}),
        ("tanh", {}),
    ]:
        e = getattr(F, name)(ember.tensor(x), **kw).numpy()
        t = getattr(TF, name)(_t(x), **kw).numpy()
        np.testing.assert_allclose(e, t, rtol=1e-6, atol=1e-7, err_msg=name)
    y = ember.tensor(x)
    assert F.relu(y, inplace=True) is y and y.numpy().min() == 0
    np.testing.assert_allclose(
        F.threshold(ember.tensor(x), 0.5, -1.0).numpy(), TF.threshold(_t(x), 0.5, -1.0).numpy()
    )
    check(lambda a, w: F.prelu(a, w), lambda a, w: TF.prelu(a, w), [(2, 3, 4), (3,)])
    check(lambda a: F.glu(a, 1), lambda a: TF.glu(a, 1), [(2, 6, 3)])
    check(lambda a: F.softmax(a, 1), lambda a: TF.softmax(a, 1), [(2, 5, 3)])
    check(
        lambda a: F.log_softmax(a, -1, dtype=ember.float64),
        lambda a: TF.log_softmax(a, -1, dtype=torch.float64),
        [(3, 4)],
    )
    check(lambda a: F.softmin(a, 0), lambda a: TF.softmin(a, 0), [(3, 4)])
    np.testing.assert_allclose(
        F.softmax(ember.tensor(x)).numpy(), TF.softmax(_t(x), dim=1).numpy(), rtol=1e-6
    )
    g = F.gumbel_softmax(ember.randn(5, 7), tau=0.5, hard=True)
    assert np.all(g.numpy().sum(-1) == 1) and set(np.unique(g.numpy())) <= {0.0, 1.0}


def test_dropout_functional():
    x = ember.ones(100, 100)
    assert F.dropout(x, 0.5, training=False) is x
    y = F.dropout(x, 0.2).numpy()
    assert 0.17 < (y == 0).mean() < 0.23
    z = ember.ones(10)
    F.dropout(z, 0.5, inplace=True)
    assert set(np.unique(z.numpy())) <= {0.0, 2.0}
    c = F.dropout2d(ember.ones(3, 4, 5, 5), 0.5).numpy().reshape(12, 25)
    assert all(len(np.unique(r)) == 1 for r in c)
    c3 = F.dropout3d(ember.ones(2, 3, 2, 2, 2), 0.5).numpy().reshape(6, 8)
    assert all(len(np.unique(r)) == 1 for r in c3)
    a = F.alpha_dropout(ember.randn(200, 200), 0.2, training=True).numpy()
    assert abs(a.mean()) < 0.05 and abs(a.std() - 1) < 0.05
    with pytest.raises(ValueError):
        F.dropout(x, -0.1)
    with pytest.raises(ember.errors.ShapeError):
        F.dropout2d(ember.ones(3), 0.5)


def test_reexported_ops():
    idx = np.array([[0, 2], [4, 1]])
    w = np.random.default_rng(0).standard_normal((5, 3))
    check(
        lambda ww: F.embedding(ember.tensor(idx), ww, padding_idx=1),
        lambda ww: TF.embedding(torch.tensor(idx), ww, padding_idx=1),
        [(5, 3)],
        meta=False,
    )
    np.testing.assert_array_equal(
        F.one_hot(ember.tensor([0, 3, 1]), 5).numpy(),
        TF.one_hot(torch.tensor([0, 3, 1]), 5).numpy(),
    )
    check(
        lambda a: F.pad(a, (1, 2, 0, 1), mode="reflect"),
        lambda a: TF.pad(a, (1, 2, 0, 1), mode="reflect"),
        [(1, 2, 4, 4)],
    )
    check(
        lambda a, ww, b: F.linear(a, ww, b),
        lambda a, ww, b: TF.linear(a, ww, b),
        [(3, 4), (5, 4), (5,)],
    )
    check(
        lambda a, ww: F.conv2d(a, ww, padding="same"),
        lambda a, ww: TF.conv2d(a, ww, padding="same"),
        [(1, 2, 5, 5), (3, 2, 3, 3)],
    )
    check(
        lambda a: F.interpolate(a, scale_factor=2, mode="nearest"),
        lambda a: TF.interpolate(a, scale_factor=2, mode="nearest"),
        [(1, 2, 3, 3)],
    )
    check(lambda a: F.pixel_shuffle(a, 2), lambda a: TF.pixel_shuffle(a, 2), [(1, 8, 2, 3)])
    assert F.embedding is not None and w is not None


def test_clip_grad():
    m = nn.Linear(4, 3)
    t = torch.nn.Linear(4, 3)
    from tests.nn.common import sync

    sync(t, m)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    (m(ember.tensor(x)) ** 2).sum().backward()
    (t(_t(x)) ** 2).sum().backward()
    for norm_type in (2.0, 1.0, float("inf")):
        m2, t2 = (
            [p.grad.numpy().copy() for p in m.parameters()],
            [p.grad.clone() for p in t.parameters()],
        )
        for p, g in zip(m.parameters(), m2):
            p.grad = ember.tensor(g.copy())
        for p, g in zip(t.parameters(), t2):
            p.grad = g.clone()
        te = nn.utils.clip_grad_norm_(m.parameters(), 0.5, norm_type)
        tt = torch.nn.utils.clip_grad_norm_(t.parameters(), 0.5, norm_type)
        np.testing.assert_allclose(te.item(), tt.item(), rtol=1e-5)
        for pe, pt in zip(m.parameters(), t.parameters()):
            np.testing.assert_allclose(pe.grad.numpy(), pt.grad.numpy(), rtol=1e-5, atol=1e-7)
        for p, g in zip(m.parameters(), m2):
            p.grad = ember.tensor(g)
        for p, g in zip(t.parameters(), t2):
            p.grad = g
    nn.utils.clip_grad_value_(m.parameters(), 0.01)
    torch.nn.utils.clip_grad_value_(t.parameters(), 0.01)
    for pe, pt in zip(m.parameters(), t.parameters()):
        # unclipped entries carry float32 summation-order differences of the two backwards: sums
        # of 5 products of size ~1, so ~1e-7 absolute (an entry near 1e-3 once differed by 3e-8)
        np.testing.assert_allclose(pe.grad.numpy(), pt.grad.numpy(), rtol=1e-5, atol=1e-6)
    vec = nn.utils.parameters_to_vector(m.parameters())
    assert vec.shape == (15,)
    nn.utils.vector_to_parameters(ember.zeros(15), m.parameters())
    assert float(m.weight.abs().sum()) == 0.0
    p = nn.Parameter(ember.ones(2))
    p.grad = ember.tensor([float("nan"), 1.0])
    with pytest.raises(ember.errors.EmberError):
        nn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    assert float(nn.utils.clip_grad_norm_([], 1.0)) == 0.0


def test_module_call_fast_path_and_training_loop():
    """A tiny classifier trains (losses fall) with SGD written inline: the parts fit together."""
    ember.manual_seed(0)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((64, 4)).astype(np.float32)
    y = (X[:, 0] + X[:, 1] > 0).astype(np.int64)
    model = nn.Sequential(
        nn.Linear(4, 16), nn.GELU(), nn.LayerNorm(16), nn.Dropout(0.1), nn.Linear(16, 2)
    )
    assert not model._forward_hooks and not model._forward_pre_hooks
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(model(ember.tensor(X)), ember.tensor(y))
        model.zero_grad()
        loss.backward()
        with ember.no_grad():
            for p in model.parameters():
                p -= 0.3 * p.grad
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    model.eval()
    acc = (model(ember.tensor(X)).argmax(-1).numpy() == y).mean()
    assert acc > 0.9
