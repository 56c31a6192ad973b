"""LoraConfig: peft's LoRA configuration (the same field names, defaults and adapter_config.json)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ember.errors import EmberError, FormatError, UnsupportedError

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"

# Fields of peft's LoraConfig that ember reads but does not implement: accepted only at the value
# that leaves them without effect (what peft writes when they are unused).
_INERT: dict[str, tuple] = {
    "use_dora": (False, None),
    "lora_bias": (False, None),
    "fan_in_fan_out": (False, None),
    "layer_replication": (None, [], ()),
    "loftq_config": ({}, None),
    "eva_config": (None,),
    "corda_config": (None,),
    "arrow_config": (None,),
    "kasa_config": (None,),
    "lora_ga_config": (None,),
    "monteclora_config": (None,),
    "velora_config": (None,),
    "megatron_config": (None,),
    "target_parameters": (None, [], ()),
    "trainable_token_indices": (None,),
    "alora_invocation_tokens": (None,),
    "use_qalora": (False, None),
    "use_bdlora": (None, False),
    "ensure_weight_tying": (False, None),
    "modules_to_tie": (None,),
    "runtime_config": (None, {}),
}
# Fields peft writes that carry no behaviour for ember (bookkeeping): accepted with any value.
_BOOKKEEPING = {
    "peft_type",
    "peft_version",
    "auto_mapping",
    "base_model_name_or_path",
    "revision",
    "task_type",
    "inference_mode",
    "megatron_core",
    "qalora_group_size",
}
_BIAS = ("none", "all", "lora_only")


class PeftConfigError(EmberError, ValueError):
    """A LoRA configuration that cannot be applied (bad value, or targets that match nothing)."""


@dataclass
class LoraConfig:
    """What to adapt and how: peft.LoraConfig's fields, defaults and meaning.

    ``target_modules``: a list of module names (a name matches a module whose dotted path is
    that name or ends with ``"." + name``), a regex string (matched against the whole path), or
    ``"all-linear"`` (every linear layer but the output head). ``rank_pattern`` and
    ``alpha_pattern`` map a name or regex (matched at the end of the path) to another ``r`` or
    ``lora_alpha``. ``init_lora_weights``: True (A Kaiming-uniform, B zero), ``"gaussian"``
    (A normal with std 1/r, B zero) or False (both random: the adapter changes the output).
    """

    r: int = 8
    lora_alpha: float = 8
    lora_dropout: float = 0.0
    target_modules: list[str] | str | None = None
    exclude_modules: list[str] | str | None = None
    bias: str = "none"
    use_rslora: bool = False
    modules_to_save: list[str] | None = None
    init_lora_weights: bool | str = True
    layers_to_transform: list[int] | int | None = None
    layers_pattern: list[str] | str | None = None
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)
    base_model_name_or_path: str | None = None
    task_type: str | None = None
    inference_mode: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.r, int) or isinstance(self.r, bool) or self.r <= 0:
            raise PeftConfigError(f"LoraConfig: r must be a positive int, got {self.r!r}")
        if not 0.0 <= float(self.lora_dropout) < 1.0:
            raise PeftConfigError(
                f"LoraConfig: lora_dropout must be in [0, 1), got {self.lora_dropout}"
            )
        if self.bias not in _BIAS:
            raise PeftConfigError(f"LoraConfig: bias must be one of {_BIAS}, got {self.bias!r}")
        if self.init_lora_weights not in (True, False, "gaussian"):
            raise UnsupportedError(
                f"LoraConfig: init_lora_weights={self.init_lora_weights!r} is not supported "
                "(True, False or 'gaussian')"
            )
        for name in ("target_modules", "exclude_modules", "layers_pattern"):
            v = getattr(self, name)
            if isinstance(v, (set, tuple)):
                setattr(self, name, sorted(v))
        if self.target_modules is None:
            raise PeftConfigError(
                "LoraConfig: target_modules is required (names, a regex or 'all-linear')"
            )
        if isinstance(self.target_modules, str) and self.target_modules != "all-linear":
            _compile(self.target_modules, "target_modules")
        if isinstance(self.exclude_modules, str):
            _compile(self.exclude_modules, "exclude_modules")
        if isinstance(self.layers_to_transform, int) and not isinstance(
            self.layers_to_transform, bool
        ):
            self.layers_to_transform = [self.layers_to_transform]
        if self.layers_pattern and not self.layers_to_transform:
            raise PeftConfigError("LoraConfig: layers_pattern needs layers_to_transform")
        for k, v in self.rank_pattern.items():
            _compile(k, "rank_pattern")
            if not isinstance(v, int) or v <= 0:
                raise PeftConfigError(
                    f"LoraConfig: rank_pattern[{k!r}] must be a positive int, got {v!r}"
                )
        for k in self.alpha_pattern:
            _compile(k, "alpha_pattern")
        if self.modules_to_save is not None:
            self.modules_to_save = list(self.modules_to_save)

    # ---------------------------------------------------------------- per-module values
    def rank_and_alpha(self, module_name: str) -> tuple[int, float]:
        """(r, lora_alpha) for the module at this dotted path (rank_pattern / alpha_pattern)."""
        r = self.r
        for key, v in self.rank_pattern.items():
            if re.match(rf"(.*\.)?({key})$", module_name):
                r = v
                break
        alpha = self.lora_alpha
        for key, v in self.alpha_pattern.items():
            if re.match(rf"(.*\.)?({key})$", module_name):
                alpha = v
                break
        return r, alpha

    def scaling_for(self, r: int, alpha: float) -> float:
        """The factor on B @ A: alpha / r, or alpha / sqrt(r) with use_rslora."""
        return alpha / math.sqrt(r) if self.use_rslora else alpha / r

    # ---------------------------------------------------------------- files
    def to_dict(self) -> dict[str, Any]:
        """The adapter_config.json dict (peft's field names; unused peft fields at their defaults)."""
        d = dataclasses.asdict(self)
        d.update(
            peft_type="LORA",
            use_dora=False,
            lora_bias=False,
            fan_in_fan_out=False,
            layer_replication=None,
            revision=None,
        )
        return d

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write adapter_config.json into directory."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / CONFIG_NAME).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "adapter config") -> LoraConfig:
        """A LoraConfig from an adapter_config.json dict; unknown or unsupported fields are errors."""
        if not isinstance(d, dict):
            raise FormatError(f"{where}: expected a JSON object, got {type(d).__name__}")
        ptype = d.get("peft_type", "LORA")
        if str(ptype).upper() != "LORA":
            raise UnsupportedError(f"{where}: peft_type {ptype!r} is not supported (only LORA)")
        own = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in d if k not in own and k not in _INERT and k not in _BOOKKEEPING)
        if unknown:
            raise FormatError(f"{where}: unknown fields {unknown} (not LoraConfig fields)")
        for k, ok in _INERT.items():
            if k in d and not any(_same(d[k], v) for v in ok):
                raise UnsupportedError(f"{where}: {k}={d[k]!r} is not supported by ember.peft")
        kwargs = {k: v for k, v in d.items() if k in own}
        if "inference_mode" in d:
            kwargs["inference_mode"] = bool(d["inference_mode"])
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as e:
            if isinstance(e, UnsupportedError):
                raise
            raise FormatError(f"{where}: {e}") from None

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> LoraConfig:
        """Read directory/adapter_config.json."""
        p = Path(directory) / CONFIG_NAME
        if not p.is_file():
            raise FileNotFoundError(f"no {CONFIG_NAME} in {directory}")
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise FormatError(f"{p}: not valid JSON ({e})") from None
        return cls.from_dict(d, str(p))


def _same(a: Any, b: Any) -> bool:
    return (a is None and b is None) or (type(a) is type(b) and a == b)


def _compile(pattern: str, what: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as e:
        raise PeftConfigError(
            f"LoraConfig: {what} pattern {pattern!r} is not a valid regex: {e}"
        ) from None
