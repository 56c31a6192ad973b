"""QLoRA: adapters on quantized weights that stay QTensors; the transposed product g @ W_q."""

import numpy as np
import pytest

import ember
from ember import config
from ember.kernels import registry
from ember.kernels.cpu.quant import packed, transposed
from ember.models import AutoModelForCausalLM
from ember.nn import functional as F
from ember.peft import LoraConfig, get_peft_model
from ember.quant import QTensor
from ember.quant.nn import QLinear
from tests.peft.test_files import tiny  # noqa: F401  (a fixture)


class ember_threads:
    """ember.set_num_threads(n) inside a block, the previous setting restored after."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __enter__(self) -> None:
        self.prev = ember.get_num_threads()
        ember.set_num_threads(self.n)

    def __exit__(self, *exc) -> None:
        ember.set_num_threads(self.prev)


SHAPES = [(1, 5, 64), (3, 67, 96), (37, 130, 32), (4, 9, 256), (0, 4, 32)]


def _weight(qtype, n, k, seed=0):
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    return QTensor.from_float(w, qtype)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_transposed_product_matches_float64(qtype, m, n, k):
    if qtype in ("Q4_K", "Q6_K") and k % 256:
        k = 256
    q = _weight(qtype, n, k)
    g = np.random.default_rng(1).standard_normal((m, n)).astype(np.float32)
    want = g.astype(np.float64) @ q.dequantize().astype(np.float64)
    scale = np.abs(g).sum(1, keepdims=True) * np.abs(q.dequantize()).max() + 1e-30
    for fn in (transposed.matmul_qt_reference, transposed.matmul_qt_tiled):
        got = fn(g, qweight=q)
        assert got.dtype == np.float32 and got.shape == (m, k)
        assert np.all(np.abs(got - want) <= 1e-6 * scale), fn.__name__
    np.testing.assert_allclose(
        transposed.matmul_qt(q, g),
        transposed.matmul_qt_reference(g, qweight=q),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_tiles_bound_the_decoded_rows(monkeypatch, threads):
    q = _weight("Q8_0", 300, 64)
    monkeypatch.setattr(transposed, "TILE_ELEMENTS", 64 * 32)  # 32 rows a tile
    monkeypatch.setattr(transposed, "MIN_TASK_ROWS", 16)  # blocks of 16+ rows of g per task
    monkeypatch.setattr(packed, "MIN_ROWS", 1 << 30)  # the BLAS tiles (test_packed: the GEMM's)
    seen = []
    fmt = transposed.FORMATS["Q8_0"]
    real = fmt._dq1

    def spy(w3, lut, unit, r0, r1, out):
        seen.append(r1 - r0)
        return real(w3, lut, unit, r0, r1, out)

    monkeypatch.setattr(fmt, "_dq1", spy)
    for m in (7, 97):
        seen.clear()
        g = np.random.default_rng(m).standard_normal((m, 300)).astype(np.float32)
        want = g.astype(np.float64) @ q.dequantize().astype(np.float64)
        with ember_threads(threads):
            got = transposed.matmul_qt_tiled(g, qweight=q)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        # each task (a block of g's rows) runs down all of W, a tile of at most 32 rows at a time
        tasks = sum(seen) // 300
        assert max(seen) == 32 and sum(seen) == 300 * tasks and len(seen) == 10 * tasks
        assert tasks == 1 if threads == 1 or m == 7 else tasks > 1


def test_the_backward_of_a_quantized_linear_runs_the_registered_kernel(monkeypatch):
    q = _weight("Q4_1", 40, 64)
    x = ember.randn(3, 5, 64, requires_grad=True)
    k = registry.pick("linear_q_t", "cpu", (np.zeros((2, 40), np.float32),), {"qweight": q})
    assert k is not None and k.name == "linear_q_t_tiled"
    calls = []
    real = k.fn
    monkeypatch.setattr(
        k, "fn", lambda g, *, qweight: calls.append(g.shape) or real(g, qweight=qweight)
    )
    gy = np.random.default_rng(3).standard_normal((3, 5, 40)).astype(np.float32)
    F.linear(x, q).backward(ember.from_numpy(gy))
    assert calls == [(15, 40)]
    want = gy.reshape(15, 40).astype(np.float64) @ q.dequantize().astype(np.float64)
    np.testing.assert_allclose(x.grad.numpy().reshape(15, 64), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ember.errors.ShapeError, match=r"\(M, 40\)"):
        transposed.matmul_qt(q, np.zeros((2, 39), np.float32))


def _no_full_decode(monkeypatch):
    def refuse(self, *a, **k):
        raise AssertionError(f"a whole {self.qtype} {self.shape} weight was decoded")

    monkeypatch.setattr(QTensor, "dequantize", refuse)
    monkeypatch.setattr(QTensor, "__array__", refuse)


def test_qlora_trains_only_adapters_on_quantized_weights(tiny, monkeypatch):  # noqa: F811
    # float activations, so that the quantized and the dense model compute the same products
    # (by default Q8_0 products quantize x to int8, as llama.cpp's do)
    monkeypatch.setattr(config, "QUANT_DOT", "float")
    model = AutoModelForCausalLM.from_pretrained(tiny, quantize="q8_0")
    dense = AutoModelForCausalLM.from_pretrained(tiny)  # the same weights, dequantized
    for name, mod in model.named_modules():
        if isinstance(mod, QLinear):
            lin = dense.get_submodule(name)
            lin.weight = ember.nn.Parameter(ember.from_numpy(mod.weight.dequantize()))
    cfg = dict(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    pm = get_peft_model(model, LoraConfig(**cfg))
    ember.manual_seed(0)
    pd = get_peft_model(dense, LoraConfig(**cfg))
    twin = dict(pd.named_parameters())
    for k, p in pm.named_parameters():
        if p.requires_grad:
            twin[k]._data = p._data.copy()
    layers = [m for _, m in pm.base_model.lora_layers()]
    assert layers and all(type(m.base_layer.weight) is QTensor for m in layers)
    ids = ember.tensor(np.random.default_rng(4).integers(0, 128, (2, 12)))

    def loss_of(m):
        logits = m(ids)
        return F.cross_entropy(logits[:, :-1].reshape(-1, 128), ids[:, 1:].reshape(-1))

    ld = loss_of(pd)
    ld.backward()
    _no_full_decode(monkeypatch)
    opt = ember.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-2)
    loss = loss_of(pm)
    loss.backward()
    np.testing.assert_allclose(loss.item(), ld.item(), rtol=1e-5)
    dense_grads = dict(pd.named_parameters())
    for k, p in pm.named_parameters():
        if p.requires_grad:
            np.testing.assert_allclose(
                p.grad.numpy(), dense_grads[k].grad.numpy(), rtol=1e-4, atol=1e-5
            )
        else:
            assert p.grad is None, k
    first = loss.item()
    for _ in range(10):
        opt.step()
        opt.zero_grad()
        loss = loss_of(pm)
        loss.backward()
    assert loss.item() < first - 0.1
    assert all(type(m.base_layer.weight) is QTensor for m in layers)
    assert len(opt.state) == 2 * len(layers)  # optimizer state for the adapters only


@pytest.fixture(scope="module")
def smollm2():
    from ember.models.hub import default_model_path

    return default_model_path()


def test_qlora_on_the_bundled_smollm2_q4_1(smollm2, tmp_path, monkeypatch):
    from ember.peft import load_gguf_adapter, save_gguf_adapter

    model = AutoModelForCausalLM.from_pretrained(smollm2)
    pm = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    )
    q = pm.base_model.model.model.layers[3].self_attn.q_proj
    assert type(q.base_layer.weight) is QTensor and q.base_layer.weight.qtype == "Q4_1"
    ids = ember.tensor([[1, 422, 1789, 314, 253, 3458, 30, 2]])
    _no_full_decode(monkeypatch)
    opt = ember.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=5e-3)
    for _ in range(2):
        logits = pm(ids)
        loss = F.cross_entropy(logits[0, :-1], ids[0, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert q.lora_B["default"].weight.grad is not None
    assert np.abs(q.lora_B["default"].weight.detach().numpy()).max() > 0  # it moved
    monkeypatch.undo()
    with ember.no_grad():
        want = pm(ids).numpy()
    save_gguf_adapter(pm, tmp_path / "a.gguf")
    again = load_gguf_adapter(AutoModelForCausalLM.from_pretrained(smollm2), tmp_path / "a.gguf")
    with ember.no_grad():
        np.testing.assert_allclose(again(ids).numpy(), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_gradient_checkpointing_gives_the_same_gradients(tiny, dropout, monkeypatch):  # noqa: F811
    from ember.peft import enable_gradient_checkpointing, prepare_model_for_kbit_training

    # float x in the base's products: the checkpointed run's logits differ by ~1e-7 from the
    # plain run's, which int8 activations turn into a flipped rounding now and then (a few
    # gradient entries off by 1e-5); this test is about what checkpointing recomputes
    monkeypatch.setattr(config, "QUANT_DOT", "float")

    cfg = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules="all-linear",
        lora_dropout=dropout,
        init_lora_weights=False,
    )
    ids = ember.tensor(np.random.default_rng(6).integers(0, 128, (2, 12)))
    grads = []
    for ckpt in (False, True):
        model = AutoModelForCausalLM.from_pretrained(tiny, quantize="q8_0")
        if ckpt:
            prepare_model_for_kbit_training(model)
        ember.manual_seed(0)
        pm = get_peft_model(model, cfg)
        if ckpt:
            enable_gradient_checkpointing(pm.get_base_model())  # twice: a no-op
        logits = pm(ids)
        F.cross_entropy(logits[:, :-1].reshape(-1, 128), ids[:, 1:].reshape(-1)).backward()
        grads.append({k: p.grad.numpy() for k, p in pm.named_parameters() if p.requires_grad})
        if ckpt:
            assert "forward" in pm.get_base_model().model.layers[1].__dict__
        if ckpt and not dropout:  # the same forward (dropout would draw new masks)
            with ember.no_grad():
                np.testing.assert_allclose(pm(ids).numpy(), logits.detach().numpy(), atol=1e-6)
    assert sorted(grads[0]) == sorted(grads[1])
    for k in grads[0]:
        np.testing.assert_allclose(
            grads[1][k], grads[0][k], rtol=1e-4, atol=1e-6, err_msg=k
        )  # float32
