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

Kernels three taps wide at column stride 1 (MobileNetV2's) run whole kernel rows instead
(``ember_dwr1_P``): per kernel row the 3 weight vectors and the P + 2 input columns the P
windows span are each loaded once, every column feeding the FMAs of each pixel whose window
holds it (13 loads per 24 FMAs, against 27 per 24 per tap): one call of 8 pixels on cached
rows, 144 channels, 72 -> 122 GMAC/s. Two channel vectors per trip (16
sums) ran at 47 GMAC/s there (spilled registers). In a whole map the rows then came from L2,
each input row once per output row it feeds; so the interior pixels go a slice of channels at
a time over all the rows asked for (``SLICE_BYTES`` of a slice's input rows: 12 KB measured a
little ahead of 24 and of no slicing, which was the old order), and a row's next two output
rows find the slice's input in L1. Whole maps on 1 thread (aligned, ReLU6): 7x7x960 10.0-10.6
-> 7.7-8.0 us, 14x14x576 24-25 -> 16-18, 14x14x384 15.5-16 -> 9.7-10.3, 28x28x192 27-30 ->
22-23; the 56x56 and 112x112 ones, whose input comes from memory, within the noise. In
MobileNetV2 b1 (one process, the two paths alternating, medians of 80 calls per node, 2 threads)
the stride-1 blocks took 1.5-4 % less, the whole network ~2 %; the stride-2 blocks on the
whole-row kernel (at stride 2, P pixels span 2P + 1 columns) took 0.5-1.5 % more, so they keep
the per-tap kernel. The pixels whose window crosses the left or right border run on
``ember_dwe``: one pixel, ``EDGE_NV`` channel vectors at once (one vector's sum waits an FMA
latency per tap: 144 channels 29 -> 42 GMAC/s).
"""

from __future__ import annotations

import numpy as np

from ember.kernels.cpu import gemm as G

P_MAX = 8  # output pixels per call: P accumulators + the weight + an input vector in registers
_STATE: dict = {}
ROW_KW = 3  # the kernel width with whole-row kernels (at column stride 1)
SLICE_BYTES = 12 << 10  # input rows' bytes of a channel slice (kept in L1 across output rows)
EDGE_NV = 8  # channel vectors at once of a border pixel's kernel
_de = None  # the border pixels' kernel (ExternalFunction)
_d1 = _d2 = _d3 = _d4 = _d5 = _d6 = _d7 = _d8 = None  # the IR kernels (ExternalFunction)
_r1 = _r2 = _r3 = _r4 = _r5 = _r6 = _r7 = _r8 = None  # the whole-row kernels
_call = _callr = _rows = None  # _call_py, _callr_py, _rows_py compiled


def _load_ir(w: int, masked: bool, dst: str, ptr: str) -> str:
    """Load a vector of w floats at %ptr into %dst (masked: the lanes of %mask, zeros else)."""
    vt = f"<{w} x float>"
    if masked:
        return (f"  %{dst} = call {vt} @llvm.masked.load.v{w}f32.p0(ptr %{ptr}, i32 4,"
                f" <{w} x i1> %mask, {vt} zeroinitializer)")  # fmt: skip
    return f"  %{dst} = load {vt}, ptr %{ptr}, align 4"


def _head_ir(pre: str, p: int, w: int, cb: str, masked: bool) -> list[str]:
    """A pixel block's loop over the taps up to the tap's offsets: each of the p sums starts
    at the bias of channels %cb.., ``%{pre}off`` the tap's input offset, ``%{pre}wo`` its
    weights' (the caller's loop body follows, then ``_tail_ir``)."""
    vt = f"<{w} x float>"
    s = [f"{pre}init:", f"  %{pre}bp = getelementptr float, ptr %bias, i64 %{cb}"]
    s += [_load_ir(w, masked, f"{pre}b0", f"{pre}bp"), f"  br label %{pre}tap", f"{pre}tap:"]
    s += [f"  %{pre}t = phi i64 [0, %{pre}init], [%{pre}t1, %{pre}tb]"]
    s += [
        f"  %{pre}A{q} = phi {vt} [%{pre}b0, %{pre}init], [%{pre}N{q}, %{pre}tb]" for q in range(p)
    ]
    s += [
        f"  %{pre}go = icmp ult i64 %{pre}t, %nt",
        f"  br i1 %{pre}go, label %{pre}tb, label %{pre}st",
    ]
    s += [f"{pre}tb:", f"  %{pre}op = getelementptr i64, ptr %to, i64 %{pre}t"]
    return s + [
        f"  %{pre}off = load i64, ptr %{pre}op",
        f"  %{pre}wp = getelementptr i64, ptr %tw, i64 %{pre}t",
        f"  %{pre}woff = load i64, ptr %{pre}wp",
        f"  %{pre}wo = add i64 %{pre}woff, %{cb}",
    ]


def _tail_ir(pre: str, p: int, w: int, cb: str, masked: bool, nxt: str) -> list[str]:
    """The next tap, then (all taps summed) the clamped store, then nxt."""
    s = [f"  %{pre}t1 = add i64 %{pre}t, 1", f"  br label %{pre}tap", f"{pre}st:"]
    return s + _store_ir(pre, p, w, cb, masked) + [nxt]


def _block_ir(pre: str, p: int, w: int, cb: str, masked: bool, nxt: str) -> list[str]:
    """One block of w channels at offset %cb for p pixels: bias, taps, clamp, store; then nxt."""
    vt = f"<{w} x float>"
    s = _head_ir(pre, p, w, cb, masked)
    s += [f"  %{pre}wq = getelementptr float, ptr %w, i64 %{pre}wo"]
    s += [_load_ir(w, masked, f"{pre}wv", f"{pre}wq"), f"  %{pre}xo = add i64 %{pre}off, %{cb}"]
    for q in range(p):
        s += [f"  %{pre}xo{q} = add i64 %{pre}xo, %ps{q}"]
        s += [f"  %{pre}xp{q} = getelementptr float, ptr %x, i64 %{pre}xo{q}"]
        s += [_load_ir(w, masked, f"{pre}xv{q}", f"{pre}xp{q}")]
        s += [f"  %{pre}N{q} = call {vt} @llvm.fma.v{w}f32({vt} %{pre}xv{q}, {vt} %{pre}wv,"
              f" {vt} %{pre}A{q})"]  # fmt: skip
    return s + _tail_ir(pre, p, w, cb, masked, nxt)


def _rowblock_ir(pre, p, w, kw, sw, cb, masked, nxt) -> list[str]:
    """One block of w channels at offset %cb for p pixels, a kernel row per loop trip: its kw
    weight vectors and the (p - 1) * sw + kw input columns its pixels' windows span are loaded
    once each, every column feeding the FMAs of each pixel whose window holds it."""
    vt = f"<{w} x float>"
    s = _head_ir(pre, p, w, cb, masked)
    for j in range(kw):
        s += [f"  %{pre}wo{j} = add i64 %{pre}wo, %cc{j}"]
        s += [f"  %{pre}wq{j} = getelementptr float, ptr %w, i64 %{pre}wo{j}"]
        s += [_load_ir(w, masked, f"{pre}wv{j}", f"{pre}wq{j}")]
    s += [f"  %{pre}xo = add i64 %{pre}off, %{cb}"]
    last = [f"%{pre}A{q}" for q in range(p)]  # each pixel's latest partial sum
    step = 0
    for col in range((p - 1) * sw + kw):
        s += [f"  %{pre}xo{col} = add i64 %{pre}xo, %cc{col}"]
        s += [f"  %{pre}xp{col} = getelementptr float, ptr %x, i64 %{pre}xo{col}"]
        s += [_load_ir(w, masked, f"{pre}xv{col}", f"{pre}xp{col}")]
        for q in range(p):
            j = col - q * sw
            if 0 <= j < kw:
                dst = f"%{pre}N{q}" if j == kw - 1 else f"%{pre}S{step}"
                step += 1
                s += [f"  {dst} = call {vt} @llvm.fma.v{w}f32({vt} %{pre}xv{col},"
                      f" {vt} %{pre}wv{j}, {vt} {last[q]})"]  # fmt: skip
                last[q] = dst
    return s + _tail_ir(pre, p, w, cb, masked, nxt)


def _edgeblock_ir(pre: str, nv: int, w: int, cb: str, nxt: str) -> list[str]:
    """One pixel's nv blocks of w channels from offset %cb, over the taps: nv independent
    sums (a pixel's lone sum waits an FMA latency per tap)."""
    vt = f"<{w} x float>"
    vs = [f"{pre}v{v}" for v in range(nv)]
    s = [f"{pre}init:"]
    for v, u in enumerate(vs):
        s += [
            f"  %{u}c = add i64 %{cb}, {v * w}",
            f"  %{u}bp = getelementptr float, ptr %bias, i64 %{u}c",
        ]
        s += [f"  %{u}b0 = load {vt}, ptr %{u}bp, align 4"]
    s += [f"  br label %{pre}tap", f"{pre}tap:"]
    s += [f"  %{pre}t = phi i64 [0, %{pre}init], [%{pre}t1, %{pre}tb]"]
    s += [f"  %{u}A0 = phi {vt} [%{u}b0, %{pre}init], [%{u}N0, %{pre}tb]" for u in vs]
    s += [
        f"  %{pre}go = icmp ult i64 %{pre}t, %nt",
        f"  br i1 %{pre}go, label %{pre}tb, label %{pre}st",
    ]
    s += [f"{pre}tb:", f"  %{pre}op = getelementptr i64, ptr %to, i64 %{pre}t"]
    s += [
        f"  %{pre}off = load i64, ptr %{pre}op",
        f"  %{pre}wp = getelementptr i64, ptr %tw, i64 %{pre}t",
        f"  %{pre}woff = load i64, ptr %{pre}wp",
    ]
    for u in vs:
        s += [f"  %{u}wo = add i64 %{pre}woff, %{u}c", f"  %{u}xo = add i64 %{pre}off, %{u}c"]
        s += [f"  %{u}wq = getelementptr float, ptr %w, i64 %{u}wo"]
        s += [f"  %{u}xq = getelementptr float, ptr %x, i64 %{u}xo"]
        s += [
            f"  %{u}wv = load {vt}, ptr %{u}wq, align 4",
            f"  %{u}xv = load {vt}, ptr %{u}xq, align 4",
        ]
        s += [f"  %{u}N0 = call {vt} @llvm.fma.v{w}f32({vt} %{u}xv, {vt} %{u}wv, {vt} %{u}A0)"]
    s += [f"  %{pre}t1 = add i64 %{pre}t, 1", f"  br label %{pre}tap", f"{pre}st:"]
    for u in vs:
        s += _store_ir(u, 1, w, f"{u}c", False)
    return s + [nxt]


def _store_ir(pre: str, p: int, w: int, cb: str, masked: bool) -> list[str]:
    """Clamp each pixel's sum to [lo, hi] keeping NaN (as the GEMM's store does), then store it."""
    vt = f"<{w} x float>"
    s = []
    for q in range(p):
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
    return s


def kernel_ir(p: int, w: int, kw: int = 0, sw: int = 1, nv: int = 0) -> str:
    """``ember_dw_{p}``: out[q*c + k] = clamp(bias[k] + sum_t x[q*ps + to[t] + k] * wt[tw[t] + k])
    for pixels q < p and channels k < c (element offsets; x points at pixel 0's window origin).
    With kw: ``ember_dwr{sw}_{p}``, the same sums over whole kernel rows of kw taps at column
    stride sw (to, tw: each kernel row's first tap) for the first c of ps channels (ps: the
    stride of x's columns, w's taps and out's pixels). With nv: ``ember_dwe``, ``ember_dw_1``
    on nv vectors of channels at once while that many remain."""
    vt = f"<{w} x float>"
    name = "ember_dwe" if nv else f"ember_dw_{p}" if kw == 0 else f"ember_dwr{sw}_{p}"
    s = [
        f"define void @{name}(i64 %xi, i64 %ps, i64 %toi, i64 %twi, i64 %nt, i64 %wi,"
        " i64 %c, i64 %bi, i64 %oi, float %lof, float %hif) #0 {",
        "entry:",
    ]
    for name in ("x", "to", "tw", "w", "bias", "out"):
        src = {"x": "xi", "to": "toi", "tw": "twi", "w": "wi", "bias": "bi", "out": "oi"}[name]
        s += [f"  %{name} = inttoptr i64 %{src} to ptr"]
    ld = "c" if kw == 0 else "ps"  # the pixels' stride in out (and the row kernels' x and w)
    for q in range(p):
        s += [f"  %ps{q} = mul i64 %ps, {q}", f"  %oc{q} = mul i64 %{ld}, {q}"]
    for k in range((p - 1) * sw + kw if kw else 0):  # input columns' (and weights') offsets
        s += [f"  %cc{k} = mul i64 %ps, {k}"]
    for v, arg in (("lov", "lof"), ("hiv", "hif")):
        s += [f"  %{v}0 = insertelement {vt} poison, float %{arg}, i32 0"]
        s += [f"  %{v} = shufflevector {vt} %{v}0, {vt} poison, <{w} x i32> zeroinitializer"]
    cw = f"and i64 %c, {-w * nv}" if nv else "add i64 0, 0"  # where single vectors start
    s += [f"  %cf = and i64 %c, {-w}", f"  %cw = {cw}", "  br label %dl", "dl:"]
    if nv:  # blocks of nv vectors
        s += ["  %db = phi i64 [0, %entry], [%db1, %Dst]", "  %dmore = icmp ult i64 %db, %cw"]
        s += ["  br i1 %dmore, label %Dinit, label %cl0"]
        s += _edgeblock_ir("D", nv, w, "db", f"  %db1 = add i64 %db, {w * nv}")
        s += ["  br label %dl"]
    else:
        s += ["  br label %cl0"]
    s += ["cl0:", "  br label %cl", "cl:"]
    s += ["  %cb = phi i64 [%cw, %cl0], [%cb1, %Fst]", "  %more = icmp ult i64 %cb, %cf"]
    s += ["  br i1 %more, label %Finit, label %tl"]
    body = _block_ir if kw == 0 else lambda *a: _rowblock_ir(a[0], a[1], a[2], kw, sw, *a[3:])
    s += body("F", p, w, "cb", False, "  %cb1 = add i64 %cb, " + str(w))
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
    s += body("T", p, w, "cf", True, "  br label %done")
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


def _callr_py(p, args):  # pragma: no cover - compiled
    """The whole-row kernel for p pixels (1..P_MAX)."""
    if p == 8:
        _r8(*args)
    elif p == 7:
        _r7(*args)
    elif p == 6:
        _r6(*args)
    elif p == 5:
        _r5(*args)
    elif p == 4:
        _r4(*args)
    elif p == 3:
        _r3(*args)
    elif p == 2:
        _r2(*args)
    else:
        _r1(*args)


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
    # interior offsets, weights; edge offsets, weights; kernel rows' offsets, weights
    taps = np.empty((6, kh * kw), np.int64)
    ta, twa = np.int64(taps[0].ctypes.data), np.int64(taps[1].ctypes.data)
    ea, ewa = np.int64(taps[2].ctypes.data), np.int64(taps[3].ctypes.data)
    ka, kwa = np.int64(taps[4].ctypes.data), np.int64(taps[5].ctypes.data)
    whole = kw == ROW_KW and sw == 1
    x0 = min((pl + sw - 1) // sw, ow)  # output columns [x0, x1): windows inside the image
    x1 = max(min((wd - kw + pl) // sw + 1, ow), x0)
    ps = sw * c
    if whole:  # interior pixels, a slice of channels at a time over all the rows
        cs = max(16, SLICE_BYTES // (kh * wd * 4) // 16 * 16)
        for c0 in range(0, c, cs):
            cn = min(cs, c - c0)
            for r in range(r0, r1):
                b = r // oh
                y = r - b * oh
                ih0 = y * sh - pt
                i0, i1 = max(0, -ih0), min(kh, h - ih0)
                for i in range(i0, i1):
                    taps[4, i - i0] = i * wd * c
                    taps[5, i - i0] = i * kw * c
                row = (b * h + ih0) * wd * c + c0  # the window rows' offset (< 0: padding)
                orow = (b * oh + y) * ow * c + c0
                xo = x0
                while xo < x1:
                    p = min(P_MAX, x1 - xo)
                    _callr(p, (xa + (row + (xo - pl) * c) * 4, c, ka, kwa, i1 - i0, wa + c0 * 4,
                               cn, ba + c0 * 4, oa + (orow + xo * c) * 4, lo, hi))  # fmt: skip
                    xo += p
    for r in range(r0, r1):
        b = r // oh
        y = r - b * oh
        ih0 = y * sh - pt
        i0, i1 = max(0, -ih0), min(kh, h - ih0)
        row = (b * h + ih0) * wd * c  # element offset of the window rows (negative: padding)
        orow = (b * oh + y) * ow * c
        if not whole:
            nt = 0
            for i in range(i0, i1):
                for j in range(kw):
                    taps[0, nt] = (i * wd + j) * c
                    taps[1, nt] = (i * kw + j) * c
                    nt += 1
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
            _de(
                xa + (row + iw0 * c) * 4,
                ps,
                ea,
                ewa,
                ne,
                wa,
                c,
                ba,
                oa + (orow + xo * c) * 4,
                lo,
                hi,
            )


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
            ps = range(1, P_MAX + 1)
            names = [f"ember_dw_{p}" for p in ps]
            names += [f"ember_dwr1_{p}" for p in ps]
            irs = [kernel_ir(p, w) for p in ps]
            irs += [kernel_ir(p, w, ROW_KW) for p in ps]
            names.append("ember_dwe")
            irs.append(kernel_ir(1, w, nv=EDGE_NV))
            engine = G.jit_ir(irs, names)
            i64 = types.int64
            sig = types.void(*([i64] * 9), types.float32, types.float32)
            g = globals()
            g["_de"] = types.ExternalFunction("ember_dwe", sig)
            for p in ps:
                g[f"_d{p}"] = types.ExternalFunction(f"ember_dw_{p}", sig)
                g[f"_r{p}"] = types.ExternalFunction(f"ember_dwr1_{p}", sig)
            g["prange"] = nb.prange
            opts = dict(nogil=True, cache=True, fastmath=set(FASTMATH))
            g["_call"] = nb.njit(**opts)(_call_py)
            g["_callr"] = nb.njit(**opts)(_callr_py)
            g["_rows"] = nb.njit(**opts)(_rows_py)
            _STATE.update(
                ok=True, engine=engine, rows=_rows, serial=nb.njit(**opts)(_serial_py),
                parallel=nb.njit(parallel=True, **opts)(_parallel_py),
            )  # fmt: skip
    return _STATE if _STATE["ok"] else None
