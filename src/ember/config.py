"""Every ``EMBER_*`` environment switch, read once, in one place.

The values are read when this module is first imported (``import ember`` does it) and mean the
same in every module. Tests that need another value run a fresh process with the variable set.

| variable | values | effect |
| --- | --- | --- |
| ``EMBER_NO_NUMBA`` | ``1`` / ``true`` | never import numba: kernels that need it step aside, ops run their numpy references |
| ``EMBER_KERNELS`` | ``all`` (default), ``reference`` | ``reference``: the registry picks no kernel |
| ``EMBER_SGEMM_ISA`` | ``avx512``, ``avx2``, ``none`` | cap the LLVM IR microkernel family (``none``: numpy) |
| ``EMBER_QUANT_DOT`` | ``int8`` (default), ``int8-256``, ``float`` | ``float``: Q8_0/Q4_0/Q4_1/Q6_K/Q4_K/Q5_K products dequantize to float instead of quantizing x to int8 (kernels.cpu.quant._pdot, _idot); ``int8-256``: their 256-bit loop even where AVX-512 VNNI runs two blocks per 512-bit step |
| ``EMBER_QUANT_REPACK`` | ``1`` (default), ``0`` | ``0``: Q8_0/Q4_0/Q4_1/Q6_K/Q4_K/Q5_K products read the GGUF blocks where they lie instead of a copy repacked once in panels of 16 rows (kernels.cpu.quant._panels: about the weight's size in memory) |
| ``EMBER_HALF_DOT`` | ``bf16`` (default), ``float`` | ``float``: BF16 weights times many rows of x (a prompt) multiply float32 x by the widened weights instead of rounding x to bf16 for ``vdpbf16ps`` (kernels.cpu.quant.bf16dot) |
| ``EMBER_GRAPHS`` | ``1`` (default), ``0`` | ``0``: one-token decode steps run as plain forwards instead of captured, replayed graphs (ember.nn.graph) |
| ``EMBER_MALLOC`` | ``keep`` (default), ``system`` | ``system``: leave glibc's malloc thresholds alone (ember.memory) |
| ``EMBER_FUZZ_EXAMPLES`` | an int | tests only: a longer randomised run of the reader fuzzer |

What ember writes into ``os.environ`` on a user's behalf: ``GOMP_SPINCOUNT=0`` before numba
starts its OpenMP workers, unless the user set ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` (see
``ember.kernels.cpu.numba_or_none``). Not a variable but process state: glibc's malloc keeps freed
arrays of up to 32 MB for reuse (``ember.memory``), unless ``EMBER_MALLOC=system``.
"""

from __future__ import annotations

import os

from ember.errors import EmberError

_TRUE = ("1", "true", "yes", "on")


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def _choice(name: str, choices: tuple[str, ...], default: str) -> str:
    v = os.environ.get(name, "").strip().lower()
    if not v:
        return default
    if v not in choices:
        raise EmberError(f"{name}={v!r}: expected one of {', '.join(choices)}")
    return v


NO_NUMBA: bool = _flag("EMBER_NO_NUMBA")
KERNELS: str = _choice("EMBER_KERNELS", ("all", "reference"), "all")
SGEMM_ISA: str | None = _choice("EMBER_SGEMM_ISA", ("avx512", "avx2", "none", "auto"), "auto")
if SGEMM_ISA == "auto":
    SGEMM_ISA = None
QUANT_DOT: str = _choice("EMBER_QUANT_DOT", ("int8", "int8-256", "float"), "int8")
QUANT_WIDE: bool = QUANT_DOT == "int8"
QUANT_REPACK: bool = _choice("EMBER_QUANT_REPACK", ("1", "0"), "1") == "1"
HALF_DOT: str = _choice("EMBER_HALF_DOT", ("bf16", "float"), "bf16")
GRAPHS: bool = _choice("EMBER_GRAPHS", ("1", "0"), "1") == "1"
MALLOC: str = _choice("EMBER_MALLOC", ("keep", "system"), "keep")
FUZZ_EXAMPLES: int | None = (
    int(os.environ["EMBER_FUZZ_EXAMPLES"]) if os.environ.get("EMBER_FUZZ_EXAMPLES") else None
)
