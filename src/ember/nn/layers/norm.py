"""BatchNorm1d/2d, LayerNorm, RMSNorm, GroupNorm, InstanceNorm1d/2d."""

from __future__ import annotations

from ember import dtypes as _dt
from ember.errors import ShapeError
from ember.nn import functional as F
from ember.nn import init
from ember.nn.layers._common import empty_param
from ember.nn.module import Module
from ember.tensor import Tensor


def _zeros(shape, device, dtype) -> Tensor:
    from ember.ops.creation import zeros

    return zeros(tuple(shape), dtype=dtype, device=device)


def _ones(shape, device, dtype) -> Tensor:
    from ember.ops.creation import ones

    return ones(tuple(shape), dtype=dtype, device=device)


def _affine(module: Module, shape: tuple, affine: bool, bias: bool, device, dtype) -> None:
    """Register weight and bias of the given shape (None when not affine / no bias)."""
    module.register_parameter("weight", empty_param(shape, device, dtype) if affine else None)
    module.register_parameter(
        "bias", empty_param(shape, device, dtype) if affine and bias else None
    )


def _reset_affine(module: Module) -> None:
    """Weight 1, bias 0 (where they exist)."""
    if module.weight is not None:
        init.ones_(module.weight)
    if getattr(module, "bias", None) is not None:
        init.zeros_(module.bias)


class _NormBase(Module):
    """State shared by batch and instance norm: affine parameters and running statistics."""

    _version = 2

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device=None,
        dtype=None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        _affine(self, (num_features,), affine, bias, device, dtype)
        if track_running_stats:
            self.register_buffer("running_mean", _zeros((num_features,), device, dtype))
            self.register_buffer("running_var", _ones((num_features,), device, dtype))
            self.register_buffer("num_batches_tracked", _zeros((), device, _dt.int64))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        """Running mean 0, running variance 1, no batches seen."""
        if self.track_running_stats:
            init.zeros_(self.running_mean)
            init.ones_(self.running_var)
            init.zeros_(self.num_batches_tracked)

    def reset_parameters(self) -> None:
        """Reset running stats; weight 1, bias 0."""
        self.reset_running_stats()
        _reset_affine(self)

    def _check_input_dim(self, input: Tensor) -> None:
        raise NotImplementedError

    def extra_repr(self) -> str:
        """torch's summary line."""
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}"
        )

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors
    ) -> None:
        version = local_metadata.get("version", None)
        key = prefix + "num_batches_tracked"
        if (version is None or version < 2) and self.track_running_stats and key not in state_dict:
            from ember.ops.creation import tensor

            state_dict[key] = (
                self.num_batches_tracked
                if self.num_batches_tracked is not None and not self.num_batches_tracked.is_meta
                else tensor(0, dtype=_dt.int64)
            )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing, unexpected, errors
        )


class _BatchNorm(_NormBase):
    """Forward of the batch norm layers."""

    def forward(self, input: Tensor) -> Tensor:
        """Normalise with batch stats in training (updating the running ones), running in eval."""
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            nbt = self.num_batches_tracked
            if not nbt.is_meta:
                nbt._data[...] += 1
                if self.momentum is None:
                    factor = 1.0 / float(nbt._data)
        bn_training = (
            True if self.training else (self.running_mean is None and self.running_var is None)
        )
        use_buffers = not self.training or self.track_running_stats
        return F.batch_norm(
            input,
            self.running_mean if use_buffers else None,
            self.running_var if use_buffers else None,
            self.weight,
            self.bias,
            bn_training,
            factor,
            self.eps,
        )


class BatchNorm1d(_BatchNorm):
    """Batch norm over (N, C) or (N, C, L) inputs."""

    def _check_input_dim(self, input: Tensor) -> None:
        if input.ndim not in (2, 3):
            raise ShapeError(f"expected 2D or 3D input (got {input.ndim}D input)")


class BatchNorm2d(_BatchNorm):
    """Batch norm over (N, C, H, W) inputs."""

    def _check_input_dim(self, input: Tensor) -> None:
        if input.ndim != 4:
            raise ShapeError(f"expected 4D input (got {input.ndim}D input)")


class BatchNorm3d(_BatchNorm):
    """Batch norm over (N, C, D, H, W) inputs."""

    def _check_input_dim(self, input: Tensor) -> None:
        if input.ndim != 5:
            raise ShapeError(f"expected 5D input (got {input.ndim}D input)")


class _InstanceNorm(_NormBase):
    """Forward of the instance norm layers (affine and running stats off by default, as torch)."""

    _nd = 2

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = False,
        track_running_stats: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)

    def extra_repr(self) -> str:
        """torch's summary line."""
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"track_running_stats={self.track_running_stats}"
        )

    def forward(self, input: Tensor) -> Tensor:
        """Normalise each (sample, channel) over its spatial dims."""
        nd = self._nd
        if input.ndim not in (nd + 1, nd + 2):
            raise ShapeError(f"expected {nd + 1}D or {nd + 2}D input (got {input.ndim}D input)")
        unbatched = input.ndim == nd + 1
        x = input.unsqueeze(0) if unbatched else input
        out = F.instance_norm(
            x,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            self.training or not self.track_running_stats,
            0.1 if self.momentum is None else self.momentum,
            self.eps,
        )
        return out.squeeze(0) if unbatched else out


class InstanceNorm1d(_InstanceNorm):
    """Instance norm over (N, C, L) or (C, L)."""

    _nd = 1


class InstanceNorm2d(_InstanceNorm):
    """Instance norm over (N, C, H, W) or (C, H, W)."""

    _nd = 2


class LayerNorm(Module):
    """Standardise over the trailing normalized_shape dims, then scale and shift."""

    def __init__(
        self,
        normalized_shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        _affine(self, self.normalized_shape, elementwise_affine, bias, device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weight 1, bias 0."""
        _reset_affine(self)

    def forward(self, input: Tensor) -> Tensor:
        """layer_norm(input)."""
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        """torch's summary line."""
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}, "
            f"bias={self.bias is not None}"
        )


class RMSNorm(Module):
    """x / sqrt(mean(x**2) + eps) * weight over the trailing dims (eps=None: machine epsilon)."""

    def __init__(
        self,
        normalized_shape,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = empty_param(self.normalized_shape, device, dtype)
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weight 1."""
        _reset_affine(self)

    def forward(self, x: Tensor) -> Tensor:
        """rms_norm(x)."""
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        """torch's summary line."""
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        )


class GroupNorm(Module):
    """Standardise groups of channels over the group and spatial dims, then per-channel affine."""

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        device=None,
        dtype=None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if num_channels % num_groups != 0:
            raise ValueError("num_channels must be divisible by num_groups")
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        _affine(self, (num_channels,), affine, bias, device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weight 1, bias 0."""
        _reset_affine(self)

    def forward(self, input: Tensor) -> Tensor:
        """group_norm(input)."""
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        """torch's summary line."""
        return (
            f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
            f"bias={self.bias is not None}"
        )
