"""Token-major transformer pieces around the packed-weight GEMM: linear, conv1d, norm, gelu.

Activations are (tokens, features) float32 rows (or (batch, length, channels) for conv1d, the
channels-last layout), as a Transformer's residual stream is stored:

- ``pack(w)``: a linear weight (out, in), or a conv1d weight (out, in, k), in sgemm's panels;
- ``linear(x, w, bias, residual)``: x @ W^T + bias (+ residual), the adds in the GEMM's epilogue;
- ``conv1d(x, w, bias, stride, padding)``: a channels-last 1-D convolution, read in place by the
  GEMM (each tap a fixed offset from the output position's window; no im2col);
- ``layer_norm(x, w, b, eps)`` and ``gelu_(x, add)``: row-parallel numba passes.

Packing a weight reads and writes it once (about 1 ms for Whisper tiny's encoder on this
machine), so callers may pack on every call instead of caching packed copies that go stale when
a weight changes in place.

Each kernel has a numpy reference (``*_reference``), which the tests compare against and which
runs where numba or the microkernels are missing (EMBER_NO_NUMBA=1, EMBER_SGEMM_ISA=none).
"""

from __future__ import annotations

import numpy as np

from ember.kernels.cpu import numba_or_none
from ember.kernels.cpu.special import erf_f32, erf_f32_jit

_F32 = np.float32
_I64 = np.int64
_RSQRT2 = _F32(0.7071067811865476)
_K: dict | None = None
prange = range  # numba.prange once _build runs


class Packed:
    """A weight ready for the GEMM: sgemm panels, or the (taps * in, out) matrix for numpy."""

    def __init__(self, w3, panels: np.ndarray | None) -> None:
        """w3: the (out, taps, in) weight (only its shape when panels are given)."""
        self.out_features, self.taps, self.in_features = w3 if panels is not None else w3.shape
        self.panels = panels
        self.matrix = None if panels is not None else _matrix(w3)


def _matrix(w3: np.ndarray) -> np.ndarray:
    """(out, taps, in) -> (taps * in, out), row t * in + c = w3[:, t, c]."""
    o, t, c = w3.shape
    return np.ascontiguousarray(w3.reshape(o, t * c).T, dtype=_F32)


# ------------------------------------------------------------------ numpy references
def layer_norm_reference(x: np.ndarray, w, b, eps: float) -> np.ndarray:
    """Layer norm over the last axis of a 2-D float32 array (float64 statistics)."""
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    var = ((x64 - mu) ** 2).mean(-1, keepdims=True)
    y = ((x64 - mu) / np.sqrt(var + eps)).astype(_F32)
    return y * (_F32(1.0) if w is None else w) + (_F32(0.0) if b is None else b)


def gelu_reference(x: np.ndarray, add: np.ndarray | None = None) -> np.ndarray:
    """Exact (erf) gelu of x, plus add's rows repeated down x (row r gets add[r % len(add)])."""
    y = _F32(0.5) * x * (_F32(1.0) + erf_f32(x * _RSQRT2))
    if add is not None:
        y = (y.reshape(-1, *add.shape) + add).reshape(x.shape)
    return y


# ------------------------------------------------------------------ numba kernels
def _build() -> dict:
    """Compile (or load from cache) the kernels; {} when numba is unavailable."""
    nb = numba_or_none()
    if nb is None:
        return {}
    njit, prange = nb.njit, nb.prange
    globals()["prange"] = prange
    erf32 = erf_f32_jit()
    half, one, rsqrt2 = _F32(0.5), _F32(1.0), _RSQRT2

    def pack(w3, nr, out):  # pragma: no cover - compiled
        o, taps, c = w3.shape
        for p in prange(out.shape[0]):  # panel rows outermost: contiguous writes
            blk, wp = out[p], w3[p * nr :]
            n = min(nr, o - p * nr)
            for t in range(taps):
                for k in range(c):
                    dst = blk[t * c + k]
                    for j in range(n):
                        dst[j] = wp[j, t, k]
                    for j in range(n, nr):
                        dst[j] = 0.0

    def layer_norm(x, w, b, eps, out):  # pragma: no cover - compiled
        n, f = x.shape
        for r in prange(n):
            xr, yr = x[r], out[r]
            mu = np.float32(0.0)
            for c in range(f):
                mu += xr[c]
            mu /= f
            var = np.float32(0.0)
            for c in range(f):
                dv = xr[c] - mu
                var += dv * dv
            rstd = np.float32(1.0 / np.sqrt(var / f + eps))
            for c in range(f):
                yr[c] = (xr[c] - mu) * rstd * w[c] + b[c]

    def gelu(x, add, has_add):  # pragma: no cover - compiled
        n, f = x.shape
        na = add.shape[0]
        for r in prange(n):
            xr, ar = x[r], add[r % na]
            for c in range(f):
                t = xr[c]
                y = half * t * (one + erf32(t * rsqrt2))
                xr[c] = y + ar[c] if has_add else y

    fm = {"reassoc", "contract", "arcp", "nsz"}  # the row sums vectorize
    opts = dict(cache=True, nogil=True, parallel=True)
    kernels = {
        "pack": njit(**opts)(pack),
        "layer_norm": njit(fastmath=fm, **opts)(layer_norm),
        "gelu": njit(**opts)(gelu),
    }
    from ember.kernels.cpu import vecmath

    if vecmath.symbols() is not None:  # rows at the full vector width (see vecmath)
        i8 = nb.types.int64
        globals()["_gelu_row"] = nb.types.ExternalFunction(
            "ember_gelu_row", nb.types.void(i8, i8, i8, i8)
        )
        kernels["gelu_rows"] = njit(**opts)(vecmath.keyed(_gelu_rows_py, vecmath))
    return kernels


_gelu_row = None  # vecmath's ember_gelu_row, set by _build before compiling


def _gelu_rows_py(x, add, has_add):  # pragma: no cover - compiled
    """gelu (+ add) on the rows of a C-contiguous x, one vecmath row call each."""
    n, f = x.shape
    na = add.shape[0]
    xa, aa = x.ctypes.data, add.ctypes.data
    for r in prange(n):
        _gelu_row(xa + r * f * 4, f, aa + (r % na) * f * 4, has_add)


def _kernel(name: str):
    """The compiled kernel, or None without numba."""
    global _K
    if _K is None:
        _K = _build()
    return _K.get(name) if _K else None


# ------------------------------------------------------------------ entry points
def packed_shape(out_features: int, depth: int) -> tuple[int, int, int] | None:
    """Shape of the panels ``pack`` makes for a (out_features, depth) weight; None: no panels."""
    from ember.kernels.cpu import gemm as G

    nr = G.panel_width()
    if nr is None or _kernel("pack") is None:
        return None
    return (-(-out_features // nr), depth, nr)


def pack(*weights: np.ndarray, out: np.ndarray | None = None) -> Packed:
    """Linear weights (out, in), or conv1d weights (out, in, k), packed for linear/conv1d.

    Several weights of the same input size are stacked along their outputs (q, k and v
    projections become one GEMM). out: a ``packed_shape`` float32 array to pack into.
    """
    w3s = [w[:, None, :] if w.ndim == 2 else w.transpose(0, 2, 1) for w in weights]
    w3s = [w if w.dtype == _F32 else w.astype(_F32) for w in w3s]  # (out, taps, in) views
    o = sum(w.shape[0] for w in w3s)
    _, t, c = w3s[0].shape
    shape = packed_shape(o, t * c)
    if shape is None:
        return Packed(np.concatenate(w3s) if len(w3s) > 1 else w3s[0], None)
    nr = shape[2]
    if len(w3s) > 1 and any(w.shape[0] % nr for w in w3s[:-1]):
        w3s = [np.concatenate(w3s)]  # a weight would straddle a panel: stack first
    panels = np.empty(shape, _F32) if out is None else out
    p0 = 0
    for w in w3s:
        p1 = p0 + -(-w.shape[0] // nr)
        _kernel("pack")(w, nr, panels[p0:p1])
        p0 = p1
    return Packed((o, t, c), panels)


def _gemm(a, rowoff, tapoff, w: Packed, bias, residual, out) -> np.ndarray:
    from ember.kernels.cpu import gemm as G

    b = np.zeros(w.out_features, _F32) if bias is None else np.asarray(bias, _F32)
    if w.panels is None:
        return G.gemm_reference(a, rowoff, tapoff, w.in_features, w.matrix, b, residual, 0, out)
    return G.gemm(a, rowoff, tapoff, w.in_features, w.panels, b, residual, 0, out)


def _out(out: np.ndarray | None, shape: tuple) -> np.ndarray:
    if out is None:
        return np.empty(shape, _F32)
    if out.shape != shape or out.dtype != _F32 or not out.flags.c_contiguous:
        raise ValueError(f"out: expected a contiguous float32 {shape} array, got {out.shape}")
    return out


def linear(x: np.ndarray, w: Packed, bias=None, residual=None, out=None) -> np.ndarray:
    """x (M, in) @ W^T + bias (+ residual (M, out)); out must not overlap x or residual."""
    x = np.ascontiguousarray(x, _F32)
    m = x.shape[0]
    out = _out(out, (m, w.out_features))
    if residual is not None:
        residual = np.ascontiguousarray(residual, _F32)
    rowoff = np.arange(m, dtype=_I64) * w.in_features
    return _gemm(x.reshape(-1), rowoff, np.zeros(1, _I64), w, bias, residual, out)


def conv1d(x, w: Packed, bias=None, stride: int = 1, padding: int = 0, out=None) -> np.ndarray:
    """Channels-last conv1d: x (B, L, C) -> (B, L_out, out), zero padding on both sides."""
    from ember.kernels.cpu import workspace

    nb, n, c = x.shape
    if c != w.in_features:
        raise ValueError(f"conv1d: weight expects {w.in_features} channels, x has {c}")
    lp = n + 2 * padding
    xp = workspace.local()("conv1d.padded", (nb, lp, c))
    xp[:, :padding] = 0.0
    xp[:, padding + n :] = 0.0
    xp[:, padding : padding + n] = x
    lout = (lp - w.taps) // stride + 1
    b, t = np.ix_(np.arange(nb, dtype=_I64), np.arange(lout, dtype=_I64))
    rowoff = ((b * lp + t * stride) * c).reshape(-1)
    tapoff = np.arange(w.taps, dtype=_I64) * c
    y = _out(None if out is None else out.reshape(nb * lout, -1), (nb * lout, w.out_features))
    return _gemm(xp.reshape(-1), rowoff, tapoff, w, bias, None, y).reshape(nb, lout, -1)


def layer_norm(x: np.ndarray, weight, bias, eps: float, out=None) -> np.ndarray:
    """Layer norm over the last axis of a 2-D float32 array (into out, or a new array)."""
    k = _kernel("layer_norm")
    if k is None:
        y = layer_norm_reference(x, weight, bias, eps)
        if out is None:
            return y
        out[...] = y
        return out
    f = x.shape[1]
    w = np.ones(f, _F32) if weight is None else weight
    b = np.zeros(f, _F32) if bias is None else bias
    out = _out(out, x.shape)
    k(np.ascontiguousarray(x, _F32), w, b, _F32(eps), out)
    return out


def gelu_(x: np.ndarray, add: np.ndarray | None = None) -> np.ndarray:
    """x <- gelu(x) (+ add's rows, repeated down x) in place on a 2-D float32 array; returns x."""
    k = _kernel("gelu")
    if k is None:
        x[...] = gelu_reference(x, add)
        return x
    has = add is not None
    a = np.ascontiguousarray(add, _F32) if has else np.zeros((1, x.shape[1]), _F32)
    rows = _kernel("gelu_rows")
    if rows is not None and x.flags.c_contiguous:
        rows(x, a, int(has))
    else:
        k(x, a, has)
    return x
