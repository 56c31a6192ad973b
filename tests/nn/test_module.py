"""Module, Parameter, containers: registration, state_dict, modes, dtype/device, repr, hooks."""

import copy
import pickle

import numpy as np
import pytest
import torch

import ember
from ember import nn
from ember.errors import DTypeError, EmberError, UnsupportedError
from tests.nn.common import sd_to_ember, sync


def _pair():
    """The same architecture in ember and torch."""

    def build(n):
        class Block(n.Module):
            def __init__(self):
                super().__init__()
                self.conv = n.Conv2d(3, 4, 3, padding=1)
                self.bn = n.BatchNorm2d(4)
                self.act = n.ReLU()
                self.register_buffer("scale", (ember if n is nn else torch).ones(4))
                self.register_buffer(
                    "tmp", (ember if n is nn else torch).zeros(2), persistent=False
                )

            def forward(self, x):
                return self.act(self.bn(self.conv(x)))

        class Net(n.Module):
            def __init__(self):
                super().__init__()
                self.blocks = n.ModuleList([Block(), Block()])
                self.heads = n.ModuleDict({"a": n.Linear(4, 2), "b": n.Linear(4, 3, bias=False)})
                self.seq = n.Sequential(n.Flatten(), n.Dropout(0.25))
                self.alpha = n.Parameter((ember if n is nn else torch).zeros(3))

        return Net()

    return build(nn), build(torch.nn)


def test_parameter_basics():
    t = ember.ones(2, 3)
    p = nn.Parameter(t)
    assert isinstance(p, nn.Parameter) and isinstance(p, ember.Tensor)
    assert p.requires_grad and p.is_leaf
    assert p.numpy(force=True) is t.numpy()  # shares memory
    assert repr(p).startswith("Parameter containing:\ntensor(")
    assert not nn.Parameter(ember.ones(2), requires_grad=False).requires_grad
    assert tuple(nn.Parameter().shape) == (0,)
    y = p * 2
    assert type(y) is ember.Tensor
    with pytest.raises(DTypeError):
        nn.Parameter(ember.tensor([1, 2]))


def test_registration_and_traversal_match_torch():
    e, t = _pair()
    assert [n for n, _ in e.named_parameters()] == [n for n, _ in t.named_parameters()]
    assert [n for n, _ in e.named_buffers()] == [n for n, _ in t.named_buffers()]
    assert [n for n, _ in e.named_modules()] == [n for n, _ in t.named_modules()]
    assert [n for n, _ in e.named_children()] == [n for n, _ in t.named_children()]
    assert len(list(e.modules())) == len(list(t.modules()))
    assert len(list(e.children())) == 3
    assert list(e.state_dict()) == list(t.state_dict())
    assert "blocks.0.tmp" not in e.state_dict()
    assert e.num_parameters() == sum(p.numel() for p in t.parameters())
    assert [n for n, _ in e.named_parameters(recurse=False)] == ["alpha"]
    assert [n for n, _ in e.named_parameters(prefix="m")][0] == "m.alpha"


def test_shared_parameters_listed_once():
    lin = nn.Linear(2, 2)
    m = nn.Sequential(lin, lin)
    assert len(list(m.parameters())) == 2
    assert len(list(m.named_parameters(remove_duplicate=False))) == 4
    assert list(m.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias"]


def test_attribute_rules():
    m = nn.Module()
    m.w = nn.Parameter(ember.ones(2))
    assert "w" in m._parameters and m.w is m._parameters["w"]
    assert m.__dict__["w"] is m.w  # a plain attribute hit, no __getattr__ on the hot path
    with pytest.raises(TypeError):
        m.w = ember.ones(2)  # a plain tensor cannot replace a parameter
    m.w = None
    assert m.w is None and "w" in m._parameters
    m.register_buffer("b", ember.zeros(3))
    m.b = ember.ones(3)  # buffers take plain tensors
    assert "b" in m._buffers and float(m.b.sum()) == 3.0
    m.sub = nn.Linear(2, 2)
    assert "sub" in m._modules
    m.sub = nn.ReLU()
    assert isinstance(m._modules["sub"], nn.ReLU)
    m._parameters["direct"] = nn.Parameter(ember.zeros(1))  # direct registry writes stay visible
    assert m.direct is m._parameters["direct"]
    del m._parameters["direct"]
    with pytest.raises(AttributeError):
        _ = m.direct
    del m.b
    assert "b" not in m._buffers
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = m.nope
    with pytest.raises(KeyError):
        m.register_parameter("a.b", None)
    with pytest.raises(KeyError):
        m.register_buffer("sub", ember.zeros(1))
    m.buf = nn.Buffer(ember.ones(2), persistent=False)
    assert "buf" in m._buffers and "buf" in m._non_persistent_buffers_set
    assert type(m.buf) is ember.Tensor
    with pytest.raises(TypeError):
        m.register_parameter("nl", (nn.Parameter(ember.ones(1)) * 2))  # ops give plain tensors
    with pytest.raises(AttributeError):

        class Bad(nn.Module):
            def __init__(self):
                self.w = nn.Parameter(ember.ones(1))

        Bad()


def test_state_dict_roundtrip_and_values():
    e, t = _pair()
    sync(t, e)
    for k, v in t.state_dict().items():
        np.testing.assert_array_equal(e.state_dict()[k].numpy(), v.numpy(), err_msg=k)
    sd = e.state_dict()
    assert not sd["alpha"].requires_grad
    assert e.state_dict(keep_vars=True)["alpha"] is e.alpha
    # torch loads ember's state_dict too
    t2 = _pair()[1]
    t2.load_state_dict({k: torch.from_numpy(np.array(v.numpy())) for k, v in sd.items()})


def test_load_state_dict_errors():
    e, t = _pair()
    sd = sd_to_ember(t.state_dict())
    res = e.load_state_dict(sd)
    assert res.missing_keys == [] and res.unexpected_keys == []
    assert repr(res) == "<All keys matched successfully>"
    bad = dict(sd)
    del bad["heads.a.bias"]
    bad["extra.weight"] = ember.zeros(1)
    bad["blocks.0.conv.weight"] = ember.zeros(4, 3, 5, 5)
    with pytest.raises(EmberError) as ei:
        e.load_state_dict(bad)
    msg = str(ei.value)
    assert isinstance(ei.value, RuntimeError)
    assert 'Missing key(s) in state_dict: "heads.a.bias"' in msg
    assert 'Unexpected key(s) in state_dict: "extra.weight"' in msg
    assert "size mismatch for blocks.0.conv.weight" in msg
    # non-strict: reports keys, still refuses the wrong shape
    with pytest.raises(EmberError, match="size mismatch"):
        e.load_state_dict(bad, strict=False)
    del bad["blocks.0.conv.weight"]
    res = e.load_state_dict(bad, strict=False)
    assert res.missing_keys == ["blocks.0.conv.weight", "heads.a.bias"]
    assert res.unexpected_keys == ["extra.weight"]
    del sd["blocks.1.bn.num_batches_tracked"]  # old checkpoints without it still load (as torch)
    e.load_state_dict(sd)
    with pytest.raises(TypeError):
        e.load_state_dict([1, 2])


def test_load_state_dict_copies_casts_and_assign():
    m = nn.Linear(3, 2)
    w = m.weight
    src = {"weight": ember.ones(2, 3, dtype=ember.float64), "bias": np.zeros(2)}
    m.load_state_dict(src)
    assert m.weight is w and m.weight.dtype == ember.float32 and float(m.weight.sum()) == 6.0
    new = ember.full((2, 3), 2.0)
    m.load_state_dict({"weight": new, "bias": ember.zeros(2)}, assign=True)
    assert isinstance(m.weight, nn.Parameter) and m.weight.numpy(force=True) is new.numpy()


def test_train_eval_apply_zero_grad_requires_grad():
    e, _ = _pair()
    assert e.training and e.blocks[0].bn.training
    assert e.eval() is e
    assert not any(m.training for m in e.modules())
    e.train()
    assert all(m.training for m in e.modules())
    with pytest.raises(ValueError):
        e.train("yes")
    seen = []
    e.apply(lambda m: seen.append(type(m).__name__))
    assert seen[-1] == "Net" and seen[0] == "Conv2d"
    lin = nn.Linear(3, 2)
    lin(ember.randn(4, 3)).sum().backward()
    assert lin.weight.grad is not None
    lin.zero_grad(set_to_none=False)
    assert float(lin.weight.grad.abs().sum()) == 0.0
    lin.zero_grad()
    assert lin.weight.grad is None
    lin.requires_grad_(False)
    assert not any(p.requires_grad for p in lin.parameters())


def test_to_dtype_and_device():
    e, _ = _pair()
    w = e.blocks[0].conv.weight
    e.to(ember.float64)
    assert e.blocks[0].conv.weight is w and w.dtype == ember.float64
    assert e.blocks[0].bn.running_mean.dtype == ember.float64
    assert e.blocks[0].bn.num_batches_tracked.dtype == ember.int64
    e.half()
    assert w.dtype == ember.float16
    e.bfloat16()
    assert w.dtype == ember.bfloat16
    e.float()
    assert w.dtype == ember.float32
    e.double()
    assert w.dtype == ember.float64
    e.to(dtype=torch.float32)
    assert w.dtype == ember.float32
    with pytest.raises(DTypeError):
        e.to(ember.int32)
    e.to("meta")
    assert w.device == "meta" and e.blocks[0].bn.running_var.device == "meta"
    assert e.blocks[0].conv(ember.randn(1, 3, 5, 5, device="meta")).shape == (1, 4, 5, 5)
    e.to_empty(device="cpu")
    assert w.device == "cpu" and tuple(w.shape) == (4, 3, 3, 3)
    e.to(ember.zeros(1, dtype=ember.float64))
    assert w.dtype == ember.float64
    m = nn.Linear(2, 2, device="meta")
    assert m.weight.is_meta
    assert nn.Linear(2, 2, dtype=ember.float64).weight.dtype == ember.float64


def test_repr_matches_torch():
    e, t = _pair()
    assert repr(e) == repr(t)
    e2 = nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(inplace=True),
        nn.ModuleList([nn.Linear(4, 4) for _ in range(3)] + [nn.GELU(approximate="tanh")]),
        nn.Conv1d(2, 4, 3, dilation=2, groups=2, padding_mode="reflect", padding=2),
        nn.MaxPool2d(2),
        nn.AvgPool2d(3, 1, 1),
        nn.AdaptiveAvgPool2d((1, 1)),
        nn.Upsample(scale_factor=2),
        nn.LayerNorm(8),
        nn.RMSNorm([4, 8], eps=1e-6),
        nn.GroupNorm(2, 8),
        nn.Dropout(0.1),
        nn.Softmax(dim=-1),
        nn.LeakyReLU(0.2),
        nn.ELU(),
        nn.Hardtanh(-2.0, 2.0),
        nn.ReLU6(),
        nn.Softplus(beta=2.0),
        nn.Embedding(10, 4, padding_idx=0),
        nn.Bilinear(2, 3, 4),
        nn.ConvTranspose2d(3, 4, 3, stride=2, output_padding=1),
        nn.LSTM(3, 4, 2),
        nn.GRU(3, 4, batch_first=True, bidirectional=True),
        nn.MultiheadAttention(8, 2),
        nn.Flatten(),
        nn.Unflatten(1, (2, 4)),
        nn.Identity(),
        nn.CrossEntropyLoss(),
        nn.PReLU(3),
        nn.Conv2d(2, 2, 3, padding="same"),
    )
    t2 = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(inplace=True),
        torch.nn.ModuleList(
            [torch.nn.Linear(4, 4) for _ in range(3)] + [torch.nn.GELU(approximate="tanh")]
        ),
        torch.nn.Conv1d(2, 4, 3, dilation=2, groups=2, padding_mode="reflect", padding=2),
        torch.nn.MaxPool2d(2),
        torch.nn.AvgPool2d(3, 1, 1),
        torch.nn.AdaptiveAvgPool2d((1, 1)),
        torch.nn.Upsample(scale_factor=2),
        torch.nn.LayerNorm(8),
        torch.nn.RMSNorm([4, 8], eps=1e-6),
        torch.nn.GroupNorm(2, 8),
        torch.nn.Dropout(0.1),
        torch.nn.Softmax(dim=-1),
        torch.nn.LeakyReLU(0.2),
        torch.nn.ELU(),
        torch.nn.Hardtanh(-2.0, 2.0),
        torch.nn.ReLU6(),
        torch.nn.Softplus(beta=2.0),
        torch.nn.Embedding(10, 4, padding_idx=0),
        torch.nn.Bilinear(2, 3, 4),
        torch.nn.ConvTranspose2d(3, 4, 3, stride=2, output_padding=1),
        torch.nn.LSTM(3, 4, 2),
        torch.nn.GRU(3, 4, batch_first=True, bidirectional=True),
        torch.nn.MultiheadAttention(8, 2),
        torch.nn.Flatten(),
        torch.nn.Unflatten(1, (2, 4)),
        torch.nn.Identity(),
        torch.nn.CrossEntropyLoss(),
        torch.nn.PReLU(3),
        torch.nn.Conv2d(2, 2, 3, padding="same"),
    )
    assert repr(e2) == repr(t2)
    assert list(e2.state_dict()) == list(t2.state_dict())
    enc_e = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16), 2)
    enc_t = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(8, 2, 16), 2, enable_nested_tensor=False
    )
    assert repr(enc_e) == repr(enc_t)
    assert list(enc_e.state_dict()) == list(enc_t.state_dict())
    pl_e = nn.ParameterList([nn.Parameter(ember.ones(2, 3)), ember.zeros(4)])
    pl_t = torch.nn.ParameterList([torch.nn.Parameter(torch.ones(2, 3)), torch.zeros(4)])
    assert list(pl_e.state_dict()) == list(pl_t.state_dict())
    assert repr(pl_e).replace("ember.", "torch.") == repr(pl_t)


def test_hooks():
    lin = nn.Linear(3, 3)
    calls = []

    def pre(m, args):
        calls.append("pre")
        return (args[0] * 0,)

    def post(m, args, out):
        calls.append("post")
        return out + 1

    h1 = lin.register_forward_pre_hook(pre)
    h2 = lin.register_forward_hook(post)
    out = lin(ember.randn(2, 3))
    np.testing.assert_allclose(
        out.detach().numpy(), (lin.bias.detach().numpy() + 1)[None].repeat(2, 0), rtol=1e-6
    )
    assert calls == ["pre", "post"]
    h1.remove()
    h2.remove()
    h2.remove()
    x = ember.randn(2, 3)
    np.testing.assert_allclose(
        lin(x).detach().numpy(),
        (x.numpy() @ lin.weight.detach().numpy().T + lin.bias.detach().numpy()),
        rtol=1e-5,
    )
    order = []
    lin.register_forward_hook(lambda m, a, o: order.append(1))
    lin.register_forward_hook(lambda m, a, o: order.append(0), prepend=True)
    lin(x)
    assert order == [0, 1]
    kw = nn.Identity()
    kw.register_forward_pre_hook(lambda m, a, k: ((a[0] * 2,), k), with_kwargs=True)
    kw.register_forward_hook(lambda m, a, k, o: o + 1, with_kwargs=True)
    assert float(kw(ember.ones(1)).sum()) == 3.0

    class Boom(nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")

    b = Boom()
    seen = []
    b.register_forward_hook(lambda m, a, o: seen.append(o), always_call=True)
    with pytest.raises(RuntimeError):
        b(ember.ones(1))
    assert seen == [None]
    with nn.register_module_forward_hook(lambda m, a, o: seen.append(type(m).__name__)):
        nn.ReLU()(ember.ones(1))
    nn.ReLU()(ember.ones(1))
    assert seen[-1] == "ReLU" and len(seen) == 2
    with pytest.raises(UnsupportedError):
        lin.register_full_backward_hook(lambda *a: None)
    post_calls = []
    lin.register_load_state_dict_post_hook(
        lambda m, keys: post_calls.append(list(keys.missing_keys))
    )
    lin.load_state_dict(lin.state_dict())
    assert post_calls == [[]]


def test_sequential():
    layers = [nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)]
    s = nn.Sequential(*layers)
    assert len(s) == 3 and s[0] is layers[0] and s[-1] is layers[2]
    sl = s[1:]
    assert isinstance(sl, nn.Sequential) and len(sl) == 2 and list(sl._modules) == ["1", "2"]
    s.append(nn.Sigmoid())
    assert len(s) == 4 and isinstance(s[3], nn.Sigmoid)
    s.insert(1, nn.Tanh())
    assert [type(m).__name__ for m in s] == ["Linear", "Tanh", "ReLU", "Linear", "Sigmoid"]
    del s[1]
    assert list(s._modules) == ["0", "1", "2", "3"]
    assert isinstance(s.pop(3), nn.Sigmoid)
    s[1] = nn.GELU()
    assert isinstance(s[1], nn.GELU)
    x = ember.randn(4, 2)
    np.testing.assert_allclose(s(x).numpy(force=True), s[2](s[1](s[0](x))).numpy(force=True))
    s2 = s + nn.Sequential(nn.Identity())
    assert len(s2) == 4
    with pytest.raises(IndexError):
        s[7]
    from collections import OrderedDict

    named = nn.Sequential(OrderedDict([("fc", nn.Linear(2, 2)), ("act", nn.ReLU())]))
    assert list(named.state_dict()) == ["fc.weight", "fc.bias"] and named.fc is named[0]


def test_module_list_and_dict():
    ml = nn.ModuleList([nn.Linear(1, 1) for _ in range(3)])
    assert len(ml) == 3 and isinstance(ml[1:], nn.ModuleList)
    ml.append(nn.ReLU())
    ml.extend([nn.Tanh()])
    ml.insert(0, nn.Identity())
    assert [type(m).__name__ for m in ml] == [
        "Identity",
        "Linear",
        "Linear",
        "Linear",
        "ReLU",
        "Tanh",
    ]
    del ml[0]
    assert list(ml._modules) == [str(i) for i in range(5)]
    assert isinstance(ml.pop(), nn.Tanh)
    ml += [nn.Sigmoid()]
    assert len(ml) == 5 and ml[-1] is ml[4]
    with pytest.raises(TypeError):
        ml.extend(nn.ReLU())
    md = nn.ModuleDict({"a": nn.Linear(1, 2)})
    md["b"] = nn.ReLU()
    md.update([("c", nn.Tanh())])
    assert list(md.keys()) == ["a", "b", "c"] and "b" in md and len(md) == 3
    assert isinstance(md.pop("b"), nn.ReLU) and list(md) == ["a", "c"]
    assert list(md.state_dict()) == ["a.weight", "a.bias"]
    pd = nn.ParameterDict({"w": ember.ones(2)})
    assert isinstance(pd["w"], nn.Parameter) and list(pd.state_dict()) == ["w"]
    pl = nn.ParameterList([ember.ones(1)])
    pl.append(nn.Parameter(ember.zeros(2)))
    assert len(pl) == 2 and [n for n, _ in pl.named_parameters()] == ["0", "1"]


def test_deepcopy_pickle_and_lookup():
    e, t = _pair()
    sync(t, e)
    c = copy.deepcopy(e)
    assert c.blocks[0].conv.weight is not e.blocks[0].conv.weight
    assert isinstance(c.blocks[0].conv.weight, nn.Parameter)
    np.testing.assert_array_equal(
        c.blocks[0].conv.weight.numpy(force=True), e.blocks[0].conv.weight.numpy(force=True)
    )
    c.blocks[0].conv.weight.numpy(force=True)[...] = 0
    assert float(e.blocks[0].conv.weight.abs().sum()) > 0
    c.newp = nn.Parameter(ember.ones(1))  # the copy's registries are wired to the copy
    assert "newp" in c._parameters and "newp" not in e._parameters
    assert e.get_submodule("blocks.1.bn") is e.blocks[1].bn
    assert e.get_parameter("heads.a.weight") is e.heads["a"].weight
    assert e.get_buffer("blocks.0.bn.running_mean") is e.blocks[0].bn.running_mean
    with pytest.raises(AttributeError):
        e.get_submodule("blocks.9")
    m = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ModuleDict({"f": nn.Linear(2, 2)}))
    p = pickle.loads(pickle.dumps(m))
    assert list(p.state_dict()) == list(m.state_dict()) and repr(p) == repr(m)
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(p.state_dict()[k].numpy(), v.numpy())
    assert isinstance(p[0].weight, nn.Parameter) and p[0].weight.requires_grad
    p.extra = nn.ReLU()
    assert "extra" in p._modules


def test_call_goes_to_forward():
    class Twice(nn.Module):
        def forward(self, x, k=1):
            return x * 2 * k

    m = Twice()
    assert float(m(ember.ones(1), k=3).sum()) == 6.0
    with pytest.raises(NotImplementedError):
        nn.Module()(ember.ones(1))
    with pytest.raises(TypeError):
        nn.Module(1)
