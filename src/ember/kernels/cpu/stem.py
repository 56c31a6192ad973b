"""A network's stem as one kernel: a direct few-channel conv (+ bias, ReLU/ReLU6) read from the
NCHW image, then the 3x3 stride-2 max pool that alone reads it.

    y = act(conv2d(x, W) + b)      (N, OH, OW, 64)   x (N, C, H, W) float32, C small
    z = max_pool(y, 3x3, stride 2)  (N, PH, PW, 64)   channels-last

ResNet-50's stem (7x7 stride 2, 3 -> 64 channels at 224x224, then the pool) ran as the packed
GEMM over a zero-padded NHWC copy of the image (kh taps of kw*C floats, conv.conv_gemm) and the
NHWC max pool over its 3.2 MB result. Here:

- the conv is direct, no copy of the input: a tile is P_MAX = 6 output pixels of one row by
  the 64 output channels (24 zmm accumulators, 4 weight vectors and a broadcast) and its K
  loop runs over the taps (kernel row, channel, kernel column) reading the image's NCHW rows in
  place: a tap's 6 pixels are one base pointer and fixed offsets ``sw`` floats apart (the
  GEMM's 12-row tile keeps 12 row pointers, some reloaded every step). Kernel rows outside the
  image are skipped (the row range is clamped); the tiles whose columns reach into the padding
  (2 pixels at each end of ResNet-50's rows) read zero-padded strips of their columns, copied
  by the band as its input rows come in. The row's inside tiles are one microkernel call;
- the pool reads the conv's rows while they are in L1/L2: a task is a band of pool rows of one
  image; it computes the conv rows the band owns into a 3-row ring of per-thread scratch and
  pools each row as soon as its three conv rows exist, so the conv's output never goes through
  memory. The one pool row whose window straddles two bands is computed by whichever of the
  two bands finishes its part second (an atomic count per boundary): its three conv rows are
  written into a small per-boundary buffer, no conv row is computed twice. The conv's
  ReLU/ReLU6 (the kernel runs after one of them only) leaves no negative values and the tile's
  store clears the sign bits (-0 -> +0, a negative NaN positive), so the pool is an int32 max
  (a NaN above everything: NaN wins, as in torch), 9 loads and 8 vpmaxsd a vector;
- the image's rows are prefetched AHEAD conv rows before they are read: the kernel reads 3 * kh
  short row streams at once, which the hardware prefetchers did not follow when the image came
  from memory (in ResNet-50's pass at 1 thread the node took 1.22 ms without, 1.02 with the
  image touched just before it; the prefetch and the strips copied row by row: 1.00-1.04).

ResNet-50 b1's stem, 1 thread, hot (ad hoc, medians of 40): conv ~850 us (~278 GFLOP/s),
pool rows ~30, strips ~11, the rest ~13. Tried and left out: 7-pixel tiles (28 accumulators:
LLVM spilled and shuffled them, 1.25 ms against 1.07 for the old path), the tap loop unrolled
over kw (1.07-1.20 ms against 0.95: its register allocation), each edge tile copying its own
zero-padded window per conv row (+15 us), 7 bands a thread instead of 4 (no gain).

The microkernels are LLVM IR compiled by llvmlite (gemm.jit_ir) for AVX-512 only (64 channels
as 4 vectors; on AVX2 a pixel would take 8 of the 16 registers); ``state()`` is None elsewhere
and the caller runs the conv and the pool as before. ``conv_max_pool_reference`` is the
float64 numpy reference the tests compare against.
"""

from __future__ import annotations

import threading

import numpy as np

from ember.kernels.cpu import gemm as G
from ember.kernels.cpu import pool

_STATE: dict = {}
_LOCK = threading.Lock()
carray = None  # numba.carray, bound by _build
_ld = _vptr = _tile = _prefetch = _fetch_add = _submit = None  # bound by _build
_strips = _fetch_rows = _conv_row = _pool_row = _where = _bands = None  # compiled by _build

O = 64  # output channels: 4 AVX-512 vectors
NV = 4
P_MAX = 6  # pixels per tile: 24 accumulators + 4 weight vectors + a broadcast
STRIDES = (1, 2)  # the conv column strides the microkernels are built for
MIN_BAND = 4  # pool rows per band at least (a band owns 2 of each 2 conv rows, plus one)
TASKS_PER_THREAD = 4
AHEAD = 2  # conv rows ahead whose input rows are prefetched (into L2)

# descriptor words
(D_X, D_N, D_H, D_W, D_C, D_KH, D_KW, D_SH, D_SW, D_PT, D_PL, D_OH, D_OW, D_WP, D_B, D_ACT,
 D_PH, D_PW, D_QT, D_QL, D_OUT, D_SCR, D_SLOT, D_NSLOTS, D_CLAIMS, D_EDGE, D_CNT, D_TPI,
 D_TILES, D_NT, D_STRIP, D_WORDS) = range(32)  # fmt: skip


# ------------------------------------------------------------------ numpy reference
def conv_max_pool_reference(x, w, b, stride, pads, act: int, pool_stride, pool_pads, out_hw):
    """float64 reference: x (N, C, H, W), w (O, C, kh, kw), b (O,) -> (N, PH, PW, O) of
    max_pool(act(conv2d(x, w) + b)), 3x3 windows, -inf padding (act 0 none, 1 ReLU, 2 ReLU6)."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    (sh, sw), (pt, pb, pl, pr) = stride, pads
    oh, ow = (h + pt + pb - kh) // sh + 1, (wd + pl + pr - kw) // sw + 1
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    y = np.zeros((n, oh, ow, o))
    for i in range(kh):
        for j in range(kw):
            v = xp[:, :, i : i + sh * (oh - 1) + 1 : sh, j : j + sw * (ow - 1) + 1 : sw]
            y += np.einsum("nchw,oc->nhwo", v, w[:, :, i, j])
    y += np.asarray(b, np.float64)
    if act == 1:
        y = np.maximum(y, 0)
    elif act == 2:
        y = np.clip(y, 0, 6)
    (qh, qw), (qt, ql), (ph, pw) = pool_stride, pool_pads, out_hw
    yp = np.pad(y, ((0, 0), (qt, 3), (ql, 3), (0, 0)), constant_values=-np.inf)
    z = np.full((n, ph, pw, o), -np.inf)
    for i in range(3):
        for j in range(3):
            np.maximum(
                z, yp[:, i : i + qh * (ph - 1) + 1 : qh, j : j + qw * (pw - 1) + 1 : qw], out=z
            )
    return z


# ------------------------------------------------------------------ LLVM IR microkernels
def _tile_ir(p: int, sw: int) -> str:
    """ntl tiles, each C[p pixels x 64] = act(sum over rows i, channels c, columns j of
    A[i, c, q*sw + j] * W[i, c, j, :] + bias): pixel q's value at a + i*rs + c*cs +
    (q*sw + j)*4 bytes, W packed (kh, C, kw, 64) from wi on (the first used row's), C's pixels
    64 floats apart; the next tile's A and C at astep bytes and p*64 floats on."""
    vt, w = "<16 x float>", 16
    acc = [(q, v) for q in range(p) for v in range(NV)]
    s = [
        f"define void @ember_stem_{sw}_{p}(i64 %ai, i64 %rs, i64 %cs, i64 %nrows, i64 %nc,"
        " i64 %kw, i64 %wi, i64 %ci, i64 %bi, float %lof, float %hif, i64 %ntl, i64 %astep) #0 {",
        "entry:",
        "  %w0 = inttoptr i64 %wi to ptr",
        "  %bias = inttoptr i64 %bi to ptr",
        f"  %lo = insertelement {vt} poison, float %lof, i32 0",
        f"  %lov = shufflevector {vt} %lo, {vt} poison, <{w} x i32> zeroinitializer",
        f"  %hi = insertelement {vt} poison, float %hif, i32 0",
        f"  %hiv = shufflevector {vt} %hi, {vt} poison, <{w} x i32> zeroinitializer",
        "  br label %tile",
        "tile:",
        "  %t = phi i64 [0, %entry], [%t1, %store]",
        "  %at = phi i64 [%ai, %entry], [%at1, %store]",
        "  %ct = phi i64 [%ci, %entry], [%ct1, %store]",
        "  %a0 = inttoptr i64 %at to ptr",
        "  br label %row",
        "row:",
        "  %i = phi i64 [0, %tile], [%i1, %rowend]",
        "  %ar = phi ptr [%a0, %tile], [%ar1, %rowend]",
        "  %wr = phi ptr [%w0, %tile], [%wp1, %rowend]",
    ]
    s += [f"  %R{q}_{v} = phi {vt} [zeroinitializer, %tile], [%F{q}_{v}, %rowend]" for q, v in acc]
    s += ["  br label %ch", "ch:"]
    s += ["  %c = phi i64 [0, %row], [%c1, %chend]"]
    s += [
        "  %ac = phi ptr [%ar, %row], [%ac1, %chend]",
        "  %wc = phi ptr [%wr, %row], [%wp1, %chend]",
    ]
    s += [f"  %H{q}_{v} = phi {vt} [%R{q}_{v}, %row], [%F{q}_{v}, %chend]" for q, v in acc]
    s += ["  br label %tap", "tap:"]
    s += ["  %j = phi i64 [0, %ch], [%j1, %tap]"]
    s += ["  %ap = phi ptr [%ac, %ch], [%ap1, %tap]", "  %wp = phi ptr [%wc, %ch], [%wp1, %tap]"]
    s += [f"  %T{q}_{v} = phi {vt} [%H{q}_{v}, %ch], [%F{q}_{v}, %tap]" for q, v in acc]
    for v in range(NV):
        s += [f"  %bp{v} = getelementptr float, ptr %wp, i64 {v * w}"]
        s += [f"  %b{v} = load {vt}, ptr %bp{v}, align 4"]
    for q in range(p):
        s += [f"  %aq{q} = getelementptr float, ptr %ap, i64 {q * sw}"]
        s += [f"  %as{q} = load float, ptr %aq{q}, align 4"]
        s += [f"  %ai{q} = insertelement {vt} poison, float %as{q}, i32 0"]
        s += [f"  %av{q} = shufflevector {vt} %ai{q}, {vt} poison, <{w} x i32> zeroinitializer"]
        for v in range(NV):
            s += [
                f"  %F{q}_{v} = call {vt} @llvm.fma.v{w}f32({vt} %av{q}, {vt} %b{v}, {vt} %T{q}_{v})"
            ]
    s += [
        "  %ap1 = getelementptr float, ptr %ap, i64 1",
        f"  %wp1 = getelementptr float, ptr %wp, i64 {O}",
    ]
    s += [
        "  %j1 = add i64 %j, 1",
        "  %jc = icmp ult i64 %j1, %kw",
        "  br i1 %jc, label %tap, label %chend",
    ]
    s += ["chend:", "  %ac1 = getelementptr i8, ptr %ac, i64 %cs", "  %c1 = add i64 %c, 1"]
    s += ["  %cc = icmp ult i64 %c1, %nc", "  br i1 %cc, label %ch, label %rowend"]
    s += ["rowend:", "  %ar1 = getelementptr i8, ptr %ar, i64 %rs", "  %i1 = add i64 %i, 1"]
    s += ["  %ic = icmp ult i64 %i1, %nrows", "  br i1 %ic, label %row, label %store", "store:"]
    s += ["  %cp = inttoptr i64 %ct to ptr"]
    for v in range(NV):
        s += [f"  %bsp{v} = getelementptr float, ptr %bias, i64 {v * w}"]
        s += [f"  %bs{v} = load {vt}, ptr %bsp{v}, align 4"]
    for q, v in acc:
        x = f"{q}_{v}"
        s += [f"  %y{x} = fadd {vt} %F{x}, %bs{v}"]
        s += G._clamp_ir("", x, f"%y{x}", vt, w)  # NaN kept, as the GEMM's store
        # after ReLU/ReLU6 (lo = 0) the sign bit cleared: -0 and a negative NaN become +0
        # and a positive NaN, so the pool compares the floats as int32 (NaN the largest)
        s += [f"  %h{x} = call {vt} @llvm.fabs.v{w}f32({vt} %f{x})"]
        s += [f"  %op{x} = getelementptr float, ptr %cp, i64 {q * O + v * w}"]
        s += [f"  store {vt} %h{x}, ptr %op{x}, align 4"]
    s += ["  %at1 = add i64 %at, %astep", f"  %ct1 = add i64 %ct, {p * O * 4}"]
    s += ["  %t1 = add i64 %t, 1", "  %tc = icmp ult i64 %t1, %ntl"]
    s += ["  br i1 %tc, label %tile, label %done", "done:", "  ret void", "}"]
    return "\n".join(s)


def _dispatch_ir() -> str:
    """ember_stem_tile(sw, p, args...): the microkernel of p pixels at column stride sw."""
    args = "i64 %ai, i64 %rs, i64 %cs, i64 %nrows, i64 %nc, i64 %kw, i64 %wi, i64 %ci, i64 %bi"
    call = args + ", float %lof, float %hif, i64 %ntl, i64 %astep"
    s = [f"define void @ember_stem_tile(i64 %sw, i64 %p, {call}) {{", "entry:"]
    s += ["  %key = mul i64 %sw, 16", "  %k = add i64 %key, %p", "  switch i64 %k, label %done ["]
    s += [f"    i64 {sw * 16 + p}, label %k{sw}_{p}" for sw in STRIDES for p in range(1, P_MAX + 1)]
    s += ["  ]"]
    for sw in STRIDES:
        for p in range(1, P_MAX + 1):
            s += [f"k{sw}_{p}:", f"  call void @ember_stem_{sw}_{p}({call})", "  ret void"]
    s += ["done:", "  ret void", "}"]
    return "\n".join(s)


# ------------------------------------------------------------------ numba band task
def _strips_py(p, b, y_lo, y0, y1, strips):  # pragma: no cover - compiled
    """Input rows [y0, y1) of image b in the edge tiles' windows, zero-padded: edge tile e's
    (its columns leave the image) a (rows, C, span) array from row y_lo on at strips +
    e * D_STRIP floats."""
    xa, h, wd, c = _ld(p, D_X), _ld(p, D_H), _ld(p, D_W), _ld(p, D_C)
    kw, sw, pl, sf = _ld(p, D_KW), _ld(p, D_SW), _ld(p, D_PL), _ld(p, D_STRIP)
    tiles = carray(_vptr(_ld(p, D_TILES)), (_ld(p, D_NT), 4), np.int64)
    plane = h * wd
    img = xa + b * c * plane * 4
    for t in range(tiles.shape[0]):
        ox0, npx, e = tiles[t, 0], tiles[t, 1], tiles[t, 3]
        if e < 0:
            continue
        ix0 = ox0 * sw - pl
        span = (npx - 1) * sw + kw
        j_lo, j_hi = max(0, -ix0), min(span, wd - ix0)
        dst = carray(_vptr(strips + e * sf * 4), (sf,), np.float32)
        for iy in range(y0, y1):
            for ch in range(c):
                src = carray(_vptr(img + (ch * plane + iy * wd) * 4), (wd,), np.float32)
                q = ((iy - y_lo) * c + ch) * span
                for u in range(span):
                    dst[q + u] = src[ix0 + u] if j_lo <= u < j_hi else np.float32(0.0)


def _fetch_rows_py(p, b, y0, y1):  # pragma: no cover - compiled
    """Prefetch input rows [y0, y1) of image b (every channel; clamped to the image): the conv
    reads its kernel rows' C planes as 3 * kh short streams, which the hardware prefetchers
    did not follow (ResNet-50 b1's image, cold in the pass: ~0.2 ms of the stem's 1.2)."""
    xa, h, wd, c = _ld(p, D_X), _ld(p, D_H), _ld(p, D_W), _ld(p, D_C)
    y0, y1 = max(y0, 0), min(y1, h)
    if y1 <= y0:
        return
    for ch in range(c):
        a = xa + ((b * c + ch) * h + y0) * wd * 4
        _prefetch(a - (a & 63), ((a & 63) + (y1 - y0) * wd * 4 + 63) // 64)


def _conv_row_py(p, b, oy, dst, strips, y_lo):  # pragma: no cover - compiled
    """Conv row oy of image b (bias and activation applied) into dst (OW x 64 floats at that
    address); its edge tiles read the strips of input rows from y_lo (``_strips``)."""
    xa, h, wd, c = _ld(p, D_X), _ld(p, D_H), _ld(p, D_W), _ld(p, D_C)
    kh, kw, sh, sw = _ld(p, D_KH), _ld(p, D_KW), _ld(p, D_SH), _ld(p, D_SW)
    pt, pl, wa, ba = _ld(p, D_PT), _ld(p, D_PL), _ld(p, D_WP), _ld(p, D_B)
    act, sf = _ld(p, D_ACT), _ld(p, D_STRIP)
    tiles = carray(_vptr(_ld(p, D_TILES)), (_ld(p, D_NT), 4), np.int64)
    lo = np.float32(0.0)
    hi = np.float32(6.0 if act == 2 else np.inf)
    iy0 = oy * sh - pt
    i_lo = max(0, -iy0)
    nrows = min(kh, h - iy0) - i_lo
    plane = h * wd
    wrow = wa + i_lo * c * kw * O * 4
    rowa = xa + (b * c * plane + (iy0 + i_lo) * wd) * 4
    for t in range(tiles.shape[0]):
        ox0, npx, cnt, e = tiles[t, 0], tiles[t, 1], tiles[t, 2], tiles[t, 3]
        out = dst + ox0 * O * 4
        if e < 0:  # cnt tiles of npx pixels inside the image: read in place
            _tile(sw, npx, rowa + (ox0 * sw - pl) * 4, wd * 4, plane * 4, nrows, c, kw, wrow,
                  out, ba, lo, hi, cnt, npx * sw * 4)  # fmt: skip
        else:
            span = (npx - 1) * sw + kw
            a = strips + (e * sf + (iy0 + i_lo - y_lo) * c * span) * 4
            _tile(sw, npx, a, c * span * 4, span * 4, nrows, c, kw, wrow, out, ba, lo, hi, 1, 0)


def _pool_row_py(ra, rb, rc, oa, ow, pw, ql):  # pragma: no cover - compiled
    """One 3-wide stride-2 max-pool row (left padding ql, columns clamped into the row: a
    repeated tap leaves the max unchanged) over conv rows ra, rb, rc (OW x 64 floats, at those
    addresses) into oa (PW x 64); NaN wins, as in torch. After ReLU/ReLU6 the rows hold no sign
    bits (the tile kernel's store), so their int32 max is the float max with a NaN above
    everything: 9 loads and 8 vpmaxsd a vector."""
    ai = carray(_vptr(ra), (ow, O), np.int32)
    bi = carray(_vptr(rb), (ow, O), np.int32)
    ci = carray(_vptr(rc), (ow, O), np.int32)
    oi = carray(_vptr(oa), (pw, O), np.int32)
    for xo in range(pw):
        j0 = xo * 2 - ql
        u0, u1 = min(max(j0, 0), ow - 1), min(max(j0 + 1, 0), ow - 1)
        u2 = min(max(j0 + 2, 0), ow - 1)
        a0, a1, a2, b0, b1, b2 = ai[u0], ai[u1], ai[u2], bi[u0], bi[u1], bi[u2]
        c0, c1, c2, o = ci[u0], ci[u1], ci[u2], oi[xo]
        for t in range(O):
            o[t] = max(max(max(a0[t], a1[t]), max(a2[t], b0[t])),
                       max(max(b1[t], b2[t]), max(max(c0[t], c1[t]), c2[t])))  # fmt: skip


def _where_py(r, k, lo, hi, last, e_in, e_out, ring, row):  # pragma: no cover - compiled
    """The address of conv row r in band k (owning rows [lo, hi)): its first row in the
    boundary buffer e_in, its last two (unless it is the last band) in e_out, the rest in the
    3-row ring."""
    if k > 0 and r == lo:
        return e_in + 2 * row
    if not last and r >= hi - 2:
        return e_out + (r - (hi - 2)) * row
    return ring + (r % 3) * row


def _bands_py(p, i0, i1):  # pragma: no cover - compiled
    """Bands i0..i1-1 (image, band of pool rows) of the stem described at p.

    Band k of an image has pool rows [p0, p1) and computes the conv rows [lo, hi) it owns
    (lo: the first row of its first window; hi: the next band's lo). Its pool rows but the
    last (whose window ends on the next band's first conv row) are pooled from a 3-row ring as
    their last row is done. The rows a straddling window needs (a band's last two, the next
    band's first) go into that boundary's buffer; the second of the two bands to write its
    part pools that row (the count of arrivals at the boundary, back to zero after)."""
    oh, ow, ph, pw = _ld(p, D_OH), _ld(p, D_OW), _ld(p, D_PH), _ld(p, D_PW)
    qt, ql, tpi, oa = _ld(p, D_QT), _ld(p, D_QL), _ld(p, D_TPI), _ld(p, D_OUT)
    sa, slot, nslots, claims = _ld(p, D_SCR), _ld(p, D_SLOT), _ld(p, D_NSLOTS), _ld(p, D_CLAIMS)
    ea, cnt = _ld(p, D_EDGE), _ld(p, D_CNT)
    row = ow * O * 4  # bytes of a conv row
    prow = pw * O * 4  # bytes of a pool row
    sl = 0  # a scratch slot of our own (the first free one: nslots > the tasks at once)
    while _fetch_add(claims + sl * 8, 1) != 0:
        _fetch_add(claims + sl * 8, -1)
        sl = (sl + 1) % nslots
    ring = sa + sl * slot * 4
    strips = ring + 3 * row
    h, sh, pt, kh = _ld(p, D_H), _ld(p, D_SH), _ld(p, D_PT), _ld(p, D_KH)
    for item in range(i0, i1):
        b, k = item // tpi, item % tpi
        p0, p1 = ph * k // tpi, ph * (k + 1) // tpi
        last = k == tpi - 1
        lo = 0 if k == 0 else p0 * 2 - qt
        hi = oh if last else p1 * 2 - qt
        e_in = ea + (b * tpi + k) * 3 * row  # this band's first row goes to its slot 2
        e_out = ea + (b * tpi + k + 1) * 3 * row  # its last two to the next boundary's 0, 1
        q = p0  # the next pool row of this band to compute
        q_end = p1 if last else p1 - 1
        y_lo = max(0, lo * sh - pt)
        filled = y_lo  # the input rows copied into the strips so far: [y_lo, filled)
        _fetch_rows(p, b, lo * sh - pt, (lo + AHEAD) * sh - pt + kh)
        for r in range(lo, hi):
            need = min(h, r * sh - pt + kh)
            if need > filled:  # the strips' rows as the rows come in (prefetched by now)
                _strips(p, b, y_lo, filled, need, strips)
                filled = need
            if r + AHEAD < hi:  # the rows conv row r + AHEAD adds to the window
                _fetch_rows(p, b, (r + AHEAD) * sh - pt + kh - sh, (r + AHEAD) * sh - pt + kh)
            _conv_row(p, b, r, _where(r, k, lo, hi, last, e_in, e_out, ring, row), strips, y_lo)
            if k > 0 and r == lo and _fetch_add(cnt + (b * tpi + k) * 64, 1) == 1:
                _pool_row(e_in, e_in + row, e_in + 2 * row, oa + (b * ph + p0 - 1) * prow, ow,
                          pw, ql)  # fmt: skip
                _fetch_add(cnt + (b * tpi + k) * 64, -2)
            while q < q_end and min(q * 2 - qt + 2, oh - 1) <= r:
                r0 = _where(
                    min(max(q * 2 - qt, 0), oh - 1), k, lo, hi, last, e_in, e_out, ring, row
                )
                r1 = _where(min(q * 2 - qt + 1, oh - 1), k, lo, hi, last, e_in, e_out, ring, row)
                r2 = _where(min(q * 2 - qt + 2, oh - 1), k, lo, hi, last, e_in, e_out, ring, row)
                _pool_row(r0, r1, r2, oa + (b * ph + q) * prow, ow, pw, ql)
                q += 1
        if not last and _fetch_add(cnt + (b * tpi + k + 1) * 64, 1) == 1:
            _pool_row(e_out, e_out + row, e_out + 2 * row, oa + (b * ph + p1 - 1) * prow, ow, pw,
                      ql)  # fmt: skip
            _fetch_add(cnt + (b * tpi + k + 1) * 64, -2)
    _fetch_add(claims + sl * 8, -1)


def _task_py(p, a1, a2, i0, i1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover - compiled
    """The pool's chunk function: bands i0..i1-1 of the stem described at p."""
    _bands(p, i0, i1)


def _go_py(ctrl, own, desc, fn, items, x, out, scr, claims, edge):  # pragma: no cover - compiled
    """Fill a copy of the descriptor with the call's addresses and run its bands on the pool."""
    d = desc.copy()  # the plan may run in several threads at once
    d[D_X], d[D_OUT], d[D_SCR] = x.ctypes.data, out.ctypes.data, scr.ctypes.data
    d[D_CLAIMS], d[D_EDGE] = claims.ctypes.data, edge.ctypes.data
    d[D_CNT] = claims.ctypes.data + d[D_NSLOTS] * 8
    _submit(ctrl, own, d, fn, items)


def _build(nb) -> dict:
    from numba import types

    if G.isa() != "avx512" or pool.state() is None:
        return {"ok": False}
    fns = [_tile_ir(p, sw) for sw in STRIDES for p in range(1, P_MAX + 1)]
    fabs = "declare <16 x float> @llvm.fabs.v16f32(<16 x float>)"
    fetch = G.prefetch_ir("ember_stem_prefetch", 0, 2)  # n lines from a towards L2, to read
    engine = G.jit_ir([fabs, *fns, _dispatch_ir(), fetch],
                      ["ember_stem_tile", "ember_stem_prefetch"])  # fmt: skip
    ld, vptr = pool.intrinsics()
    g = globals()
    i64, f32 = types.int64, types.float32
    g.update(_ld=ld, _vptr=vptr, carray=nb.carray)
    g["_tile"] = types.ExternalFunction(
        "ember_stem_tile", types.void(*([i64] * 11), f32, f32, i64, i64)
    )
    g["_fetch_add"] = types.ExternalFunction("ember_sgemm_fetch_add", i64(i64, i64))
    g["_prefetch"] = types.ExternalFunction("ember_stem_prefetch", types.void(i64, i64))
    opts = dict(nogil=True, cache=True)
    g["_strips"] = nb.njit(**opts)(_strips_py)
    g["_fetch_rows"] = nb.njit(**opts)(_fetch_rows_py)
    g["_conv_row"] = nb.njit(**opts)(_conv_row_py)
    g["_pool_row"] = nb.njit(**opts)(_pool_row_py)
    g["_where"] = nb.njit(**opts)(_where_py)
    g["_bands"] = nb.njit(**opts)(_bands_py)
    g["_submit"] = pool.submit_items()
    sig = types.void(*([i64] * 12))
    task = nb.cfunc(sig, nopython=True, cache=True)(_task_py)
    go = nb.njit(**opts)(_go_py)
    return {"ok": True, "engine": engine, "task": task, "fn": task.address, "go": go}


def _build_all() -> dict:
    from ember.kernels.cpu import numba_or_none

    nb = numba_or_none()
    if nb is None or G.isa() is None:
        return {"ok": False}
    return _build(nb)


def state() -> dict | None:
    """The compiled kernels (built once, under a lock), or None where the stem must run as the
    conv and the pool (no numba, no AVX-512, no pool)."""
    from ember.kernels.cpu import built_once

    return built_once(_STATE, _LOCK, _build_all)


_local = threading.local()


def _buffers(slots: int, counts: int, edge: int) -> tuple:
    """This thread's (scratch, counts, boundary rows, job block), grown to at least these sizes
    (never shrunk: their pages stay); the float arrays start on a cache line, the counts at
    zero (every task leaves them at zero)."""
    from ember.kernels.cpu.conv import empty_aligned

    old = getattr(_local, "bufs", None)
    if old is not None and old[0].size >= slots and old[1].size >= counts and old[2].size >= edge:
        return old
    if old is not None:
        slots, counts, edge = (
            max(slots, old[0].size),
            max(counts, old[1].size),
            max(edge, old[2].size),
        )
    bufs = (empty_aligned((slots,)), np.zeros(counts, np.int64), empty_aligned((edge,)),
            np.zeros(pool.CTRL_WORDS, np.int64))  # fmt: skip
    _local.bufs = bufs
    return bufs


def applies(x_shape: tuple, w_shape: tuple, stride, pads, pool_stride, pool_pads,
            pool_hw) -> bool:  # fmt: skip
    """Whether ``Plan`` runs this stem: 64 output channels, a column stride it is built for, no
    conv window wholly in the padding, a 3x3 stride-2 pool with pads of at most 1 whose every
    window meets the conv's output."""
    n, c, h, w = x_shape
    o, cw, kh, kw = w_shape
    (sh, sw), (pt, pb, pl, pr) = stride, pads
    (qh, qw), (qt, ql), (ph, pw) = pool_stride, pool_pads, pool_hw
    if o != O or cw != c or c < 1 or sw not in STRIDES or sh < 1 or min(n, ph, pw) < 1:
        return False
    if not (0 <= pt < kh and 0 <= pb < kh and 0 <= pl < kw and 0 <= pr < kw):
        return False
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    if oh < 1 or ow < 1 or (qh, qw) != (2, 2) or not (0 <= qt <= 1 and 0 <= ql <= 1):
        return False
    return (ph - 1) * 2 - qt < oh and (pw - 1) * 2 - ql < ow


def _tiles(ow: int, w: int, kw: int, sw: int, pl: int) -> np.ndarray:
    """A conv row's tiles as rows (first pixel, pixels, tiles, edge index): the pixels whose
    windows lie in the image's columns as one run of P_MAX-pixel tiles (edge index -1), the
    others (and the run's remainder, with the right edge's) as edge tiles of at most P_MAX
    pixels, each with its index into the strips."""
    a = min(ow, -(-pl // sw))  # the first pixel whose window starts inside the image
    r = max(a, min(ow, (w + pl - kw) // sw + 1))  # the first whose window ends outside it
    rows, e = [], 0
    for x0 in range(0, a, P_MAX):
        rows.append((x0, min(P_MAX, a - x0), 1, e))
        e += 1
    full = (r - a) // P_MAX
    if full:
        rows.append((a, P_MAX, full, -1))
    x0 = a + full * P_MAX
    if r > x0 and ow - x0 > P_MAX:  # the remainder alone, then the right edge's pixels
        rows.append((x0, r - x0, 1, -1))
        x0 = r
    for x1 in range(x0, ow, P_MAX):
        n = min(P_MAX, ow - x1)
        inside = x1 + n <= r
        rows.append((x1, n, 1, -1 if inside else e))
        e += 0 if inside else 1
    return np.array(rows, np.int64).reshape(-1, 4)


class Plan:
    """The stem's task layout for one input shape (see the module docstring): the descriptor
    (operand addresses filled per call), its bands and the scratch they need."""

    def __init__(self, x_shape: tuple, w: np.ndarray, b: np.ndarray, stride, pads, act: int,
                 pool_pads, pool_hw, threads: int) -> None:  # fmt: skip
        """w (64, C, kh, kw) and b (64,) float32, act 1 ReLU or 2 ReLU6 (the pool compares the
        activations' bits as int32); pool_pads (top, left) and pool_hw the 3x3 stride-2 pool's;
        ``applies`` must hold."""
        if act not in (1, 2):
            raise ValueError(f"the stem kernel runs after ReLU or ReLU6 only (act {act})")
        n, c, h, wd = x_shape
        _, _, kh, kw = w.shape
        (sh, sw), (pt, pb, pl, pr) = stride, pads
        oh, ow = (h + pt + pb - kh) // sh + 1, (wd + pl + pr - kw) // sw + 1
        ph, pw = pool_hw
        self.x_shape, self.shape = tuple(x_shape), (n, ph, pw, O)
        self.wp = np.ascontiguousarray(np.asarray(w, np.float32).transpose(2, 1, 3, 0))
        self.b = np.ascontiguousarray(b, np.float32)
        tpi = (
            1 if threads == 1 else min(max(1, ph // MIN_BAND), -(-TASKS_PER_THREAD * threads // n))
        )
        self.items, self.tpi = n * tpi, tpi
        self.nslots = threads + 1  # at most `threads` tasks at once: one slot always free
        self.tiles = _tiles(ow, wd, kw, sw, pl)
        edges = int((self.tiles[:, 3] >= 0).sum())
        rows = 0  # input rows of a band at most
        for k in range(tpi):
            p0, p1 = ph * k // tpi, ph * (k + 1) // tpi
            lo = 0 if k == 0 else p0 * 2 - pool_pads[0]
            hi = oh if k == tpi - 1 else p1 * 2 - pool_pads[0]
            rows = max(rows, min(h, (hi - 1) * sh - pt + kh) - max(0, lo * sh - pt))
        strip = rows * c * ((P_MAX - 1) * sw + kw)
        self.slot = -(-(3 * ow * O + edges * strip) // 16) * 16
        # floats of scratch (slots), int64 claim and boundary counts, floats of boundary rows
        self.need = (self.nslots * self.slot, self.nslots + n * tpi * 8, n * tpi * 3 * ow * O)
        self.go, self.fn = _STATE["go"], _STATE["fn"]
        d = np.zeros(D_WORDS, np.int64)
        d[D_N], d[D_H], d[D_W], d[D_C], d[D_KH], d[D_KW] = n, h, wd, c, kh, kw
        d[D_SH], d[D_SW], d[D_PT], d[D_PL], d[D_OH], d[D_OW] = sh, sw, pt, pl, oh, ow
        d[D_WP], d[D_B], d[D_ACT] = self.wp.ctypes.data, self.b.ctypes.data, act
        d[D_PH], d[D_PW], d[D_QT], d[D_QL] = ph, pw, *pool_pads
        d[D_SLOT], d[D_NSLOTS], d[D_TPI] = self.slot, self.nslots, tpi
        d[D_TILES], d[D_NT], d[D_STRIP] = self.tiles.ctypes.data, len(self.tiles), strip
        self.desc = d

    def run(self, x: np.ndarray) -> np.ndarray:
        """The pooled (N, PH, PW, 64) float32 for x, a C-contiguous float32 NCHW array of the
        plan's shape (the caller checks)."""
        bufs = getattr(_local, "bufs", None)
        if (
            bufs is None
            or bufs[0].size < self.need[0]
            or bufs[1].size < self.need[1]
            or (bufs[2].size < self.need[2])
        ):
            bufs = _buffers(*self.need)
        scr, claims, edge, own = bufs
        out = np.empty(self.shape, np.float32)
        self.go(pool.ctrl(), own, self.desc, self.fn, self.items, x, out, scr, claims, edge)
        return out
