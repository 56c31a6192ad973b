"""MobileNetV2's inverted-residual block as one kernel: expand, depthwise, 1x1 project.

    e = act_e(conv(x, We) + be)       (N, H, W, Ce)    a 1x1 (or the kxk stem); or e = x
    d = act_d(depthwise(e) + bd)      (N, OH, OW, Ce)
    y = act_p(d @ Wp + bp [+ res])    (N, OH, OW, Co)

Run as three layers, the expanded activations e and d (6x the block's input channels) go
through memory in full: at batch 1 MobileNetV2's 112x112x96 and 56x56x144 maps are 4.8 and
1.8 MB, written by one kernel and read back by the next (at batch 8 the 38.5 MB one was a fresh
mapping every call, ~1.8 ms of page faults). Here each task computes a band of output rows of
one image, in sub-bands of a few rows: it expands only the input rows the sub-band's depthwise
windows need (the last ``kh - sh`` of them are kept for the next sub-band, not recomputed),
runs the depthwise rows into a second scratch, and projects them into the output (residual
and bias added in the GEMM's store). A sub-band's scratch is sized to stay in L2
(``L2_BUDGET``), so e and d never leave the core; the next block reads the output, the narrow
map. Bands are tasks on ember's pool (kernels.cpu.pool); a band boundary recomputes
``kh - sh`` expanded rows, so bands are no thinner than ``MIN_BAND`` rows (8 measured a little
ahead of 4 and 14 for the whole network at batch 1).

The pieces are the unfused kernels' own: the expand and project products are the packed
GEMM's ``_block`` (gemm.block_kernel: the same microkernels, K in blocks of gemm.K_BLOCK), the
depthwise rows dwconv's vector kernels (``dwconv.state()["rows"]``), so each value is computed
as in the three separate layers up to the order of the sums over K. The expand may be any
dense conv read the way conv_gemm reads it (tap offsets into its zero-padded NHWC input, a
kernel row as one tap below conv.FEW_CHANNELS channels): MobileNetV2's stem (3x3
stride 2 from the RGB image) is its first block's expand, and the image's NCHW rows are copied
into the padded input by the tasks that read them (no serial pre-pass: 40-60 us at batch 1).
A project of at most NR/2 output channels (the first block's 32 -> 16) runs on gemm_narrow's
rows (panels of one vector, whole K per tile): on NR-wide panels half its multiply-adds were
padding (that block 256 -> 207 us alone, 2 threads, with the first version of these kernels).

A map of fewer bands than threads (MobileNetV2's 14x14 and 7x7 blocks at batch 1, 2 threads)
is not cut into bands thinner than MIN_BAND: two bands of a 7x7 map expand 9 rows for 7 (the
rows around the boundary twice), and those blocks ran only 1.53-1.75x faster on 2 threads than
on one. There each task is one image's block on a part of the expanded channels (the expand's
panels, those depthwise channels, the project's rows of K), writing a partial product (the
first part's with bias and residual into the output, the others' into arrays of their own);
the last part of an image to finish adds the others' in and applies the project's activation.
Those blocks then ran 1.81-1.95x faster on 2 threads than on one (each block alone, 2 threads:
nodes 6-16 of MobileNetV2 b1 1030 -> 861 us in sum; ad-hoc timing, medians of 300 calls).

``HeadPlan`` is MobileNetV2's last 1x1 conv (320 -> 1280 at 7x7) when only a global average
pool reads it: tasks over groups of its weight's panels compute their columns into a reused
per-thread scratch slot and sum them over each image's pixels themselves, so the conv's
output never goes through memory and the pool is no node of its own (in the network at batch
1: conv + pool 199-230 us -> 139-148, ad-hoc A/B of the two graphs in one process).

The expand, project and head products tile their rows evenly (``_even``): the fewest tiles
of at most MR rows, all about as high. A 7x7 map's 49 rows went as 4 x 12 + 1, and the 1-row
tile's microkernel waits an FMA latency per step of K for 2 FMAs; as 4 x 10 + 9 the 7x7
blocks took 3-7 % less and the head 7 % (MobileNetV2 b1, the two tilings alternating in one
process, medians of 160 calls per node, 1 and 2 threads; each value's sum is unchanged).

Where the kernels or the pool do not run, ``state()`` is None and the caller runs the three
layers (and the head its two nodes).
"""

from __future__ import annotations

import threading

import numpy as np

from ember.kernels.cpu import gemm as G

_STATE: dict = {}
_LOCK = threading.Lock()
carray = None  # numba.carray, bound by _build
_ld = _vptr = _block = _dw_rows = _fetch_add = _bands = _submit = None  # bound

# descriptor words
(D_X, D_N, D_H, D_W, D_HAS_E, D_EP, D_EB, D_CE, D_EACT, D_DW, D_DB, D_KH, D_KW, D_SH,
 D_SW, D_PT, D_PL, D_DACT, D_OH, D_OW, D_PP, D_PB, D_CO, D_PACT, D_RES, D_HAS_R, D_OUT, D_TPI,
 D_RSUB, D_SCR, D_SLOT, D_ROI, D_ROE, D_TAP0, D_MR, D_NR, D_KBLOCK, D_CHUNK, D_ETAP, D_ENT,
 D_EKC, D_XROW, D_XIMG, D_SRC, D_SC, D_SH_IN, D_SW_IN, D_SPT, D_SPL, D_EKH, D_ESH,
 D_NARROW, D_PPN, D_NSLOTS, D_CLAIMS, D_PARTS, D_COUNT, D_SACT, D_WORDS) = range(59)  # fmt: skip

MIN_BAND = 8  # output rows per task at least (a band boundary recomputes kh - sh expanded rows)
TASKS_PER_THREAD = 4  # bands per thread (when the map has that many MIN_BAND-row bands)
L2_BUDGET = 384 << 10  # bytes of scratch (expanded rows + depthwise rows) per sub-band


def _gemm_rows_py(aa, ra, ta, nt, kc, ba, oa, bsa, rsa, m, o, nr, mr, kblock, chunk, flags, act):
    """out (m, o) at oa = act(sum_t A_t @ W_t + bias [+ res]), A_t's rows at aa + ra[p] + ta[t]
    (nt taps of kc floats): gemm._driver_py's loop on one thread (pragma: no cover - compiled)."""
    panels = (o + nr - 1) // nr
    g = max(1, kblock // kc)
    ncs = 1 if kc <= kblock else (kc + kblock - 1) // kblock
    nkb = (nt + g - 1) // g if ncs == 1 else nt * ncs
    lo = np.float32(-np.inf if act == 0 else 0.0)
    hi = np.float32(6.0 if act == 2 else np.inf)
    for q0 in range(0, m, chunk):
        q1 = min(q0 + chunk, m)
        _block(q0, q1, 0, panels, aa, ra, ta, ba, oa, bsa, rsa, o, nt * kc, nr, nt, kc, g, ncs,
               nkb, _even(q1 - q0, mr), flags, lo, hi)  # fmt: skip


def _even_py(rows, mr):  # pragma: no cover - compiled
    """Tile height for rows in the fewest tiles of at most mr rows, as even as they go: the
    microkernel's last tile of 1-3 rows waits an FMA latency per step of K for a few FMAs
    (49 rows, a 7x7 map: 4 x 12 + 1 -> 4 x 10 + 9)."""
    tiles = (rows + mr - 1) // mr
    return (rows + tiles - 1) // max(tiles, 1)


_gemm_rows = _narrow_rows = _even = None  # compiled by _build; gemm_narrow's rows (bound)


def _task_py(p, a1, a2, i0, i1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover - compiled
    """Bands i0..i1-1 (image, band of output rows) of the block described at p, or with
    ``D_PARTS`` > 1 items (image, part of the expanded channels): each part's descriptor
    (D_WORDS words each, from p) is a whole-image band of a block on its channels only, whose
    project writes a partial product (the first part's with bias and residual, into the
    output; the others' into their own arrays, no activation); the last part of an image to
    finish adds the others' into the output and applies the project's activation."""
    parts = _ld(p, D_PARTS)
    if parts == 1:
        _bands(p, i0, i1)
        return
    for item in range(i0, i1):
        b, k = item // parts, item % parts
        _bands(p + k * D_WORDS * 8, b, b + 1)
        cnt = _ld(p, D_COUNT) + b * 8
        if _fetch_add(cnt, 1) == parts - 1:  # the others' partial products are all written
            _fetch_add(cnt, -parts)  # zero again for the next call
            img = _ld(p, D_OH) * _ld(p, D_OW) * _ld(p, D_CO)
            out = carray(_vptr(_ld(p, D_OUT) + b * img * 4), (img,), np.float32)
            for q in range(1, parts):
                part = carray(_vptr(_ld(p + q * D_WORDS * 8, D_OUT) + b * img * 4), (img,),
                              np.float32)  # fmt: skip
                for t in range(img):
                    out[t] += part[t]
            act = _ld(p, D_SACT)
            if act != 0:
                hi = np.float32(6.0 if act == 2 else np.inf)
                for t in range(img):
                    out[t] = min(max(out[t], np.float32(0.0)), hi)


def _bands_py(p, i0, i1):  # pragma: no cover - compiled
    """Bands i0..i1-1 (image, band of output rows) of the block described at p."""
    xa, h, wd = _ld(p, D_X), _ld(p, D_H), _ld(p, D_W)
    has_e, epa, eba, ce, eact = (_ld(p, D_HAS_E), _ld(p, D_EP), _ld(p, D_EB), _ld(p, D_CE),
                                 _ld(p, D_EACT))  # fmt: skip
    kh, kw, sh, sw = _ld(p, D_KH), _ld(p, D_KW), _ld(p, D_SH), _ld(p, D_SW)
    pt, pl, dact, oh, ow = _ld(p, D_PT), _ld(p, D_PL), _ld(p, D_DACT), _ld(p, D_OH), _ld(p, D_OW)
    ppa, pba, co, pact = _ld(p, D_PP), _ld(p, D_PB), _ld(p, D_CO), _ld(p, D_PACT)
    ra, has_r, oa, tpi = _ld(p, D_RES), _ld(p, D_HAS_R), _ld(p, D_OUT), _ld(p, D_TPI)
    rsub, sa, slot = _ld(p, D_RSUB), _ld(p, D_SCR), _ld(p, D_SLOT)
    roi, roe, tap0 = _ld(p, D_ROI), _ld(p, D_ROE), _ld(p, D_TAP0)
    mr, nr, kblock, chunk = _ld(p, D_MR), _ld(p, D_NR), _ld(p, D_KBLOCK), _ld(p, D_CHUNK)
    eta, ent, ekc, xrow, ximg = (_ld(p, D_ETAP), _ld(p, D_ENT), _ld(p, D_EKC), _ld(p, D_XROW),
                                 _ld(p, D_XIMG))  # fmt: skip
    nchw, sc, hin, win, spt, spl = (_ld(p, D_SRC), _ld(p, D_SC), _ld(p, D_SH_IN), _ld(p, D_SW_IN),
                                    _ld(p, D_SPT), _ld(p, D_SPL))  # fmt: skip
    ekh, esh = _ld(p, D_EKH), _ld(p, D_ESH)
    wp = xrow // (esh * sc)  # the padded input's width
    narrow, ppn = _ld(p, D_NARROW), _ld(p, D_PPN)
    wdw = carray(_vptr(_ld(p, D_DW)), (kh, kw, ce), np.float32)
    bdw = carray(_vptr(_ld(p, D_DB)), (ce,), np.float32)
    erow = wd * ce  # floats of one expanded row
    ecap = (rsub - 1) * sh + kh  # expanded rows a sub-band needs at most
    pflags = 6 if has_r else 2
    # a scratch slot of our own: the first free one of nslots (more than the threads that run
    # tasks at once), claimed by an atomic increment of its count
    nslots, claims = _ld(p, D_NSLOTS), _ld(p, D_CLAIMS)
    sl = 0
    while _fetch_add(claims + sl * 8, 1) != 0:
        _fetch_add(claims + sl * 8, -1)
        sl = (sl + 1) % nslots
    ea = sa + sl * slot * 4
    for item in range(i0, i1):
        b, k = item // tpi, item % tpi
        y0, y1 = oh * k // tpi, oh * (k + 1) // tpi
        da = ea + ecap * erow * 4
        e = carray(_vptr(ea), (ecap * erow,), np.float32)
        e_lo, e_hi = 0, 0  # the input rows whose expansion E holds (from its first row)
        c_hi = 0  # the NCHW source's rows this task has written into the padded input so far
        for ya in range(y0, y1, rsub):
            yb = min(y1, ya + rsub)
            lo = max(0, ya * sh - pt)
            hi = max(lo, min(h, (yb - 1) * sh - pt + kh))
            if has_e:
                start = lo
                if e_lo <= lo < e_hi:  # rows the last sub-band expanded: move them to the front
                    if lo > e_lo:  # from a second view: e[t] = e[off + t] ran scalar (one
                        # float a cycle, ~40 us of MobileNetV2's features.2 alone on 1 thread)
                        nmv = (e_hi - lo) * erow
                        esrc = carray(_vptr(ea + (lo - e_lo) * erow * 4), (nmv,), np.float32)
                        for t in range(nmv):
                            e[t] = esrc[t]
                    start = e_hi
                if hi > start and nchw != 0:  # the padded NHWC rows the expand reads, made here
                    i0_ = max(c_hi, start * esh - spt, 0)
                    i1_ = min(hin, (hi - 1) * esh + ekh - spt)
                    for ih in range(i0_, i1_):
                        dst = carray(_vptr(xa + (b * ximg + ((ih + spt) * wp + spl) * sc) * 4),
                                     (win * sc,), np.float32)  # fmt: skip
                        if sc == 3:  # RGB in one interleaving pass, vectorized by LLVM (the
                            # channel-by-channel strided stores: ~30 us of the stem, 1 thread)
                            r0 = carray(_vptr(nchw + (((b * 3) * hin + ih) * win) * 4), (win,),
                                        np.float32)  # fmt: skip
                            r1 = carray(_vptr(nchw + (((b * 3 + 1) * hin + ih) * win) * 4),
                                        (win,), np.float32)  # fmt: skip
                            r2 = carray(_vptr(nchw + (((b * 3 + 2) * hin + ih) * win) * 4),
                                        (win,), np.float32)  # fmt: skip
                            for t in range(win):
                                dst[3 * t] = r0[t]
                                dst[3 * t + 1] = r1[t]
                                dst[3 * t + 2] = r2[t]
                            continue
                        for ch in range(sc):
                            row = carray(_vptr(nchw + (((b * sc + ch) * hin + ih) * win) * 4),
                                         (win,), np.float32)  # fmt: skip
                            for t in range(win):
                                dst[t * sc + ch] = row[t]
                    c_hi = max(c_hi, i1_)
                if hi > start:
                    _gemm_rows(xa + (b * ximg + start * xrow) * 4, roi, eta, ent, ekc, epa,
                               ea + (start - lo) * erow * 4, eba, ea, (hi - start) * wd, ce, nr,
                               mr, kblock, chunk, 2, eact)  # fmt: skip
                src = ea
                e_lo, e_hi = lo, hi
            else:
                src = xa + (b * ximg + lo * xrow) * 4  # the block's input itself (cin == ce)
            xin = carray(_vptr(src), (1, hi - lo, wd, ce), np.float32)
            dv = carray(_vptr(da), (1, yb - ya, ow, ce), np.float32)
            _dw_rows(xin, wdw, bdw, dv, sh, sw, pt + lo - ya * sh, pl, dact, 0, yb - ya)
            off = (b * oh + ya) * ow * co * 4
            rsa = ra + off if has_r else oa + off
            if narrow:  # one vector of columns per row: a 2-vector panel would be half padding
                _narrow_rows(0, (yb - ya) * ow, da, roe, tap0, 1, ce, ppn, oa + off, co, pba, rsa,
                             pflags, pact)  # fmt: skip
            else:
                _gemm_rows(da, roe, tap0, 1, ce, ppa, oa + off, pba, rsa, (yb - ya) * ow, co, nr,
                           mr, kblock, chunk, pflags, pact)  # fmt: skip
    _fetch_add(claims + sl * 8, -1)


# the head's descriptor words (a 1x1 conv whose output is only averaged over its pixels)
(H_X, H_N, H_HW, H_K, H_PP, H_PB, H_O, H_ACT, H_OUT, H_SCR, H_ACC, H_ROWS, H_TAP0, H_MR, H_NR,
 H_KBLOCK, H_CHUNK, H_GROUPS, H_CLAIMS, H_NSLOTS, H_WORDS) = range(21)  # fmt: skip


def _head_task_py(p, a1, a2, i0, i1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover - compiled
    """Panel groups i0..i1-1 of the head at p: the conv's columns of those panels for every
    pixel (into the scratch, chunk by chunk of rows), then their sums over each image's pixels
    (float64) divided by the pixel count into the pooled output."""
    xa, n, hw, kk, ppa, pba = _ld(p, H_X), _ld(p, H_N), _ld(p, H_HW), _ld(p, H_K), _ld(p, H_PP), \
        _ld(p, H_PB)  # fmt: skip
    o, act, pa, sa, acca = _ld(p, H_O), _ld(p, H_ACT), _ld(p, H_OUT), _ld(p, H_SCR), _ld(p, H_ACC)
    ra, tap0, mr, nr = _ld(p, H_ROWS), _ld(p, H_TAP0), _ld(p, H_MR), _ld(p, H_NR)
    kblock, chunk, groups = _ld(p, H_KBLOCK), _ld(p, H_CHUNK), _ld(p, H_GROUPS)
    m = n * hw
    panels = (o + nr - 1) // nr
    g = max(1, kblock // kk)
    ncs = 1 if kk <= kblock else (kk + kblock - 1) // kblock
    lo = np.float32(-np.inf if act == 0 else 0.0)
    hi = np.float32(6.0 if act == 2 else np.inf)
    claims, nslots = _ld(p, H_CLAIMS), _ld(p, H_NSLOTS)
    sl = 0  # a scratch slot of chunk rows of our own, claimed as in _task_py
    while _fetch_add(claims + sl * 8, 1) != 0:
        _fetch_add(claims + sl * 8, -1)
        sl = (sl + 1) % nslots
    sa += sl * chunk * o * 4
    y = carray(_vptr(sa), (chunk * o,), np.float32)
    acc = carray(_vptr(acca), (n * o,), np.float64)
    pooled = carray(_vptr(pa), (n * o,), np.float32)
    for item in range(i0, i1):
        j0, j1 = panels * item // groups, panels * (item + 1) // groups
        c0, c1 = j0 * nr, min(o, j1 * nr)
        for b in range(n):
            for c in range(c0, c1):
                acc[b * o + c] = 0.0
        for q0 in range(0, m, chunk):
            q1 = min(q0 + chunk, m)
            ya = sa - q0 * o * 4  # row q0 at the slot's start
            _block(q0, q1, j0, j1, xa, ra, tap0, ppa, ya, pba, ya, o, kk, nr, 1, kk, g, ncs, ncs,
                   _even(q1 - q0, mr), 2, lo, hi)  # fmt: skip
            for q in range(q0, q1):  # while the chunk's columns are in L1/L2
                b = q // hw
                for c in range(c0, c1):
                    acc[b * o + c] += y[(q - q0) * o + c]
        for b in range(n):
            for c in range(c0, c1):
                pooled[b * o + c] = np.float32(acc[b * o + c] / hw)
    _fetch_add(claims + sl * 8, -1)


def _head_go_py(ctrl, own, desc, fn, items, x, out, scr, acc, claims):
    """_go_py for the head: the call's five addresses, then its panel groups on the pool
    (pragma: no cover - compiled)."""
    d = desc.copy()
    d[H_X], d[H_OUT], d[H_SCR], d[H_ACC] = x.ctypes.data, out.ctypes.data, scr.ctypes.data, \
        acc.ctypes.data  # fmt: skip
    d[H_CLAIMS] = claims.ctypes.data
    _submit(ctrl, own, d, fn, items)


def _go_py(ctrl, own, desc, fn, items, x, out, scr, claims, res, nchw, has_res, has_nchw, tmp):
    """Fill a copy of the descriptor with the call's addresses and run its bands on the pool
    (on ``own`` alone when another thread holds the pool's job block): in Python the four
    ``ctypes.data`` alone took ~6 us a call (pragma: no cover - compiled)."""
    d = desc.copy()  # the node may run in several threads at once
    parts = d[D_PARTS]
    for k in range(parts):  # each part's descriptor: the first part's output is the block's
        q = k * D_WORDS
        d[q + D_X], d[q + D_SCR], d[q + D_CLAIMS] = x.ctypes.data, scr.ctypes.data, \
            claims.ctypes.data  # fmt: skip
        d[q + D_OUT] = out.ctypes.data if k == 0 else tmp.ctypes.data + (k - 1) * out.nbytes
        d[q + D_RES] = res.ctypes.data if has_res and k == 0 else 0
        d[q + D_SRC] = nchw.ctypes.data if has_nchw else 0
    d[D_COUNT] = claims.ctypes.data + d[D_NSLOTS] * 8  # an image's finished parts
    _submit(ctrl, own, d, fn, items)


def _build(nb) -> dict:
    from numba import types

    from ember.kernels.cpu import dwconv, pool

    dw = dwconv.state()
    if dw is None or G.block_kernel() is None or pool.state() is None:
        return {"ok": False}
    ld, vptr = pool.intrinsics()
    g = globals()
    g.update(_ld=ld, _vptr=vptr, _block=G.block_kernel(), _dw_rows=dw["rows"], carray=nb.carray)
    g["_even"] = nb.njit(nogil=True, cache=True)(_even_py)
    g["_gemm_rows"] = nb.njit(nogil=True, cache=True)(_gemm_rows_py)
    g["_bands"] = nb.njit(nogil=True, cache=True)(_bands_py)
    g["_fetch_add"] = types.ExternalFunction(
        "ember_sgemm_fetch_add", types.int64(types.int64, types.int64)
    )
    from ember.kernels.cpu import gemm_narrow

    narrow = gemm_narrow._state()
    if narrow is None:
        return {"ok": False}
    g["_narrow_rows"] = narrow["rows"]
    sig = types.void(*([types.int64] * 12))
    task = nb.cfunc(sig, nopython=True, cache=True)(_task_py)
    g["_submit"] = pool.submit_items()
    go = nb.njit(nogil=True, cache=True)(_go_py)
    head = nb.cfunc(sig, nopython=True, cache=True)(_head_task_py)
    head_go = nb.njit(nogil=True, cache=True)(_head_go_py)
    return {"ok": True, "task": task, "fn": task.address, "go": go, "head": head,
            "head_fn": head.address, "head_go": head_go}  # fmt: skip


def _build_all() -> dict:
    from ember.kernels.cpu import numba_or_none

    nb = numba_or_none()
    if nb is None or G.isa() is None:
        return {"ok": False}
    return _build(nb)


def state() -> dict | None:
    """The compiled task (built once, under a lock), or None where the block must run as three
    layers."""
    from ember.kernels.cpu import built_once

    return built_once(_STATE, _LOCK, _build_all)


_local = threading.local()


def _scratch(size: int, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """This thread's scratch of at least size floats (grown, never shrunk: its pages stay) and
    the slots' claim counts (zeros when made; every task puts its count back to zero when it
    ends, so they are zero at the start of every job)."""
    claims = getattr(_local, "claims", None)
    if claims is None or claims.size < slots:
        claims = _local.claims = np.zeros(max(slots, 8), np.int64)
    return _grown("buf", size, np.float32), claims


def _grown(name: str, size: int, dtype) -> np.ndarray:
    """This thread's array ``name`` of at least size elements (grown, never shrunk), starting
    on a cache line: the vector loads of a misaligned scratch each touch two lines (a large
    np.empty starts 16 bytes into a page; the depthwise rows ran 1.4-1.5x slower from it)."""
    buf = getattr(_local, name, None)
    if buf is None or buf.size < size:
        from ember.kernels.cpu.conv import empty_aligned

        buf = empty_aligned((size,), dtype)
        setattr(_local, name, buf)
    return buf


def _rowoffs(rows: int, k: int) -> np.ndarray:
    return np.arange(rows, dtype=np.int64) * k


_TAP0 = np.zeros(1, np.int64)


class Plan:
    """One block's task layout for one input shape: the descriptor (operand addresses filled
    per call), the bands and the scratch they need."""

    def __init__(self, n: int, h: int, w: int, src: tuple, expand, dw, stride, pads, project,
                 has_res: bool, threads: int) -> None:  # fmt: skip
        """h, w: the depthwise's input size; src (hp, wp, c): the NHWC array ``run`` gets (the
        expand's zero-padded input, or the depthwise's input when there is no expand);
        expand: (PackedWeight, bias, act, tap offsets, floats per tap, (row, column) stride, (kernel
        rows, top and left padding, unpadded height and width)) or None;
        dw: (weight (kh, kw, Ce), bias, act); project: (PackedWeight, bias, co, act); stride and pads
        (top, bottom, left, right) the depthwise's."""
        g = G._state()
        nr = g["nr"]
        wdw, bdw, dact = dw
        kh, kw, ce = wdw.shape
        (sh, sw), (pt, pb_, pl, pr) = stride, pads
        pw, pb, co, pact = project
        oh, ow = self.out_hw = _out(h, kh, sh, pt, pb_), _out(w, kw, sw, pl, pr)
        self.n, self.co, self.nslots = n, co, threads + 1  # at most `threads` tasks at once
        self.shape = (n, oh, ow, co)
        # bands per image: TASKS_PER_THREAD per thread over the batch when the map has that
        # many MIN_BAND-row bands; a multiple of the threads when there are few of them (3 bands
        # of a 14x14 map on 2 threads: one thread computes two)
        tpi = min(max(1, oh // MIN_BAND), -(-TASKS_PER_THREAD * threads // n))
        if n * tpi < TASKS_PER_THREAD * threads and n * tpi > threads:
            tpi = max(1, (n * tpi // threads) * threads // n)
        ep = None if expand is None else _panels(expand[0], nr)
        pp = _panels(pw, nr)
        narrow = _panels(pw, nr // 2) if co <= nr // 2 else None  # gemm_narrow's panels
        parts = 1  # channel parts: for 1x1 expands only (not the stem), wide projects
        if ep is not None and n * tpi < threads and narrow is None and expand[3].size == 1:
            parts = min(threads, ep.shape[0])
        self.parts = parts
        if parts == 1:  # bands of rows (thinner than MIN_BAND rows where the map is small)
            if n * tpi < threads:
                tpi = min(oh, -(-threads // n))
            proj = (pp, pb, co, pact, narrow)
            d, self.slot, self.keep = _describe(
                n, h, w, src, expand, ep, dw, stride, pads, proj, has_res, tpi, threads
            )
            self.items, self.desc = n * tpi, d
            return
        # a small map on fewer images than threads (MobileNetV2's 14x14 and 7x7 blocks at
        # batch 1): bands of rows would each expand the kh - sh rows around their boundary
        # again (2 bands of a 7x7 map: 9 expanded rows for 7); instead each task is one
        # image's block on a part of the expanded channels (the expand's panels, the depthwise
        # channels and the project's rows of K), whose partial products the last adds up
        descs, slots, keep = [], [], []
        eb, eact = expand[1], expand[2]
        for k in range(parts):
            j0, j1 = ep.shape[0] * k // parts, ep.shape[0] * (k + 1) // parts
            c0, c1 = j0 * nr, min(ce, j1 * nr)
            e_k = (None, np.ascontiguousarray(eb[c0:c1]), eact, *expand[3:])
            dw_k = (np.ascontiguousarray(wdw[:, :, c0:c1]), np.ascontiguousarray(bdw[c0:c1]), dact)
            pp_k = np.ascontiguousarray(pp[:, c0:c1])
            pb_k = pb if k == 0 else np.zeros_like(pb)
            proj = (pp_k, pb_k, co, 0, None)  # no activation before the parts are added
            d, slot, kp = _describe(
                n, h, w, src, e_k, ep[j0:j1], dw_k, stride, pads, proj, has_res and k == 0, 1,
                threads,
            )  # fmt: skip
            descs.append(d)
            slots.append(slot)
            keep.append((kp, e_k, dw_k, pp_k, pb_k))
        self.slot, self.keep, self.items = max(slots), keep, n * parts
        d = np.concatenate(descs)
        for k in range(parts):
            d[k * D_WORDS + D_SLOT] = self.slot
        d[D_PARTS], d[D_SACT] = parts, pact
        self.desc = d

    def run(
        self, x: np.ndarray, res: np.ndarray | None, nchw: np.ndarray | None = None
    ) -> np.ndarray:
        """The block's output (N, OH, OW, Co) for x (the src array) and res (that shape or None),
        contiguous float32 (the caller checks). nchw: the expand's unpadded input as a
        contiguous NCHW array, whose rows the tasks copy into x's interior as they need them
        (x's zero border is then all x must hold)."""
        from ember.kernels.cpu import pool

        out = np.empty(self.shape, np.float32)
        # an image's count of finished parts follows the slots' claim counts
        scr, claims = _scratch(self.nslots * self.slot, self.nslots + self.n)
        tmp = out if self.parts == 1 else _grown("parts", (self.parts - 1) * out.size, np.float32)
        own = getattr(_local, "own", None)  # the job block for when another thread holds the pool's
        if own is None:
            own = _local.own = np.zeros(pool.CTRL_WORDS, np.int64)
        _STATE["go"](pool.ctrl(), own, self.desc, _STATE["fn"], self.items, x, out, scr, claims,
                     out if res is None else res, x if nchw is None else nchw, res is not None,
                     nchw is not None, tmp)  # fmt: skip
        return out


def _describe(n, h, w, src, expand, ep, dw, stride, pads, project, has_res, tpi, threads):
    """(descriptor, slot floats, arrays it points into) of bands tpi per image of a block;
    ep: the expand's panels (None without an expand); project: (panels, bias, co, act,
    gemm_narrow's panels or None)."""
    g = G._state()
    mr, nr = g["mr"], g["nr"]
    wdw, bdw, dact = dw
    kh, kw, ce = wdw.shape
    (sh, sw), (pt, pb_, pl, pr) = stride, pads
    pp, pb, co, pact, narrow = project
    oh, ow = _out(h, kh, sh, pt, pb_), _out(w, kw, sw, pl, pr)
    erow = w * ce * 4
    rsub = (L2_BUDGET - max(kh - sh, 0) * erow) // (sh * erow + ow * ce * 4)
    rsub = max(1, min(rsub, -(-oh // tpi)))
    ecap = (rsub - 1) * sh + kh
    slot = -(-(ecap * w * ce + rsub * ow * ce) // 16) * 16
    hp, wp, c = src
    _, eb, eact, etap, ekc, (esh, esw), (ekh, spt, spl, hin, win) = (
        expand if expand is not None else (None, None, 0, _TAP0, ce, (1, 1), (1, 0, 0, h, w))
    )
    q = np.arange(ecap * w, dtype=np.int64)
    roi = ((q // w) * esh * wp + (q % w) * esw) * c  # from the row block's origin
    roe = _rowoffs(rsub * ow, ce)
    keep = (expand, dw, project, narrow, ep, roi, roe)  # the arrays the descriptor points into
    d = np.zeros(D_WORDS, np.int64)
    d[D_N], d[D_H], d[D_W] = n, h, w
    d[D_XROW], d[D_XIMG] = esh * wp * c, hp * wp * c
    d[D_SC], d[D_SH_IN], d[D_SW_IN], d[D_SPT], d[D_SPL] = c, hin, win, spt, spl
    d[D_EKH], d[D_ESH] = ekh, esh
    d[D_HAS_E] = expand is not None
    if expand is not None:
        d[D_EP], d[D_EB], d[D_EACT] = ep.ctypes.data, eb.ctypes.data, eact
        d[D_ETAP], d[D_ENT], d[D_EKC] = etap.ctypes.data, etap.size, ekc
    d[D_CE], d[D_DW], d[D_DB], d[D_KH], d[D_KW] = ce, wdw.ctypes.data, bdw.ctypes.data, kh, kw
    d[D_SH], d[D_SW], d[D_PT], d[D_PL], d[D_DACT] = sh, sw, pt, pl, dact
    d[D_OH], d[D_OW], d[D_PP], d[D_PB], d[D_CO], d[D_PACT] = oh, ow, pp.ctypes.data, \
        pb.ctypes.data, co, pact  # fmt: skip
    d[D_HAS_R], d[D_TPI], d[D_RSUB], d[D_SLOT] = has_res, tpi, rsub, slot
    d[D_NSLOTS], d[D_PARTS] = threads + 1, 1
    if narrow is not None:
        d[D_NARROW], d[D_PPN] = 1, narrow.ctypes.data
    d[D_ROI], d[D_ROE], d[D_TAP0] = roi.ctypes.data, roe.ctypes.data, _TAP0.ctypes.data
    d[D_MR], d[D_NR], d[D_KBLOCK], d[D_CHUNK] = mr, nr, G.K_BLOCK, G.CHUNK_PIXELS
    return d, slot, keep


def _panels(w, nr: int) -> np.ndarray:
    """A PackedWeight's panels if they are nr wide, else its values packed so (a weight of at
    most NR/2 outputs carries gemm_narrow's panels)."""
    p = w.panels
    if p is not None and p.shape[2] == nr:
        return p
    return G.pack_weight(G._matrix(np.asarray(w, np.float32)), nr)


def _out(size: int, k: int, s: int, lo: int, hi: int) -> int:
    return (size + lo + hi - k) // s + 1


class HeadPlan:
    """A 1x1 conv (N, H, W, K) -> (N, H, W, O) whose output is only averaged over its pixels
    (MobileNetV2's last conv before GlobalAveragePool): the pooled (N, O) without the conv's
    output going through memory (it is in a reused per-thread scratch, summed by each task
    right after the task computes its columns). Tasks are groups of the weight's panels, each
    over every pixel of every image: a group's panels stay in L2 across the images."""

    def __init__(self, n: int, hw: int, k: int, project, threads: int) -> None:
        """project: (PackedWeight, bias, o, act)."""
        g = G._state()
        mr, nr = g["mr"], g["nr"]
        pw, pb, o, act = project
        pp = _panels(pw, nr)
        panels = -(-o // nr)
        self.items = min(panels, TASKS_PER_THREAD * threads)
        self.n, self.o, self.m = n, o, n * hw
        self.rows = _rowoffs(n * hw, k)
        self.keep = (pp, pb)
        d = np.zeros(H_WORDS, np.int64)
        d[H_N], d[H_HW], d[H_K], d[H_PP], d[H_PB], d[H_O] = n, hw, k, pp.ctypes.data, \
            pb.ctypes.data, o  # fmt: skip
        d[H_ACT], d[H_ROWS], d[H_TAP0] = act, self.rows.ctypes.data, _TAP0.ctypes.data
        d[H_MR], d[H_NR], d[H_KBLOCK], d[H_CHUNK] = mr, nr, G.K_BLOCK, G.CHUNK_PIXELS
        d[H_GROUPS] = self.items
        self.nslots = d[H_NSLOTS] = threads + 1  # as Plan's: one slot always free
        self.slot = G.CHUNK_PIXELS * o
        self.desc = d

    def run(self, x: np.ndarray) -> np.ndarray:
        """The pooled (N, O) float32 for x, the conv's (N, H, W, K) contiguous float32 input."""
        from ember.kernels.cpu import pool

        out = np.empty((self.n, self.o), np.float32)
        scr, claims = _scratch(self.nslots * self.slot, self.nslots)
        acc = _grown("hacc", self.n * self.o, np.float64)  # the float64 sums
        own = getattr(_local, "own", None)
        if own is None:
            own = _local.own = np.zeros(pool.CTRL_WORDS, np.int64)
        _STATE["head_go"](pool.ctrl(), own, self.desc, _STATE["head_fn"], self.items, x, out,
                          scr, acc, claims)  # fmt: skip
        return out
