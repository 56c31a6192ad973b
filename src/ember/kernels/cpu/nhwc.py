"""Copies and elementwise passes over channels-last (NHWC) float32 maps, for the ONNX importer.

A fused conv's result is channels-last (an (N, C, H, W) view of NHWC memory, kernels.cpu.conv);
the ops between PP-OCR's convs kept making NCHW or odd-strided copies of it, which the next conv
then copied back. These keep the data NHWC, with rows of pixels as tasks on ember's worker pool
(kernels.cpu.pool: the pool the GEMMs before and after them run on; a numba ``prange`` region
right after a GEMM waited ~0.2 ms for the core the pool's worker still spun on):

- ``resize_nearest``: a nearest-neighbour Resize given its source index per output row and
  column (each output pixel's C floats copied from its source pixel);
- ``concat_channels``: a Concat along channels into one NHWC array (each input's C floats of a
  pixel copied to their offset in the output pixel);
- ``scale_add``: ``x * s + x`` with s one value per (image, channel): PP-OCR's SE blocks
  (``x + x * hardsigmoid(...)``) in one pass instead of a Mul and an Add;
- ``add_gather``: ``a + resize(x)``, and ``concat_channels`` with per-input indices: a nearest
  upsampling read in place by the Add or Concat after it (PP-OCR's FPN), never copied out;
- ``channel_sums`` (conv.channel_mean's global average pool), ``depth_to_space`` and
  ``conv_transpose_direct`` (the importer's stride-k, kernel-k transposed conv): as numba
  ``prange`` regions right after the conv before them, these waited for the pool's spinning
  worker; PP-OCRv4 det b1's 10 global pools took 1.0 ms that way, its two upsamplings 1.95 and
  0.87 ms, on the pool 0.5, 1.5 and 0.66 (ad-hoc per-node timings, 2 threads).

A fresh output of 32 MB or more (``FRESH_SERIAL_BYTES``) is written by the calling thread: its
first touch inside the pool's tasks stalled the worker (see ``_on_pool``); the importer's fused
nodes hand in reused buffers for those instead (``_fuse_dense.Arena``).

Every function has a numpy reference (``*_reference``) the tests compare against and which runs
where numba is absent.
"""

from __future__ import annotations

import threading

import numpy as np

from ember.threads import get_num_threads

_F32 = np.dtype(np.float32)
# floats copied/computed per pool task at least; smaller maps run on the calling thread
TASK_FLOATS = 1 << 15
SERIAL_BELOW = 1 << 16  # floats of output from which the rows go to the pool
# a fresh output this big is glibc's fresh mapping: its first touch (page faults, zeroing) inside
# the pool's tasks stalled the worker, and the pool then ran the next jobs on one thread
# (PP-OCRv4 det b8: its 96 -> 24 convs after these 78.6 MB maps took 56 ms instead of 31)
FRESH_SERIAL_BYTES = 32 << 20
_K: dict = {}
_LOCK = threading.Lock()
_ld = _vptr = carray = None  # bound by _kernels
_gather = _concat = _scale_add = _add_gather = _sums = _d2s = _convt = None  # compiled


# ------------------------------------------------------------------ numpy references
def resize_nearest_reference(x: np.ndarray, iy: np.ndarray, ix: np.ndarray) -> np.ndarray:
    """x (N, H, W, C) -> (N, len(iy), len(ix), C): out[b, y, x] = x[b, iy[y], ix[x]]."""
    return np.ascontiguousarray(x[:, iy][:, :, ix])


def concat_channels_reference(xs: list[np.ndarray]) -> np.ndarray:
    """(N, H, W, C_i) arrays -> (N, H, W, sum C_i)."""
    return np.concatenate(xs, axis=3)


def scale_add_reference(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """x (N, M, C), s (N, C) -> x * s + x (s broadcast over M)."""
    return x * s[:, None, :] + x


# ------------------------------------------------------------------ row functions
# flat arrays and unsigned indices: numba then emits plain vector copies (no wraparound or
# aliasing checks per element); a pixel's 24 channels copied through 2-D row views ran 3x slower
def _gather_py(x, out, iy, ix, r0, r1):  # pragma: no cover - compiled
    """Output rows r0..r1-1 (of N * OH) of the nearest resize."""
    h, w, c = x.shape[1], x.shape[2], x.shape[3]
    oh, ow = out.shape[1], out.shape[2]
    xf, of = x.reshape(-1), out.reshape(-1)
    for r in range(r0, r1):
        b, y = r // oh, r % oh
        s0 = (b * h + iy[y]) * w * c
        d0 = r * ow * c
        for j in range(ow):
            s = s0 + ix[j] * c
            d = d0 + j * c
            for t in range(c):
                of[np.uint64(d + t)] = xf[np.uint64(s + t)]


def _concat_py(out, desc, k, r0, r1):  # pragma: no cover - compiled
    """Output rows r0..r1-1 (of N * OH) of out (N, OH, OW, Ctot): input i's channels (desc[i]:
    address, C, H, W, row index address, column index address) at their offset, each pixel
    from input pixel (iy[y], ix[x])."""
    oh, ow, ctot = out.shape[1], out.shape[2], out.shape[3]
    of = out.reshape(-1)
    off = 0
    for i in range(k):
        c, h, w = desc[i, 1], desc[i, 2], desc[i, 3]
        n = out.shape[0]
        src = carray(_vptr(desc[i, 0]), (n * h * w * c,), np.float32)
        iy = carray(_vptr(desc[i, 4]), (oh,), np.int64)
        ix = carray(_vptr(desc[i, 5]), (ow,), np.int64)
        for r in range(r0, r1):
            b, y = r // oh, r % oh
            s0 = (b * h + iy[y]) * w * c
            d0 = r * ow * ctot + off
            for j in range(ow):
                s, d = s0 + ix[j] * c, d0 + j * ctot
                for t in range(c):
                    of[np.uint64(d + t)] = src[np.uint64(s + t)]
        off += c


def _add_gather_py(a, x, out, iy, ix, r0, r1):  # pragma: no cover - compiled
    """Output rows r0..r1-1 (of N * OH) of out = a + x[:, iy][:, :, ix] (NHWC)."""
    h, w, c = x.shape[1], x.shape[2], x.shape[3]
    oh, ow = out.shape[1], out.shape[2]
    xf, af, of = x.reshape(-1), a.reshape(-1), out.reshape(-1)
    for r in range(r0, r1):
        b, y = r // oh, r % oh
        s0 = (b * h + iy[y]) * w * c
        d0 = r * ow * c
        for j in range(ow):
            s, d = s0 + ix[j] * c, d0 + j * c
            for t in range(c):
                i = np.uint64(d + t)
                of[i] = af[i] + xf[np.uint64(s + t)]


def _scale_add_py(x, s, out, r0, r1):  # pragma: no cover - compiled
    """Rows r0..r1-1 (of N * M) of out (N, M, C) = x * s + x."""
    m, c = x.shape[1], x.shape[2]
    xf, of, sf = x.reshape(-1), out.reshape(-1), s.reshape(-1)
    for r in range(r0, r1):
        b = r // m
        for t in range(c):
            i = np.uint64(r * c + t)
            v = xf[i]
            of[i] = v * sf[np.uint64(b * c + t)] + v


def _sums_py(x, parts, t0, t1):  # pragma: no cover - compiled
    """Tasks t0..t1-1 (of N * K) of the channel sums: parts[b, k] = the sum of rows
    [M * k // K, M * (k + 1) // K) of x[b] (float64)."""
    m, c = x.shape[1], x.shape[2]
    nb_ = parts.shape[1]
    xf = x.reshape(-1)
    for task in range(t0, t1):
        b, k = task // nb_, task % nb_
        acc = parts[b, k]
        for t in range(c):
            acc[t] = 0.0
        for r in range(m * k // nb_, m * (k + 1) // nb_):
            s = (b * m + r) * c
            for t in range(c):
                acc[t] += xf[np.uint64(s + t)]


def _d2s_py(y, out, r0, r1):  # pragma: no cover - compiled
    """Rows r0..r1-1 (of R * KH) of out (R, KH, W, S) = y (R, W, KH, S) with axes 1, 2 swapped."""
    kh, w, s = out.shape[1], out.shape[2], out.shape[3]
    yf, of = y.reshape(-1), out.reshape(-1)
    for r in range(r0, r1):
        ri, a = r // kh, r % kh
        for j in range(w):
            src, dst = ((ri * w + j) * kh + a) * s, (r * w + j) * s
            for t in range(s):
                of[np.uint64(dst + t)] = yf[np.uint64(src + t)]


def _convt_py(x, wt, bias, out, act, r0, r1):  # pragma: no cover - compiled
    """Input rows r0..r1-1 (of N * H) of conv.conv_transpose_reference, directly."""
    w, c = x.shape[2], x.shape[3]
    kh, q_n = wt.shape[0], wt.shape[1]
    xf, wf, of = x.reshape(-1), wt.reshape(-1), out.reshape(-1)
    for r in range(r0, r1):
        for j in range(w):
            xs = (r * w + j) * c
            for a in range(kh):
                ds = ((r * kh + a) * w + j) * q_n
                for q in range(q_n):
                    ws = (a * q_n + q) * c
                    acc = bias[a * q_n + q]
                    for t in range(c):  # unsigned indices: no wraparound, it vectorises
                        acc += xf[np.uint64(xs + t)] * wf[np.uint64(ws + t)]
                    if act == 1:
                        acc = max(acc, np.float32(0))
                    elif act == 2:
                        acc = min(max(acc, np.float32(0)), np.float32(6))
                    of[np.uint64(ds + q)] = acc


def _gather_task_py(p, a1, a2, r0, r1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover
    n, h, w, c, oh, ow = _ld(p, 4), _ld(p, 5), _ld(p, 6), _ld(p, 7), _ld(p, 8), _ld(p, 9)
    x = carray(_vptr(_ld(p, 0)), (n, h, w, c), np.float32)
    out = carray(_vptr(_ld(p, 1)), (n, oh, ow, c), np.float32)
    iy = carray(_vptr(_ld(p, 2)), (oh,), np.int64)
    ix = carray(_vptr(_ld(p, 3)), (ow,), np.int64)
    _gather(x, out, iy, ix, r0, r1)


def _concat_task_py(p, a1, a2, r0, r1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover
    n, oh, ow, ctot, k = _ld(p, 1), _ld(p, 2), _ld(p, 3), _ld(p, 4), _ld(p, 5)
    out = carray(_vptr(_ld(p, 0)), (n, oh, ow, ctot), np.float32)
    desc = carray(_vptr(_ld(p, 6)), (k, 6), np.int64)
    _concat(out, desc, k, r0, r1)


def _add_gather_task_py(p, a1, a2, r0, r1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover
    n, h, w, c, oh, ow = _ld(p, 5), _ld(p, 6), _ld(p, 7), _ld(p, 8), _ld(p, 9), _ld(p, 10)
    a = carray(_vptr(_ld(p, 0)), (n, oh, ow, c), np.float32)
    x = carray(_vptr(_ld(p, 1)), (n, h, w, c), np.float32)
    out = carray(_vptr(_ld(p, 2)), (n, oh, ow, c), np.float32)
    iy = carray(_vptr(_ld(p, 3)), (oh,), np.int64)
    ix = carray(_vptr(_ld(p, 4)), (ow,), np.int64)
    _add_gather(a, x, out, iy, ix, r0, r1)


def _scale_add_task_py(p, a1, a2, r0, r1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover
    n, m, c = _ld(p, 3), _ld(p, 4), _ld(p, 5)
    x = carray(_vptr(_ld(p, 0)), (n, m, c), np.float32)
    s = carray(_vptr(_ld(p, 1)), (n, c), np.float32)
    out = carray(_vptr(_ld(p, 2)), (n, m, c), np.float32)
    _scale_add(x, s, out, r0, r1)


def _sums_task_py(p, a1, a2, r0, r1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover
    n, m, c, k = _ld(p, 2), _ld(p, 3), _ld(p, 4), _ld(p, 5)
    x = carray(_vptr(_ld(p, 0)), (n, m, c), np.float32)
    parts = carray(_vptr(_ld(p, 1)), (n, k, c), np.float64)
    _sums(x, parts, r0, r1)


def _d2s_task_py(p, a1, a2, r0, r1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover
    r, w, kh, s = _ld(p, 2), _ld(p, 3), _ld(p, 4), _ld(p, 5)
    y = carray(_vptr(_ld(p, 0)), (r, w, kh, s), np.float32)
    out = carray(_vptr(_ld(p, 1)), (r, kh, w, s), np.float32)
    _d2s(y, out, r0, r1)


def _convt_task_py(p, a1, a2, r0, r1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover
    n, h, w, c, kh, q_n = _ld(p, 4), _ld(p, 5), _ld(p, 6), _ld(p, 7), _ld(p, 8), _ld(p, 9)
    x = carray(_vptr(_ld(p, 0)), (n, h, w, c), np.float32)
    wt = carray(_vptr(_ld(p, 1)), (kh, q_n, c), np.float32)
    bias = carray(_vptr(_ld(p, 2)), (kh * q_n,), np.float32)
    out = carray(_vptr(_ld(p, 3)), (n * h * kh * w * q_n,), np.float32)  # read flat
    _convt(x, wt, bias, out, _ld(p, 10), r0, r1)


def _kernels() -> dict | None:
    """{"gather"/"concat"/...: the row functions, "tasks": their pool tasks' addresses (None
    without the pool)}, or None without numba."""
    from ember.kernels.cpu import built_once

    return built_once(_K, _LOCK, _build)


def _build() -> dict:
    from ember.kernels.cpu import FASTMATH, numba_or_none, pool

    nb = numba_or_none()
    if nb is None:
        return {"ok": False}
    g = globals()
    g["_ld"], g["_vptr"] = pool.intrinsics()
    g["carray"] = nb.carray
    opts = dict(nogil=True, cache=True)  # no fast-math: x * s + x rounds as a Mul, an Add
    rows = (("_gather", _gather_py), ("_concat", _concat_py), ("_scale_add", _scale_add_py),
            ("_add_gather", _add_gather_py), ("_sums", _sums_py), ("_d2s", _d2s_py))  # fmt: skip
    for name, fn in rows:
        g[name] = nb.njit(**opts)(fn)
    # the dot products of the direct transposed conv: fast-math (a reassociated, vector sum)
    g["_convt"] = nb.njit(nogil=True, cache=True, fastmath=set(FASTMATH))(_convt_py)
    st = {"ok": True, "tasks": None}
    st.update({name[1:]: g[name] for name, _ in rows}, convt=g["_convt"])
    if pool.state() is not None:
        i8 = nb.types.int64
        sig = nb.types.void(*([i8] * 12))
        cf = {k: nb.cfunc(sig, nopython=True, cache=True)(f) for k, f in
              (("gather", _gather_task_py), ("concat", _concat_task_py),
               ("scale_add", _scale_add_task_py), ("add_gather", _add_gather_task_py),
               ("sums", _sums_task_py), ("d2s", _d2s_task_py), ("convt", _convt_task_py))}  # fmt: skip
        st.update(cfuncs=cf, tasks={k: f.address for k, f in cf.items()})
    return st


def _into(y: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """A reference's result, written into out when the caller gave one."""
    if out is None:
        return y
    if out.shape != y.shape or out.dtype != _F32 or not out.flags.c_contiguous:
        raise ValueError(f"nhwc: out must be a contiguous float32 {y.shape} array")
    out[...] = y
    return out


def _out(shape: tuple, out: np.ndarray | None) -> tuple[np.ndarray, bool]:
    """(the output array: `out` checked, or a new one; whether it is a fresh mapping)."""
    if out is None:
        new = np.empty(shape, _F32)
        return new, new.nbytes >= FRESH_SERIAL_BYTES
    if out.shape != shape or out.dtype != _F32 or not out.flags.c_contiguous:
        raise ValueError(f"nhwc: out must be a contiguous float32 {shape} array")
    return out, False


def _on_pool(k: dict, kind: str, desc: np.ndarray, rows: int, floats_per_row: int,
             fresh: bool) -> bool:  # fmt: skip
    """Run a kind's task over rows on the pool when the output is big enough (and no fresh
    mapping: FRESH_SERIAL_BYTES); False if it runs on the calling thread instead."""
    threads = get_num_threads()
    if k["tasks"] is None or threads == 1 or rows * floats_per_row < SERIAL_BELOW or fresh:
        return False
    from ember.kernels.cpu import pool

    per = max(1, min(-(-rows // (4 * threads)), TASK_FLOATS // max(1, floats_per_row)))
    pool.run_items(k["tasks"][kind], desc.ctypes.data, rows, per)
    return True


def resize_nearest(
    x: np.ndarray, iy: np.ndarray, ix: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """x (N, H, W, C) float32 contiguous -> (N, len(iy), len(ix), C), out[b, y, x] =
    x[b, iy[y], ix[x]] (int64 indices, each in range: the caller's)."""
    k = _kernels()
    n, h, w, c = x.shape
    iy, ix = _index(iy, len(iy), h), _index(ix, len(ix), w)
    if k is None or x.dtype != _F32 or not x.flags.c_contiguous:
        return _into(resize_nearest_reference(x, iy, ix), out)
    oh, ow = len(iy), len(ix)
    out, fresh = _out((n, oh, ow, c), out)
    desc = np.array([x.ctypes.data, out.ctypes.data, iy.ctypes.data, ix.ctypes.data,
                     n, h, w, c, oh, ow], np.int64)  # fmt: skip
    if not _on_pool(k, "gather", desc, n * oh, ow * c, fresh):
        k["gather"](x, out, iy, ix, 0, n * oh)
    return out


def _index(idx: np.ndarray | None, n: int, size: int) -> np.ndarray:
    """Source indices as contiguous int64 (identity when None), checked to lie in [0, size)."""
    if idx is None:
        return np.arange(n, dtype=np.int64)
    idx = np.ascontiguousarray(idx, np.int64)
    if len(idx) != n or len(idx) and (idx.min() < 0 or idx.max() >= size):
        raise IndexError(f"nhwc: {len(idx)} source indices for {n} outputs, or out of [0, {size})")
    return idx


def concat_channels(
    xs: list[np.ndarray], gathers: list | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """(N, H_i, W_i, C_i) float32 arrays -> (N, OH, OW, sum C_i): input i's pixel (iy[y], ix[x])
    at output (y, x), where gathers[i] is (iy, ix) (a nearest resize read in place) or None
    (then H_i, W_i are OH, OW). Without gathers, a plain channel concat."""
    k = _kernels()
    gathers = gathers or [None] * len(xs)
    g0 = next((g for g in gathers if g is not None), None)
    n = xs[0].shape[0]
    if g0 is not None:
        oh, ow = len(g0[0]), len(g0[1])
    else:
        oh, ow = xs[0].shape[1:3]
    idx = []
    for x, g in zip(xs, gathers):
        if x.shape[0] != n or g is None and x.shape[1:3] != (oh, ow):
            raise ValueError("concat_channels: inputs differ in N, H or W")
        gy, gx = (None, None) if g is None else g
        idx.append((_index(gy, oh, x.shape[1]), _index(gx, ow, x.shape[2])))
    if k is None or any(x.dtype != _F32 or not x.flags.c_contiguous for x in xs):
        ys = [x[:, iy][:, :, ix] for x, (iy, ix) in zip(xs, idx)]
        return _into(concat_channels_reference(ys), out)
    ctot = sum(x.shape[3] for x in xs)
    out, fresh = _out((n, oh, ow, ctot), out)
    desc = np.array([[x.ctypes.data, x.shape[3], x.shape[1], x.shape[2], iy.ctypes.data,
                      ix.ctypes.data] for x, (iy, ix) in zip(xs, idx)], np.int64)  # fmt: skip
    params = np.array([out.ctypes.data, n, oh, ow, ctot, len(xs), desc.ctypes.data], np.int64)
    if not _on_pool(k, "concat", params, n * oh, ow * ctot, fresh):
        k["concat"](out, desc, len(xs), 0, n * oh)
    return out


def add_gather(
    a: np.ndarray, x: np.ndarray, iy: np.ndarray, ix: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """a (N, OH, OW, C) + x (N, H, W, C) resized by nearest indices (iy (OH,), ix (OW,)): a new
    (N, OH, OW, C) array, x's resized copy never made."""
    k = _kernels()
    n, h, w, c = x.shape
    oh, ow = a.shape[1:3]
    if a.shape != (n, oh, ow, c):
        raise ValueError(f"add_gather: {a.shape} and {x.shape} resized to ({oh}, {ow})")
    iy, ix = _index(iy, oh, h), _index(ix, ow, w)
    if k is None or any(v.dtype != _F32 or not v.flags.c_contiguous for v in (a, x)):
        return _into(a + resize_nearest_reference(x, iy, ix), out)
    out, fresh = _out(a.shape, out)
    desc = np.array([a.ctypes.data, x.ctypes.data, out.ctypes.data, iy.ctypes.data,
                     ix.ctypes.data, n, h, w, c, oh, ow], np.int64)  # fmt: skip
    if not _on_pool(k, "add_gather", desc, n * oh, ow * c, fresh):
        k["add_gather"](a, x, out, iy, ix, 0, n * oh)
    return out


def scale_add(x: np.ndarray, s: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x (N, M, C) float32 contiguous, s (N, C) float32 -> x * s + x, a new (N, M, C) array."""
    k = _kernels()
    n, m, c = x.shape
    if s.shape != (n, c):
        raise ValueError(f"scale_add: scale {s.shape} for data {x.shape}")
    if k is None or x.dtype != _F32 or s.dtype != _F32 or not x.flags.c_contiguous:
        return _into(scale_add_reference(x, s), out)
    s = np.ascontiguousarray(s)
    out, fresh = _out((n, m, c), out)
    desc = np.array([x.ctypes.data, s.ctypes.data, out.ctypes.data, n, m, c], np.int64)
    if not _on_pool(k, "scale_add", desc, n * m, c, fresh):
        k["scale_add"](x, s, out, 0, n * m)
    return out


def channel_sums(x: np.ndarray) -> np.ndarray:
    """x (N, M, C) float32 contiguous -> (N, K, C) float64 partial sums over blocks of M rows
    (the caller adds them up), blocks of at least 64 rows as tasks on the pool."""
    k = _kernels()
    n, m, c = x.shape
    parts = np.empty((n, max(1, min(8, m // 64)), c), np.float64)
    if k is None or x.dtype != _F32 or not x.flags.c_contiguous:
        for kk in range(parts.shape[1]):
            lo, hi = m * kk // parts.shape[1], m * (kk + 1) // parts.shape[1]
            parts[:, kk] = x[:, lo:hi].sum(axis=1, dtype=np.float64)
        return parts
    desc = np.array([x.ctypes.data, parts.ctypes.data, n, m, c, parts.shape[1]], np.int64)
    tasks = n * parts.shape[1]
    if not _on_pool(k, "sums", desc, tasks, m * c // parts.shape[1], False):
        k["sums"](x, parts, 0, tasks)
    return parts


def depth_to_space(y: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out (R, KH, W, S) = y (R, W, KH, S) with axes 1 and 2 swapped (both float32 contiguous):
    a transposed conv's taps into its output rows."""
    k = _kernels()
    r, w, kh, s = y.shape
    if out.shape != (r, kh, w, s):
        raise ValueError(f"depth_to_space: {y.shape} into {out.shape}")
    if k is None or any(a.dtype != _F32 or not a.flags.c_contiguous for a in (y, out)):
        out[...] = y.transpose(0, 2, 1, 3)
        return out
    desc = np.array([y.ctypes.data, out.ctypes.data, r, w, kh, s], np.int64)
    if not _on_pool(k, "d2s", desc, r * kh, w * s, False):
        k["d2s"](y, out, 0, r * kh)
    return out


def conv_transpose_direct(x, wt, bias, out, act: int) -> np.ndarray | None:
    """conv.conv_transpose_reference's op (contiguous float32 operands) as input rows on the
    pool, each output a dot product over C; None where numba is absent (the caller's
    reference then)."""
    k = _kernels()
    if k is None:
        return None
    n, h, w, c = x.shape
    kh, q_n = wt.shape[:2]
    desc = np.array([x.ctypes.data, wt.ctypes.data, bias.ctypes.data, out.ctypes.data,
                     n, h, w, c, kh, q_n, act], np.int64)  # fmt: skip
    # rows of work: each input row makes kh * q_n * w outputs of c multiply-adds
    if not _on_pool(k, "convt", desc, n * h, w * kh * q_n * c // 4, False):
        k["convt"](x, wt, bias, out, act, 0, n * h)
    return out
