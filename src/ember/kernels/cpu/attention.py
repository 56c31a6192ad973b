"""Blocked (flash-style) non-causal self- or cross-attention on token-major float32 arrays.

    out[b, i, h] = sum_j softmax_j(q[b, i, h] . k[b, j, h] * scale) v[b, j, h]

q is (B, L, H*D), k and v (B, S, H*D): head h is columns h*D:(h+1)*D, so the outputs of the q/k/v
projections are used as they are (column slices of one fused qkv matrix too), and the result is
(B, L, H*D), ready for the output projection. An optional key mask (B, S) drops padding keys.

How: K and V are packed per (batch, head) into the panel layout of the packed-weight GEMM
(``kernels.sgemm``: (panels, rows, NR) floats): K transposed, so that a block of queries times
a panel is a (rows x NR) tile of scores. Both steps run on ember's worker pool
(``kernels.cpu.pool``), the one the packed GEMM's products run on: the packing as one item per
(batch, head), then one item per thread that takes (batch, head, block of query rows) tasks from
a shared counter. (As numba ``prange`` regions, an attention right after a GEMM ran on a core
that the pool's worker still spun on, ~0.2 ms after each job: ViT-B/16's 197-token attention
took 0.85 ms after a GEMM against 0.61 ms alone.) For its block a task

1. writes the scores S = Q_blk K^T (rows x S) with a register-blocked tile kernel of its own
   (``_tile_ir``: LLVM IR like sgemm's microkernels, but rows at a fixed stride, whole panels
   and plain stores; sgemm's masked epilogue cost as much as the 64-deep product);
2. turns each row into exp((s - max) * scale) in place and keeps 1 / sum (a float32 exp,
   branch-free so that it vectorizes: numba's np.exp calls libm's scalar expf);
3. multiplies P V with the tile kernel straight into the output, each row scaled by its 1 / sum
   as it is stored (sgemm's microkernels and a scaling pass when D is not whole panels).

With many (batch, head) pairs per thread and at most PER_HEAD_MAX_KEYS keys (an encoder at
batch 1 or 8) there is no pack job: a task is one (batch, head), which packs that head's K into
its worker's scratch and then runs every block of its queries; and P V reads V where it lies
(the tile kernel takes B's row stride) when D is whole panels and the keys are few.

Only a (rows x S) block of scores per thread exists at any time (about 300 KB at S = 1500), so
it stays in L2, where a full (H, L, S) score tensor (54 MB for Whisper's encoder) would stream
through memory three times. As every key of the row is in the block, the softmax is the exact
two-pass one (no running rescale as in FlashAttention's online softmax, which only pays when a
row of scores does not fit in cache).

``attention_reference`` is the numpy version the tests compare with; it also runs where the
microkernels are unavailable (no numba, no AVX2+FMA, EMBER_NO_NUMBA=1, EMBER_SGEMM_ISA=none).
"""

from __future__ import annotations

import math
import threading

import numpy as np

from ember.errors import DTypeError, ShapeError
from ember.kernels.cpu import have_numba, jit, numba_or_none
from ember.kernels.registry import register

_F32 = np.float32
_K: dict | None = None
_ENGINE: list = []  # the tile kernels' execution engine (it owns their machine code)
SCORE_BLOCK_BYTES = 1 << 19  # a task's (rows x keys) float32 scores: at most ~512 KB (in L2)

# exp(x) for float32 (Cephes' expf): x = n ln2 + r, |r| <= ln2 / 2; exp(r) by a degree-6
# polynomial; 2^n built in the exponent bits. Relative error ~1.2e-7 on [-87, 88].
_LOG2E, _LN2_HI, _LN2_LO = _F32(1.4426950408889634), _F32(0.693359375), _F32(-2.12194440e-4)
_P0, _P1, _P2, _P3, _P4, _P5 = (
    _F32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                      1.6666665459e-1, 5.0000001201e-1)
)  # fmt: skip
_EXP_LO, _EXP_HI, _HALF, _ONE = _F32(-87.0), _F32(88.0), _F32(0.5), _F32(1.0)


def expf(x):
    """exp of a float32 scalar, branch-free (compiled by numba; vectorizes inside loops)."""
    x = min(max(x, _EXP_LO), _EXP_HI)
    n = np.floor(x * _LOG2E + _HALF)
    r = x - n * _LN2_HI - n * _LN2_LO
    p = ((((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4) * r + _P5
    p = p * (r * r) + r + _ONE
    return p * np.int32((np.int32(n) + 127) << 23).view(np.float32)


# ------------------------------------------------------------------ numpy reference
def attention_reference(q, k, v, num_heads: int, scale: float, key_mask=None) -> np.ndarray:
    """softmax(q k^T * scale) v per head, float32; (B, L, H*D), (B, S, H*D) x2 -> (B, L, H*D).

    key_mask: bool (B, S), True = attend, or None. Rows with no key to attend to give zeros.
    """
    b, lq, hd = q.shape
    s_len = k.shape[1]
    d = hd // num_heads
    out = np.zeros((b, lq, hd), _F32)
    for i in range(b):
        for h in range(num_heads):
            c = slice(h * d, (h + 1) * d)
            s = (q[i, :, c] @ k[i, :, c].T).astype(_F32) * _F32(scale)  # (L, S)
            if key_mask is not None:
                s = np.where(key_mask[i][None, :], s, -np.inf)
            if s_len == 0 or not np.isfinite(s.max(initial=-np.inf)):
                continue
            p = np.exp(s - s.max(-1, keepdims=True))
            out[i, :, c] = (p @ v[i, :, c]) / p.sum(-1, keepdims=True)
    return out


# ------------------------------------------------------------------ numba kernels
_micro = None  # sgemm's microkernel dispatcher, set by _build before compiling
TILE_ROWS_MAX = 12  # the tile kernels below are built for 1..12 rows (the ISA's MR may be less)


def _tile_ir(mr: int, nv: int, w: int) -> str:
    """C[r, :nr] = (sum_k A[r*lda + k] * B[k, :]) [* s[r]] for r < mr; nr = nv*w, full panels.

    The attention blocks' own microkernel: rows of A at a fixed stride (query rows of q, or score
    rows), one packed panel of B (K^T or V), and C stored with plain vector stores. sgemm's
    general kernel also handles partial panels, bias, residual and clamping with masked loads
    and stores, a fixed cost per tile that the scores (only D = 64 deep) cannot amortize. s: 0,
    or the address of mr row factors (the softmax's 1 / sum, applied as P V is stored).
    """
    vt = f"<{w} x float>"
    rows, vecs = range(mr), range(nv)
    acc = [(r, v) for r in rows for v in vecs]
    s = [
        f"define void @ember_attn_tile_{mr}(i64 %ai, i64 %lda, i64 %bi, i64 %ldb, i64 %kc,"
        " i64 %ci, i64 %ldc, i64 %si) #0 {",
        "entry:",
        "  %a = inttoptr i64 %ai to ptr",
        "  %b = inttoptr i64 %bi to ptr",
        "  %c = inttoptr i64 %ci to ptr",
    ]
    for r in rows:
        s += [
            f"  %ao{r} = mul i64 %lda, {r}",
            f"  %ap{r} = getelementptr float, ptr %a, i64 %ao{r}",
        ]
    s += ["  br label %k", "k:"]
    s += ["  %kk = phi i64 [0, %entry], [%kk1, %k]", "  %bk = phi ptr [%b, %entry], [%bn, %k]"]
    s += [f"  %K{r}_{v} = phi {vt} [zeroinitializer, %entry], [%N{r}_{v}, %k]" for r, v in acc]
    for v in vecs:
        s += [f"  %bp{v} = getelementptr float, ptr %bk, i64 {v * w}"]
        s += [f"  %bv{v} = load {vt}, ptr %bp{v}, align 4"]
    for r in rows:
        s += [f"  %aq{r} = getelementptr float, ptr %ap{r}, i64 %kk"]
        s += [f"  %as{r} = load float, ptr %aq{r}, align 4"]
        s += [f"  %ai{r} = insertelement {vt} poison, float %as{r}, i32 0"]
        s += [f"  %av{r} = shufflevector {vt} %ai{r}, {vt} poison, <{w} x i32> zeroinitializer"]
        for v in vecs:
            s += [
                f"  %N{r}_{v} = call {vt} @llvm.fma.v{w}f32({vt} %av{r}, {vt} %bv{v},"
                f" {vt} %K{r}_{v})"
            ]
    s += ["  %bn = getelementptr float, ptr %bk, i64 %ldb"]
    s += ["  %kk1 = add i64 %kk, 1", "  %more = icmp ult i64 %kk1, %kc"]
    s += ["  br i1 %more, label %k, label %done", "done:"]
    s += ["  %hs = icmp ne i64 %si, 0", "  br i1 %hs, label %scaled, label %plain"]
    for blk, scaled in (("scaled", True), ("plain", False)):
        s += [f"{blk}:"]
        if scaled:
            s += ["  %sp = inttoptr i64 %si to ptr"]
        for r in rows:
            s += [f"  %{blk}co{r} = mul i64 %ldc, {r}"]
            s += [f"  %{blk}cr{r} = getelementptr float, ptr %c, i64 %{blk}co{r}"]
            if scaled:
                s += [f"  %sq{r} = getelementptr float, ptr %sp, i64 {r}"]
                s += [f"  %ss{r} = load float, ptr %sq{r}, align 4"]
                s += [f"  %si{r} = insertelement {vt} poison, float %ss{r}, i32 0"]
                s += [f"  %sv{r} = shufflevector {vt} %si{r}, {vt} poison,"]
                s[-1] += f" <{w} x i32> zeroinitializer"
            for v in vecs:
                x = f"{r}_{v}"
                val = f"%N{x}"
                if scaled:
                    s += [f"  %y{x} = fmul {vt} %N{x}, %sv{r}"]
                    val = f"%y{x}"
                s += [f"  %{blk}cp{x} = getelementptr float, ptr %{blk}cr{r}, i64 {v * w}"]
                s += [f"  store {vt} {val}, ptr %{blk}cp{x}, align 4"]
        s += ["  ret void"]
    s += ["}"]
    return "\n".join(s)


def _tile_py(m, args):  # pragma: no cover - compiled
    """The attention tile kernel for m rows (1..TILE_ROWS_MAX)."""
    if m == 12:
        _t12(*args)
    elif m == 11:
        _t11(*args)
    elif m == 10:
        _t10(*args)
    elif m == 9:
        _t9(*args)
    elif m == 8:
        _t8(*args)
    elif m == 7:
        _t7(*args)
    elif m == 6:
        _t6(*args)
    elif m == 5:
        _t5(*args)
    elif m == 4:
        _t4(*args)
    elif m == 3:
        _t3(*args)
    elif m == 2:
        _t2(*args)
    else:
        _t1(*args)


_t1 = _t2 = _t3 = _t4 = _t5 = _t6 = _t7 = _t8 = _t9 = _t10 = _t11 = _t12 = None  # _build binds


def _pack_one_py(kf, ks0, ks1, vf, vs0, vs1, s_len, b, h, pk, pv, pack_v):  # pragma: no cover
    """pk[j, e, c] = k[b, j*NR + c, h*D + e]; pv[p, t, c] = v[b, t, h*D + p*NR + c] for one
    (batch, head); k, v as flat float arrays with their (batch, row) strides in floats.

    Zero-padded past the last key (pk) and the last feature of a head (pv); pv only with
    pack_v (else P V reads v in place).
    """
    d, nr = pk.shape[1], pk.shape[2]
    c0 = h * d
    for j in range(pk.shape[0]):  # rows of the panel outermost: contiguous writes
        blk = pk[j]
        k0 = b * ks0 + j * nr * ks1 + c0
        n = min(nr, s_len - j * nr)
        for e in range(d):
            dst = blk[e]
            for c in range(n):
                dst[c] = kf[k0 + c * ks1 + e]
            for c in range(n, nr):
                dst[c] = 0.0
    for p in range(pv.shape[0] if pack_v else 0):
        blk = pv[p]
        e0 = b * vs0 + c0 + p * nr
        n = min(nr, d - p * nr)
        for t in range(s_len):
            dst = blk[t]
            r = e0 + t * vs1
            for c in range(n):
                dst[c] = vf[r + c]
            for c in range(n, nr):
                dst[c] = 0.0


# descriptor words (int64) of one call, read by the pool tasks below
(W_QA, W_QS0, W_QS1, W_LQ, W_HD, W_PK, W_NB, W_NPK, W_D, W_NR, W_PV, W_NPV, W_SLEN, W_MASK,
 W_MASKB, W_HASMASK, W_HEADS, W_SCALE, W_ROWS, W_MR, W_WORK, W_WORKN, W_QUEUE, W_OUT, W_KA,
 W_KS0, W_KS1, W_KSPAN, W_VA, W_VS0, W_VS1, W_VSPAN, W_WORKERS, W_PER_HEAD, W_VIN) = range(35)  # fmt: skip
W_WORDS = 35


def _pack_items_py(p, a1, a2, r0, r1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover - compiled
    """Pool task: pack K and V of the (batch, head) items r0..r1-1 of the call described at p."""
    nb, nh, npk, d, nr = _ld(p, W_NB), _ld(p, W_HEADS), _ld(p, W_NPK), _ld(p, W_D), _ld(p, W_NR)
    npv, s_len = _ld(p, W_NPV), _ld(p, W_SLEN)
    pk = carray(_vptr(_ld(p, W_PK)), (nb, nh, npk, d, nr), np.float32)
    pv = carray(_vptr(_ld(p, W_PV)), (nb, nh, npv, s_len, nr), np.float32)
    kf = carray(_vptr(_ld(p, W_KA)), (_ld(p, W_KSPAN),), np.float32)
    vf = carray(_vptr(_ld(p, W_VA)), (_ld(p, W_VSPAN),), np.float32)
    ks0, ks1, vs0, vs1 = _ld(p, W_KS0), _ld(p, W_KS1), _ld(p, W_VS0), _ld(p, W_VS1)
    vin = _ld(p, W_VIN)
    for item in range(r0, r1):
        b, h = item // nh, item % nh
        _pack_one(kf, ks0, ks1, vf, vs0, vs1, s_len, b, h, pk[b, h], pv[b, h], vin == 0)


def _attention_items_py(p, a1, a2, r0, r1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover
    """Pool task: workers r0..r1-1 of the call described at p (see the module doc).

    Worker w takes the next tasks from the call's shared counter until none are left, working
    in its scratch row ``work[w]``: a thread of the pool that was asleep or preempted when the
    call started finds fewer tasks left, and the calling thread never waits for more than the
    tasks a late thread has claimed. A task is TASKS_PER_GRAB blocks of query rows (the pack
    job packed every head before), or with W_PER_HEAD one (batch, head): the worker packs its
    K and V into its scratch row, then runs every block of its queries.
    """
    nb, nh, npk, d, nr = _ld(p, W_NB), _ld(p, W_HEADS), _ld(p, W_NPK), _ld(p, W_D), _ld(p, W_NR)
    npv, s_len, lq, hd = _ld(p, W_NPV), _ld(p, W_SLEN), _ld(p, W_LQ), _ld(p, W_HD)
    rows, mr, per_head = _ld(p, W_ROWS), _ld(p, W_MR), _ld(p, W_PER_HEAD)
    mask = carray(_vptr(_ld(p, W_MASK)), (_ld(p, W_MASKB), s_len), np.bool_)
    work = carray(_vptr(_ld(p, W_WORK)), (_ld(p, W_WORKERS), _ld(p, W_WORKN)), np.float32)
    out = carray(_vptr(_ld(p, W_OUT)), (nb, lq, hd), np.float32)
    scale = np.int32(_ld(p, W_SCALE)).view(np.float32)
    qa, qs0, qs1 = _ld(p, W_QA), _ld(p, W_QS0), _ld(p, W_QS1)
    has_mask, queue = _ld(p, W_HASMASK) != 0, _ld(p, W_QUEUE)
    vin = _ld(p, W_VIN)  # v's address when P V reads it in place (whole panels), else 0
    vt = (vin, _ld(p, W_VS0), _ld(p, W_VS1))
    nblk = (lq + rows - 1) // rows
    lds = npk * nr
    for w in range(r0, r1):
        ws = work[w]
        offs = ws[rows * lds : rows * lds + 4 * rows].view(np.int64)
        for r in range(rows):
            offs[rows + r] = r * lds
        if per_head:
            kf = carray(_vptr(_ld(p, W_KA)), (_ld(p, W_KSPAN),), np.float32)
            vf = carray(_vptr(_ld(p, W_VA)), (_ld(p, W_VSPAN),), np.float32)
            ks0, ks1, vs0, vs1 = _ld(p, W_KS0), _ld(p, W_KS1), _ld(p, W_VS0), _ld(p, W_VS1)
            k0 = rows * lds + 5 * rows
            v0 = k0 + npk * d * nr
            pkh = ws[k0:v0].reshape((npk, d, nr))
            pvh = ws[v0 : v0 + npv * s_len * nr].reshape((npv, s_len, nr))
            while True:
                t = _fetch_add(queue, 1)
                if t >= nb * nh:
                    break
                b, h = t // nh, t % nh
                _pack_one(kf, ks0, ks1, vf, vs0, vs1, s_len, b, h, pkh, pvh, vin == 0)
                for q0 in range(0, lq, rows):
                    _task(b, h, q0, qa, qs0, qs1, lq, hd, pkh, pvh, vt, mask, has_mask, nh,
                          s_len, scale, rows, mr, ws, out)  # fmt: skip
            continue
        pk = carray(_vptr(_ld(p, W_PK)), (nb, nh, npk, d, nr), np.float32)
        pv = carray(_vptr(_ld(p, W_PV)), (nb, nh, npv, s_len, nr), np.float32)
        ntasks = nb * nh * nblk
        while True:
            t0 = _fetch_add(queue, TASKS_PER_GRAB)
            if t0 >= ntasks:
                break
            for task in range(t0, min(ntasks, t0 + TASKS_PER_GRAB)):
                b, h, q0 = task // (nh * nblk), (task // nblk) % nh, (task % nblk) * rows
                _task(b, h, q0, qa, qs0, qs1, lq, hd, pk[b, h], pv[b, h], vt, mask, has_mask,
                      nh, s_len, scale, rows, mr, ws, out)  # fmt: skip


def _task_py(
    b,
    h,
    r0,
    qa,
    qs0,
    qs1,
    lq,
    hd,
    pk,
    pv,
    vt,
    mask,
    has_mask,
    num_heads,
    s_len,
    scale,
    rows,
    mr,
    ws,
    out,
):  # pragma: no cover - compiled
    """Query rows r0.. (a block of at most rows) of head h of batch b, on that head's packed K
    (pk: (panels, D, NR)) and V (pv: (panels, S, NR)), in the worker's scratch ws: the block's
    scores (rows x lds floats), then the row offsets of its queries and of its score rows
    (2 * rows int64, the second half filled by the caller), then 1 / sum per row. q: its
    address and (batch, row) strides in floats (a strided view: a column slice of qkv). vt: v's
    address and (batch, row) strides when P V reads v in place (address 0: from pv)."""
    d = hd // num_heads
    nr = pk.shape[2]
    lds = pk.shape[0] * nr  # score row stride: the keys rounded up to whole panels
    m = min(rows, lq - r0)
    os0, os1 = out.strides[0] // 4, out.strides[1] // 4
    ninf, pinf = np.float32(-np.inf), np.float32(np.inf)
    sc = ws[: rows * lds].reshape((rows, lds))
    offs = ws[rows * lds : rows * lds + 4 * rows].view(np.int64)
    inv = ws[rows * lds + 4 * rows : rows * lds + 5 * rows]
    sa, oa = sc.ctypes.data, out.ctypes.data
    ros = offs.ctypes.data + rows * 8
    # 1. scores: the block's query rows (q's row stride) times each panel of K^T (D deep),
    # whole panels (the score rows are padded to lds; the zero keys past s_len are never read)
    q0 = qa + (b * qs0 + r0 * qs1 + h * d) * 4
    for j in range(pk.shape[0]):
        ba = pk[j].ctypes.data
        for p in range(0, m, mr):
            c = sa + (p * lds + j * nr) * 4
            _tile(min(mr, m - p), (q0 + p * qs1 * 4, qs1, ba, nr, d, c, lds, 0))
    # 2. softmax numerators in place, 1 / denominators aside
    for r in range(m):
        s = sc[r]
        if has_mask:
            mx = _masked_max(s, mask[b], s_len)
            if mx == ninf:  # no key to attend to: zeros, as the reference
                for e in range(s_len):
                    s[e] = 0.0
                inv[r] = 0.0
                continue
            inv[r] = np.float32(1.0) / _masked_exp(s, mask[b], s_len, mx, scale)
        else:
            inv[r] = np.float32(1.0) / _softmax_row(s, s_len, scale)
    # 3. out = P V (S deep), written in place, scaled by 1 / sum as it is stored; a head whose
    # last panel is partial (D not a multiple of NR) takes sgemm's masked kernel, then the scaling
    if d % nr == 0:
        ia = inv.ctypes.data
        for pp in range(d // nr):
            if vt[0]:  # v's rows in place: this panel's NR features of each key, at v's stride
                ba, ldb = vt[0] + (b * vt[1] + h * d + pp * nr) * 4, vt[2]
            else:
                ba, ldb = pv[pp].ctypes.data, nr
            for p in range(0, m, mr):
                c = oa + (b * os0 + (r0 + p) * os1 + h * d + pp * nr) * 4
                _tile(min(mr, m - p), (sa + p * lds * 4, lds, ba, ldb, s_len, c, os1, ia + p * 4))
        return
    for pp in range(pv.shape[0]):
        ba = pv[pp].ctypes.data
        nc = min(nr, d - pp * nr)
        for p in range(0, m, mr):
            c = oa + (b * os0 + (r0 + p) * os1 + h * d + pp * nr) * 4
            args = (sa, ros + p * 8, ros, 1, s_len, ba, c, os1, nc)
            _micro(min(mr, m - p), args + (oa, oa, 0, ninf, pinf, 0, 0))
    for r in range(m):
        o = out[b, r0 + r]
        for e in range(h * d, (h + 1) * d):
            o[e] *= inv[r]


def _softmax_row_py(s, n, scale):  # pragma: no cover - compiled
    """s[:n] <- exp((s - max) * scale); returns the sum (vecmath's full-width IR loop)."""
    return _softmax_ext(s.ctypes.data, n, scale)


def _masked_max_py(s, ok, n):  # pragma: no cover - compiled
    """max of s[j] over the keys with ok[j] (-inf when none)."""
    m = np.float32(-np.inf)
    for j in range(n):
        if ok[j]:
            m = max(m, s[j])
    return m


def _masked_exp_py(s, ok, n, mx, scale):  # pragma: no cover - compiled
    """s[:n] <- exp((s - mx) * scale) where ok, 0 elsewhere; returns the sum."""
    ms = mx * scale
    tot = np.float32(0.0)
    for j in range(n):
        e = _expf(s[j] * scale - ms) if ok[j] else np.float32(0.0)
        s[j] = e
        tot += e
    return tot


prange = range
_expf = _softmax_ext = _softmax_row = _masked_max = _masked_exp = _fetch_add = _task = None
_tile = _pack_one = _ld = _vptr = carray = None  # bound by _build
TASKS_PER_GRAB = 2  # blocks a worker takes from the queue at a time (one head's, mostly)
# a call with at least this many (batch, head) pairs per thread, of at most this many keys, runs
# a task per head that packs its own K and V (no pack job before it; see _attention_items_py)
PER_HEAD_TASKS = 4
PER_HEAD_MAX_KEYS = 512
# P V reads v where it lies when a head is whole panels (D a multiple of NR) and the keys are
# few: no copy of V. In one process alternating (ad hoc, 2 threads): ViT-B/16 b1's attention
# 5.36 -> 4.90 ms, MiniLM-L6 b1's 1.61 -> 1.33 ms (medians); Whisper's 1500 keys (rows 4.6 KB
# apart in the fused qkv, every query block walking all of them) took 8.45 -> 8.71 ms a layer
V_IN_PLACE = True


def _build() -> dict:
    """Compile (or load from numba's cache) the kernels; {} without numba or microkernels."""
    from ember.kernels.cpu import gemm as G
    from ember.kernels.cpu import pool, vecmath

    nb = numba_or_none()
    micro = G.microkernel()
    if nb is None or micro is None or vecmath.symbols() is None or pool.state() is None:
        return {}
    tile, mr, nr = micro  # the microkernels are compiled and their symbols registered by now
    g = globals()
    w, nv, _ = G.ISAS[G.isa()]
    names = [f"ember_attn_tile_{m}" for m in range(1, TILE_ROWS_MAX + 1)]
    _ENGINE.append(G.jit_ir([_tile_ir(m, nv, w) for m in range(1, TILE_ROWS_MAX + 1)], names))
    i8 = nb.types.int64
    for m, name in enumerate(names, 1):
        g[f"_t{m}"] = nb.types.ExternalFunction(name, nb.types.void(*([i8] * 8)))
    sig = nb.types.float32(nb.types.int64, nb.types.int64, nb.types.float32)
    g["_softmax_ext"] = nb.types.ExternalFunction("ember_softmax_row", sig)
    g["_fetch_add"] = nb.types.ExternalFunction("ember_sgemm_fetch_add", i8(i8, i8))
    # the sums may be reassociated (vectorized); no "no-NaN/no-inf" flags: masked keys are -inf
    fm = {"reassoc", "contract", "arcp", "nsz"}
    inline = dict(cache=True, nogil=True, inline="always")
    g.update(_micro=tile, _expf=nb.njit(**inline)(expf), carray=nb.carray)
    g["_ld"], g["_vptr"] = pool.intrinsics()
    g["_pack_one"] = nb.njit(**inline)(_pack_one_py)
    g["_tile"] = nb.njit(**inline)(_tile_py)
    for name in ("_softmax_row", "_masked_max", "_masked_exp"):
        g[name] = nb.njit(fastmath=fm, **inline)(g[name + "_py"])
    # these two link sgemm's microkernels and vecmath's symbols: cache them under names keyed
    # on those modules' source (vecmath.keyed)
    g["_task"] = nb.njit(fastmath=fm, cache=True, nogil=True)(vecmath.keyed(_task_py, G, vecmath))
    sig = nb.types.void(*([i8] * 12))  # the pool's task signature (kernels.cpu.pool)
    tasks = {
        "pack": nb.cfunc(sig, nopython=True, cache=True)(_pack_items_py),
        "attention": nb.cfunc(sig, nopython=True, cache=True, fastmath=fm)(
            vecmath.keyed(_attention_items_py, G, vecmath)
        ),
    }
    return {"mr": mr, "nr": nr, "tasks": tasks, **{k: t.address for k, t in tasks.items()}}


def _kernels() -> dict:
    global _K
    if _K is None:
        _K = _build()
    return _K


def _check(q, k, v, num_heads: int, key_mask) -> None:
    """The kernel follows raw pointers: refuse shapes that would take it out of bounds."""
    same = q.ndim == k.ndim == 3 and k.shape == v.shape
    if not same or (q.shape[0], q.shape[2]) != (k.shape[0], k.shape[2]):
        raise ShapeError(
            f"attention: expected q (B, L, H*D) and k, v (B, S, H*D), got {q.shape}, "
            f"{k.shape}, {v.shape}"
        )
    if num_heads < 1 or q.shape[2] % num_heads:
        raise ShapeError(f"attention: {q.shape[2]} features are not {num_heads} equal heads")
    if key_mask is not None and np.shape(key_mask) != k.shape[:2]:
        raise ShapeError(f"attention: key_mask {np.shape(key_mask)} is not (B, S) = {k.shape[:2]}")
    if any(a.dtype != _F32 for a in (q, k, v)):
        raise DTypeError(
            f"attention: float32 q, k, v expected, got {q.dtype}, {k.dtype}, {v.dtype}"
        )


def _strided_ok(a: np.ndarray) -> bool:
    return a.strides[2] == 4 and all(st >= 0 and st % 4 == 0 for st in a.strides[:2])


def attention(
    q, k, v, num_heads: int, scale: float | None = None, key_mask=None, out=None
) -> np.ndarray:
    """softmax(q k^T * scale) v per head (non-causal); (B, L, H*D), (B, S, H*D) -> (B, L, H*D).

    q, k, v: float32 with the last axis contiguous (views such as column slices of a fused qkv
    matrix are read in place). scale defaults to 1/sqrt(D). key_mask: bool (B, S), True = a key
    to attend to, or None; a query with no key to attend to gets zeros. out: a contiguous
    (B, L, H*D) float32 array to write into (default: a new one).
    """
    from ember.threads import get_num_threads

    threads = get_num_threads()
    if key_mask is None and out is None:
        y = _planned(q, k, v, num_heads, scale, threads)
        if y is not None:
            return y
    _check(q, k, v, num_heads, key_mask)
    b, lq, hd = q.shape
    s_len = k.shape[1]
    d = hd // num_heads
    plan_key = _plan_key(q, k, v, num_heads, scale, threads)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    kern = _kernels()
    if kern:  # the tasks read q, k, v by (batch, row) strides of whole floats, forwards
        strided = [_strided_ok(a) for a in (q, k, v)]
        q, k, v = (a if ok else np.ascontiguousarray(a) for a, ok in zip((q, k, v), strided))
    if not kern or lq == 0 or s_len == 0:
        y = attention_reference(q, k, v, num_heads, scale, key_mask)
        if out is None:
            return y
        out[...] = y
        return out
    from ember.kernels.cpu import pool, workspace

    ws = workspace.local()  # internal buffers: the same memory from call to call
    mr, nr = kern["mr"], kern["nr"]
    npk, npv = -(-s_len // nr), -(-d // nr)
    rows = max(mr, min(8 * mr, SCORE_BLOCK_BYTES // (4 * s_len) // mr * mr))
    heads = b * num_heads
    per_head = s_len <= PER_HEAD_MAX_KEYS and heads >= PER_HEAD_TASKS * threads
    while not per_head and rows > mr and heads * -(-lq // rows) < 2 * threads:
        rows -= mr  # few (batch, head) pairs: smaller blocks, so every thread has work
    # a mask that keeps every key (a padded batch without padding) is no mask: the masked
    # softmax is a scalar loop (MiniLM b1, 128 tokens: 0.25 vs 0.15 ms per layer)
    has_mask = key_mask is not None and not np.all(key_mask)
    mask = np.ascontiguousarray(key_mask, np.bool_) if has_mask else np.ones((1, s_len), np.bool_)
    nwork = rows * npk * nr + 5 * rows  # _task_py's scratch (+ a head's K and V: per_head)
    if per_head:
        workers = min(threads, heads)
        bufs = (("attention.work", (workers, nwork + (npk * d + npv * s_len) * nr)),)
    else:
        workers = max(1, min(threads, heads * -(-lq // rows)))
        bufs = (("attention.work", (workers, nwork)), ("attention.k", (b, num_heads, npk, d, nr)),
                ("attention.v", (b, num_heads, npv, s_len, nr)))  # fmt: skip
    arrays = tuple(ws(name, shape) for name, shape in bufs)
    work = arrays[0]
    pk, pv = (work, work) if per_head else arrays[1:]  # (per head: unused)
    planned = out is None and not has_mask and all(strided)
    if out is None:
        out = np.empty((b, lq, hd), _F32)
    elif out.shape != (b, lq, hd) or out.dtype != _F32 or not out.flags.c_contiguous:
        raise ValueError(f"attention: out must be a contiguous float32 {(b, lq, hd)} array")
    queue = np.zeros(1, np.int64)  # the next task (see _attention_items_py)
    w = [0] * W_WORDS
    w[W_QA], w[W_QS0], w[W_QS1] = q.ctypes.data, q.strides[0] // 4, q.strides[1] // 4
    w[W_LQ], w[W_HD], w[W_NB], w[W_HEADS], w[W_D] = lq, hd, b, num_heads, d
    w[W_PK], w[W_NPK], w[W_NR] = pk.ctypes.data, npk, nr
    w[W_PV], w[W_NPV], w[W_SLEN] = pv.ctypes.data, npv, s_len
    w[W_MASK], w[W_MASKB], w[W_HASMASK] = mask.ctypes.data, mask.shape[0], int(has_mask)
    w[W_SCALE] = int(_F32(scale).view(np.int32))
    w[W_ROWS], w[W_MR], w[W_QUEUE], w[W_OUT] = rows, mr, queue.ctypes.data, out.ctypes.data
    w[W_WORK], w[W_WORKN], w[W_WORKERS] = work.ctypes.data, work.shape[1], workers
    w[W_PER_HEAD] = int(per_head)
    in_place = V_IN_PLACE and d % nr == 0 and s_len <= PER_HEAD_MAX_KEYS
    w[W_VIN] = v.ctypes.data if in_place else 0
    for i, a in ((W_KA, k), (W_VA, v)):  # k, v: flat from their first float to their last
        s0, s1 = a.strides[0] // 4, a.strides[1] // 4
        w[i], w[i + 1], w[i + 2] = a.ctypes.data, s0, s1
        w[i + 3] = (b - 1) * s0 + (s_len - 1) * s1 + hd
    desc = np.array(w, np.int64)
    if planned:
        plans = _plans()
        if len(plans) >= PLANS_KEPT:
            plans.clear()
        plans[plan_key] = (desc.copy(), bufs, arrays, mask, queue, per_head, workers, heads,
                           in_place)  # fmt: skip
    if not per_head:
        pool.run_items(kern["pack"], desc.ctypes.data, heads)
    pool.run_items(kern["attention"], desc.ctypes.data, workers)
    return out


# A call's job description for the last few operand layouts, per thread (its workspace's buffers
# are its own): a transformer calls its attention with the same shapes in every layer, and
# building and checking the description was ~17 of a call's ~20 us of Python (MiniLM-L6 b1's
# attention kernel takes ~130 us a layer).
PLANS_KEPT = 8
_PLAN_LOCAL = threading.local()


def _plans() -> dict:
    plans = getattr(_PLAN_LOCAL, "plans", None)
    if plans is None:
        plans = _PLAN_LOCAL.plans = {}
    return plans


def _plan_key(q, k, v, num_heads: int, scale, threads: int) -> tuple:
    """What a kept job depends on: the operands' layouts, the call's settings, the schedule's."""
    return (q.shape, k.shape, v.shape, q.strides, k.strides, v.strides, q.dtype, k.dtype,
            v.dtype, num_heads, scale, threads, PER_HEAD_TASKS, PER_HEAD_MAX_KEYS, V_IN_PLACE,
            SCORE_BLOCK_BYTES)  # fmt: skip


def _planned(q, k, v, num_heads: int, scale, threads: int) -> np.ndarray | None:
    """attention() without a key mask by the job kept for these operands' layout (see
    ``PLANS_KEPT``), or None when there is none (or its workspace buffers were replaced)."""
    plan = _plans().get(_plan_key(q, k, v, num_heads, scale, threads))
    if plan is None:
        return None
    desc, bufs, arrays, _mask, queue, per_head, workers, heads, in_place = plan
    from ember.kernels.cpu import pool, workspace

    ws = workspace.local()
    for (name, shape), a in zip(bufs, arrays):
        if ws(name, shape) is not a:  # another call took the name for other shapes
            return None
    b, lq, hd = q.shape
    out = np.empty((b, lq, hd), _F32)
    queue[0] = 0
    desc[W_QA], desc[W_OUT] = q.ctypes.data, out.ctypes.data
    ka, va = k.ctypes.data, v.ctypes.data
    desc[W_KA], desc[W_VA], desc[W_VIN] = ka, va, va if in_place else 0
    kern = _kernels()
    if not per_head:
        pool.run_items(kern["pack"], desc.ctypes.data, heads)
    pool.run_items(kern["attention"], desc.ctypes.data, workers)
    return out


# ------------------------------------------------------------------ the ops' kernels
# varlen_attn (ember.ops.attention) on packed sequences, and scaled_dot_product_attention
# (ember.nn.functional) on dense batches: float32, no gradient recorded, non-causal, as many
# key heads as query heads.

# A packed batch's short sequences (an encoder's sentences) go to a plain numba loop over
# (sequence, head) pairs, which runs on the calling thread (it sits between BLAS calls, and
# handing work from BLAS's threads to numba's costs more than it takes) until the batch holds
# this many multiply-adds (features * sum of lq * lk); sequences of at least BLOCKED_MIN_KEYS
# keys go to the blocked kernel above.
PARALLEL_VARLEN_WORK = 1 << 24
BLOCKED_MIN_KEYS = 128
# scaled_dot_product_attention's kernel needs this many queries: the blocked kernel packs K and
# V on every call, which a decoding step (one query against a long cache) cannot amortize
SDPA_MIN_QUERIES = 8


def _varlen_py(q, k, v, cu_q, cu_k, scale, out):  # pragma: no cover - compiled
    """out[t, h] = softmax(q[t, h] . k[s, h] * scale) v[s, h] over sequence t's keys s."""
    nh, d, dv = q.shape[1], q.shape[2], v.shape[2]
    for p in prange((cu_q.shape[0] - 1) * nh):
        b = p // nh
        h = p - b * nh
        q0, k0 = cu_q[b], cu_k[b]
        lq, lk = cu_q[b + 1] - q0, cu_k[b + 1] - k0
        if lq <= 0:
            continue
        if lk <= 0:
            for i in range(lq):
                out[q0 + i, h, :] = 0.0
            continue
        kt = np.empty((d, lk), np.float32)  # keys transposed: the score loop runs along j
        for j in range(lk):
            kj = k[k0 + j, h]
            for e in range(d):
                kt[e, j] = kj[e]
        s = np.empty(lk, np.float32)
        o = np.empty(dv, np.float32)
        for i in range(lq):
            qi = q[q0 + i, h]
            s[:] = 0.0
            for e in range(d):
                qe = qi[e] * scale
                ke = kt[e]
                for j in range(lk):
                    s[j] += qe * ke[j]
            mx = s[0]
            for j in range(1, lk):
                mx = max(mx, s[j])
            den = np.float32(0.0)
            for j in range(lk):
                s[j] = np.exp(s[j] - mx)
                den += s[j]
            inv = np.float32(1.0) / den
            o[:] = 0.0
            for j in range(lk):
                w = s[j] * inv
                vj = v[k0 + j, h]
                for e in range(dv):
                    o[e] += w * vj[e]
            oi = out[q0 + i, h]
            for e in range(dv):
                oi[e] = o[e]


_VARLEN: dict = {}


def _varlen_kernel(parallel: bool):
    if not _VARLEN:
        nb = numba_or_none()
        globals()["prange"] = nb.prange
        fm = {"reassoc", "contract", "arcp", "nsz"}
        _VARLEN[False] = jit(_varlen_py, fastmath=fm)
        _VARLEN[True] = jit(_varlen_py, suffix="parallel", fastmath=fm, parallel=True)
    return _VARLEN[parallel]


def varlen_attn_reference(q, k, v, *, cu_q, cu_k, scale, window, rep):
    """varlen_attn's kernel in numpy: each sequence through ``attention_reference``."""
    tq, nh, d = q.shape
    out = np.zeros((tq, nh, v.shape[2]), _F32)
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = (int(c) for c in (cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]))
        if q1 > q0 and k1 > k0:
            y = attention_reference(
                q[None, q0:q1].reshape(1, q1 - q0, nh * d),
                k[None, k0:k1].reshape(1, k1 - k0, nh * d),
                v[None, k0:k1].reshape(1, k1 - k0, -1),
                nh,
                scale,
            )
            out[q0:q1] = y.reshape(q1 - q0, nh, -1)
    return out


def _varlen_applies(q, k, v, *, cu_q, cu_k, scale, window, rep) -> bool:
    return rep == 1 and window == (-1, -1)


@register(
    "varlen_attn", reference=varlen_attn_reference, when=_varlen_applies, available=have_numba
)
def varlen_attn(q, k, v, *, cu_q, cu_k, scale, window, rep) -> np.ndarray:
    """Attention within each packed sequence of (tokens, heads, head_dim) float32 arrays."""
    q, k, v = (np.ascontiguousarray(a) for a in (q, k, v))
    tq, nh, d = q.shape
    out = np.empty((tq, nh, v.shape[2]), _F32)
    nq, nk = np.diff(cu_q), np.diff(cu_k)
    if nk.size and nk.max() >= BLOCKED_MIN_KEYS and v.shape[2] == d and _kernels():
        # long sequences: the blocked kernel, one call per sequence, or one for all of them
        # when they have the same length
        hd = nh * d
        if (nq == nq[0]).all() and (nk == nk[0]).all() and nq[0] > 0 and nk[0] > 0:
            b, lq, lk = nq.size, int(nq[0]), int(nk[0])
            y = out.reshape(b, lq, hd)
            attention(q.reshape(b, lq, hd), k.reshape(b, lk, hd), v.reshape(b, lk, hd), nh,
                      scale, out=y)  # fmt: skip
            return out
        small = []
        for i in range(nq.size):
            q0, q1, k0, k1 = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
            if nk[i] >= BLOCKED_MIN_KEYS and q1 > q0:
                y = out[q0:q1].reshape(1, q1 - q0, hd)
                attention(q[None, q0:q1].reshape(1, -1, hd), k[None, k0:k1].reshape(1, -1, hd),
                          v[None, k0:k1].reshape(1, -1, hd), nh, scale, out=y)  # fmt: skip
            else:
                small.append(i)
        if not small:
            return out
        for i in small:  # the rest through the loop kernel, one sequence at a time
            sl = slice(int(cu_q[i]), int(cu_q[i + 1]))
            sk = slice(int(cu_k[i]), int(cu_k[i + 1]))
            one = np.array([0, sl.stop - sl.start], np.int64)
            onek = np.array([0, sk.stop - sk.start], np.int64)
            _varlen_kernel(False)(q[sl], k[sk], v[sk], one, onek, _F32(scale), out[sl])
        return out
    work = nh * d * int((nq * nk).sum())
    kern = _varlen_kernel(work >= PARALLEL_VARLEN_WORK)
    kern(q, k, v, cu_q.astype(np.int64, copy=False), cu_k.astype(np.int64, copy=False),
         _F32(scale), out)  # fmt: skip
    return out


def _heads_last(a: np.ndarray) -> np.ndarray:
    """(B, H, L, D) -> (B, L, H*D), a view when the heads sit side by side in memory."""
    b, h, n, d = a.shape
    return a.transpose(0, 2, 1, 3).reshape(b, n, h * d)


def _sdpa_applies(q, k, v, *m, scale, causal, rep, dropout_p) -> bool:
    if causal or rep != 1 or dropout_p or q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        return False
    if q.dtype != _F32 or k.dtype != _F32 or v.dtype != _F32:
        return False
    b, h, lq, d = q.shape
    if k.shape[:2] != (b, h) or v.shape != k.shape or k.shape[3] != d or lq < SDPA_MIN_QUERIES:
        return False
    if m:  # a key-padding mask only: bool (B or 1, 1, 1, S)
        mk = m[0]
        if mk.dtype != np.bool_ or mk.ndim != 4 or mk.shape[1:3] != (1, 1):
            return False
        if mk.shape[0] not in (1, b) or mk.shape[3] != k.shape[2]:
            return False
    return True


def sdpa_reference(q, k, v, *m, scale, causal, rep, dropout_p) -> np.ndarray:
    """scaled_dot_product_attention's kernel in numpy (``attention_reference`` per head)."""
    b, h, lq, d = q.shape
    mask = None if not m else np.broadcast_to(m[0][:, 0, 0, :], (b, k.shape[2]))
    y = attention_reference(_heads_last(q), _heads_last(k), _heads_last(v), h, scale, mask)
    return y.reshape(b, lq, h, d).transpose(0, 2, 1, 3)


@register(
    "scaled_dot_product_attention",
    reference=sdpa_reference,
    dtypes=None,  # float32 q, k, v and a bool mask: checked in _sdpa_applies
    when=_sdpa_applies,
    available=lambda: bool(_kernels()),
)
def sdpa_blocked(q, k, v, *m, scale, causal, rep, dropout_p) -> np.ndarray:
    """Dense (B, H, L, D) attention through the blocked kernel; the heads are read in place."""
    b, h, lq, d = q.shape
    mask = None if not m else np.broadcast_to(m[0][:, 0, 0, :], (b, k.shape[2]))
    y = attention(_heads_last(q), _heads_last(k), _heads_last(v), h, scale, mask)
    return y.reshape(b, lq, h, d).transpose(0, 2, 1, 3)
