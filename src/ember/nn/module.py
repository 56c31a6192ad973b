"""Module: the base class of every layer, with torch.nn.Module's registration, state and hooks.

Parameters, buffers and submodules live in the registries ``_parameters``, ``_buffers`` and
``_modules`` (as in torch) and are mirrored into the instance ``__dict__``, so ``self.weight`` is a
plain attribute hit; ``__getattr__`` is only the fallback. ``__call__`` goes straight to
``forward`` when no hook is registered.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, namedtuple
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from ember import dtypes as _dt
from ember.autograd import no_grad
from ember.device import Device, as_device
from ember.errors import DTypeError, EmberError, UnsupportedError
from ember.nn.parameter import Buffer, Parameter
from ember.tensor import Tensor

_EXTRA_STATE_KEY_SUFFIX = "_extra_state"


class StateDictError(EmberError, RuntimeError):
    """load_state_dict found missing, unexpected or mis-shaped keys (lists all of them)."""


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    """What load_state_dict returns: (missing_keys, unexpected_keys)."""

    __slots__ = ()

    def __repr__(self) -> str:
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


class _Registry(dict):
    """A name -> value dict that mirrors every write into its module's ``__dict__``."""

    __slots__ = ("_mirror",)

    def __init__(self, mirror: dict, items=()) -> None:
        super().__init__()
        self._mirror = mirror
        for k, v in items:
            self[k] = v

    def __setitem__(self, key, value) -> None:
        dict.__setitem__(self, key, value)
        self._mirror[key] = value

    def __delitem__(self, key) -> None:
        dict.__delitem__(self, key)
        self._mirror.pop(key, None)

    def pop(self, key, *default):
        """Remove key (and its mirror) and return its value."""
        if key in self:
            self._mirror.pop(key, None)
        return dict.pop(self, key, *default)

    def popitem(self):
        """Remove the last item (and its mirror)."""
        k, v = dict.popitem(self)
        self._mirror.pop(k, None)
        return k, v

    def setdefault(self, key, default=None):
        """Insert key with default if absent; return its value."""
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args, **kwargs) -> None:
        """Insert many items, mirroring each."""
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def clear(self) -> None:
        """Remove every item and its mirror."""
        for k in list(self):
            self._mirror.pop(k, None)
        dict.clear(self)

    def __reduce__(self):
        return (dict, (dict(self),))


class RemovableHandle:
    """Returned by register_*_hook: ``.remove()`` unregisters the hook (also a context manager)."""

    _next_id = 0

    def __init__(self, *dicts: dict) -> None:
        self.id = RemovableHandle._next_id
        RemovableHandle._next_id += 1
        self._dicts = dicts

    def remove(self) -> None:
        """Unregister the hook; calling it twice is harmless."""
        for d in self._dicts:
            d.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


_global_forward_pre_hooks: dict = OrderedDict()
_global_forward_hooks: dict = OrderedDict()


def register_module_forward_pre_hook(hook: Callable) -> RemovableHandle:
    """Run hook(module, args) before every module's forward (torch's global hook)."""
    h = RemovableHandle(_global_forward_pre_hooks)
    _global_forward_pre_hooks[h.id] = hook
    return h


def register_module_forward_hook(hook: Callable) -> RemovableHandle:
    """Run hook(module, args, output) after every module's forward (torch's global hook)."""
    h = RemovableHandle(_global_forward_hooks)
    _global_forward_hooks[h.id] = hook
    return h


def _addindent(s: str, num_spaces: int) -> str:
    lines = s.split("\n")
    if len(lines) == 1:
        return s
    first = lines.pop(0)
    lines = [(num_spaces * " ") + line if line.strip() else "" for line in lines]
    return first + "\n" + "\n".join(lines)


def _as_tensor(value):
    """A state_dict value as an ember Tensor (numpy arrays are wrapped), or None."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, np.ndarray):
        return Tensor._wrap(value)
    return None


_REGISTRIES = ("_parameters", "_buffers", "_modules")


class Module:
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
                            f"forward pre-hook must return None or a tuple of (new_args, new_kwargs), got {res}."
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
        """Call hook(module, args) (or hook(module, args, kwargs)) before forward; may replace args."""
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
        """Call hook(module, state_dict, prefix, local_metadata, strict, missing, unexpected, errors)."""
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
                    f"Cannot assign non-leaf Tensor to parameter '{name}'. Model parameters must be "
                    "created explicitly; to express '{name}' as a function of another Tensor, compute "
                    "the value in the forward() method."
                )
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Add a buffer: state that is not trained (running stats); persistent=False keeps it out
        of state_dict."""
        self._check_name(name, "buffer", "_buffers")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(
                f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' (ember.Tensor or None required)"
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

    def get_extra_state(self):
        """Extra (non-tensor) state to put in state_dict; define with set_extra_state."""
        raise RuntimeError(
            "Reached a code path in Module.get_extra_state() that should never be called."
        )

    def set_extra_state(self, state) -> None:
        """Restore what get_extra_state returned."""
        raise RuntimeError(
            "Reached a code path in Module.set_extra_state() that should never be called."
        )

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

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients of every parameter (to None by default, or to zeros)."""
        for p in self.parameters():
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
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
        """Move to a device and/or cast floating-point parameters and buffers to a dtype, in place."""
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

    # ------------------------------------------------------------------ state dict
    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = b if keep_vars else b.detach()
        if type(self).get_extra_state is not Module.get_extra_state:
            destination[prefix + _EXTRA_STATE_KEY_SUFFIX] = self.get_extra_state()

    def state_dict(
        self, *, destination: dict | None = None, prefix: str = "", keep_vars: bool = False
    ) -> dict:
        """An ordered name -> tensor map of parameters and persistent buffers (torch's keys)."""
        if destination is None:
            destination = OrderedDict()
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, m in self._modules.items():
            if m is not None:
                m.state_dict(
                    destination=destination, prefix=prefix + name + ".", keep_vars=keep_vars
                )
        return destination

    def _load_from_state_dict(
        self,
        state_dict: dict,
        prefix: str,
        local_metadata: dict,
        strict: bool,
        missing_keys: list,
        unexpected_keys: list,
        error_msgs: list,
    ) -> None:
        for hook in self._load_state_dict_pre_hooks.values():
            hook(
                self,
                state_dict,
                prefix,
                local_metadata,
                strict,
                missing_keys,
                unexpected_keys,
                error_msgs,
            )
        persistent = {
            k: v for k, v in self._buffers.items() if k not in self._non_persistent_buffers_set
        }
        local_state = {
            k: v
            for k, v in itertools.chain(self._parameters.items(), persistent.items())
            if v is not None
        }
        assign = local_metadata.get("assign_to_params_buffers", False)
        for name, param in local_state.items():
            key = prefix + name
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            value = state_dict[key]
            src = _as_tensor(value)
            if src is None and not (assign and hasattr(value, "shape")):
                error_msgs.append(
                    f'While copying the parameter named "{key}", expected ember.Tensor or a numpy array '
                    f"from checkpoint but received {type(value)}"
                )
                continue
            src = value if src is None else src
            if len(param.shape) == 0 and tuple(src.shape) == (1,):
                src = src.reshape(())
            if tuple(src.shape) != tuple(param.shape):
                error_msgs.append(
                    f"size mismatch for {key}: copying a param with shape {tuple(src.shape)} from checkpoint, "
                    f"the shape in current model is {tuple(param.shape)}."
                )
                continue
            try:
                with no_grad():
                    if assign:
                        if isinstance(param, Parameter) and not isinstance(src, Parameter):
                            src = Parameter(src, requires_grad=param.requires_grad)
                        setattr(self, name, src)
                    else:
                        param.copy_(src)
            except Exception as ex:  # noqa: BLE001 - reported with the key, as torch does
                error_msgs.append(
                    f'While copying the parameter named "{key}", whose dimensions in the model are '
                    f"{tuple(param.shape)} and whose dimensions in the checkpoint are {tuple(src.shape)}, "
                    f"an exception occurred : {ex.args}."
                )
        extra_key = prefix + _EXTRA_STATE_KEY_SUFFIX
        if type(self).set_extra_state is not Module.set_extra_state:
            if extra_key in state_dict:
                self.set_extra_state(state_dict[extra_key])
            elif strict:
                missing_keys.append(extra_key)
        elif strict and extra_key in state_dict:
            unexpected_keys.append(extra_key)
        if strict:
            for key in state_dict:
                if key.startswith(prefix) and key != extra_key:
                    head = key[len(prefix) :].split(".", 1)
                    if len(head) > 1:
                        if head[0] not in self._modules:
                            unexpected_keys.append(key)
                    elif head[0] not in local_state:
                        unexpected_keys.append(key)

    def load_state_dict(
        self, state_dict: Mapping, strict: bool = True, assign: bool = False
    ) -> _IncompatibleKeys:
        """Copy tensors from state_dict into parameters and buffers; returns (missing, unexpected).

        strict=True raises StateDictError listing every missing, unexpected and mis-shaped key;
        mis-shaped keys raise even when strict=False (as torch). assign=True adopts the given
        tensors instead of copying (keeps memory-mapped weights mapped).
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        missing: list[str] = []
        unexpected: list[str] = []
        errors: list[str] = []
        metadata = getattr(state_dict, "_metadata", None)
        state_dict = OrderedDict(state_dict)

        def load(module: Module, local: dict, prefix: str = "") -> None:
            meta = {} if metadata is None else dict(metadata.get(prefix[:-1], {}))
            if assign:
                meta["assign_to_params_buffers"] = True
            module._load_from_state_dict(local, prefix, meta, True, missing, unexpected, errors)
            for name, child in module._modules.items():
                if child is not None:
                    cp = prefix + name + "."
                    load(child, {k: v for k, v in local.items() if k.startswith(cp)}, cp)
            keys = _IncompatibleKeys(missing, unexpected)
            for hook in module._load_state_dict_post_hooks.values():
                hook(module, keys)

        load(self, state_dict)
        if strict:
            if unexpected:
                errors.insert(
                    0,
                    "Unexpected key(s) in state_dict: {}. ".format(
                        ", ".join(f'"{k}"' for k in unexpected)
                    ),
                )
            if missing:
                errors.insert(
                    0,
                    "Missing key(s) in state_dict: {}. ".format(
                        ", ".join(f'"{k}"' for k in missing)
                    ),
                )
        if errors:
            raise StateDictError(
                "Error(s) in loading state_dict for {}:\n\t{}".format(
                    type(self).__name__, "\n\t".join(errors)
                )
            )
        return _IncompatibleKeys(missing, unexpected)

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
