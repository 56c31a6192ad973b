"""Module: the base class of every layer, with torch.nn.Module's registration, state and hooks.

Parameters, buffers and submodules live in the registries ``_parameters``, ``_buffers`` and
``_modules`` (as in torch) and are mirrored into the instance ``__dict__``, so ``self.weight`` is a
plain attribute hit; ``__getattr__`` is only the fallback. ``__call__`` goes straight to
``forward`` when no hook is registered.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterator

import numpy as np

from ember import dtypes as _dt
from ember.autograd import no_grad
from ember.device import Device, as_device
from ember.errors import DTypeError, UnsupportedError
from ember.nn._registry import _Registry
from ember.nn.hooks import RemovableHandle, _global_forward_hooks, _global_forward_pre_hooks
from ember.nn.parameter import Buffer, Parameter
from ember.nn.state_dict import StateDictMixin
from ember.tensor import Tensor

_REGISTRIES = ("_parameters", "_buffers", "_modules")


def _addindent(s: str, num_spaces: int) -> str:
    lines = s.split("\n")
    if len(lines) == 1:
        return s
    first = lines.pop(0)
    lines = [(num_spaces * " ") + line if line.strip() else "" for line in lines]
    return first + "\n" + "\n".join(lines)


class Module(StateDictMixin):
    """Base class of all layers and models (torch.nn.Module)."""

    training: bool
    _version = 1

    def __init__(self, *args, **kwargs) -> None:
        if args or kwargs:
            raise TypeError(
                f"{type(self).__name__}.__init__() got unexpected arguments {args} {list(kwargs)}"
            )
        d = self.__dict__
        d["training"] = True
        d["_parameters"] = _Registry(d)
        d["_buffers"] = _Registry(d)
        d["_non_persistent_buffers_set"] = set()
        d["_modules"] = _Registry(d)
        d["_forward_pre_hooks"] = OrderedDict()
        d["_forward_pre_hooks_with_kwargs"] = {}
        d["_forward_hooks"] = OrderedDict()
        d["_forward_hooks_with_kwargs"] = {}
        d["_forward_hooks_always_called"] = {}
        d["_load_state_dict_pre_hooks"] = OrderedDict()
        d["_load_state_dict_post_hooks"] = OrderedDict()

    def forward(self, *args, **kwargs):
        """The computation; subclasses define it."""
        raise NotImplementedError(
            f'Module [{type(self).__name__}] is missing the required "forward" function'
        )

    # ------------------------------------------------------------------ calling
    def __call__(self, *args, **kwargs):
        if (
            self._forward_pre_hooks
            or self._forward_hooks
            or _global_forward_pre_hooks
            or _global_forward_hooks
        ):
            return self._call_with_hooks(args, kwargs)
        return self.forward(*args, **kwargs)

    def _call_with_hooks(self, args: tuple, kwargs: dict):
        pre = itertools.chain(_global_forward_pre_hooks.items(), self._forward_pre_hooks.items())
        for hid, hook in pre:
            if hid in self._forward_pre_hooks_with_kwargs:
                res = hook(self, args, kwargs)
                if res is not None:
                    if not (isinstance(res, tuple) and len(res) == 2):
                        raise TypeError(
                            "forward pre-hook must return None or a tuple of "
                            f"(new_args, new_kwargs), got {res}."
                        )
                    args, kwargs = res
            else:
                res = hook(self, args)
                if res is not None:
                    args = res if isinstance(res, tuple) else (res,)
        called = set()
        try:
            result = self.forward(*args, **kwargs)
            post = itertools.chain(_global_forward_hooks.items(), self._forward_hooks.items())
            for hid, hook in post:
                called.add(hid)
                if hid in self._forward_hooks_with_kwargs:
                    res = hook(self, args, kwargs, result)
                else:
                    res = hook(self, args, result)
                if res is not None:
                    result = res
            return result
        except Exception:
            for hid, hook in self._forward_hooks.items():
                if hid in self._forward_hooks_always_called and hid not in called:
                    try:
                        if hid in self._forward_hooks_with_kwargs:
                            hook(self, args, kwargs, None)
                        else:
                            hook(self, args, None)
                    except Exception:  # noqa: S110 - the forward's error is the one to report
                        pass
            raise

    def register_forward_pre_hook(
        self, hook: Callable, *, prepend: bool = False, with_kwargs: bool = False
    ) -> RemovableHandle:
        """Call hook(module, args) (with_kwargs: also kwargs) before forward; may replace args."""
        h = RemovableHandle(self._forward_pre_hooks, self._forward_pre_hooks_with_kwargs)
        self._forward_pre_hooks[h.id] = hook
        if with_kwargs:
            self._forward_pre_hooks_with_kwargs[h.id] = True
        if prepend:
            self._forward_pre_hooks.move_to_end(h.id, last=False)
        return h

    def register_forward_hook(
        self,
        hook: Callable,
        *,
        prepend: bool = False,
        with_kwargs: bool = False,
        always_call: bool = False,
    ) -> RemovableHandle:
        """Call hook(module, args, output) after forward; a non-None return replaces the output."""
        h = RemovableHandle(
            self._forward_hooks, self._forward_hooks_with_kwargs, self._forward_hooks_always_called
        )
        self._forward_hooks[h.id] = hook
        if with_kwargs:
            self._forward_hooks_with_kwargs[h.id] = True
        if always_call:
            self._forward_hooks_always_called[h.id] = True
        if prepend:
            self._forward_hooks.move_to_end(h.id, last=False)
        return h

    def register_full_backward_hook(self, hook: Callable, prepend: bool = False):
        """Not supported: ember has no module backward hooks (use Tensor.register_hook)."""
        raise UnsupportedError(
            "module backward hooks are not supported; use Tensor.register_hook on outputs"
        )

    register_backward_hook = register_full_backward_hook

    def register_load_state_dict_pre_hook(self, hook: Callable) -> RemovableHandle:
        """Call hook(module, state_dict, prefix, metadata, strict, missing, unexpected, errors)."""
        h = RemovableHandle(self._load_state_dict_pre_hooks)
        self._load_state_dict_pre_hooks[h.id] = hook
        return h

    def register_load_state_dict_post_hook(self, hook: Callable) -> RemovableHandle:
        """Call hook(module, incompatible_keys) after load_state_dict; may edit the key lists."""
        h = RemovableHandle(self._load_state_dict_post_hooks)
        self._load_state_dict_post_hooks[h.id] = hook
        return h

    # ------------------------------------------------------------------ attribute registration
    def __setattr__(self, name: str, value) -> None:
        d = self.__dict__
        params = d.get("_parameters")
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            self._remove_from(name, "_buffers", "_modules")
            self.register_parameter(name, value)
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(
                    f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                    "(ember.nn.Parameter or None expected)"
                )
            self.register_parameter(name, value)
        else:
            modules = d.get("_modules")
            if isinstance(value, Module):
                if modules is None:
                    raise AttributeError("cannot assign module before Module.__init__() call")
                self._remove_from(name, "_parameters", "_buffers")
                modules[name] = value
            elif modules is not None and name in modules:
                if value is not None:
                    raise TypeError(
                        f"cannot assign '{type(value).__name__}' as child module '{name}' "
                        "(ember.nn.Module or None expected)"
                    )
                modules[name] = value
            else:
                buffers = d.get("_buffers")
                if isinstance(value, Buffer) or (buffers is not None and name in buffers):
                    if value is not None and not isinstance(value, Tensor):
                        raise TypeError(
                            f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                            "(ember.Tensor or None expected)"
                        )
                    if isinstance(value, Buffer):
                        persistent = value.persistent
                    else:
                        persistent = name not in self._non_persistent_buffers_set
                    self.register_buffer(name, value, persistent)
                else:
                    object.__setattr__(self, name, value)

    def _remove_from(self, name: str, *registries: str) -> None:
        d = self.__dict__
        d.pop(name, None)
        for r in registries:
            reg = d[r]
            if name in reg:
                del reg[name]
        d["_non_persistent_buffers_set"].discard(name)

    def __getattr__(self, name: str):
        d = self.__dict__
        for r in _REGISTRIES:
            reg = d.get(r)
            if reg is not None and name in reg:
                return reg[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        d = self.__dict__
        for r in _REGISTRIES:
            reg = d.get(r)
            if reg is not None and name in reg:
                del reg[name]
                d["_non_persistent_buffers_set"].discard(name)
                return
        object.__delattr__(self, name)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for r in _REGISTRIES:
            reg = state[r]
            for k in reg:
                state.pop(k, None)
            state[r] = dict(reg)
        return state

    def __setstate__(self, state: dict) -> None:
        d = self.__dict__
        d.update(state)
        for r in _REGISTRIES:
            d[r] = _Registry(d, state[r].items())

    def __dir__(self) -> list:
        return sorted(set(super().__dir__()))

    def _check_name(self, name, kind: str, registry: str) -> None:
        if registry not in self.__dict__:
            raise AttributeError(f"cannot assign {kind} before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string. Got {type(name).__name__}")
        if "." in name:
            raise KeyError(f'{kind} name can\'t contain "."')
        if name == "":
            raise KeyError(f'{kind} name can\'t be empty string ""')
        if hasattr(self, name) and name not in self.__dict__[registry]:
            raise KeyError(f"attribute '{name}' already exists")

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Add a parameter (or None, a declared-but-absent slot such as bias=False)."""
        self._check_name(name, "parameter", "_parameters")
        if param is not None:
            if not isinstance(param, Parameter):
                raise TypeError(
                    f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                    "(ember.nn.Parameter or None required)"
                )
            if param.grad_fn is not None:
                raise ValueError(
                    f"Cannot assign non-leaf Tensor to parameter '{name}'. Model "
                    "parameters must be "
                    f"created explicitly; to express '{name}' as a function of another "
                    "Tensor, compute "
                    "the value in the forward() method."
                )
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Add a buffer: state that is not trained (running stats); persistent=False keeps it out
        of state_dict."""
        self._check_name(name, "buffer", "_buffers")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(
                f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                "(ember.Tensor or None required)"
            )
        if isinstance(tensor, Buffer):
            tensor = Tensor._wrap(tensor._data, tensor._device)
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def add_module(self, name: str, module: Module | None) -> None:
        """Add a child module (or None) under name."""
        if not isinstance(module, Module) and module is not None:
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        self._check_name(name, "module", "_modules")
        self._modules[name] = module

    register_module = add_module

    def get_submodule(self, target: str) -> Module:
        """The submodule at a dotted path ('' is self)."""
        if target == "":
            return self
        mod = self
        for item in target.split("."):
            if not hasattr(mod, item):
                raise AttributeError(f"{mod._get_name()} has no attribute `{item}`")
            mod = getattr(mod, item)
            if not isinstance(mod, Module):
                raise AttributeError(f"`{item}` is not an nn.Module")
        return mod

    def get_parameter(self, target: str) -> Parameter:
        """The parameter at a dotted path."""
        path, _, name = target.rpartition(".")
        mod = self.get_submodule(path)
        if name not in mod._parameters:
            raise AttributeError(f"{mod._get_name()} has no parameter `{name}`")
        return mod._parameters[name]

    def get_buffer(self, target: str) -> Tensor:
        """The buffer at a dotted path."""
        path, _, name = target.rpartition(".")
        mod = self.get_submodule(path)
        if name not in mod._buffers:
            raise AttributeError(f"{mod._get_name()} has no buffer `{name}`")
        return mod._buffers[name]

    # ------------------------------------------------------------------ traversal
    def _named_members(
        self, get_members, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ):
        memo = set()
        modules = (
            self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate)
            if recurse
            else [(prefix, self)]
        )
        for module_prefix, module in modules:
            for k, v in get_members(module):
                if v is None or id(v) in memo:
                    continue
                if remove_duplicate:
                    memo.add(id(v))
                yield (module_prefix + ("." if module_prefix else "") + k, v)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        """Every parameter of this module (and its submodules when recurse), each once."""
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Parameter]]:
        """(dotted name, parameter) pairs, as in state_dict."""
        yield from self._named_members(
            lambda m: m._parameters.items(), prefix, recurse, remove_duplicate
        )

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        """Every buffer of this module (and its submodules when recurse)."""
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def named_buffers(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Tensor]]:
        """(dotted name, buffer) pairs."""
        yield from self._named_members(
            lambda m: m._buffers.items(), prefix, recurse, remove_duplicate
        )

    def children(self) -> Iterator[Module]:
        """The direct submodules."""
        for _, m in self.named_children():
            yield m

    def named_children(self) -> Iterator[tuple[str, Module]]:
        """(name, direct submodule) pairs, each module once."""
        memo = set()
        for name, m in self._modules.items():
            if m is not None and id(m) not in memo:
                memo.add(id(m))
                yield name, m

    def modules(self) -> Iterator[Module]:
        """This module and every submodule, depth first."""
        for _, m in self.named_modules():
            yield m

    def named_modules(
        self, memo: set | None = None, prefix: str = "", remove_duplicate: bool = True
    ):
        """(dotted name, module) pairs for self ('') and every submodule, depth first."""
        if memo is None:
            memo = set()
        if id(self) in memo:
            return
        if remove_duplicate:
            memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is None:
                continue
            sub = prefix + ("." if prefix else "") + name
            yield from m.named_modules(memo, sub, remove_duplicate)

    def num_parameters(self, only_trainable: bool = False) -> int:
        """The number of scalar parameters (only those requiring grad when only_trainable)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not only_trainable)

    # ------------------------------------------------------------------ modes and grads
    def train(self, mode: bool = True) -> Module:
        """Set training mode on this module and its submodules (dropout, batch norm care)."""
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        for m in self.children():
            m.train(mode)
        return self

    def eval(self) -> Module:
        """Set evaluation mode (train(False))."""
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        """Set requires_grad on every parameter."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def optimize_for_inference(self, inplace: bool = False) -> Module:
        """This module rewritten for inference (ember.inference.optimize_for_inference)."""
        from ember.inference import optimize_for_inference

        return optimize_for_inference(self, inplace=inplace)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients of every parameter (to None by default, or to zeros)."""
        for p in self.parameters():
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                elif p.grad._data.flags.writeable:
                    p.grad._data[...] = 0
                else:
                    p.grad = Tensor._wrap(np.zeros_like(p.grad._data), p.grad._device)

    def apply(self, fn: Callable[[Module], None]) -> Module:
        """Call fn on every submodule (children first) and then on self."""
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # ------------------------------------------------------------------ device and dtype
    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Module:
        if recurse:
            for m in self.children():
                m._apply(fn)
        with no_grad():
            for p in self._parameters.values():
                if p is None:
                    continue
                new = fn(p)
                if new is not p:
                    p._data, p._device = new._data, new._device
                if p.grad is not None:
                    g = fn(p.grad)
                    p.grad = Tensor._wrap(g._data, g._device)
            for k, b in self._buffers.items():
                if b is not None:
                    self._buffers[k] = fn(b)
        return self

    def to(self, *args, **kwargs) -> Module:
        """Move to a device and/or cast floating parameters and buffers to a dtype, in place."""
        device = kwargs.pop("device", None)
        dtype = kwargs.pop("dtype", None)
        kwargs.pop("non_blocking", None)
        kwargs.pop("memory_format", None)
        if kwargs:
            raise TypeError(f"to() got unexpected keyword arguments {list(kwargs)}")
        for a in args:
            if isinstance(a, Tensor):
                device, dtype = a.device, a.dtype
            elif isinstance(a, Device) or (
                isinstance(a, str) and a.split(":")[0] in ("cpu", "meta", "cuda")
            ):
                device = a
            elif a is not None:
                dtype = a
        dev = as_device(device) if device is not None else None
        dt = _dt.get_dtype(dtype) if dtype is not None else None
        if dt is not None and not dt.is_floating_point:
            raise DTypeError(
                f"nn.Module.to only accepts floating point dtypes, but got desired dtype={dt}"
            )

        def convert(t: Tensor) -> Tensor:
            out = t
            if dev is not None and out._device is not dev:
                out = out.to(dev)
            if dt is not None and out.is_floating_point():
                out = out.to(dt)
            return out

        return self._apply(convert)

    def _cast_floats(self, dtype) -> Module:
        return self._apply(lambda t: t.to(dtype) if t.is_floating_point() else t)

    def float(self) -> Module:
        """Cast floating-point parameters and buffers to float32."""
        return self._cast_floats(_dt.float32)

    def double(self) -> Module:
        """Cast floating-point parameters and buffers to float64."""
        return self._cast_floats(_dt.float64)

    def half(self) -> Module:
        """Cast floating-point parameters and buffers to float16."""
        return self._cast_floats(_dt.float16)

    def bfloat16(self) -> Module:
        """Cast floating-point parameters and buffers to bfloat16."""
        return self._cast_floats(_dt.bfloat16)

    def cpu(self) -> Module:
        """Move every parameter and buffer to the CPU."""
        return self.to("cpu")

    def cuda(self, device=None) -> Module:
        """Move to CUDA (raises DeviceError: no CUDA backend is installed)."""
        return self.to("cuda" if device is None else device)

    def to_empty(self, *, device, recurse: bool = True) -> Module:
        """Move to device with uninitialized (here: zero) storage, e.g. to leave the meta device."""
        dev = as_device(device)

        def fresh(t: Tensor) -> Tensor:
            return (
                Tensor._wrap(np.zeros(t.shape, t._data.dtype), dev)
                if dev.type != "meta"
                else t.to(dev)
            )

        return self._apply(fresh, recurse)

    def share_memory(self) -> Module:
        """No-op (ember tensors already live in process memory); returns self."""
        return self

    # ------------------------------------------------------------------ repr
    def _get_name(self) -> str:
        return type(self).__name__

    def extra_repr(self) -> str:
        """The module's own settings for repr (one line or several); subclasses override it."""
        return ""

    def __repr__(self) -> str:
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({k}): " + _addindent(repr(m), 2) for k, m in self._modules.items()]
        lines = extra_lines + child_lines
        s = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                s += extra_lines[0]
            else:
                s += "\n  " + "\n  ".join(lines) + "\n"
        return s + ")"
