"""Packed-weight float32 GEMM for channels-last convolutions and linear layers.

    y[p, o] = act(sum over taps t, channels k of a[rowoff[p] + tapoff[t] + k] * w[t*kc + k, o]
                  + bias[o] [+ res[p, o]])

With activations stored NHWC and zero-padded, output pixel p of a kxk convolution reads, for tap
(i, j), the kc = C contiguous floats of input pixel (oy*sh + i, ox*sw + j): a fixed offset
``tapoff[t]`` from the pixel's own ``rowoff[p]``. So a convolution is a GEMM whose A operand is
never materialised (no im2col; an "implicit GEMM"), a strided 1x1 convolution reads its input in
place, and a linear layer is the case of one tap with ``rowoff[p] = p * in_features``.

Why not BLAS: OpenBLAS packs both operands on every call. A ResNet layer at batch 1 is a
GEMM of a few hundred rows, so that packing (and the im2col before it) costs as much as the
multiply. Here the weight is packed once, when the model is optimised, into panels of NR output
channels (``pack_weight``: (panels, K, NR), zero-padded), and A is read where it lies.

The inner loop is a register-blocked microkernel written in LLVM IR and compiled with llvmlite
(numba's own compiler back end) for the host CPU: MR rows x NR columns of accumulators held in
vector registers (AVX-512: 12 x 32 floats in 24 zmm registers; AVX2: 6 x 16 in 12 ymm), one
broadcast of A and NR/W vector loads of B per FMA row. numba does not emit this loop by itself
(its vectoriser keeps the accumulators in memory, and LLVM keeps to 256-bit vectors on AVX-512
CPUs unless a function asks for 512), hence the hand-written IR. Its channel loop is unrolled
by UNROLL (the 12 row pointers of a tile do not fit the spare registers, and their reloads and
the loop's bookkeeping were paid on every step: one thread, 784x128x512, 237 -> 248 GFLOP/s,
~270 peak). Its store adds the bias and residual and clamps (ReLU/ReLU6) while the tile is in
registers; outputs of STREAM_BYTES or more are written with non-temporal stores. bench/gemm.py compares it on
the zoo's shapes with numpy's OpenBLAS and torch: per product it is level with OpenBLAS (ahead
on small-M and conv shapes, where OpenBLAS packs A and needs an im2col) and 3-25% behind
torch's MKL/oneDNN; in a whole network it wins by never repacking and never copying.
The microkernels are registered as symbols that a numba driver (``_driver_py``) calls; it
blocks K so that the panel rows in use stay in L1 (see its docstring; a linear's K is one block,
``linear_k_block``: the accumulators' reloads cost more there). Small products run it on
the calling thread; larger ones are cut into tasks (blocks of pixels times groups of panels)
that ember's worker pool hands out by work claiming (kernels.cpu.pool_tasks: a preempted thread
never holds the product up, as numba's barrier did on a busy machine).

Behind ops: a weight packed once is a ``PackedWeight`` (an ndarray with the weight's values that
carries its panels; ember.inference.pack makes them), and the ops pick the GEMM by that weight
type: ``linear_packed`` here is the ``linear`` op's kernel (any number of rows),
kernels.cpu.conv has those of ``conv2d`` and ``fused_conv2d`` (the implicit GEMM over NHWC
input).

Every entry point has a numpy reference (``gemm_reference``, ``linear_reference``) that tests
compare against; where llvmlite/numba or AVX2+FMA are missing (EMBER_NO_NUMBA=1) nothing is
packed and the ops' numpy forwards run. EMBER_SGEMM_ISA=avx2 runs the AVX2 family on an AVX-512
machine (the tests check it), =none the numpy path.
"""

from __future__ import annotations

import numpy as np

from ember import config
from ember.errors import DTypeError, ShapeError
from ember.kernels.cpu import numba_or_none, renamed
from ember.kernels.registry import register

_STATE: dict = {}
MR_MAX = 12  # microkernels are built for 1..MR_MAX rows; the ISA's MR may be smaller


# ------------------------------------------------------------------ numpy reference
def gemm_reference(a, rowoff, tapoff, kc, w2, bias, res, act, out) -> np.ndarray:
    """out (M, O) = act(A @ w2 + bias [+ res]) with A[p, t*kc + k] = a[rowoff[p] + tapoff[t] + k]."""
    idx = rowoff[:, None, None] + tapoff[None, :, None] + np.arange(kc)[None, None, :]
    y = a[idx.reshape(len(rowoff), -1)] @ w2 if len(rowoff) else out
    y = y + bias if res is None else y + bias + res
    if act == 1:
        y = np.maximum(y, 0)
    elif act == 2:
        y = np.clip(y, 0, 6)
    out[...] = y
    return out


def pack_weight(w2: np.ndarray, nr: int) -> np.ndarray:
    """(K, O) float32 -> (ceil(O / nr), K, nr) panels, the last one zero-padded."""
    k, o = w2.shape
    p = -(-o // nr)
    padded = np.zeros((k, p * nr), np.float32)
    padded[:, :o] = w2
    return np.ascontiguousarray(padded.reshape(k, p, nr).transpose(1, 0, 2))


# ------------------------------------------------------------------ LLVM IR microkernels
ISAS = {"avx512": (16, 2, 12), "avx2": (8, 2, 6)}  # vector width W, vectors per row NV, rows MR


def _isa(features: dict) -> str | None:
    """The best microkernel family for the host (EMBER_SGEMM_ISA=avx2/none picks a lower one)."""
    best = None
    if features.get("avx2") and features.get("fma"):
        best = "avx2"
        if features.get("avx512f") and features.get("avx512vl"):
            best = "avx512"
    want = config.SGEMM_ISA
    if want in ("none", "avx2") and best is not None:
        return None if want == "none" else "avx2"
    return best


UNROLL = 4  # k steps per trip of the microkernel's inner loop (then single steps)
PF_TILES = 2  # the rows-first order prefetches the residual and output rows this many tiles on
PF_EVERY = 2  # one prefetch of the next block per this many k steps


def _step_ir(p, kk, u, g, bt, src, dst, rows, vecs, w, nr, prefetch) -> list[str]:
    """One k step (index kk + u) of the microkernel: dst accumulators = src + a_r * b."""
    vt = f"<{w} x float>"
    s = [f"  %{p}k = add i64 {kk}, {u}", f"  %{p}bo = mul i64 %{p}k, {nr}"]
    s += [f"  %{p}b = getelementptr float, ptr {bt}, i64 %{p}bo"]
    if prefetch:  # a line of the next block of B into L2: pf + 64 * min(g, npf - 1)
        s += [f"  %{p}gq = add i64 {g}, {u // PF_EVERY}"]
        s += [f"  %{p}gi = call i64 @llvm.umin.i64(i64 %{p}gq, i64 %pfl)"]
        s += [f"  %{p}go = shl i64 %{p}gi, 6", f"  %{p}gp = getelementptr i8, ptr %pf0, i64 %{p}go"]
        s += [f"  call void @llvm.prefetch.p0(ptr %{p}gp, i32 0, i32 2, i32 1)"]
    for v in vecs:
        s += [f"  %{p}bp{v} = getelementptr float, ptr %{p}b, i64 {v * w}"]
        s += [f"  %{p}bv{v} = load {vt}, ptr %{p}bp{v}, align 4"]
    for r in rows:
        s += [f"  %{p}aq{r} = getelementptr float, ptr %ap{r}, i64 %{p}k"]
        s += [f"  %{p}as{r} = load float, ptr %{p}aq{r}, align 4"]
        s += [f"  %{p}ai{r} = insertelement {vt} poison, float %{p}as{r}, i32 0"]
        s += [
            f"  %{p}av{r} = shufflevector {vt} %{p}ai{r}, {vt} poison, <{w} x i32> zeroinitializer"
        ]
        for v in vecs:
            x = (r, v)
            s += [
                f"  {dst[x]} = call {vt} @llvm.fma.v{w}f32({vt} %{p}av{r}, {vt} %{p}bv{v}, {vt} {src[x]})"
            ]
    return s


def _kernel_ir(mr: int, nv: int, w: int) -> str:
    """C[mr x nv*w] = sum_t sum_k A[row_r + tapoff[t] + k] * B[t*kc + k, :] (masked store)."""
    nr, vt = nv * w, f"<{w} x float>"
    rows, vecs = range(mr), range(nv)
    acc = [(r, v) for r in rows for v in vecs]
    s = [
        f"define void @ember_sgemm_{mr}(i64 %ai, i64 %roi, i64 %toi, i64 %ntaps, i64 %kc,"
        " i64 %bi, i64 %ci, i64 %ldc, i64 %ncols, i64 %biasi, i64 %resi, i64 %flags,"
        " float %lof, float %hif, i64 %pfi, i64 %npf) #0 {",
        "entry:",
        "  %pf0 = inttoptr i64 %pfi to ptr",
        "  %npf0 = icmp eq i64 %npf, 0",
        "  %npf1 = sub i64 %npf, 1",
        "  %pfl = select i1 %npf0, i64 0, i64 %npf1",
        "  br label %start",
        "start:",
        "  %a = inttoptr i64 %ai to ptr",
        "  %ro = inttoptr i64 %roi to ptr",
        "  %to = inttoptr i64 %toi to ptr",
        "  %b = inttoptr i64 %bi to ptr",
        "  %c = inttoptr i64 %ci to ptr",
    ]
    for r in rows:
        s += [f"  %rp{r} = getelementptr i64, ptr %ro, i64 {r}", f"  %ro{r} = load i64, ptr %rp{r}"]
    s += ["  br label %tap", "tap:"]  # loop over taps: row pointers move by tapoff[t]
    s += [
        "  %t = phi i64 [0, %start], [%t1, %tapend]",
        "  %bt = phi ptr [%b, %start], [%bn, %tapend]",
        "  %gt = phi i64 [0, %start], [%ge, %tapend]",
    ]
    s += [f"  %T{r}_{v} = phi {vt} [zeroinitializer, %start], [%E{r}_{v}, %tapend]" for r, v in acc]
    s += ["  %tp = getelementptr i64, ptr %to, i64 %t", "  %toff = load i64, ptr %tp"]
    for r in rows:
        s += [
            f"  %o{r} = add i64 %ro{r}, %toff",
            f"  %ap{r} = getelementptr float, ptr %a, i64 %o{r}",
        ]
    # the kc channels of one tap: UNROLL steps per trip while they last, then single steps;
    # addresses are row base + index (the unrolled steps are displacements off one index)
    s += [f"  %kcu = and i64 %kc, {-UNROLL}", "  %hasu = icmp ne i64 %kcu, 0"]
    s += ["  br i1 %hasu, label %ku, label %kmid", "ku:"]
    s += ["  %uk = phi i64 [0, %tap], [%uk1, %ku]", "  %ug = phi i64 [%gt, %tap], [%ug1, %ku]"]
    s += [
        f"  %U{r}_{v} = phi {vt} [%T{r}_{v}, %tap], [%V{UNROLL - 1}_{r}_{v}, %ku]" for r, v in acc
    ]
    for u in range(UNROLL):
        src = {x: f"%U{x[0]}_{x[1]}" if u == 0 else f"%V{u - 1}_{x[0]}_{x[1]}" for x in acc}
        s += _step_ir(f"u{u}_", "%uk", u, "%ug", "%bt", src, {x: f"%V{u}_{x[0]}_{x[1]}" for x in acc},
                      rows, vecs, w, nr, u % PF_EVERY == 0)  # fmt: skip
    s += [f"  %uk1 = add i64 %uk, {UNROLL}", f"  %ug1 = add i64 %ug, {UNROLL // PF_EVERY}"]
    s += ["  %uc = icmp ult i64 %uk1, %kcu", "  br i1 %uc, label %ku, label %kmid", "kmid:"]
    s += ["  %mk = phi i64 [0, %tap], [%uk1, %ku]", "  %mg = phi i64 [%gt, %tap], [%ug1, %ku]"]
    last = f"%V{UNROLL - 1}"
    s += [f"  %M{r}_{v} = phi {vt} [%T{r}_{v}, %tap], [{last}_{r}_{v}, %ku]" for r, v in acc]
    s += ["  %rem = icmp ult i64 %mk, %kc", "  br i1 %rem, label %k, label %tapend", "k:"]
    s += ["  %kk = phi i64 [%mk, %kmid], [%kk1, %k]", "  %g = phi i64 [%mg, %kmid], [%g1, %k]"]
    s += [f"  %K{r}_{v} = phi {vt} [%M{r}_{v}, %kmid], [%N{r}_{v}, %k]" for r, v in acc]
    s += _step_ir("s_", "%kk", 0, "%g", "%bt", {x: f"%K{x[0]}_{x[1]}" for x in acc},
                  {x: f"%N{x[0]}_{x[1]}" for x in acc}, rows, vecs, w, nr, True)  # fmt: skip
    s += ["  %g1 = add i64 %g, 1", "  %kk1 = add i64 %kk, 1", "  %kc1 = icmp ult i64 %kk1, %kc"]
    s += ["  br i1 %kc1, label %k, label %tapend", "tapend:"]
    s += [f"  %E{r}_{v} = phi {vt} [%M{r}_{v}, %kmid], [%N{r}_{v}, %k]" for r, v in acc]
    s += ["  %ge = phi i64 [%mg, %kmid], [%g1, %k]"]
    s += [f"  %kcn = mul i64 %kc, {nr}", "  %bn = getelementptr float, ptr %bt, i64 %kcn"]
    s += ["  %t1 = add i64 %t, 1", "  %tc = icmp ult i64 %t1, %ntaps"]
    s += ["  br i1 %tc, label %tap, label %store", "store:"]
    # store: + C (flags & 1: accumulate onto an earlier block of K), + bias (flags & 2), +
    # residual (flags & 4), clamp to [lo, hi] (NaN kept)
    s += ["  %nc = trunc i64 %ncols to i32"]
    for bit, name in ((1, "fa"), (2, "fb"), (4, "fr")):
        s += [f"  %{name}b = and i64 %flags, {bit}", f"  %{name} = icmp ne i64 %{name}b, 0"]
    s += ["  %bias = inttoptr i64 %biasi to ptr", "  %res = inttoptr i64 %resi to ptr"]
    s += [f"  %lo = insertelement {vt} poison, float %lof, i32 0"]
    s += [f"  %lov = shufflevector {vt} %lo, {vt} poison, <{w} x i32> zeroinitializer"]
    s += [f"  %hi = insertelement {vt} poison, float %hif, i32 0"]
    s += [f"  %hiv = shufflevector {vt} %hi, {vt} poison, <{w} x i32> zeroinitializer"]
    for r in rows:
        s += [
            f"  %co{r} = mul i64 %ldc, {r}",
            f"  %cr{r} = getelementptr float, ptr %c, i64 %co{r}",
        ]
        s += [f"  %er{r} = getelementptr float, ptr %res, i64 %co{r}"]
    s += ["  %ntb = and i64 %flags, 8", "  %ntf = icmp ne i64 %ntb, 0"]
    # a full panel: plain loads and stores (_full_store_ir), but for a residual added in one
    # block of K in the panel order (flags & 16 asks for it anyway: the rows-first order's)
    s += [f"  %full = icmp eq i64 %ncols, {nr}", "  %nofr = xor i1 %fr, true"]
    s += ["  %frqb = and i64 %flags, 16", "  %frq = icmp ne i64 %frqb, 0"]
    s += ["  %plain0 = or i1 %nofr, %fa", "  %plain1 = or i1 %plain0, %frq"]
    s += ["  %fast = and i1 %full, %plain1"]
    s += ["  br i1 %fast, label %sfull, label %smask"]
    s += _full_store_ir(rows, vecs, w)
    body, masked, streamed = _masked_store_ir(rows, vecs, w)
    s += ["smask:", *body]
    s += ["  %usent = and i1 %ntf, %full", "  br i1 %usent, label %snt, label %spart"]
    s += ["snt:", *streamed, "  call void @llvm.x86.sse.sfence()", "  ret void"]
    s += ["spart:", *masked, "  ret void", "}"]
    return "\n".join(s)


def _clamp_ir(p: str, x: str, z: str, vt: str, w: int) -> list[str]:
    """%{p}f{x} = z clamped to [%lov, %hiv] (a NaN stays NaN)."""
    return [
        f"  %{p}ql{x} = fcmp olt {vt} {z}, %lov",
        f"  %{p}u{x} = select <{w} x i1> %{p}ql{x}, {vt} %lov, {vt} {z}",
        f"  %{p}qh{x} = fcmp ogt {vt} %{p}u{x}, %hiv",
        f"  %{p}f{x} = select <{w} x i1> %{p}qh{x}, {vt} %hiv, {vt} %{p}u{x}",
    ]


def _full_store_ir(rows, vecs, w: int) -> list[str]:
    """The store of a full panel (ncols == NR): plain loads and stores, a straight-line
    epilogue for each of accumulate (flags & 1) x residual (flags & 4), so a tile loads only
    what it adds (the masked form also issued C's and the residual's loads under zero masks).
    One thread, A and B in L1 (rows x K x outputs): 1200 x 256 x 64 244 -> 252 GFLOP/s,
    1200 x 64 x 256 202 -> 233, 1200 x 1024 x 32 in blocks of 256 242 -> 255. ResNet-50 b1, 2
    threads, one process alternating the two forms (30 passes each): its 1x1 convs 1-8 % and
    layer1's 64 -> 256 + residual (rows-first) 4 % faster, the sum of its nodes 19.47 -> 19.11
    ms. A residual added in one block of K in the panel order keeps the masked form: layer3's
    256 -> 1024 + residual convs (written over the residual, rows 4 KB apart) took 3-4 %
    longer plainly in the network, though not alone (not understood). flags & 8: non-temporal
    stores and an sfence, as in the masked form."""
    vt = f"<{w} x float>"
    s = ["sfull:"]
    for v in vecs:
        s += [f"  %bsp{v} = getelementptr float, ptr %bias, i64 {v * w}"]
        s += [f"  %bl{v} = load {vt}, ptr %bsp{v}, align 4"]
        s += [f"  %bs{v} = select i1 %fb, {vt} %bl{v}, {vt} zeroinitializer"]
    s += ["  br i1 %fa, label %sfa1, label %sfa0"]
    for fa in (0, 1):
        s += [f"sfa{fa}:", f"  br i1 %fr, label %sf{fa}1, label %sf{fa}0"]
    for fa in (0, 1):
        for fr in (0, 1):
            p = f"v{fa}{fr}_"
            s += [f"sf{fa}{fr}:"]
            plain, streamed = [], []
            for r in rows:
                for v in vecs:
                    x = f"{r}_{v}"
                    s += [f"  %{p}cp{x} = getelementptr float, ptr %cr{r}, i64 {v * w}"]
                    z = f"%{p}y{x}"
                    s += [f"  {z} = fadd {vt} %E{x}, %bs{v}"]
                    if fa:
                        s += [f"  %{p}c{x} = load {vt}, ptr %{p}cp{x}, align 4"]
                        s += [f"  %{p}a{x} = fadd {vt} {z}, %{p}c{x}"]
                        z = f"%{p}a{x}"
                    if fr:
                        s += [f"  %{p}ep{x} = getelementptr float, ptr %er{r}, i64 {v * w}"]
                        s += [f"  %{p}e{x} = load {vt}, ptr %{p}ep{x}, align 4"]
                        s += [f"  %{p}z{x} = fadd {vt} {z}, %{p}e{x}"]
                        z = f"%{p}z{x}"
                    s += _clamp_ir(p, x, z, vt, w)
                    plain += [f"  store {vt} %{p}f{x}, ptr %{p}cp{x}, align 4"]
                    streamed += [
                        f"  store {vt} %{p}f{x}, ptr %{p}cp{x}, align {w * 4}, !nontemporal !{{i32 1}}"
                    ]
            s += [f"  br i1 %ntf, label %sn{fa}{fr}, label %sp{fa}{fr}", f"sn{fa}{fr}:", *streamed]
            s += ["  call void @llvm.x86.sse.sfence()", "  ret void", f"sp{fa}{fr}:", *plain]
            s += ["  ret void"]
    return s


def _masked_store_ir(rows, vecs, w: int) -> tuple[list[str], list[str], list[str]]:
    """The general store (a partial last panel, or a residual): masked loads of the bias,
    residual and C under their flags and the panel's ncols columns; returns the computation,
    its masked stores and its non-temporal stores (for a full panel)."""
    vt = f"<{w} x float>"
    s = []
    iota = ", ".join(f"i32 {i}" for i in range(w))
    for v in vecs:
        s += [f"  %lim{v} = sub i32 %nc, {v * w}"]
        s += [f"  %li{v} = insertelement <{w} x i32> poison, i32 %lim{v}, i32 0"]
        s += [
            f"  %ls{v} = shufflevector <{w} x i32> %li{v}, <{w} x i32> poison,"
            f" <{w} x i32> zeroinitializer"
        ]
        s += [f"  %m{v} = icmp slt <{w} x i32> <{iota}>, %ls{v}"]
        for name in ("fa", "fb", "fr"):
            s += [f"  %{name}{v} = select i1 %{name}, <{w} x i1> %m{v}, <{w} x i1> zeroinitializer"]
        s += [f"  %mbp{v} = getelementptr float, ptr %bias, i64 {v * w}"]
        s += [f"  %mbs{v} = call {vt} @llvm.masked.load.v{w}f32.p0(ptr %mbp{v}, i32 4,"]
        s[-1] += f" <{w} x i1> %fb{v}, {vt} zeroinitializer)"
    masked, streamed = [], []
    for r in rows:
        for v in vecs:
            x = f"{r}_{v}"
            s += [f"  %ep{x} = getelementptr float, ptr %er{r}, i64 {v * w}"]
            s += [f"  %e{x} = call {vt} @llvm.masked.load.v{w}f32.p0(ptr %ep{x}, i32 4,"]
            s[-1] += f" <{w} x i1> %fr{v}, {vt} zeroinitializer)"
            s += [f"  %cp{x} = getelementptr float, ptr %cr{r}, i64 {v * w}"]
            s += [f"  %c{x} = call {vt} @llvm.masked.load.v{w}f32.p0(ptr %cp{x}, i32 4,"]
            s[-1] += f" <{w} x i1> %fa{v}, {vt} zeroinitializer)"
            s += [f"  %x{x} = fadd {vt} %E{x}, %c{x}", f"  %y{x} = fadd {vt} %x{x}, %mbs{v}"]
            s += [f"  %z{x} = fadd {vt} %y{x}, %e{x}"]
            s += _clamp_ir("", x, f"%z{x}", vt, w)
            masked += [
                f"  call void @llvm.masked.store.v{w}f32.p0({vt} %f{x}, ptr %cp{x},"
                f" i32 4, <{w} x i1> %m{v})"
            ]
            streamed += [f"  store {vt} %f{x}, ptr %cp{x}, align {w * 4}, !nontemporal !{{i32 1}}"]
    return s, masked, streamed


def prefetch_ir(name: str, write: int, locality: int) -> str:
    """``name(ai, n)``: prefetch n cache lines from address ai on (llvm.prefetch's rw and
    locality: 1, 3 for writing into L1; 0, 2 for reading towards L2)."""
    return "\n".join(
        [
            f"define void @{name}(i64 %ai, i64 %n) {{",
            "entry:",
            "  %z = icmp sle i64 %n, 0",
            "  br i1 %z, label %done, label %loop",
            "loop:",
            "  %i = phi i64 [0, %entry], [%i1, %loop]",
            "  %off = shl i64 %i, 6",
            "  %ad = add i64 %ai, %off",
            "  %p = inttoptr i64 %ad to ptr",
            f"  call void @llvm.prefetch.p0(ptr %p, i32 {write}, i32 {locality}, i32 1)",
            "  %i1 = add i64 %i, 1",
            "  %c = icmp slt i64 %i1, %n",
            "  br i1 %c, label %loop, label %done",
            "done:",
            "  ret void",
            "}",
        ]
    )


def _microkernels_ir(w: int, nv: int) -> list[str]:
    """The microkernels for 1..MR_MAX rows and the shared task counter."""
    parts = [_kernel_ir(mr, nv, w) for mr in range(1, MR_MAX + 1)]
    # n cache lines from address ai into L1 for writing (the rows-first order's)
    parts += [prefetch_ir("ember_sgemm_prefetch", 1, 3)]
    parts += [
        # the task counter parallel kernels share (numba has no atomics)
        "define i64 @ember_sgemm_fetch_add(i64 %pi, i64 %v) {",
        "  %p = inttoptr i64 %pi to ptr",
        "  %old = atomicrmw add ptr %p, i64 %v seq_cst",
        "  ret i64 %old",
        "}",
    ]
    return parts


def _declarations(w: int) -> list[str]:
    """The intrinsics the IR kernels here and in vecmath use, for vectors of w floats."""
    vt = f"<{w} x float>"
    return [
        f"declare {vt} @llvm.fma.v{w}f32({vt}, {vt}, {vt})",
        f"declare {vt} @llvm.floor.v{w}f32({vt})",
        f"declare {vt} @llvm.maxnum.v{w}f32({vt}, {vt})",
        f"declare float @llvm.vector.reduce.fmax.v{w}f32({vt})",
        f"declare float @llvm.vector.reduce.fadd.v{w}f32(float, {vt})",
        f"declare {vt} @llvm.masked.load.v{w}f32.p0(ptr, i32, <{w} x i1>, {vt})",
        f"declare void @llvm.masked.store.v{w}f32.p0({vt}, ptr, i32, <{w} x i1>)",
        "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)",
        "declare i64 @llvm.umin.i64(i64, i64)",
        "declare void @llvm.x86.sse.sfence()",
    ]


def jit_ir(functions: list[str], names: list[str]):
    """Compile LLVM IR functions for this process's vector width and register `names` for numba.

    The functions may use the intrinsics of ``_declarations`` and the attribute group #0 (512-bit
    vectors allowed on AVX-512: LLVM's tuning for those CPUs prefers 256 bits unless told). The
    target is the host CPU, or a plain AVX2 one (haswell: 16 vector registers) when
    EMBER_SGEMM_ISA=avx2 picks the AVX2 family on an AVX-512 machine. Returns the execution
    engine, which owns the machine code: keep it alive.
    """
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    w = ISAS[_STATE["isa"]][0]
    wide = ' "min-legal-vector-width"="512" "prefer-vector-width"="512"' if w == 16 else ""
    ir = [*_declarations(w), *functions, f"attributes #0 = {{ nounwind{wide} }}"]
    mod = llvm.parse_assembly("\n".join(ir))
    mod.verify()
    host = llvm.get_host_cpu_features()
    cpu, features = "haswell", ""  # AVX2 + FMA
    if _STATE["isa"] == "avx512" or not host.get("avx512f"):
        cpu, features = llvm.get_host_cpu_name(), host.flatten()
    target = llvm.Target.from_default_triple()
    engine = llvm.create_mcjit_compiler(mod, target.create_target_machine(cpu, features, opt=3))
    engine.finalize_object()
    for name in names:
        llvm.add_symbol(name, engine.get_function_address(name))
    return engine


# ------------------------------------------------------------------ numba driver
# Module globals that _build_driver fills in before compiling: numba's cache keys a function on
# its code and closure, and a closure over these objects would differ in every process.
prange = range  # numba.prange
_k1 = _k2 = _k3 = _k4 = _k5 = _k6 = _k7 = _k8 = _k9 = _k10 = _k11 = _k12 = (
    None  # the microkernels (ExternalFunction)
)
_micro = _block = _rows_first = None  # _micro_py, _block_py, _rows_first_py compiled
_prefetch = None  # ember_sgemm_prefetch (ExternalFunction)


def _micro_py(m, args):  # pragma: no cover - compiled
    """The microkernel for m rows (1..MR_MAX)."""
    if m == 12:
        _k12(*args)
    elif m == 11:
        _k11(*args)
    elif m == 10:
        _k10(*args)
    elif m == 9:
        _k9(*args)
    elif m == 8:
        _k8(*args)
    elif m == 7:
        _k7(*args)
    elif m == 6:
        _k6(*args)
    elif m == 5:
        _k5(*args)
    elif m == 4:
        _k4(*args)
    elif m == 3:
        _k3(*args)
    elif m == 2:
        _k2(*args)
    else:
        _k1(*args)


def _driver_py(
    a,
    rowoff,
    tapoff,
    kc,
    bp,
    bias,
    res,
    has_res,
    act,
    out,
    mr,
    tasks_m,
    tasks_p,
    chunk,
    kblock,
):  # pragma: no cover - compiled
    """Tasks (pixel blocks x panel groups) -> pixel chunks -> panels -> blocks of K -> tiles.

    A block of K is a run of whole taps (at most kblock channels in all) or a slice of one
    tap's channels: the panel's rows for it stay in L1 while every tile of the chunk uses them,
    and the weight streams from memory once per chunk. Tiles accumulate across blocks; the last
    block applies bias, residual and activation.
    """
    m_total, o = out.shape
    panels, kk, nr = bp.shape
    nt = tapoff.shape[0]
    tiles = (m_total + mr - 1) // mr
    aa, ra, ta = a.ctypes.data, rowoff.ctypes.data, tapoff.ctypes.data
    ba, oa, bsa, rsa = bp.ctypes.data, out.ctypes.data, bias.ctypes.data, res.ctypes.data
    g = max(1, kblock // kc)  # taps per block, or
    ncs = 1 if kc <= kblock else (kc + kblock - 1) // kblock  # channel slices per tap
    nkb = (nt + g - 1) // g if ncs == 1 else nt * ncs
    lo_act = np.float32(-np.inf if act == 0 else 0.0)
    hi_act = np.float32(6.0 if act == 2 else np.inf)
    last_flags = (6 if has_res & 1 else 2) | (has_res & 8)  # 8: stream the output
    rows_first = has_res & ROWS_FIRST and nkb == 1 and panels > 1 and tasks_p == 1
    for task in prange(tasks_m * tasks_p):  # static: a thread gets the same rows every layer
        tm, tp = task // tasks_p, task % tasks_p
        m0 = min(m_total, (tiles * tm // tasks_m) * mr)
        m1 = min(m_total, (tiles * (tm + 1) // tasks_m) * mr)
        j0, j1 = panels * tp // tasks_p, panels * (tp + 1) // tasks_p
        for q0 in range(m0, m1, chunk):
            if rows_first:
                _rows_first(q0, min(q0 + chunk, m1), panels, aa, ra, ta, ba, oa, bsa, rsa, o,
                            kk, nr, nt, kc, mr, last_flags, lo_act, hi_act)  # fmt: skip
            else:
                _block(q0, min(q0 + chunk, m1), j0, j1, aa, ra, ta, ba, oa, bsa, rsa, o, kk, nr,
                       nt, kc, g, ncs, nkb, mr, last_flags, lo_act, hi_act)  # fmt: skip


def _block_py(
    q0,
    q1,
    j0,
    j1,
    aa,
    ra,
    ta,
    ba,
    oa,
    bsa,
    rsa,
    o,
    kk,
    nr,
    nt,
    kc,
    g,
    ncs,
    nkb,
    mr,
    last_flags,
    lo_act,
    hi_act,
):  # pragma: no cover - compiled
    """Rows [q0, q1) of the output by panels [j0, j1): every block of K (g taps, or one of
    ncs slices of a tap's kc channels), tiles of up to mr rows; the last block applies bias,
    residual and activation (last_flags, lo_act..hi_act). Addresses: aa (A), ra/ta (row and
    tap offsets), ba (panels), oa (out), bsa (bias), rsa (residual)."""
    ntiles = (q1 - q0 + mr - 1) // mr
    for j in range(j0, j1):
        n0 = j * nr
        nc = min(nr, o - n0)
        for kb in range(nkb):
            if ncs == 1:
                t0, c0, c1 = kb * g, 0, kc
                t1 = min(nt, t0 + g)
            else:
                t0, s = kb // ncs, kb % ncs
                t1, c0, c1 = t0 + 1, s * kc // ncs, (s + 1) * kc // ncs
            last = kb == nkb - 1
            flags = (1 if kb > 0 else 0) | (last_flags if last else 0)
            lo = lo_act if last else np.float32(-np.inf)
            hi = hi_act if last else np.float32(np.inf)
            bk = ba + ((j * kk + t0 * kc + c0) * nr) * 4
            # while this block's tiles run, the next block (what follows it in memory)
            # streams into L2, a slice per tile: from DRAM it would stall the first tile
            pf = bk + (t1 - t0) * (c1 - c0) * nr * 4
            per_tile = ((t1 - t0) * (c1 - c0) * nr * 4 // 64 + ntiles - 1) // ntiles
            for p in range(q0, q1, mr):
                off = (p * o + n0) * 4
                args = (aa + c0 * 4, ra + p * 8, ta + t0 * 8, t1 - t0, c1 - c0, bk)
                args2 = (oa + off, o, nc, bsa + n0 * 4, rsa + off, flags, lo, hi)
                _micro(min(mr, q1 - p), args + args2 + (pf, per_tile))
                pf += per_tile * 64


def _rows_first_py(
    q0, q1, panels, aa, ra, ta, ba, oa, bsa, rsa, o, kk, nr, nt, kc, mr, last_flags, lo_act, hi_act
):  # pragma: no cover - compiled
    """``_block``'s work for rows [q0, q1) by all panels, K in one block, tile by tile: each
    tile's output and residual rows are one contiguous run, and those of the tile PF_TILES on
    are prefetched while this one computes (the residual, or the output when there is none, by
    the microkernel's prefetch; the output beside a residual by ``_prefetch``). Stores are
    plain (a streaming flag is dropped): see ROWS_FIRST_BYTES. The drivers call it in place of
    ``_block`` for products ``rows_first`` marks."""
    flags = (last_flags & 7) | 16  # 16: the plain store with a residual too (_kernel_ir)
    lines = (mr * o * 4 // 64 + panels - 1) // panels  # of a tile's rows, per panel
    for p in range(q0, q1, mr):
        ahead = ((p + PF_TILES * mr) * o) * 4
        for j in range(panels):
            n0 = j * nr
            off = (p * o + n0) * 4
            if last_flags & 4:  # a residual: the output's lines here (else rsa is the output)
                _prefetch(oa + ahead + j * lines * 64, lines)
            args = (aa, ra + p * 8, ta, nt, kc, ba + (j * kk * nr) * 4, oa + off, o)
            args2 = (min(nr, o - n0), bsa + n0 * 4, rsa + off, flags, lo_act, hi_act)
            _micro(min(mr, q1 - p), args + args2 + (rsa + ahead + j * lines * 64, lines))


def _build_driver(nb):
    from numba import types

    g = globals()
    i64 = types.int64
    sig = types.void(*([i64] * 12), types.float32, types.float32, i64, i64)
    for i in range(1, MR_MAX + 1):
        g[f"_k{i}"] = types.ExternalFunction(f"ember_sgemm_{i}", sig)
    g["_prefetch"] = types.ExternalFunction("ember_sgemm_prefetch", types.void(i64, i64))
    g["prange"] = nb.prange
    g["_micro"] = nb.njit(nogil=True, cache=True)(_micro_py)
    g["_rows_first"] = nb.njit(nogil=True, cache=True)(_rows_first_py)
    g["_block"] = nb.njit(nogil=True, cache=True)(_block_py)
    serial = nb.njit(nogil=True, cache=True)(renamed(_driver_py, "serial"))
    return nb.njit(nogil=True, cache=True, parallel=True)(_driver_py), serial


def _state():
    if not _STATE:
        nb = numba_or_none()
        isa = None
        if nb is not None:
            import llvmlite.binding as llvm

            isa = _isa(llvm.get_host_cpu_features())
        _STATE["isa"] = isa
        if isa is not None:
            w, nv, mr = ISAS[isa]
            names = [f"ember_sgemm_{m}" for m in range(1, MR_MAX + 1)]
            names += ["ember_sgemm_fetch_add", "ember_sgemm_prefetch"]
            _STATE.update(engine=jit_ir(_microkernels_ir(w, nv), names), nr=nv * w, mr=mr)
            _STATE["driver"], _STATE["serial"] = _build_driver(nb)
    return _STATE


def isa() -> str | None:
    """The microkernel family this process uses ("avx512", "avx2"), or None (numpy fallback)."""
    return _state()["isa"]


def panel_width() -> int | None:
    """NR, the output channels per packed panel on this CPU, or None (no microkernels here)."""
    st = _state()
    return st["nr"] if st["isa"] is not None else None


def _check(a, rowoff, tapoff, kc, packed, bias, res, out, nr, span=None) -> None:
    """The kernels follow raw pointers: refuse anything that would take them out of bounds."""
    arrays = {"a": a, "packed": packed, "bias": bias, "out": out, "res": res}
    for name, x in arrays.items():
        if x is not None and (x.dtype != np.float32 or not x.flags.c_contiguous):
            raise DTypeError(f"sgemm: {name} must be C-contiguous float32, got {x.dtype}")
    for name, x in (("rowoff", rowoff), ("tapoff", tapoff)):
        if x.dtype != np.int64 or x.ndim != 1 or not x.flags.c_contiguous:
            raise DTypeError(f"sgemm: {name} must be a contiguous 1-D int64 array")
    m, o = out.shape
    if packed.ndim != 3 or packed.shape[2] != nr or packed.shape[1] != len(tapoff) * kc:
        raise ShapeError(f"sgemm: packed {packed.shape} is not ({len(tapoff)}*{kc} rows, {nr})")
    if packed.shape[0] * nr < o or bias.size < o or len(rowoff) != m or len(tapoff) == 0:
        raise ShapeError(f"sgemm: out {out.shape} does not fit the weight, bias or row offsets")
    if res is not None and res.shape != out.shape:
        raise ShapeError(f"sgemm: residual {res.shape} is not the output's {out.shape}")
    if not m:
        return
    if span is None:
        span = (rowoff.min() + tapoff.min(), rowoff.max() + tapoff.max())
    if span[0] < 0 or span[1] + kc > a.size:
        raise ShapeError(f"sgemm: offsets reach outside the input ({a.size} floats)")


def microkernel():
    """(tile, MR, NR) for numba kernels that drive the microkernels themselves, or None.

    ``tile(m, args)`` (a numba function, callable from other numba code) computes an m-row tile
    (1 <= m <= MR); ``args`` is the microkernel's argument tuple, see ``_kernel_ir`` (the
    blocked attention kernel uses it for its Q K^T and P V blocks).
    """
    st = _state()
    return None if st["isa"] is None else (_micro, st["mr"], st["nr"])


def block_kernel():
    """``_block_py`` compiled (rows by panels over every block of K: the drivers' inner loop,
    for the pool's GEMM tasks too), or None where the microkernels do not run."""
    return None if _state()["isa"] is None else _block


# products of fewer multiply-adds than this run on the calling thread, as one task: a parallel
# region's wake-up (the workers sleep between regions) costs more than the second thread saves
SERIAL_BELOW = 1 << 21
# ... unless the weight is this big: a short product over a large weight (a classifier's 1000 x
# 1280 at batch 1, 5 MB) streams it from L3 or memory, and two threads read it faster than one
# (MobileNetV2's classifier in the network: 160 -> 100 us, 2 threads)
SERIAL_MAX_WEIGHT_BYTES = 2 << 20
USE_POOL = True  # False: numba's prange driver, one task per thread (before the pool; to compare)
CHUNK_PIXELS = 96  # rows a task sweeps per pass over its panels (their A stays in L1/L2)
# Rows on the calling thread: the callers that pass ``rows`` for a product of a few hundred rows (linear_packed's
# and conv_gemm's one-block products) have the calling thread sweep all of them per pass over
# the panels too, so the weight streams in once: in CHUNK_PIXELS blocks (196 rows: 96 + 96 + 4)
# each block re-read the whole weight, from L3 or memory. One thread, weights cycled through
# 64 MB (cold, as in a network), the two alternated in one process (median us, Zen 5, ad hoc):
# ResNet-50 b1's 1x1 2048 -> 512 at 7x7 464 -> 447, 512 -> 2048 459 -> 450, 1024 -> 256 at 14x14
# 439 -> 431, 256 -> 1024 441 -> 420; linears 197x768x3072 4129 -> 3891, 197x3072x768 4169 ->
# 3983, 128x384x1536 639 -> 619, 197x768x768 995 -> 959. ResNet-50 b1 whole at 1 thread, one
# process alternating per pass (medians of 10, twice): node sums 33.51 / 33.35 -> 33.09 / 32.95 ms.
# conv outputs of this many bytes or more are written with non-temporal stores: they go back to
# memory before the next layer reads them anyway (ResNet-50 b8's 56x56x256 maps: 25.7 MB), and
# a normal store first reads each line in. ResNet-50 b8, per node in the network (ad hoc, 5
# passes): its 1x1 64 -> 256 convs 4.2-4.6 -> 3.5-4.2 ms, 128 -> 512 3.0-3.2 -> 2.6-2.9.
# Products in the rows-first order (ROWS_FIRST_BYTES) store plainly: prefetching won there
STREAM_BYTES = 1 << 24
# Products whose output has this many bytes or more, K in one block (at most K_BLOCK) and a
# task over all panels, run each tile of MR rows across all panels (``_rows_first``) instead of
# each panel down the task's rows: a tile's output and residual rows are then one contiguous
# run, and those PF_TILES tiles on are prefetched while it computes. Panel by panel, a tile's
# 12 rows x 128 bytes at the output's row stride missed the hardware prefetchers, and the
# microkernel stalled on every output line's read-for-ownership and residual line. ResNet-50
# b8's 1x1 64 -> 256 conv + residual + ReLU (25088 rows), alone, one thread: 8.2 -> 4.1 ms (its
# in-cache speed); streaming stores there (STREAM_BYTES) took 7.3 ms, so this order stores
# plainly. The whole network, 2 threads, one process alternating (median of 20): streamed
# 157.0 / 150.1 ms, plain 144.6 / 141.8. The threshold was 4 MB on the guess that ResNet-50 b1's
# 3.2 MB outputs are cache-resident, but a pass's buffer was last touched a pass ago: in the
# network at b1 its 7x7 stem (12544 x 147 x 64, 3.2 MB out) took 0.82-0.89 ms panel by panel and
# 0.62-0.64 rows-first (0.53 alone, its buffer warm), the 56x56 1x1 64 -> 256 + residual convs
# ~0.29 -> ~0.28 (each node's call wrapped, medians of 40 passes, alternating). Smaller outputs
# keep the panel order, which keeps each panel's B in L1.
ROWS_FIRST_BYTES = 3 << 20
ROWS_FIRST = 16  # the flag (in the has_res word, with the streaming stores' 8)


def job_flags(has_res: bool, stream: bool, m: int, o: int, kk: int) -> int:
    """The driver's has_res word: 1 with a residual, 8 for streaming stores, and ROWS_FIRST for
    an (m, o) float32 output of ROWS_FIRST_BYTES or more over a weight of at most K_BLOCK rows
    (each tile reads every panel: a deeper weight would not stay in cache)."""
    big = m * o * 4 >= ROWS_FIRST_BYTES and kk <= K_BLOCK
    return int(has_res) | (8 if stream else 0) | (ROWS_FIRST if big else 0)


K_BLOCK = 256  # rows of a panel (32 KB at NR=32) kept in L1 while the chunk's tiles use them


def k_block(panels: int, kk: int) -> int:
    """The K blocking of a product of `panels` panels of kk rows: K_BLOCK, or all of K for one
    panel of at most 2048 rows (an output of at most NR columns: its weight, 256 KB at most,
    stays in L2, and every block of K cost the tiles a pass of loads and stores of their
    accumulators; PP-OCRv4 det's 3x3 96 -> 24 conv at 160x160: 3.2 -> 2.9 ms, ad-hoc timing of
    the GEMM, 2 threads)."""
    return kk if panels == 1 and kk <= 2048 else K_BLOCK


def gemm(
    a,
    rowoff,
    tapoff,
    kc,
    packed,
    bias,
    res,
    act: int,
    out,
    span=None,
    threads: int | None = None,
    rows: int | None = None,
    stream: bool = False,
    kblock: int | None = None,
) -> np.ndarray:
    """out (M, O) = act(sum_t A_t @ W_t + bias [+ res]) on the packed weight (see module doc).

    a: 1-D float32 (the padded NHWC input, or rows of features); rowoff (M,) and tapoff (T,)
    int64 element offsets; packed from ``pack_weight``; res (M, O) or None (not ``out``
    itself: a K longer than K_BLOCK sums into out block by block); act 0/1/2. span: the
    (lowest, highest) row + tap offset when the caller knows it (else computed here). threads:
    numba's threads (default ember's setting); 1 runs on the calling thread without starting
    numba's team. rows: output rows per pool task, and per pass over the panels on the calling
    thread (default CHUNK_PIXELS; see linear_packed and the note at CHUNK_PIXELS).
    stream: write an output of STREAM_BYTES or more whose rows start on cache lines with
    non-temporal stores (see ``STREAM_BYTES``). kblock: channels per block of K (default
    ``k_block``'s; see ``linear_k_block``).
    """
    from ember.threads import get_num_threads

    st = _state()
    if packed.ndim == 3 and packed.shape[2] != st["nr"] and packed.shape[2] * 2 == st["nr"]:
        from ember.kernels.cpu import gemm_narrow  # panels of one vector (a narrow weight)

        return gemm_narrow.gemm(a, rowoff, tapoff, kc, packed, bias, res, act, out, span, threads)
    m, o = out.shape
    threads = max(1, get_num_threads() if threads is None else threads)
    _check(a, rowoff, tapoff, kc, packed, bias, res, out, st["nr"], span)
    if m == 0:
        return out
    panels, mr = packed.shape[0], st["mr"]
    # has_res's word also carries the streaming stores' flag (8) and ROWS_FIRST (16)
    stream = (
        stream
        and out.nbytes >= STREAM_BYTES
        and out.ctypes.data % 64 == 0
        and (o * 4) % (ISAS[st["isa"]][0] * 4) == 0
    )
    flags = job_flags(res is not None, stream, m, o, packed.shape[1])
    kblock = kblock or k_block(panels, packed.shape[1])
    small = m * o * packed.shape[1] < SERIAL_BELOW and packed.nbytes < SERIAL_MAX_WEIGHT_BYTES
    if threads == 1 or small:  # waking the workers costs more
        st["serial"](
            a, rowoff, tapoff, kc, packed, bias, out if res is None else res, flags,
            act, out, mr, 1, 1, rows or CHUNK_PIXELS, kblock,
        )  # fmt: skip
        return out
    if USE_POOL:
        from ember.kernels.cpu import pool_tasks

        if pool_tasks.state() is not None:
            pool_tasks.gemm(
                a, rowoff, tapoff, kc, packed, bias, res, act, out, threads, rows, stream, kblock
            )
            return out
    # one task per thread, the same split every call: the rows a thread writes in one layer are
    # the rows it reads in the next, from its own cache (measured: handing out 4 tasks per
    # thread from a shared counter cost ~2-3 ms of a ResNet-50 pass)
    tiles = -(-m // mr)
    if m >= o or panels == 1:  # many pixels: each thread takes a block of pixels, all panels
        tasks_m, tasks_p = min(threads, tiles), 1
    else:  # few pixels, wide weight: each thread takes its own panels (its slice of the weight)
        tasks_p = min(threads, panels)
        tasks_m = min(tiles, max(1, threads // tasks_p))
    st["driver"](
        a, rowoff, tapoff, kc, packed, bias, out if res is None else res, flags, act,
        out, mr, tasks_m, tasks_p, CHUNK_PIXELS, kblock,
    )  # fmt: skip
    return out


# ------------------------------------------------------------------ the packed weight type
class PackedWeight(np.ndarray):
    """A float32 weight, as its layer stores it, that also carries the GEMM's packed panels.

    ``PackedWeight(w)`` packs a Linear weight (out, in) or a Conv2d weight (out, in, kh, kw)
    once: ``panels`` is ``pack_weight`` of the (kh*kw*in, out) matrix (taps outermost, as the
    NHWC implicit GEMM reads them), or None where this process has no microkernels; a weight of
    at most NR/2 outputs gets panels of NR/2 columns (kernels.cpu.gemm_narrow's). It stays an
    ndarray with the weight's own values, so ``state_dict()``, ``parameters()`` and every op see
    the weight; the kernels of the ``linear``, ``conv2d`` and ``fused_conv2d`` ops (registered
    here and in kernels.cpu.conv) apply when they are given one with panels.

    Arrays derived from it (views, slices, results) are plain weights again (``panels`` None),
    and writing into it (``w[...] = v``, an in-place ufunc, ``np.copyto``, an ``out=``) drops
    its panels, so a stale packing is never used; pickling stores the plain weight.
    """

    panels: np.ndarray | None

    def __new__(cls, weight: np.ndarray, panels: np.ndarray | None | bool = True):
        w = np.asarray(weight)
        if w.dtype != np.float32 or w.ndim not in (2, 4):
            raise DTypeError(f"PackedWeight: expected a 2-D or 4-D float32 weight, got {w.dtype}")
        obj = w.view(cls)
        if panels is True:
            nr = panel_width()
            if nr is not None and w.shape[0] <= nr // 2:  # narrow: kernels.cpu.gemm_narrow
                from ember.kernels.cpu import gemm_narrow

                nr = gemm_narrow.width() or nr
            panels = None if nr is None else pack_weight(_matrix(w), nr)
        obj.panels = panels
        return obj

    def __array_finalize__(self, obj) -> None:
        self.panels = None

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        plain = lambda a: a.view(np.ndarray) if isinstance(a, PackedWeight) else a  # noqa: E731
        out = kwargs.get("out")
        if out is None:
            return getattr(ufunc, method)(*(plain(a) for a in inputs), **kwargs)
        for o in out:
            if isinstance(o, PackedWeight):
                o.panels = None  # written in place: the panels would be stale
        kwargs["out"] = tuple(plain(o) for o in out)
        getattr(ufunc, method)(*(plain(a) for a in inputs), **kwargs)
        return out[0] if len(out) == 1 else out

    def __setitem__(self, key, value) -> None:
        self.panels = None
        self.view(np.ndarray)[key] = value

    def __array_function__(self, func, types, args, kwargs):
        dst = args[0] if func in _WRITES_FIRST and args else kwargs.get("out")
        for o in dst if isinstance(dst, tuple) else (dst,):
            if isinstance(o, PackedWeight):
                o.panels = None  # np.copyto(w, v), np.clip(..., out=w): written in place
        return super().__array_function__(func, types, args, kwargs)

    def copy(self, order="C") -> PackedWeight:
        """A copy, panels included."""
        p = self.panels
        return PackedWeight(self.view(np.ndarray).copy(order), None if p is None else p.copy())

    def __deepcopy__(self, memo) -> PackedWeight:
        return self.copy()

    def __reduce__(self):
        return np.ndarray.__reduce__(self.view(np.ndarray))


_WRITES_FIRST = (np.copyto, np.put, np.place, np.putmask, np.fill_diagonal, np.put_along_axis)


def _matrix(w: np.ndarray) -> np.ndarray:
    """The GEMM's B operand of a weight: (in, out) for linear, (kh*kw*in, out) for conv."""
    if w.ndim == 2:
        return w.T
    o, c, kh, kw = w.shape
    return w.transpose(2, 3, 1, 0).reshape(kh * kw * c, o)


def packed_panels(w) -> np.ndarray | None:
    """The panels a weight array carries (a PackedWeight's), or None."""
    return w.panels if type(w) is PackedWeight else None


def microkernels_available() -> bool:
    """Whether the packed GEMM runs here (the registry's ``available`` for its kernels)."""
    return panel_width() is not None


# ------------------------------------------------------------------ the linear op's kernel
_ROWS: dict = {}  # (m, k) -> the row offsets of m rows of k features


def linear_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """x @ w.T + b over the last dim of x (float32)."""
    w = np.asarray(w)
    out = np.matmul(x, w.T)
    return out if b is None else out + b


# Every row count runs here, tall products too: alone, OpenBLAS's packed-A loop is level or a
# little ahead above a few hundred rows, but in a model its idle workers spin on the cores that
# the numba kernels between the products (attention, norms) then wait for. bench/whisper.py's
# tiny.en encoder at 2 threads: 214 ms with this, 292-346 ms with a 128-row cap (bench/RESULTS.md).
def _linear_applies(x, w, b=None) -> bool:
    return packed_panels(w) is not None and w.ndim == 2 and x.ndim >= 1


@register(
    "linear", reference=linear_reference, when=_linear_applies, available=microkernels_available
)
def linear_packed(x: np.ndarray, w: PackedWeight, b: np.ndarray | None = None) -> np.ndarray:
    """x @ w.T + b on w's panels (bias in the GEMM's epilogue): no packing, no BLAS call."""
    return linear_packed_residual(x, w, b, None)


def linear_packed_residual(
    x: np.ndarray,
    w: PackedWeight,
    b: np.ndarray | None,
    res: np.ndarray | None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """x @ w.T + b + res, res added in the GEMM's epilogue (a C-contiguous float32 array of the
    result's shape, or None); w must carry panels (``packed_panels``). out: a C-contiguous
    float32 (rows, out_features) array to write into (default: a new one)."""
    o, k = w.shape
    lead = x.shape[:-1]
    x2 = np.ascontiguousarray(x.reshape(-1, k))
    m = x2.shape[0]
    rows = _ROWS.get((m, k))
    if rows is None:
        if len(_ROWS) >= 64:
            _ROWS.clear()
        rows = _ROWS[m, k] = np.arange(m, dtype=np.int64) * k
    bias = _zeros(o) if b is None else np.ascontiguousarray(b)
    if out is None:
        out = np.empty((m, o), np.float32)
    elif out.shape != (m, o) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ShapeError(f"linear: out must be a contiguous float32 {(m, o)} array")
    r = None if res is None else res.reshape(m, o)
    plan = _pool_plan(w, bias, m, r is not None) if x2.dtype == np.float32 else None
    if plan is not None and (r is None or (r.dtype == np.float32 and r.flags.c_contiguous)):
        from ember.kernels.cpu import pool_tasks as PT

        PT.rerun_gemm(plan, x2, out, r)
        return out.reshape(*lead, o)
    mr = _state()["mr"]
    one_block = m <= LINEAR_ONE_BLOCK_ROWS and w.panels.shape[0] >= LINEAR_ONE_BLOCK_PANELS
    block = -(-m // mr) * mr if one_block else None
    gemm(x2.reshape(-1), rows, _TAP0, k, w.panels, bias, r, 0, out, (0, (m - 1) * k), rows=block,
         kblock=linear_k_block(k))  # fmt: skip
    return out.reshape(*lead, o)


_ZEROS: dict = {}  # o -> the zero bias of a linear without one (one array: its plans' key)


def _zeros(o: int) -> np.ndarray:
    z = _ZEROS.get(o)
    if z is None:
        if len(_ZEROS) >= 64:
            _ZEROS.clear()
        z = _ZEROS[o] = np.zeros(o, np.float32)
    return z


def _pool_plan(w: PackedWeight, bias: np.ndarray, m: int, has_res: bool) -> tuple | None:
    """The pool job of x @ w.T + bias [+ res] for m rows, as gemm would build it (its operand
    checks passed once), kept on the weight: a transformer calls each of its linears with the
    same rows every time, and building and checking the job took ~7 of a call's ~11 us of
    Python (MiniLM-L6 b1 has 24 products of 20-340 us). None where gemm runs it otherwise (on
    the calling thread, numba's driver)."""
    from ember.threads import get_num_threads

    threads = max(1, get_num_threads())
    panels = w.panels
    key = (id(panels), id(bias), m, has_res, threads)
    plans = w.__dict__.setdefault("_pool_plans", {})
    plan = plans.get(key)
    if plan is not None:
        return plan[0]
    o, k = w.shape
    if threads == 1 or not USE_POOL or m * o * k < SERIAL_BELOW or bias.dtype != np.float32:
        return None
    from ember.kernels.cpu import pool_tasks as PT

    if PT.state() is None or bias.size < o or not bias.flags.c_contiguous:
        return None
    if panels.ndim != 3 or panels.shape[2] != _state()["nr"]:
        return None  # panels of another width (a narrow weight's): gemm picks their kernel
    rows = _ROWS.get((m, k))
    if rows is None:
        rows = np.arange(m, dtype=np.int64) * k
    one = np.empty((m, o), np.float32)  # stands in for x, out and res: rewritten per call
    xs = np.empty(m * k, np.float32)
    _check(xs, rows, _TAP0, k, panels, bias, one if has_res else None, one, _state()["nr"],
           (0, (m - 1) * k))  # fmt: skip
    mr = _state()["mr"]
    one_block = m <= LINEAR_ONE_BLOCK_ROWS and panels.shape[0] >= LINEAR_ONE_BLOCK_PANELS
    block = -(-m // mr) * mr if one_block else None
    params, tasks = PT.gemm_params(xs, rows, _TAP0, k, panels, bias, one if has_res else None, 0,
                                   one, threads, block, kblock=linear_k_block(k))  # fmt: skip
    if len(plans) >= 16:
        plans.clear()  # many row counts: keep the last few
    plans[key] = ((params, tasks), (panels, bias, rows))  # the arrays its words point to
    return params, tasks


# A product of at most this many rows (a transformer's tokens at batch 1) runs its pool tasks on
# all of its rows, each task a group of panels: every panel streams in once, where blocks of
# CHUNK_PIXELS rows read each panel once per block (ViT-B/16's 197 rows: blocks of 96, 96 and 5).
# In the model, one process alternating the two (median / best ms, 2 threads, Zen 5, ad hoc):
# ViT-B/16 b1 103.2 / 100.9 -> 96.2 / 93.6, MiniLM-L6 b1 (128 rows) 9.97 / 9.31 -> 9.81 / 8.94.
LINEAR_ONE_BLOCK_ROWS = 256
LINEAR_ONE_BLOCK_PANELS = 8  # and enough panels to make a task for each thread several times


# A linear's K in one block up to this many channels: every block of K after the first cost each
# tile a reload and store of its accumulators and a restart of the microkernel, which K_BLOCK's
# L1-resident panel rows did not win back (the panel streams from L2 well enough). Ad hoc, one
# process alternating K_BLOCK and all of K, 2 threads, best of 12 (Zen 5): 128x384x384 93.9 ->
# 86.4 us, 128x384x1536 314.9 -> 300.3, 197x768x3072 1972.6 -> 1855.7, 197x3072x768 1917.9 ->
# 1814.5, 1500x1536x384 3492.9 -> 3366.9, 128x8192x768 3474.8 -> 3128.7 (1 thread: 237 -> 256
# GFLOP/s at 128x384x384, 241 -> 267 at 197x768x3072, of a ~272 peak).
LINEAR_K_BLOCK_MAX = 8192


def linear_k_block(k: int) -> int:
    """The K blocking of a linear product of k input features (see ``LINEAR_K_BLOCK_MAX``)."""
    return k if k <= LINEAR_K_BLOCK_MAX else K_BLOCK


_TAP0 = np.zeros(1, np.int64)
