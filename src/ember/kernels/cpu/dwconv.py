"""The NHWC depthwise convolution's vector kernel: P output pixels x all channels per call.

A depthwise conv over NHWC is memory-bound (9 multiply-adds per output value for a 3x3), so
it should run at cache bandwidth. numba's loop (``conv._dw_rows``) kept its accumulator row in
memory and reloaded it for every tap: MobileNetV2's 144x56x56 3x3 took 280 us on one thread
(14 GMAC/s) and the 32x112x112 one 630 us, a third of the network's kernel time at batch 1.

Here the inner loop is LLVM IR (compiled with ``gemm.jit_ir`` for the host's vector width W):
``ember_dw_P`` computes P consecutive output pixels of one row, for one block of W channels at
a time (a masked block for the last C % W), with the P accumulators in vector registers across
every tap: per tap one load of the weight vector and P loads and FMAs of input, then bias,
ReLU/ReLU6 clamp and one store per pixel. A numba driver (``_rows_py``) walks output rows: the
taps of a row (the kernel rows inside the image, each with every column) are a list of element
offsets from the pixel's window origin, so interior pixels run in blocks of P_MAX with no
bounds checks, and only the few pixels whose window crosses the left or right border run one at
a time on their own (shorter) tap list. Zero padding is never materialised.

Measured on one thread (Zen 5, MobileNetV2's 3x3 ReLU6 layers at batch 1, numba loop -> here):
112x112x32 610 -> 117 us, 56x56x144 343 -> 136, 28x28x192 119 -> 46, 14x14x384 46 -> 18,
7x7x960 27 -> 15 (about 30 GMAC/s; the loop is bound by its vector loads, P + 1 per P FMAs).
On the pool's two threads the large ones take ~0.6x of that. Where the microkernels do not
build (EMBER_SGEMM_ISA=none, no AVX2) conv's numba loop runs instead.
"""

from __future__ import annotations

import numpy as np

from ember.kernels.cpu import gemm as G

P_MAX = 8  # output pixels per call: P accumulators + the weight + an input vector in registers
_STATE: dict = {}
_d1 = _d2 = _d3 = _d4 = _d5 = _d6 = _d7 = _d8 = None  # the IR kernels (ExternalFunction)
_call = _rows = None  # _call_py, _rows_py compiled


def _block_ir(pre: str, p: int, w: int, cb: str, masked: bool, nxt: str) -> list[str]:
    """One block of w channels at offset %cb for p pixels: bias, taps, clamp, store; then nxt."""
    vt = f"<{w} x float>"

    def load(dst: str, ptr: str) -> str:
        if masked:
            return (f"  %{dst} = call {vt} @llvm.masked.load.v{w}f32.p0(ptr %{ptr}, i32 4,"
                    f" <{w} x i1> %mask, {vt} zeroinitializer)")  # fmt: skip
        return f"  %{dst} = load {vt}, ptr %{ptr}, align 4"

    s = [f"{pre}init:", f"  %{pre}bp = getelementptr float, ptr %bias, i64 %{cb}"]
    s += [load(f"{pre}b0", f"{pre}bp"), f"  br label %{pre}tap", f"{pre}tap:"]
    s += [f"  %{pre}t = phi i64 [0, %{pre}init], [%{pre}t1, %{pre}tb]"]
    s += [
        f"  %{pre}A{q} = phi {vt} [%{pre}b0, %{pre}init], [%{pre}N{q}, %{pre}tb]" for q in range(p)
    ]
    s += [
        f"  %{pre}go = icmp ult i64 %{pre}t, %nt",
        f"  br i1 %{pre}go, label %{pre}tb, label %{pre}st",
    ]
    s += [f"{pre}tb:", f"  %{pre}op = getelementptr i64, ptr %to, i64 %{pre}t"]
    s += [
        f"  %{pre}off = load i64, ptr %{pre}op",
        f"  %{pre}wp = getelementptr i64, ptr %tw, i64 %{pre}t",
    ]
    s += [f"  %{pre}woff = load i64, ptr %{pre}wp", f"  %{pre}wo = add i64 %{pre}woff, %{cb}"]
    s += [f"  %{pre}wq = getelementptr float, ptr %w, i64 %{pre}wo", load(f"{pre}wv", f"{pre}wq")]
    s += [f"  %{pre}xo = add i64 %{pre}off, %{cb}"]
    for q in range(p):
        s += [f"  %{pre}xo{q} = add i64 %{pre}xo, %ps{q}"]
        s += [f"  %{pre}xp{q} = getelementptr float, ptr %x, i64 %{pre}xo{q}"]
        s += [load(f"{pre}xv{q}", f"{pre}xp{q}")]
        s += [f"  %{pre}N{q} = call {vt} @llvm.fma.v{w}f32({vt} %{pre}xv{q}, {vt} %{pre}wv,"
              f" {vt} %{pre}A{q})"]  # fmt: skip
    s += [f"  %{pre}t1 = add i64 %{pre}t, 1", f"  br label %{pre}tap", f"{pre}st:"]
    for q in range(p):  # clamp to [lo, hi] keeping NaN (as the GEMM's store does)
        z = f"%{pre}A{q}"
        s += [f"  %{pre}ql{q} = fcmp olt {vt} {z}, %lov"]
        s += [f"  %{pre}u{q} = select <{w} x i1> %{pre}ql{q}, {vt} %lov, {vt} {z}"]
        s += [f"  %{pre}qh{q} = fcmp ogt {vt} %{pre}u{q}, %hiv"]
        s += [f"  %{pre}f{q} = select <{w} x i1> %{pre}qh{q}, {vt} %hiv, {vt} %{pre}u{q}"]
        s += [f"  %{pre}oo{q} = add i64 %oc{q}, %{cb}"]
        s += [f"  %{pre}opq{q} = getelementptr float, ptr %out, i64 %{pre}oo{q}"]
        if masked:
            s += [f"  call void @llvm.masked.store.v{w}f32.p0({vt} %{pre}f{q}, ptr %{pre}opq{q},"
                  f" i32 4, <{w} x i1> %mask)"]  # fmt: skip
        else:
            s += [f"  store {vt} %{pre}f{q}, ptr %{pre}opq{q}, align 4"]
    return s + [nxt]


def kernel_ir(p: int, w: int) -> str:
    """``ember_dw_{p}``: out[q*c + k] = clamp(bias[k] + sum_t x[q*ps + to[t] + k] * wt[tw[t] + k])
    for pixels q < p and channels k < c (element offsets; x points at pixel 0's window origin)."""
    vt = f"<{w} x float>"
    s = [
        f"define void @ember_dw_{p}(i64 %xi, i64 %ps, i64 %toi, i64 %twi, i64 %nt, i64 %wi,"
        " i64 %c, i64 %bi, i64 %oi, float %lof, float %hif) #0 {",
        "entry:",
    ]
    for name in ("x", "to", "tw", "w", "bias", "out"):
        src = {"x": "xi", "to": "toi", "tw": "twi", "w": "wi", "bias": "bi", "out": "oi"}[name]
        s += [f"  %{name} = inttoptr i64 %{src} to ptr"]
    for q in range(p):
        s += [f"  %ps{q} = mul i64 %ps, {q}", f"  %oc{q} = mul i64 %c, {q}"]
    for v, arg in (("lov", "lof"), ("hiv", "hif")):
        s += [f"  %{v}0 = insertelement {vt} poison, float %{arg}, i32 0"]
        s += [f"  %{v} = shufflevector {vt} %{v}0, {vt} poison, <{w} x i32> zeroinitializer"]
    s += [f"  %cf = and i64 %c, {-w}", "  br label %cl", "cl:"]
    s += ["  %cb = phi i64 [0, %entry], [%cb1, %Fst]", "  %more = icmp ult i64 %cb, %cf"]
    s += ["  br i1 %more, label %Finit, label %tl"]
    s += _block_ir("F", p, w, "cb", False, "  %cb1 = add i64 %cb, " + str(w))
    s += ["  br label %cl", "tl:"]
    iota = ", ".join(f"i32 {i}" for i in range(w))
    s += [
        "  %rem = sub i64 %c, %cf",
        "  %hast = icmp ne i64 %rem, 0",
        "  %rem32 = trunc i64 %rem to i32",
    ]
    s += [f"  %rs = insertelement <{w} x i32> poison, i32 %rem32, i32 0"]
    s += [f"  %rv = shufflevector <{w} x i32> %rs, <{w} x i32> poison, <{w} x i32> zeroinitializer"]
    s += [
        f"  %mask = icmp slt <{w} x i32> <{iota}>, %rv",
        "  br i1 %hast, label %Tinit, label %done",
    ]
    s += _block_ir("T", p, w, "cf", True, "  br label %done")
    s += ["done:", "  ret void", "}"]
    return "\n".join(s)


def _call_py(p, args):  # pragma: no cover - compiled
    """The kernel for p pixels (1..P_MAX)."""
    if p == 8:
        _d8(*args)
    elif p == 7:
        _d7(*args)
    elif p == 6:
        _d6(*args)
    elif p == 5:
        _d5(*args)
    elif p == 4:
        _d4(*args)
    elif p == 3:
        _d3(*args)
    elif p == 2:
        _d2(*args)
    else:
        _d1(*args)


def _rows_py(x, w, bias, out, sh, sw, pt, pl, act, r0, r1):  # pragma: no cover - compiled
    """Output rows r0..r1-1 (of N * OH) of the NHWC depthwise conv (+ bias, ReLU/ReLU6):
    conv._dw_rows' contract, on the vector kernels."""
    n, h, wd, c = x.shape
    kh, kw = w.shape[0], w.shape[1]
    oh, ow = out.shape[1], out.shape[2]
    xa, wa = np.int64(x.ctypes.data), np.int64(w.ctypes.data)
    ba, oa = np.int64(bias.ctypes.data), np.int64(out.ctypes.data)
    lo = np.float32(-np.inf) if act == 0 else np.float32(0.0)
    hi = np.float32(6.0) if act == 2 else np.float32(np.inf)
    taps = np.empty((4, kh * kw), np.int64)  # interior offsets, weights; edge offsets, weights
    ta, twa = np.int64(taps[0].ctypes.data), np.int64(taps[1].ctypes.data)
    ea, ewa = np.int64(taps[2].ctypes.data), np.int64(taps[3].ctypes.data)
    x0 = min((pl + sw - 1) // sw, ow)  # output columns [x0, x1): windows inside the image
    x1 = max(min((wd - kw + pl) // sw + 1, ow), x0)
    ps = sw * c
    for r in range(r0, r1):
        b = r // oh
        y = r - b * oh
        ih0 = y * sh - pt
        i0, i1 = max(0, -ih0), min(kh, h - ih0)
        nt = 0
        for i in range(i0, i1):
            for j in range(kw):
                taps[0, nt] = (i * wd + j) * c
                taps[1, nt] = (i * kw + j) * c
                nt += 1
        row = (b * h + ih0) * wd * c  # element offset of the window rows (negative: padding)
        orow = (b * oh + y) * ow * c
        xo = x0
        while xo < x1:
            p = min(P_MAX, x1 - xo)
            _call(p, (xa + (row + (xo * sw - pl) * c) * 4, ps, ta, twa, nt, wa, c, ba,
                      oa + (orow + xo * c) * 4, lo, hi))  # fmt: skip
            xo += p
        for e in range(x0 + ow - x1):  # the columns whose window crosses the left/right border
            xo = e if e < x0 else x1 + e - x0
            iw0 = xo * sw - pl
            ne = 0
            for i in range(i0, i1):
                for j in range(kw):
                    if 0 <= iw0 + j < wd:
                        taps[2, ne] = (i * wd + j) * c
                        taps[3, ne] = (i * kw + j) * c
                        ne += 1
            _call(1, (xa + (row + iw0 * c) * 4, ps, ea, ewa, ne, wa, c, ba,
                      oa + (orow + xo * c) * 4, lo, hi))  # fmt: skip


def _serial_py(x, w, bias, out, sh, sw, pt, pl, act):  # pragma: no cover - compiled
    _rows(x, w, bias, out, sh, sw, pt, pl, act, 0, out.shape[0] * out.shape[1])
    return out


def _parallel_py(x, w, bias, out, sh, sw, pt, pl, act):  # pragma: no cover - compiled
    rows = out.shape[0] * out.shape[1]
    for r in prange(rows):
        _rows(x, w, bias, out, sh, sw, pt, pl, act, r, r + 1)
    return out


prange = range  # numba.prange, bound by state()


def state() -> dict | None:
    """The compiled kernels and drivers ("rows", "serial", "parallel"), or None where the
    microkernels do not build (conv's numba loop runs there)."""
    if "ok" not in _STATE:
        _STATE["ok"] = False
        from ember.kernels.cpu import FASTMATH, numba_or_none

        nb = numba_or_none()
        if nb is not None and G.isa() is not None:
            from numba import types

            w = G.ISAS[G.isa()][0]
            names = [f"ember_dw_{p}" for p in range(1, P_MAX + 1)]
            engine = G.jit_ir([kernel_ir(p, w) for p in range(1, P_MAX + 1)], names)
            i64 = types.int64
            sig = types.void(*([i64] * 9), types.float32, types.float32)
            g = globals()
            for p in range(1, P_MAX + 1):
                g[f"_d{p}"] = types.ExternalFunction(f"ember_dw_{p}", sig)
            g["prange"] = nb.prange
            opts = dict(nogil=True, cache=True, fastmath=set(FASTMATH))
            g["_call"] = nb.njit(**opts)(_call_py)
            g["_rows"] = nb.njit(**opts)(_rows_py)
            _STATE.update(
                ok=True, engine=engine, rows=_rows, serial=nb.njit(**opts)(_serial_py),
                parallel=nb.njit(parallel=True, **opts)(_parallel_py),
            )  # fmt: skip
    return _STATE if _STATE["ok"] else None
