"""Captured decode steps (ember.nn.graph): a replay computes bitwise what the plain forward
computes, for every decoder family, dense and quantized, over a KVCache and over BatchKVCache
rows whose slots change from step to step."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import config, nn
from ember.errors import ShapeError, UnsupportedError
from ember.nn.graph import DecodeGraphs, StepGraph
from tests.models.test_stack_linears import _tiny, _tiny_llama


def _model(family):
    if family.startswith("llama"):
        qtype = family.partition(":")[2] or None
        extra = {"qk_norm": True, "attention_bias": True} if qtype == "q8_0" else {}
        return _tiny_llama(qtype, **extra)
    model = _tiny(family)
    for p in model.parameters():
        p._data[...] = np.random.default_rng(p.numel()).standard_normal(p.shape) * 0.2
    return model


def _dims(model):
    return model.spec.num_layers, model.num_kv_heads, model.spec.head_dim


FAMILIES = ["llama", "llama:q8_0", "llama:q4_1", "llama:bf16", "gemma2", "phi3", "gpt2"]


@pytest.mark.parametrize("family", FAMILIES)
def test_replayed_steps_equal_plain_forwards(family):
    model = _model(family)
    layers, hk, hd = _dims(model)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, model.config.vocab_size, (2, 6))  # past gemma2's 4-token window
    caches = [nn.KVCache(layers, 2, hk, 24, hd) for _ in range(2)]
    graphs = DecodeGraphs(model, logits_to_keep=1)
    with ember.no_grad():
        for c in caches:
            model(ember.tensor(prompt), cache=c)
        for step in range(8):
            ids = rng.integers(0, model.config.vocab_size, (2, 1))
            plain = model(ember.tensor(ids), cache=caches[0], logits_to_keep=1).numpy()
            got = graphs(ids, caches[1]).numpy()
            np.testing.assert_array_equal(got, plain, err_msg=f"step {step}")
            assert caches[1].pos == caches[0].pos
    for a, b in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
        np.testing.assert_array_equal(a, b)
    (graph,) = [g for g, _ in graphs._graphs.values()]
    assert graph.captures == 1 and graph.replays == 7


@pytest.mark.parametrize("family", ["llama:q4_1", "gemma2"])
def test_batch_rows_change_without_a_new_capture(family):
    """A graph per batch size: other slots in other orders replay the same graph."""
    model = _model(family)
    layers, hk, hd = _dims(model)
    vocab = model.config.vocab_size
    rng = np.random.default_rng(1)
    caches = [nn.BatchKVCache(layers, 5, hk, 32, hd) for _ in range(2)]
    graphs = DecodeGraphs(model)
    with ember.no_grad():
        for slot in range(5):
            prompt = ember.tensor(rng.integers(0, vocab, (1, 2 + slot)))
            for c in caches:
                model(prompt, cache=c.rows([slot]))
        for slots in ([0, 1, 2], [4, 0, 3], [2, 3, 1], [1, 4, 0], [3, 2]):
            ids = rng.integers(0, vocab, (len(slots), 1))
            plain = model(ember.tensor(ids), cache=caches[0].rows(slots)).numpy()
            got = graphs(ids, caches[1].rows(slots)).numpy()
            np.testing.assert_array_equal(got, plain, err_msg=str(slots))
    np.testing.assert_array_equal(caches[0].lengths, caches[1].lengths)
    assert sorted(graphs._graphs) == [2, 3]  # one graph per batch size
    assert graphs._graphs[3][0].captures == 1 and graphs._graphs[3][0].replays == 3


def test_a_reallocated_cache_gets_new_graphs():
    model = _model("llama")
    layers, hk, hd = _dims(model)
    graphs = DecodeGraphs(model)
    with ember.no_grad():
        for _ in range(2):
            cache = nn.KVCache(layers, 1, hk, 8, hd)
            model(ember.tensor([[1, 2]]), cache=cache)
            plain_cache = nn.KVCache(layers, 1, hk, 8, hd)
            model(ember.tensor([[1, 2]]), cache=plain_cache)
            for tok in (3, 4):
                np.testing.assert_array_equal(
                    graphs([[tok]], cache).numpy(),
                    model(ember.tensor([[tok]]), cache=plain_cache).numpy(),
                )
        with pytest.raises(ShapeError, match="overflow"):
            for tok in range(10):
                graphs([[tok]], cache)


def test_other_steps_and_the_switch_run_plain_forwards(monkeypatch):
    model = _model("llama")
    layers, hk, hd = _dims(model)
    cache = nn.KVCache(layers, 1, hk, 16, hd)
    graphs = DecodeGraphs(model)
    with ember.no_grad():
        graphs([[1, 2, 3]], cache)  # a prompt: a plain forward
        assert cache.pos == 3 and not graphs._graphs
        monkeypatch.setattr(config, "GRAPHS", False)
        off = DecodeGraphs(model)
        off([[4]], cache)
        assert cache.pos == 4 and not off._graphs


def test_step_graph_replays_with_new_inputs_and_recaptures_new_shapes():
    w = ember.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))

    def fn(x):
        return (x @ w).relu().reshape(-1) * 2.0

    g = StepGraph(fn)
    rng = np.random.default_rng(2)
    for shape in [(2, 3), (2, 3), (5, 3), (5, 3), (2, 3)]:
        x = ember.tensor(rng.standard_normal(shape).astype(np.float32))
        np.testing.assert_array_equal(g(x).numpy(), fn(x).numpy())
    assert g.captures == 3 and g.replays == 2


def test_step_graph_refuses_a_recorded_graph():
    w = ember.tensor(np.ones((2, 2), np.float32), requires_grad=True)

    def fn(x):
        with ember.enable_grad():
            return x @ w

    with pytest.raises(UnsupportedError):
        StepGraph(fn)(ember.tensor(np.ones((1, 2), np.float32)))


def test_a_capture_records_only_its_own_thread():
    """Ops another thread runs while a step is being captured stay out of its tape."""
    import threading

    w = ember.tensor(np.ones((4, 4), np.float32))
    started, release = threading.Event(), threading.Event()

    def other():
        started.set()
        release.wait(10)
        for _ in range(50):
            (w @ w).relu()

    t = threading.Thread(target=other)
    t.start()
    started.wait(10)

    def fn(x):
        release.set()
        y = x
        for _ in range(20):
            y = (y @ w) * 0.5
        return y

    g = StepGraph(fn)
    x = ember.tensor(np.ones((2, 4), np.float32))
    g(x)
    t.join()
    assert len(g._steps) == 40  # its 20 matmuls and 20 multiplies, nothing of the other thread
    np.testing.assert_array_equal(g(x * 2.0).numpy(), fn(x * 2.0).numpy())
