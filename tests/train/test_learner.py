"""The Learner: fit, logs, checkpoints, exact resume, early stopping, best checkpoint, Ctrl-C."""

from __future__ import annotations

import csv

import numpy as np
import pytest

import ember
from ember import nn, optim
from ember.data import DataLoader, TensorDataset
from ember.nn import functional as F
from ember.train import (
    Accuracy,
    Callback,
    EarlyStopping,
    LambdaCallback,
    Learner,
    Metric,
    ModelCheckpoint,
    fit,
    load_checkpoint,
    load_model_state,
)


def _data(n=160, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 6)).astype(np.float32)
    w = rng.standard_normal((6, 3)).astype(np.float32)
    y = (x @ w).argmax(1)
    return x, y


def _loaders(seed=0, gen_seed=0, n=160, batch_size=16):
    x, y = _data(n, seed)
    ds = TensorDataset(ember.tensor(x), ember.tensor(y))
    split = n * 3 // 4
    train = TensorDataset(ember.tensor(x[:split]), ember.tensor(y[:split]))
    valid = TensorDataset(ember.tensor(x[split:]), ember.tensor(y[split:]))
    g = ember.Generator().manual_seed(gen_seed)
    return DataLoader(train, batch_size, shuffle=True, generator=g), DataLoader(valid, 32), ds


def _model(seed=0):
    ember.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))


def _params(model):
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def test_fit_logs_curves_and_checkpoints(tmp_path, capsys):
    train, valid, _ = _loaders()
    model = _model()
    opt = optim.Adam(model.parameters(), lr=0.02)
    learner = Learner(model, opt, F.cross_entropy, metrics=[Accuracy()], out_dir=tmp_path)
    history = learner.fit(train, valid, epochs=4)
    assert len(history) == 4 and learner.epoch == 4
    assert [h["epoch"] for h in history] == [1, 2, 3, 4]
    for key in ("train_loss", "train_accuracy", "valid_loss", "valid_accuracy", "lr", "time"):
        assert key in history[0]
    assert history[-1]["valid_loss"] < history[0]["valid_loss"]
    assert history[-1]["valid_accuracy"] > 0.6
    out = capsys.readouterr().out
    assert "epoch 1/4" in out and "samples/s" in out  # plain lines when not a terminal
    rows = list(csv.DictReader(open(tmp_path / "log.csv")))
    assert len(rows) == 4 and float(rows[3]["valid_loss"]) == pytest.approx(
        history[3]["valid_loss"]
    )
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "last.safetensors").exists() and (tmp_path / "best.safetensors").exists()
    # last.safetensors restores the trained weights into a fresh model
    fresh = _model(seed=99)
    fresh.load_state_dict(load_model_state(tmp_path / "last.safetensors"))
    for k, v in _params(model).items():
        np.testing.assert_array_equal(_params(fresh)[k], v)
    # evaluate() agrees with the logged validation numbers
    ev = learner.evaluate(valid)
    assert ev["loss"] == pytest.approx(history[-1]["valid_loss"], rel=1e-6)
    assert ev["accuracy"] == history[-1]["valid_accuracy"]
    assert learner.predict(valid).shape == (40, 3)


@pytest.mark.parametrize("with_scheduler", [False, True])
def test_resume_is_exact(tmp_path, with_scheduler):
    """2 epochs straight == 1 epoch + checkpoint + fresh objects + resume + 1 epoch."""

    def run(out_dir, epochs, resume=None, model_seed=0, gen_seed=0):
        train, valid, _ = _loaders(gen_seed=gen_seed)
        model = _model(model_seed)
        opt = optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)
        sched = optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5) if with_scheduler else None
        learner = Learner(
            model, opt, F.cross_entropy, scheduler=sched, out_dir=out_dir, progress=False
        )
        learner.fit(train, valid, epochs=epochs, resume=resume)
        return learner

    straight = run(tmp_path / "a", 2)
    run(tmp_path / "b", 1)
    # different init and shuffling seed: the checkpoint must restore all of it
    resumed = run(
        tmp_path / "c", 2, resume=tmp_path / "b" / "last.safetensors", model_seed=7, gen_seed=3
    )
    a, c = _params(straight.model), _params(resumed.model)
    for k in a:
        np.testing.assert_array_equal(a[k], c[k], err_msg=k)
    assert resumed.epoch == 2 and len(resumed.history) == 2
    assert [h["train_loss"] for h in resumed.history] == [h["train_loss"] for h in straight.history]
    sa, sc = straight.optimizer.state_dict(), resumed.optimizer.state_dict()
    for i in sa["state"]:
        for key, v in sa["state"][i].items():
            np.testing.assert_array_equal(np.asarray(v), np.asarray(sc["state"][i][key]))
    assert resumed.optimizer.param_groups[0]["lr"] == straight.optimizer.param_groups[0]["lr"]
    # a third epoch keeps agreeing (from the same global RNG state: dropout draws from it)
    rng = ember.get_rng_state()
    straight.fit(straight.train_loader, straight.valid_loader, epochs=3)
    ember.set_rng_state(rng)
    resumed.fit(resumed.train_loader, resumed.valid_loader, epochs=3)
    for k, v in _params(straight.model).items():
        np.testing.assert_array_equal(v, _params(resumed.model)[k])
    # resume=True picks out_dir/last.safetensors
    again = run(tmp_path / "c", 3, resume=True, model_seed=5)
    assert again.epoch == 3 and len(again.history) == 3


def test_early_stopping_and_best_checkpoint(tmp_path):
    class Scripted(Metric):
        """A metric with scripted validation values, to test best-checkpoint selection."""

        name = "score"
        higher_is_better = True
        values = [0.5, 0.9, 0.7, 0.8, 0.6, 0.85, 0.1]

        def __init__(self):
            self.calls = 0
            self.training = True

        def reset(self):
            pass

        def update(self, output, target, loss=None):
            pass

        def compute(self):
            self.calls += 1
            # train metrics are computed first each epoch, then valid ones
            return self.values[(self.calls - 1) // 2]

    snapshots = {}
    snap = LambdaCallback(
        on_epoch_end=lambda lrn, logs: snapshots.update({logs["epoch"]: _params(lrn.model)})
    )
    train, valid, _ = _loaders()
    model = _model()
    es = EarlyStopping(monitor="valid_score", patience=3)
    mc = ModelCheckpoint(monitor="valid_score", restore_best=True)
    learner = Learner(
        model,
        optim.SGD(model.parameters(), lr=0.05),
        F.cross_entropy,
        metrics=[Scripted()],
        callbacks=[es, mc, snap],
        out_dir=tmp_path,
        progress=False,
    )
    learner.fit(train, valid, epochs=7)
    # best 0.9 at epoch 2; 0.7, 0.8, 0.6 do not improve -> stop after epoch 5
    assert len(learner.history) == 5 and es.stopped_epoch == 5
    assert mc.best_epoch == 2 and mc.best == 0.9
    meta = load_checkpoint(tmp_path / "best.safetensors")
    assert meta["epoch"] == 2
    for k, v in load_model_state(tmp_path / "best.safetensors").items():
        np.testing.assert_array_equal(v.numpy(), snapshots[2][k])
        np.testing.assert_array_equal(_params(model)[k], snapshots[2][k])  # restore_best
    # min mode on valid_loss with a learning rate of 0: nothing ever improves after epoch 1
    model = _model()
    es = EarlyStopping(patience=2)
    learner = Learner(
        model,
        optim.SGD(model.parameters(), lr=0.0),
        F.cross_entropy,
        callbacks=[es],
        progress=False,
    )
    ember.manual_seed(0)
    learner.fit(train, valid, epochs=10)
    assert len(learner.history) == 3 and es.monitor == "valid_loss"


def test_keyboard_interrupt_saves_and_stops(tmp_path):
    class Interrupt(Callback):
        def __init__(self):
            self.ended = False

        def on_batch_end(self, learner, logs):
            if learner.global_step == 12:
                raise KeyboardInterrupt

        def on_fit_end(self, learner):
            self.ended = True

    train, valid, _ = _loaders()
    model = _model()
    cb = Interrupt()
    learner = Learner(
        model, optim.Adam(model.parameters()), F.cross_entropy, callbacks=[cb], out_dir=tmp_path
    )
    history = learner.fit(train, valid, epochs=5)  # returns instead of raising
    assert learner.interrupted and cb.ended and len(history) == 1  # 8 batches per epoch
    path = tmp_path / "interrupted.safetensors"
    assert path.exists()
    for k, v in load_model_state(path).items():
        np.testing.assert_array_equal(v.numpy(), _params(model)[k])
    assert load_checkpoint(path)["epoch"] == 1
    assert (tmp_path / "log.csv").exists() and (tmp_path / "curves.png").exists()


def test_evaluation_runs_under_no_grad_in_eval_mode():
    seen = []

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 3)

        def forward(self, x):
            seen.append((self.training, ember.is_grad_enabled()))
            return self.lin(x)

    train, valid, _ = _loaders(n=40)
    model = Probe()
    learner = fit(
        model,
        train,
        valid,
        optim.SGD(model.parameters(), lr=0.1),
        F.cross_entropy,
        1,
        progress=False,
    )
    assert isinstance(learner, Learner)
    n_train = len(train)
    assert all(s == (True, True) for s in seen[:n_train])
    assert seen[n_train:] and all(s == (False, False) for s in seen[n_train:])
    assert model.training  # back in training mode afterwards


def test_schedulers_inside_the_learner():
    train, valid, _ = _loaders()
    model = _model()
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, epochs=2, steps_per_epoch=len(train))
    learner = Learner(model, opt, F.cross_entropy, scheduler=sched, progress=False)
    assert learner.scheduler_interval == "step"
    learner.fit(train, valid, epochs=2)
    assert sched.last_epoch == 2 * len(train)
    model = _model()
    opt = optim.SGD(model.parameters(), lr=0.0)
    sched = optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
    opt.param_groups[0]["lr"] = 0.0
    learner = Learner(model, opt, F.cross_entropy, scheduler=sched, progress=False)
    learner.fit(train, valid, epochs=3)
    assert sched.num_bad_epochs == 0 and sched.last_epoch == 3


def test_tqdm_progress(capsys):
    train, valid, _ = _loaders(n=40)
    model = _model()
    learner = Learner(
        model, optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, progress="tqdm"
    )
    learner.fit(train, valid, epochs=1)
    err = capsys.readouterr().err
    assert "epoch 1/1" in err and "train_loss" in err


def test_errors():
    model = _model()
    with pytest.raises(TypeError):
        fit(model, [], None, None, F.cross_entropy)
    learner = Learner(model, optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, progress=False)
    with pytest.raises(TypeError):
        learner.fit([ember.zeros(2, 6)], epochs=1)
    with pytest.raises(FileNotFoundError):
        learner.fit([], epochs=1, resume="/nonexistent/ckpt.safetensors")
    with pytest.raises(ValueError):
        Learner(model, learner.optimizer, F.cross_entropy, scheduler_interval="batch")


def test_gradient_clipping_in_the_learner():
    train, valid, _ = _loaders(n=40)
    grads = []

    class Probe(Callback):
        def on_batch_end(self, learner, logs):
            total = sum(float((p.grad * p.grad).sum()) for p in learner.model.parameters())
            grads.append(total**0.5)

    model = _model()
    opt = optim.SGD(model.parameters(), lr=0.1)
    learner = Learner(
        model, opt, F.cross_entropy, callbacks=[Probe()], clip_grad_norm=0.05, progress=False
    )
    learner.fit(train, valid, epochs=1)
    assert grads and max(grads) <= 0.05 + 1e-6


def test_plain_progress_without_tqdm_and_dict_batches(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "tqdm", None)  # as if the train extra were not installed
    x, y = _data(40)

    class Dicts(ember.data.Dataset):
        def __len__(self):
            return len(y)

        def __getitem__(self, i):
            return {"input": x[i], "target": int(y[i])}

    model = _model()
    learner = Learner(
        model, optim.Adam(model.parameters(), lr=0.01), F.cross_entropy, progress="tqdm"
    )
    learner.fit(DataLoader(Dicts(), batch_size=8), epochs=2)
    out = capsys.readouterr()
    assert "epoch 2/2 | train_loss" in out.out and "it/s" not in out.err
    assert learner.default_monitor == "train_loss"
