"""get_peft_model, PeftModel and LoraModel: putting adapters into a model, switching, merging."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

from ember import nn
from ember.errors import UnsupportedError
from ember.peft.config import LoraConfig, PeftConfigError
from ember.peft.layer import LoraLinear, ModulesToSaveWrapper, is_linear

# components that live inside an adapted layer: never targets themselves
_INTERNAL = re.compile(
    r"(^|\.)(base_layer|lora_A|lora_B|lora_dropout|modules_to_save|original_module)(\.|$)"
)


def _listed(key: str, names) -> bool:
    return any(key == n or key.endswith("." + n) for n in names)


def _layer_index(key: str, patterns) -> int | None:
    if not patterns:
        m = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", key)
    else:
        m = None
        for p in [patterns] if isinstance(patterns, str) else patterns:
            m = re.match(rf"(?:^|.*?\.){p}\.(?P<idx>\d+)\.", key)
            if m:
                break
    return int(m.group("idx")) if m else None


def _is_output_head(key: str) -> bool:
    return key.rsplit(".", 1)[-1] in ("lm_head", "output", "embed_out")


def target_module_names(model: nn.Module, config: LoraConfig) -> list[str]:
    """Dotted paths of the modules this config adapts (peft's matching rules).

    A list entry of ``target_modules`` that names no module at all (a misspelling) is an error,
    as is a config that ends up adapting nothing.
    """
    keys = [k for k, _ in model.named_modules() if k and not _INTERNAL.search(k)]
    mods = dict(model.named_modules())
    tm = config.target_modules
    if isinstance(tm, list):
        missing = [t for t in tm if not _listed_any(keys, t)]
        if missing:
            raise PeftConfigError(
                f"target_modules {missing} match no module of {type(model).__name__} "
                f"(linear layers it has: {_linear_leaf_names(mods)})"
            )
    found = []
    for key in keys:
        ex = config.exclude_modules
        if ex and (re.fullmatch(ex, key) if isinstance(ex, str) else _listed(key, ex)):
            continue
        if config.modules_to_save and any(
            re.match(rf"(^|.*\.){m}($|\..*)", key) for m in config.modules_to_save
        ):
            continue
        if tm == "all-linear":
            # a layer that already carries an adapter is still one of the model's linears
            linear = is_linear(mods[key]) or isinstance(mods[key], LoraLinear)
            hit = linear and not _is_output_head(key)
        elif isinstance(tm, str):
            hit = re.fullmatch(tm, key) is not None
        else:
            hit = _listed(key, tm)
            if hit and config.layers_to_transform:
                idx = _layer_index(key, config.layers_pattern)
                hit = idx is not None and idx in config.layers_to_transform
        if hit:
            found.append(key)
    if not found:
        raise PeftConfigError(
            f"target_modules={tm!r} adapt no module of {type(model).__name__} (after "
            f"exclude_modules / layers_to_transform); its linear layers: {_linear_leaf_names(mods)}"
        )
    return found


def _listed_any(keys: list[str], t: str) -> bool:
    return any(k == t or k.endswith("." + t) for k in keys)


def _linear_leaf_names(mods: dict) -> list[str]:
    return sorted(
        {k.rsplit(".", 1)[-1] for k, m in mods.items() if k and is_linear(m)}
        | {k.rsplit(".", 1)[-1] for k, m in mods.items() if isinstance(m, LoraLinear)}
    )


def _set_submodule(model: nn.Module, key: str, module: nn.Module) -> None:
    parent, _, leaf = key.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


class LoraModel(nn.Module):
    """The tuner: holds the adapted model as ``model`` (so names read ``base_model.model....``)."""

    def __init__(self, model: nn.Module, config: LoraConfig, adapter_name: str = "default") -> None:
        super().__init__()
        self.model = model
        self.peft_config: dict[str, LoraConfig] = {}
        self.active_adapter = adapter_name
        self.inject_adapter(config, adapter_name)

    def forward(self, *args, **kwargs):
        """The adapted model's forward."""
        return self.model(*args, **kwargs)

    def lora_layers(self) -> Iterator[tuple[str, LoraLinear]]:
        """(path inside the model, layer) for every adapted linear."""
        for k, m in self.model.named_modules():
            if isinstance(m, LoraLinear):
                yield k, m

    def saved_modules(self) -> Iterator[tuple[str, ModulesToSaveWrapper]]:
        """(path, wrapper) for every module of modules_to_save."""
        for k, m in self.model.named_modules():
            if isinstance(m, ModulesToSaveWrapper):
                yield k, m

    def inject_adapter(self, config: LoraConfig, adapter_name: str) -> None:
        """Wrap the targeted linears (or add to their adapters) and the modules to save."""
        if adapter_name in self.peft_config:
            raise PeftConfigError(f"an adapter named {adapter_name!r} already exists")
        if not isinstance(config, LoraConfig):
            raise TypeError(f"expected a LoraConfig, got {type(config).__name__}")
        model = self.model
        keys = target_module_names(model, config)
        for key in keys:  # every target checked before any is wrapped
            mod = model.get_submodule(key)
            if not isinstance(mod, LoraLinear) and not is_linear(mod):
                raise UnsupportedError(
                    f"target module {key!r} is a {type(mod).__name__}; ember.peft adapts "
                    "nn.Linear and QLinear layers"
                )
        for key in keys:
            mod = model.get_submodule(key)
            if not isinstance(mod, LoraLinear):
                mod = LoraLinear(mod)
                _set_submodule(model, key, mod)
            r, alpha = config.rank_and_alpha(key)
            mod.update_layer(
                adapter_name, r, alpha, config.lora_dropout, config.init_lora_weights,
                config.use_rslora,
            )  # fmt: skip
        for name in config.modules_to_save or ():
            hits = [
                k for k, m in model.named_modules()
                if k and _listed(k, [name]) and not _INTERNAL.search(k)
            ]  # fmt: skip
            if not hits:
                raise PeftConfigError(f"modules_to_save entry {name!r} matches no module")
            for k in hits:
                m = model.get_submodule(k)
                if isinstance(m, ModulesToSaveWrapper):
                    m.update(adapter_name)
                else:
                    _set_submodule(model, k, ModulesToSaveWrapper(m, adapter_name))
        self.peft_config[adapter_name] = config
        self._mark_trainable()

    def _mark_trainable(self) -> None:
        """Only the active adapter's tensors (and the biases its config names) train."""
        name = self.active_adapter
        cfg = self.peft_config.get(name)
        for p in self.model.parameters():
            p.requires_grad_(False)
        if cfg is None or cfg.inference_mode:
            return
        for _, layer in self.lora_layers():
            if name in layer.lora_A:
                layer.lora_A[name].requires_grad_(True)
                layer.lora_B[name].requires_grad_(True)
                if cfg.bias == "lora_only" and layer.base_layer.bias is not None:
                    layer.base_layer.bias.requires_grad_(True)
        for _, w in self.saved_modules():
            if name in w.modules_to_save:
                w.modules_to_save[name].requires_grad_(True)
        if cfg.bias == "all":
            for k, p in self.model.named_parameters():
                if k.endswith("bias"):
                    p.requires_grad_(True)

    def set_adapter(self, adapter_name: str) -> None:
        """Make one adapter the active (and the only trainable) one."""
        if adapter_name not in self.peft_config:
            raise PeftConfigError(
                f"no adapter named {adapter_name!r} (have {sorted(self.peft_config)})"
            )
        self.active_adapter = adapter_name
        for _, layer in self.lora_layers():
            if layer.merged:
                layer.unmerge()
            layer.active_adapters = [adapter_name]
        for _, w in self.saved_modules():
            w.active_adapters = [adapter_name]
        self._mark_trainable()

    def delete_adapter(self, adapter_name: str) -> None:
        """Remove an adapter everywhere; another one becomes active if it was."""
        if adapter_name not in self.peft_config:
            raise PeftConfigError(f"no adapter named {adapter_name!r}")
        del self.peft_config[adapter_name]
        for key, layer in list(self.lora_layers()):
            layer.delete_adapter(adapter_name)
            if not layer.lora_A:
                _set_submodule(self.model, key, layer.base_layer)
        for key, w in list(self.saved_modules()):
            if adapter_name in w.modules_to_save:
                del w.modules_to_save[adapter_name]
            if not len(w.modules_to_save):
                _set_submodule(self.model, key, w.original_module)
        if self.active_adapter == adapter_name and self.peft_config:
            self.set_adapter(next(iter(self.peft_config)))

    def _set_disabled(self, flag: bool) -> None:
        for _, layer in self.lora_layers():
            layer.disable_adapters = flag
        for _, w in self.saved_modules():
            w.disable_adapters = flag

    def merge_adapter(self, adapter_names: list[str] | None = None) -> None:
        """Merge the active (or the named) adapters into the base weights, keeping the layers."""
        for _, layer in self.lora_layers():
            layer.merge(adapter_names)

    def unmerge_adapter(self) -> None:
        """Take merged adapters out of the base weights again."""
        for _, layer in self.lora_layers():
            layer.unmerge()

    def _unload(self, merge: bool) -> nn.Module:
        for key, layer in list(self.lora_layers()):
            if merge:
                layer.merge()
            _set_submodule(self.model, key, layer.base_layer)
        for key, w in list(self.saved_modules()):
            _set_submodule(self.model, key, w.active_module if merge else w.original_module)
        return self.model


class PeftModel(nn.Module):
    """A model with LoRA adapters, as peft's PeftModel: call it like the model it wraps."""

    def __init__(self, model: nn.Module, config: LoraConfig, adapter_name: str = "default") -> None:
        super().__init__()
        self.base_model = LoraModel(model, config, adapter_name)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("_") or "base_model" not in self.__dict__:
                raise
            return getattr(self.__dict__["base_model"].model, name)

    def forward(self, *args, **kwargs):
        """The adapted model's forward."""
        return self.base_model.model(*args, **kwargs)

    # ------------------------------------------------------------------ adapters
    @property
    def peft_config(self) -> dict[str, LoraConfig]:
        """Adapter name -> its LoraConfig."""
        return self.base_model.peft_config

    @property
    def active_adapter(self) -> str:
        """The adapter the forward uses (and trains)."""
        return self.base_model.active_adapter

    def add_adapter(self, adapter_name: str, peft_config: LoraConfig) -> None:
        """Add another named adapter (not active until set_adapter)."""
        active = self.base_model.active_adapter
        self.base_model.inject_adapter(peft_config, adapter_name)
        self.base_model.set_adapter(active)

    def set_adapter(self, adapter_name: str) -> None:
        """Make the named adapter active (and the only trainable one)."""
        self.base_model.set_adapter(adapter_name)

    def delete_adapter(self, adapter_name: str) -> None:
        """Remove a named adapter."""
        self.base_model.delete_adapter(adapter_name)

    @contextmanager
    def disable_adapter(self):
        """Within the block the model runs as its base (merged adapters are unmerged first)."""
        self.base_model._set_disabled(True)
        try:
            yield
        finally:
            self.base_model._set_disabled(False)

    def get_base_model(self) -> nn.Module:
        """The wrapped model (with its adapted layers in place)."""
        return self.base_model.model

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """nn.Module.load_state_dict, except that frozen read-only weights (memory-mapped base
        weights) are left alone when equal and replaced, not written into, when not."""
        import numpy as np

        from ember.nn.state_dict import StateDictError, _IncompatibleKeys

        own = dict(self.named_parameters())
        rest, handled = {}, set()
        for k, v in state_dict.items():
            p = own.get(k)
            arr = v._data if hasattr(v, "_data") else np.asarray(v)
            if (
                p is not None and not p.requires_grad and not p._data.flags.writeable
                and tuple(p.shape) == tuple(arr.shape)
            ):  # fmt: skip
                if not np.array_equal(p._data, arr):
                    p._data = np.array(arr, dtype=p._data.dtype)
                handled.add(k)
            else:
                rest[k] = v
        keys = super().load_state_dict(rest, strict=False, assign=assign)
        missing = [k for k in keys.missing_keys if k not in handled]
        if strict and (missing or keys.unexpected_keys):
            raise StateDictError(
                f"Error(s) in loading state_dict for PeftModel: missing keys {missing[:8]}, "
                f"unexpected keys {keys.unexpected_keys[:8]}"
            )
        return _IncompatibleKeys(missing, keys.unexpected_keys)

    # ------------------------------------------------------------------ counting
    def get_nb_trainable_parameters(self) -> tuple[int, int]:
        """(trainable parameters, all parameters); quantized weights count their elements."""
        trainable = total = 0
        for p in self.parameters():
            total += p.numel()
            if p.requires_grad:
                trainable += p.numel()
        seen = set()
        for m in self.modules():
            w = getattr(m, "__dict__", {}).get("weight")
            if w is not None and not hasattr(w, "requires_grad") and hasattr(w, "numel"):
                if id(w) not in seen:
                    seen.add(id(w))
                    total += int(w.numel)
        return trainable, total

    def print_trainable_parameters(self) -> None:
        """Print 'trainable params: N || all params: M || trainable%: P' as peft does."""
        t, a = self.get_nb_trainable_parameters()
        print(f"trainable params: {t:,d} || all params: {a:,d} || trainable%: {100 * t / a:.4f}")

    # ------------------------------------------------------------------ merging
    def merge_adapter(self, adapter_names: list[str] | None = None) -> None:
        """Merge adapters into the base weights in place (the layers stay, for unmerge)."""
        self.base_model.merge_adapter(adapter_names)

    def unmerge_adapter(self) -> None:
        """Undo merge_adapter."""
        self.base_model.unmerge_adapter()

    def merge_and_unload(self) -> nn.Module:
        """The base model with the active adapter merged into its weights, no LoRA layers left."""
        return self.base_model._unload(merge=True)

    def unload(self) -> nn.Module:
        """The base model as it was, adapters dropped."""
        return self.base_model._unload(merge=False)

    # ------------------------------------------------------------------ files
    def save_pretrained(
        self, save_directory: str | os.PathLike, selected_adapters: list[str] | None = None
    ) -> None:
        """Write adapter_config.json + adapter_model.safetensors (peft's names); other adapters
        than "default" go to a subdirectory of their name, as peft does."""
        from ember.peft.files import save_adapter

        for name in selected_adapters or list(self.peft_config):
            d = save_directory if name == "default" else os.path.join(save_directory, name)
            save_adapter(self, d, name)

    def load_adapter(
        self, model_id: str | os.PathLike, adapter_name: str, is_trainable: bool = False
    ) -> None:
        """Add an adapter saved by peft or ember under adapter_name."""
        from ember.peft.files import load_adapter_weights

        config = LoraConfig.from_pretrained(model_id)
        config.inference_mode = not is_trainable
        active = self.base_model.active_adapter
        self.base_model.inject_adapter(config, adapter_name)
        load_adapter_weights(self, model_id, adapter_name)
        self.base_model.set_adapter(active)

    @classmethod
    def from_pretrained(
        cls, model: nn.Module, model_id: str | os.PathLike, adapter_name: str = "default",
        is_trainable: bool = False,
    ) -> PeftModel:  # fmt: skip
        """The model with the adapter saved in model_id (by peft or ember) put in."""
        from ember.peft.files import load_adapter_weights

        config = LoraConfig.from_pretrained(model_id)
        config.inference_mode = not is_trainable
        out = cls(model, config, adapter_name)
        load_adapter_weights(out, model_id, adapter_name)
        if not is_trainable:
            out.eval()
        return out


def get_peft_model(
    model: nn.Module, peft_config: LoraConfig, adapter_name: str = "default"
) -> PeftModel:
    """Freeze the model and put LoRA adapters in (and trainable copies of modules_to_save)."""
    return PeftModel(model, peft_config, adapter_name)
