"""Integer-dot products for Q8_0, Q4_0 and Q4_1 weights and 1..16 rows of x (decode, small batches)
on the GGUF blocks where they lie: the path of ``EMBER_QUANT_REPACK=0`` (by default products run
``_pdot``'s kernels on weights repacked in panels) and of Q8_0 with float x.

As llama.cpp does, each call quantizes the rows of x once to Q8 blocks (32 int8 values ``q``
with one float32 scale ``d = max|x| / 127``, ``q = rint(x / d)``, and, for Q4_1's min term,
``d * sum(q)``), then multiplies the weight's 4/8-bit integers with those bytes in
int32 (exact) and finishes each block in float:

* Q8_0:  ``y += (d_w * d_x) * sum(q_w * q_x)``
* Q4_0:  ``y += (d_w * d_x) * sum((n_w - 8) * q_x)`` (the -8 applied to the nibbles before the
  integer dot, as llama.cpp does: exact)
* Q4_1:  ``y += (d_w * d_x) * sum(n_w * q_x)`` and ``+ m_w * (d_x * sum(q_x))``: the min term
  also sees the quantized x, so the error is ``sum_j w_j (x_j - d q_j)`` with ``w_j`` the
  dequantized (centred) weight, smaller than with the exact sum of x (``d_w n_j`` is not centred)

The integer dot is AVX2's ``vpmaddubsw`` (unsigned x signed bytes, pairs to int16: no
saturation, |pair| <= 2 * 128 * 127) and ``vpmaddwd`` against ones (int16 pairs to int32), or
AVX-VNNI / AVX-512 VNNI's ``vpdpbusd`` (the same int32 lanes in one instruction) where the host
has it. Signed weights use llama.cpp's sign trick: ``|q_w|`` (unsigned) times ``sign(q_w) * q_x``.
Eight int32 lanes per block become floats and accumulate by one FMA with the broadcast
``d_w * d_x`` into eight float lanes per (weight row, x row), summed by a fixed tree at the end.

Batch invariance: row i of an M-row product is bitwise the M=1 product of x[i]. Every x row is
quantized by the same loop, and each (weight row, x row) pair sees the same float operations in
the same order whatever M is (the x rows are taken G_MAX at a time, each with its own
accumulators; VNNI and AVX2 give the same integers, so the same floats).

The error against the float product is the activation quantization's: ``|x - d q| <= d / 2``
per element, so ``|y - W x| <= sum_b d_b / 2 * sum_j |w_bj|`` plus float32 rounding (the tests
assert that bound against a float64 reference of the dequantized weight).

The loops over weight rows are LLVM IR (``_kernel_ir``, one function per format and number of x
rows g = 1..G_MAX), compiled with ``gemm.jit_ir`` and called by a numba driver (``_driver_py``)
that quantizes x (``_q8x``'s loop) and hands chunks of weight rows to ``kernels.cpu.pool``'s threads (work
claiming: a late or preempted thread never holds the caller up); each chunk runs every group
of G_MAX rows of x while its weight rows stay in cache.
``Q8_0F`` is the same loop for Q8_0 weights and float32 x (no quantization of x): each block
decodes to ``d_w * q_w`` (exact in float32); its products with x are summed in L lanes (L = 16
on AVX-512, 8 on AVX2: one multiply, then FMAs) and added to the (weight row, x row)
accumulator, in an order that does not depend on M. It is Q8_0's product for 1..16 rows of
float x: one pass over the weight for all rows (per-row matrix-vector passes read a large head
M times), batch-invariant as above. Its x is not quantized, so it also runs under
``EMBER_QUANT_DOT=float``.

Where AVX2 is missing, llvmlite/numba are absent or ``EMBER_SGEMM_ISA=none``, the float kernels
of the format modules run instead (and, for the integer kernels, under ``EMBER_QUANT_DOT=float``).
"""

from __future__ import annotations

import sys

import numpy as np

from ember import config
from ember.errors import DTypeError, ShapeError

G_MAX = 4  # x rows one kernel call carries (an accumulator each, in registers)
MAX_M = 16  # up to this many rows of x, linear_q runs the integer kernels
CHUNK_BYTES = 1 << 15  # weight bytes (times groups of G_MAX x rows) per chunk of pool work
MAX_GROUPS_ROWS = 4 * 32  # x rows one pool job carries (kernels.cpu.pool.MAX_GROUPS groups)
# bytes ahead of the current block that each block step prefetches (as _common.PREFETCH_BYTES;
# 768 before: an ad-hoc one-thread sweep read a 1B model's Q4_0/Q4_1 rows from DRAM at 9.6-10.7
# GB/s instead of 6.7-6.9; bench/quant.py's DRAM columns are the measurement of record)
PREFETCH = 6144

# qtype -> (format id, bytes per block, offset of the quants, kind); kind: "s8" signed bytes,
# "s4" nibbles minus 8, "u4" nibbles with a min (fp16 at byte 2)
SPECS = {"Q8_0": (0, 34, 2, "s8"), "Q4_0": (1, 18, 2, "s4"), "Q4_1": (2, 20, 4, "u4")}
# Q8_0 weights times float32 x ("f8": no quantization of x), format id 3; see product
FLOAT_SPEC = (3, 34, 2, "f8")
# float32 weights times float32 x ("f32"), format id 4: rows of K floats read as K / 32 blocks
# of 128 bytes (a view of the weight, no copy); the products of kernels.cpu.matvec
F32_SPEC = (4, 128, 0, "f32")
KERNELS = (*SPECS, "Q8_0F", "F32")  # format-major, in format id order
ALL_SPECS = {**SPECS, "Q8_0F": FLOAT_SPEC, "F32": F32_SPEC}
FLOAT_X = (3, 4)  # format ids whose kernels read x as floats (no Q8 blocks of x)
_STATE: dict = {}


# ------------------------------------------------------------------ LLVM IR
def _rows_ir(
    qtype: str, g: int, vnni: bool, nr: int, t: str, start: str, nxt: str, lanes: int = 8
) -> list[str]:
    """The loop over weight rows taken nr (1 or 2) at a time, labels suffixed t.

    Enters at label ``{t}row`` with ``%{t}n0`` (the first row) from block ``start``; loops while
    ``n + nr <= %{t}end`` and leaves to ``nxt``. Each (weight row, x row) pair has its own
    accumulators and the same float operations whether its weight row is paired or not.
    """
    _, bs, qoff, kind = ALL_SPECS[qtype]
    flt = kind in ("f8", "f32")  # float x: products in L lanes
    v8f, b32 = "<8 x float>", "<32 x i8>"
    L = lanes if flt else 8  # float lanes per accumulator
    va = f"<{L} x float>"
    splat = lambda ty, n, v: "<" + ", ".join([f"{ty} {v}"] * n) + ">"  # noqa: E731
    pairs = [(i, r) for i in range(nr) for r in range(g)]
    s = [f"{t}row:", f"  %{t}n = phi i64 [%{t}n0, %{start}], [%{t}n1, %{t}rowend]"]
    for i in range(nr):
        s += [f"  %{t}ni{i} = add i64 %{t}n, {i}", f"  %{t}wo{i} = mul i64 %{t}ni{i}, %rowb"]
        s += [f"  %{t}wr{i} = getelementptr i8, ptr %w, i64 %{t}wo{i}"]
    s += [f"  br label %{t}blk", f"{t}blk:", f"  %{t}b = phi i64 [0, %{t}row], [%{t}b1, %{t}blk]"]
    for i, r in pairs:
        s += [f"  %{t}a{i}_{r} = phi {va} [zeroinitializer, %{t}row], [%{t}an{i}_{r}, %{t}blk]"]
        if kind == "u4":
            s += [f"  %{t}s{i}_{r} = phi float [0.0, %{t}row], [%{t}sn{i}_{r}, %{t}blk]"]
    xshift = 7 if flt else 5  # bytes of x per block: 32 floats or 32 int8
    s += [f"  %{t}bo = mul i64 %{t}b, {bs}", f"  %{t}xo = shl i64 %{t}b, {xshift}"]
    for i in range(nr):  # decode weight block b of row i once, for all g rows of x
        u = f"{t}{i}"
        s += [f"  %wb{u} = getelementptr i8, ptr %{t}wr{i}, i64 %{t}bo"]
        s += [f"  %pf{u} = getelementptr i8, ptr %wb{u}, i64 {PREFETCH}"]
        s += [f"  call void @llvm.prefetch.p0(ptr %pf{u}, i32 0, i32 3, i32 1)"]
        if kind == "f32":  # 32 floats, no scale
            v32 = "<32 x float>"
            s += [f"  %wf{u} = load {v32}, ptr %wb{u}, align 4"]
            for c in range(32 // L):
                ix = ", ".join(f"i32 {L * c + j}" for j in range(L))
                s += [
                    f"  %wc{u}_{c} = shufflevector {v32} %wf{u}, {v32} poison, <{L} x i32> <{ix}>"
                ]
            continue
        s += [
            f"  %dh{u} = load half, ptr %wb{u}, align 1",
            f"  %dw{u} = fpext half %dh{u} to float",
        ]
        if kind == "u4":
            s += [f"  %mp{u} = getelementptr i8, ptr %wb{u}, i64 2"]
            s += [f"  %mh{u} = load half, ptr %mp{u}, align 1"]
            s += [f"  %mw{u} = fpext half %mh{u} to float"]
        s += [f"  %qp{u} = getelementptr i8, ptr %wb{u}, i64 {qoff}"]
        if kind == "f8":  # d * q is exact in float32 (11 + 8 significant bits)
            v32 = "<32 x float>"
            s += [f"  %q{u} = load {b32}, ptr %qp{u}, align 1"]
            s += [f"  %qf{u} = sitofp {b32} %q{u} to {v32}"]
            s += [f"  %di{u} = insertelement {v32} poison, float %dw{u}, i32 0"]
            s += [
                f"  %dv{u} = shufflevector {v32} %di{u}, {v32} poison, <32 x i32> zeroinitializer"
            ]
            s += [f"  %wf{u} = fmul {v32} %qf{u}, %dv{u}"]
            for c in range(32 // L):
                ix = ", ".join(f"i32 {L * c + j}" for j in range(L))
                s += [
                    f"  %wc{u}_{c} = shufflevector {v32} %wf{u}, {v32} poison, <{L} x i32> <{ix}>"
                ]
        elif kind == "s8":
            s += [f"  %q{u} = load {b32}, ptr %qp{u}, align 1"]
        else:
            iota = ", ".join(f"i32 {j}" for j in range(32))
            s += [f"  %p{u} = load <16 x i8>, ptr %qp{u}, align 1"]
            s += [f"  %lo{u} = and <16 x i8> %p{u}, {splat('i8', 16, 15)}"]
            s += [f"  %hi{u} = lshr <16 x i8> %p{u}, {splat('i8', 16, 4)}"]
            q = f"%q{u}" if kind == "u4" else f"%q0{u}"
            s += [f"  {q} = shufflevector <16 x i8> %lo{u}, <16 x i8> %hi{u}, <32 x i32> <{iota}>"]
            if kind == "s4":
                s += [f"  %q{u} = sub {b32} %q0{u}, {splat('i8', 32, 8)}"]
        if kind in ("s8", "s4"):
            s += [f"  %ax{u} = call {b32} @llvm.abs.v32i8({b32} %q{u}, i1 false)"]
    for r in range(g):  # x row r's block b: int8 values, scale (and d * sum(q)), or floats
        s += [f"  %yp{t}{r} = getelementptr i8, ptr %xq{r}, i64 %{t}xo"]
        if flt:
            for c in range(32 // L):
                s += [f"  %yc{t}{r}_{c} = getelementptr i8, ptr %yp{t}{r}, i64 {4 * L * c}"]
                s += [f"  %yv{t}{r}_{c} = load {va}, ptr %yc{t}{r}_{c}, align 4"]
            continue
        s += [f"  %yv{t}{r} = load {b32}, ptr %yp{t}{r}, align 1"]
        s += [f"  %dxp{t}{r} = getelementptr float, ptr %xd{r}, i64 %{t}b"]
        s += [f"  %dx{t}{r} = load float, ptr %dxp{t}{r}, align 4"]
        if kind == "u4":
            s += [f"  %sxp{t}{r} = getelementptr float, ptr %xs{r}, i64 %{t}b"]
            s += [f"  %sx{t}{r} = load float, ptr %sxp{t}{r}, align 4"]
    for i, r in pairs:
        u, x = f"{t}{i}_{r}", f"{t}{r}"
        if flt:  # the block's products in L lanes (a fixed order), then one add:
            # the accumulator's dependency chain is one add per block, not 32 / L FMAs
            s += [f"  %fa{u}_0 = fmul {va} %wc{t}{i}_0, %yv{x}_0"]
            for c in range(1, 32 // L):
                s += [f"  %fa{u}_{c} = call {va} @llvm.fma.v{L}f32({va} %wc{t}{i}_{c},"
                      f" {va} %yv{x}_{c}, {va} %fa{u}_{c - 1})"]  # fmt: skip
            s += [f"  %{t}an{i}_{r} = fadd {va} %{t}a{i}_{r}, %fa{u}_{32 // L - 1}"]
            continue
        if kind == "u4":
            a, b = f"%q{t}{i}", f"%yv{x}"
        else:
            s += [f"  %sy{u} = call {b32} @llvm.x86.avx2.psign.b({b32} %yv{x}, {b32} %q{t}{i})"]
            a, b = f"%ax{t}{i}", f"%sy{u}"
        if vnni:
            s += [
                f"  %ub{u} = bitcast {b32} {a} to <8 x i32>",
                f"  %vb{u} = bitcast {b32} {b} to <8 x i32>",
            ]
            s += [
                f"  %pi{u} = call <8 x i32> @llvm.x86.avx512.vpdpbusd.256(<8 x i32>"
                f" zeroinitializer, <8 x i32> %ub{u}, <8 x i32> %vb{u})"
            ]
        else:
            s += [f"  %pr{u} = call <16 x i16> @llvm.x86.avx2.pmadd.ub.sw({b32} {a}, {b32} {b})"]
            s += [
                f"  %pi{u} = call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> %pr{u},"
                f" <16 x i16> {splat('i16', 16, 1)})"
            ]
        s += [f"  %pv{u} = sitofp <8 x i32> %pi{u} to {v8f}"]
        s += [f"  %dd{u} = fmul float %dw{t}{i}, %dx{x}"]
        s += [f"  %ddi{u} = insertelement {v8f} poison, float %dd{u}, i32 0"]
        s += [f"  %ddv{u} = shufflevector {v8f} %ddi{u}, {v8f} poison, <8 x i32> zeroinitializer"]
        s += [
            f"  %{t}an{i}_{r} = call {v8f} @llvm.fma.v8f32({v8f} %ddv{u}, {v8f} %pv{u},"
            f" {v8f} %{t}a{i}_{r})"
        ]
        if kind == "u4":
            s += [
                f"  %{t}sn{i}_{r} = call float @llvm.fma.f32(float %mw{t}{i}, float %sx{x},"
                f" float %{t}s{i}_{r})"
            ]
    s += [f"  %{t}b1 = add i64 %{t}b, 1", f"  %{t}bc = icmp ult i64 %{t}b1, %nb"]
    s += [f"  br i1 %{t}bc, label %{t}blk, label %{t}rowend", f"{t}rowend:"]
    idx = lambda *ix: ", ".join(f"i32 {j}" for j in ix)  # noqa: E731
    for i, r in pairs:  # the lanes summed by a fixed tree
        u, acc = f"{t}{i}_{r}", f"%{t}an{i}_{r}"
        if L == 16:
            s += [f"  %h0{u} = shufflevector {va} {acc}, {va} poison, <8 x i32> <{idx(*range(8))}>"]
            s += [
                f"  %h1{u} = shufflevector {va} {acc}, {va} poison, <8 x i32> <{idx(*range(8, 16))}>"
            ]
            s += [f"  %h2{u} = fadd {v8f} %h0{u}, %h1{u}"]
            acc = f"%h2{u}"
        s += [f"  %ha{u} = shufflevector {v8f} {acc}, {v8f} poison, <4 x i32> <{idx(0, 1, 2, 3)}>"]
        s += [f"  %hb{u} = shufflevector {v8f} {acc}, {v8f} poison, <4 x i32> <{idx(4, 5, 6, 7)}>"]
        s += [f"  %hc{u} = fadd <4 x float> %ha{u}, %hb{u}"]
        s += [
            f"  %hd{u} = shufflevector <4 x float> %hc{u}, <4 x float> poison, <2 x i32> <{idx(0, 1)}>"
        ]
        s += [
            f"  %he{u} = shufflevector <4 x float> %hc{u}, <4 x float> poison, <2 x i32> <{idx(2, 3)}>"
        ]
        s += [f"  %hf{u} = fadd <2 x float> %hd{u}, %he{u}"]
        s += [f"  %hg{u} = extractelement <2 x float> %hf{u}, i32 0"]
        s += [f"  %hh{u} = extractelement <2 x float> %hf{u}, i32 1"]
        s += [f"  %t{u} = fadd float %hg{u}, %hh{u}"]
        out = f"%t{u}"
        if kind == "u4":
            s += [f"  %tm{u} = fadd float %t{u}, %{t}sn{i}_{r}"]
            out = f"%tm{u}"
        s += [f"  %yq{u} = getelementptr float, ptr %y{r}, i64 %{t}ni{i}"]
        s += [f"  store float {out}, ptr %yq{u}, align 4"]
    s += [f"  %{t}n1 = add i64 %{t}n, {nr}", f"  %{t}nn = add i64 %{t}n1, {nr}"]
    s += [
        f"  %{t}nc = icmp ule i64 %{t}nn, %{t}end",
        f"  br i1 %{t}nc, label %{t}row, label %{nxt}",
    ]
    return s


def _wide_block(qtype: str, g: int, nr: int, t: str, b: str, acc: str, out: str, two: bool):
    """IR of one step of the 512-bit loop: blocks b and b + 1 (``two``), or block b alone in the
    low half (the odd last block; the high half's integers and scales are zeros, so it adds 0).

    Reads accumulators ``%{acc}a{i}_{r}`` (16 floats) and, for Q4_1's min term,
    ``%{acc}s{i}_{r}`` (2 floats: even and odd blocks); defines ``%{out}...`` in their place.
    """
    _, bs, qoff, kind = SPECS[qtype]
    v16f, v64 = "<16 x float>", "<64 x i8>"
    splat = lambda ty, n, v: "<" + ", ".join([f"{ty} {v}"] * n) + ">"  # noqa: E731
    iota = lambda n: ", ".join(f"i32 {j}" for j in range(n))  # noqa: E731
    halves = ", ".join(["i32 0"] * 8 + ["i32 1"] * 8)
    u = f"{out}"
    s = [f"  %bo{u} = mul i64 %{b}, {bs}", f"  %xo{u} = shl i64 %{b}, 5"]

    def pair_of(name: str, load: str) -> list[str]:  # <2 x float> from block b (and b + 1)
        # load: the value of block j, with {j} and {pq} ("p" for block b, "q" for b + 1)
        r = [f"  %{name}0 = {load.format(j=0, pq='p')}"]
        r += [f"  %{name}i = insertelement <2 x float> zeroinitializer, float %{name}0, i32 0"]
        if two:
            r += [f"  %{name}1 = {load.format(j=1, pq='q')}"]
            r += [f"  %{name} = insertelement <2 x float> %{name}i, float %{name}1, i32 1"]
        else:
            r += [f"  %{name} = fadd <2 x float> %{name}i, zeroinitializer"]
        return r

    for i in range(nr):  # weight row i: both blocks' integers in one register, scales per half
        w = f"{u}w{i}"
        s += [f"  %wb{w} = getelementptr i8, ptr %{t}wr{i}, i64 %bo{u}"]
        s += [f"  %wc{w} = getelementptr i8, ptr %wb{w}, i64 {bs}"]
        s += [f"  %pf{w} = getelementptr i8, ptr %wb{w}, i64 {PREFETCH}"]
        s += [f"  call void @llvm.prefetch.p0(ptr %pf{w}, i32 0, i32 3, i32 1)"]
        blk = (f"%wb{w}", f"%wc{w}").__getitem__
        for j in range(2 if two else 1):
            s += [f"  %dh{w}_{j} = load half, ptr {blk(j)}, align 1"]
            if kind == "u4":
                s += [f"  %mp{w}_{j} = getelementptr i8, ptr {blk(j)}, i64 2"]
                s += [f"  %mh{w}_{j} = load half, ptr %mp{w}_{j}, align 1"]
        s += pair_of(f"d{w}", f"fpext half %dh{w}_{{j}} to float")
        s += [
            f"  %dv{w} = shufflevector <2 x float> %d{w}, <2 x float> poison, <16 x i32> <{halves}>"
        ]
        if kind == "u4":
            s += pair_of(f"m{w}", f"fpext half %mh{w}_{{j}} to float")
        for j in range(2 if two else 1):  # nibbles: low half elements 0..15, high 16..31
            s += [f"  %qp{w}_{j} = getelementptr i8, ptr {blk(j)}, i64 {qoff}"]
            s += [f"  %p{w}_{j} = load <16 x i8>, ptr %qp{w}_{j}, align 1"]
            s += [f"  %lo{w}_{j} = and <16 x i8> %p{w}_{j}, {splat('i8', 16, 15)}"]
            s += [f"  %hi{w}_{j} = lshr <16 x i8> %p{w}_{j}, {splat('i8', 16, 4)}"]
            s += [
                f"  %q{w}_{j} = shufflevector <16 x i8> %lo{w}_{j}, <16 x i8> %hi{w}_{j},"
                f" <32 x i32> <{iota(32)}>"
            ]
        second = f"%q{w}_1" if two else "zeroinitializer"
        s += [
            f"  %q{w} = shufflevector <32 x i8> %q{w}_0, <32 x i8> {second}, <64 x i32> <{iota(64)}>"
        ]
        s += [f"  %qi{w} = bitcast {v64} %q{w} to <16 x i32>"]
    for r in range(g):  # x row r: 64 int8 values (or 32 and zeros), its scales per half
        x = f"{u}x{r}"
        s += [f"  %yp{x} = getelementptr i8, ptr %xq{r}, i64 %xo{u}"]
        if two:
            s += [f"  %yv{x} = load {v64}, ptr %yp{x}, align 1"]
        else:
            s += [f"  %yh{x} = load <32 x i8>, ptr %yp{x}, align 1"]
            s += [
                f"  %yv{x} = shufflevector <32 x i8> %yh{x}, <32 x i8> zeroinitializer,"
                f" <64 x i32> <{iota(64)}>"
            ]
        s += [f"  %yi{x} = bitcast {v64} %yv{x} to <16 x i32>"]
        for name, base in (("dx", "xd"), ("sx", "xs")) if kind == "u4" else (("dx", "xd"),):
            s += [f"  %{name}p{x} = getelementptr float, ptr %{base}{r}, i64 %{b}"]
            s += [f"  %{name}q{x} = getelementptr float, ptr %{name}p{x}, i64 1"]
            s += pair_of(f"{name}{x}", f"load float, ptr %{name}{{pq}}{x}, align 4")
        s += [
            f"  %dxv{x} = shufflevector <2 x float> %dx{x}, <2 x float> poison, <16 x i32> <{halves}>"
        ]
        if kind == "s4":  # sum((n - 8) q) = sum(n q) - 8 sum(q), all in int32: exact
            ones = splat("i32", 16, 0x01010101)
            s += [
                f"  %qs{x} = call <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32>"
                f" zeroinitializer, <16 x i32> {ones}, <16 x i32> %yi{x})"
            ]
            s += [f"  %q8{x} = mul <16 x i32> %qs{x}, {splat('i32', 16, -8)}"]
    for i in range(nr):
        for r in range(g):
            w, x, pr = f"{u}w{i}", f"{u}x{r}", f"{u}_{i}_{r}"
            src = f"%q8{x}" if kind == "s4" else "zeroinitializer"
            s += [
                f"  %pi{pr} = call <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32> {src},"
                f" <16 x i32> %qi{w}, <16 x i32> %yi{x})"
            ]
            s += [f"  %pv{pr} = sitofp <16 x i32> %pi{pr} to {v16f}"]
            s += [f"  %dd{pr} = fmul {v16f} %dv{w}, %dxv{x}"]
            s += [
                f"  %{out}a{i}_{r} = call {v16f} @llvm.fma.v16f32({v16f} %dd{pr}, {v16f} %pv{pr},"
                f" {v16f} %{acc}a{i}_{r})"
            ]
            if kind == "u4":
                s += [
                    f"  %{out}s{i}_{r} = call <2 x float> @llvm.fma.v2f32(<2 x float> %m{w},"
                    f" <2 x float> %sx{x}, <2 x float> %{acc}s{i}_{r})"
                ]
    return s


def _rows_ir_wide(qtype: str, g: int, nr: int, t: str, start: str, nxt: str) -> list[str]:
    """``_rows_ir`` for AVX-512 VNNI hosts, Q4_0 and Q4_1: two blocks per 512-bit step.

    Each (weight row, x row) pair's two blocks go through one ``vpdpbusd`` (64 bytes), one
    conversion, one multiply of the two blocks' scale products and one FMA into 16 float lanes
    (the 256-bit loop spends all of these on one block); Q4_1's min term accumulates in two
    lanes (even and odd blocks). An odd last block runs the same step with zeros in the high
    half. The order of the float operations depends on the weight's shape only, so batch
    invariance holds as in the 256-bit loop.
    """
    kind = SPECS[qtype][3]
    v16f = "<16 x float>"
    pairs = [(i, r) for i in range(nr) for r in range(g)]
    s = [f"{t}row:", f"  %{t}n = phi i64 [%{t}n0, %{start}], [%{t}n1, %{t}rowend]"]
    for i in range(nr):
        s += [f"  %{t}ni{i} = add i64 %{t}n, {i}", f"  %{t}wo{i} = mul i64 %{t}ni{i}, %rowb"]
        s += [f"  %{t}wr{i} = getelementptr i8, ptr %w, i64 %{t}wo{i}"]
    s += [f"  %{t}two = icmp uge i64 %nb, 2", f"  br i1 %{t}two, label %{t}blk, label %{t}post"]
    s += [f"{t}blk:", f"  %{t}b = phi i64 [0, %{t}row], [%{t}b2, %{t}blk]"]
    for i, r in pairs:
        s += [f"  %{t}a{i}_{r} = phi {v16f} [zeroinitializer, %{t}row], [%{t}ana{i}_{r}, %{t}blk]"]
        if kind == "u4":
            s += [
                f"  %{t}s{i}_{r} = phi <2 x float> [zeroinitializer, %{t}row],"
                f" [%{t}ans{i}_{r}, %{t}blk]"
            ]
    s += _wide_block(qtype, g, nr, t, f"{t}b", t, f"{t}an", two=True)
    s += [f"  %{t}b2 = add i64 %{t}b, 2", f"  %{t}b4 = add i64 %{t}b, 4"]
    s += [f"  %{t}bc = icmp ule i64 %{t}b4, %nb"]
    s += [f"  br i1 %{t}bc, label %{t}blk, label %{t}post", f"{t}post:"]
    for i, r in pairs:
        s += [f"  %{t}pa{i}_{r} = phi {v16f} [zeroinitializer, %{t}row], [%{t}ana{i}_{r}, %{t}blk]"]
        if kind == "u4":
            s += [
                f"  %{t}ps{i}_{r} = phi <2 x float> [zeroinitializer, %{t}row],"
                f" [%{t}ans{i}_{r}, %{t}blk]"
            ]
    s += [f"  %{t}odd = and i64 %nb, 1", f"  %{t}hasodd = icmp ne i64 %{t}odd, 0"]
    s += [f"  br i1 %{t}hasodd, label %{t}tb, label %{t}rowend", f"{t}tb:"]
    s += [f"  %{t}bt = sub i64 %nb, 1"]
    s += _wide_block(qtype, g, nr, t, f"{t}bt", f"{t}p", f"{t}tn", two=False)
    s += [f"  br label %{t}rowend", f"{t}rowend:"]
    idx = lambda *ix: ", ".join(f"i32 {j}" for j in ix)  # noqa: E731
    for i, r in pairs:
        u = f"{t}{i}_{r}"
        s += [f"  %f{u} = phi {v16f} [%{t}pa{i}_{r}, %{t}post], [%{t}tna{i}_{r}, %{t}tb]"]
        if kind == "u4":
            s += [f"  %fs{u} = phi <2 x float> [%{t}ps{i}_{r}, %{t}post], [%{t}tns{i}_{r}, %{t}tb]"]
    for i, r in pairs:  # the lanes summed by a fixed tree, then the min term's two lanes
        u = f"{t}{i}_{r}"
        s += [
            f"  %h0{u} = shufflevector {v16f} %f{u}, {v16f} poison, <8 x i32> <{idx(*range(8))}>",
            f"  %h1{u} = shufflevector {v16f} %f{u}, {v16f} poison,"
            f" <8 x i32> <{idx(*range(8, 16))}>",
            f"  %h2{u} = fadd <8 x float> %h0{u}, %h1{u}",
            f"  %ha{u} = shufflevector <8 x float> %h2{u}, <8 x float> poison, <4 x i32> <{idx(0, 1, 2, 3)}>",
            f"  %hb{u} = shufflevector <8 x float> %h2{u}, <8 x float> poison, <4 x i32> <{idx(4, 5, 6, 7)}>",
            f"  %hc{u} = fadd <4 x float> %ha{u}, %hb{u}",
            f"  %hd{u} = shufflevector <4 x float> %hc{u}, <4 x float> poison, <2 x i32> <{idx(0, 1)}>",
            f"  %he{u} = shufflevector <4 x float> %hc{u}, <4 x float> poison, <2 x i32> <{idx(2, 3)}>",
            f"  %hf{u} = fadd <2 x float> %hd{u}, %he{u}",
            f"  %hg{u} = extractelement <2 x float> %hf{u}, i32 0",
            f"  %hh{u} = extractelement <2 x float> %hf{u}, i32 1",
            f"  %t{u} = fadd float %hg{u}, %hh{u}",
        ]
        out = f"%t{u}"
        if kind == "u4":
            s += [
                f"  %ma{u} = extractelement <2 x float> %fs{u}, i32 0",
                f"  %mb{u} = extractelement <2 x float> %fs{u}, i32 1",
                f"  %mc{u} = fadd float %ma{u}, %mb{u}",
                f"  %tm{u} = fadd float %t{u}, %mc{u}",
            ]
            out = f"%tm{u}"
        s += [f"  %yq{u} = getelementptr float, ptr %y{r}, i64 %{t}ni{i}"]
        s += [f"  store float {out}, ptr %yq{u}, align 4"]
    s += [f"  %{t}n1 = add i64 %{t}n, {nr}", f"  %{t}nn = add i64 %{t}n1, {nr}"]
    s += [
        f"  %{t}nc = icmp ule i64 %{t}nn, %{t}end",
        f"  br i1 %{t}nc, label %{t}row, label %{nxt}",
    ]
    return s


def _kernel_ir(qtype: str, g: int, vnni: bool = False, lanes: int = 8, wide: bool = False) -> str:
    """y[r, n] for weight rows n in [r0, r1) and x rows r < g of one format (see module doc).

    Two weight rows at a time (two independent FMA chains per x row, each x block loaded once
    for both), then the odd row alone. ``wide``: Q4_0 / Q4_1 take two blocks per step in
    512-bit registers (``_rows_ir_wide``).
    """
    rows = _rows_ir
    if wide and ALL_SPECS[qtype][3] in ("u4", "s4"):
        rows = lambda q, g, vnni, nr, t, start, nxt, lanes: _rows_ir_wide(q, g, nr, t, start, nxt)  # noqa: E731
    name = f"ember_qdot_{qtype.lower()}_{g}{'_vnni' if vnni else ''}"
    s = [
        f"define void @{name}(i64 %wi, i64 %rowb, i64 %nb, i64 %r0, i64 %r1, i64 %xqi,"
        " i64 %ldx, i64 %xdi, i64 %xsi, i64 %ldd, i64 %yi, i64 %ldy) #0 {",
        "entry:",
        "  %w = inttoptr i64 %wi to ptr",
        "  %xq = inttoptr i64 %xqi to ptr",
        "  %xd = inttoptr i64 %xdi to ptr",
        "  %xs = inttoptr i64 %xsi to ptr",
        "  %y = inttoptr i64 %yi to ptr",
    ]
    for r in range(g):
        s += [
            f"  %xqo{r} = mul i64 %ldx, {r}",
            f"  %xq{r} = getelementptr i8, ptr %xq, i64 %xqo{r}",
        ]
        s += [
            f"  %xdo{r} = mul i64 %ldd, {r}",
            f"  %xd{r} = getelementptr float, ptr %xd, i64 %xdo{r}",
        ]
        s += [f"  %xs{r} = getelementptr float, ptr %xs, i64 %xdo{r}"]
        s += [f"  %yo{r} = mul i64 %ldy, {r}", f"  %y{r} = getelementptr float, ptr %y, i64 %yo{r}"]
    s += ["  %len = sub i64 %r1, %r0", "  %odd = and i64 %len, 1", "  %Pend = sub i64 %r1, %odd"]
    s += ["  %Pn0 = add i64 %r0, 0", "  %Pany = icmp ult i64 %r0, %Pend"]
    s += ["  br i1 %Pany, label %Prow, label %tail"]
    s += rows(qtype, g, vnni, 2, "P", "entry", "tail", lanes)
    s += ["tail:", "  %Send = add i64 %r1, 0", "  %Sn0 = add i64 %Pend, 0"]
    s += ["  %Sany = icmp ult i64 %Pend, %r1", "  br i1 %Sany, label %Srow, label %done"]
    s += rows(qtype, g, vnni, 1, "S", "tail", "done", lanes)
    s += ["done:", "  ret void", "}"]
    return "\n".join(s)


def _declarations(vnni: bool, wide: bool = False) -> list[str]:
    """The integer intrinsics the kernels use (gemm.jit_ir declares the float ones)."""
    b32 = "<32 x i8>"
    d = [
        f"declare {b32} @llvm.abs.v32i8({b32}, i1)",
        f"declare {b32} @llvm.x86.avx2.psign.b({b32}, {b32})",
        f"declare <16 x i16> @llvm.x86.avx2.pmadd.ub.sw({b32}, {b32})",
        "declare <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16>, <16 x i16>)",
        "declare float @llvm.fma.f32(float, float, float)",
    ]
    if vnni:
        d += ["declare <8 x i32> @llvm.x86.avx512.vpdpbusd.256(<8 x i32>, <8 x i32>, <8 x i32>)"]
    if wide:
        d += [
            "declare <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32>, <16 x i32>, <16 x i32>)",
            "declare <2 x float> @llvm.fma.v2f32(<2 x float>, <2 x float>, <2 x float>)",
        ]
    return d


def module_ir(vnni: bool = False, lanes: int = 8, wide: bool = False) -> list[str]:
    """Every kernel (three formats x 1..G_MAX rows) with the declarations they need."""
    fns = [_kernel_ir(q, g, vnni, lanes, wide) for q in KERNELS for g in range(1, G_MAX + 1)]
    return _declarations(vnni, wide) + fns


def _has_wide(features: dict, isa: str) -> bool:
    """512-bit vpdpbusd (AVX-512 VNNI and BW) in the AVX-512 family (not under
    EMBER_SGEMM_ISA=avx2 or EMBER_QUANT_DOT=int8-256)."""
    if isa != "avx512" or not config.QUANT_WIDE:
        return False
    return bool(features.get("avx512vnni") and features.get("avx512bw"))


def _has_vnni(features: dict, isa: str) -> bool:
    """256-bit vpdpbusd: AVX-VNNI, or AVX-512 VNNI with VL (not under EMBER_SGEMM_ISA=avx2)."""
    if isa != "avx512" and config.SGEMM_ISA == "avx2":
        return False
    return bool(
        features.get("avxvnni") or (features.get("avx512vnni") and features.get("avx512vl"))
    )


# ------------------------------------------------------------------ numba driver
_q8 = None  # _q8x's ember_q8_rows (ExternalFunction)
_run = _acquire = None  # kernels.cpu.pool's ember_pool_run and ember_pool_acquire
_submit = None  # _submit_py compiled (the panel kernels' driver in _pdot calls it too)
# the pool's job words the driver fills (kernels.cpu.pool's layout), bound by _build
_CHUNK = _ROWS = _GROUPS = _WI = _ROWB = _NB = _LDX = _LDD = _LDY = _GROUP0 = _GROUP_WORDS = 0


def _driver_py(f, w, x, y, xq, xd, xs, xi, chunk, ctrl, own, fns):  # pragma: no cover - compiled
    """y (M, N) = x @ W.T for W's (N, blocks, bytes) uint8 blocks of format f, x float32 (M, K).

    Quantizes x, then hands the weight's rows to ``kernels.cpu.pool`` in chunks of ``chunk``
    rows; each chunk runs the kernel for every group of up to G_MAX rows of x while its weight
    rows stay in cache. ``ctrl``: the pool's job block; ``own``: the caller's, used alone when
    another thread holds the pool's. ``fns``: the kernels' addresses, format-major. xq, xd,
    xs, xi: scratch for x's Q8 blocks (``_q8x``), from the caller (the kernels see raw addresses
    only: arrays allocated here could be freed by numba before the pool reads them). Returns the
    cycles the caller waited.
    """
    m, k = x.shape
    n, nb, bs = w.shape
    fx = f >= 3  # Q8_0F and F32 read x as floats
    xb = 4 * k if fx else k  # bytes per row of what the kernels read: x, or its int8 blocks
    if not fx:
        _q8(x.ctypes.data, m, k, xq.ctypes.data, xd.ctypes.data, xs.ctypes.data, xi.ctypes.data)
    qa = x.ctypes.data if fx else xq.ctypes.data
    job = (w.ctypes.data, nb * bs, nb, chunk, n, m, G_MAX, G_MAX * f)
    return _submit(ctrl, own, fns, job, qa, xb, xd.ctypes.data, xs.ctypes.data, 4, y.ctypes.data)


def _submit_py(ctrl, own, fns, job, qa, xb, da, sa, sb, ya):  # pragma: no cover - compiled
    """Fill the pool's job block (``own`` when another thread holds ``ctrl``) and run it: the
    weight's rows in chunks, each chunk running every group of up to gmax rows of x. job: (weight
    address, bytes per row, blocks per row, rows per chunk, n, m, gmax, the format's first
    kernel in fns); x's int8 blocks at qa (xb bytes a row), their scales at da (nb floats a
    row), the sums at sa (sb bytes per block a row), y at ya. Returns the cycles waited."""
    wi, rowb, nb, chunk, n, m, gmax, f0 = job
    shared = _acquire(ctrl.ctypes.data)
    if shared == 0:
        ctrl = own
    ctrl[_CHUNK] = chunk
    ctrl[_ROWS] = n
    ctrl[_WI] = wi
    ctrl[_ROWB] = rowb
    ctrl[_NB] = nb
    ctrl[_LDX] = xb
    ctrl[_LDD] = nb
    ctrl[_LDY] = n
    groups = (m + gmax - 1) // gmax
    ctrl[_GROUPS] = groups
    for j in range(groups):
        m0 = j * gmax
        o = _GROUP0 + _GROUP_WORDS * j
        ctrl[o] = fns[f0 + min(gmax, m - m0) - 1]
        ctrl[o + 1] = qa + m0 * xb
        ctrl[o + 2] = da + m0 * nb * 4
        ctrl[o + 3] = sa + m0 * nb * sb
        ctrl[o + 4] = ya + m0 * n * 4
    return _run(ctrl.ctypes.data, (n + chunk - 1) // chunk, shared)


def _build(nb, vnni: bool):
    from ember.kernels.cpu import pool, vecmath
    from ember.kernels.cpu.quant import _q8x

    g = globals()
    pool.bind(g, *"CHUNK ROWS GROUPS WI ROWB NB LDX LDD LDY GROUP0 GROUP_WORDS".split())
    opts = dict(cache=True, nogil=True, error_model="numpy")
    g["_q8"] = q8_symbol()
    me = sys.modules[__name__]
    g["_submit"] = nb.njit(**opts)(vecmath.keyed(_submit_py, me, pool))
    return nb.njit(**opts)(vecmath.keyed(_driver_py, me, pool, _q8x))


def q8_symbol():
    """_q8x's ``ember_q8_rows`` as a function numba drivers call (compiled once)."""
    from numba import types

    from ember.kernels.cpu.quant import _q8x

    _q8x.state()
    i64 = types.int64
    return types.ExternalFunction("ember_q8_rows", types.void(i64, i64, i64, i64, i64, i64, i64))


def state() -> dict | None:
    """Compile the kernels, the pool and the driver once; None where they cannot run here."""
    if "ok" not in _STATE:
        _STATE["ok"] = False
        from ember.kernels.cpu import numba_or_none

        nb = numba_or_none()
        if nb is not None:
            from ember.kernels.cpu import gemm as G
            from ember.kernels.cpu import pool

            isa = G.isa()  # None without llvmlite, AVX2+FMA, or under EMBER_SGEMM_ISA=none
            if isa is not None and pool.state() is not None:
                import llvmlite.binding as llvm

                features = llvm.get_host_cpu_features()
                vnni = _has_vnni(features, isa)
                wide = vnni and _has_wide(features, isa)
                suffix = "_vnni" if vnni else ""
                names = [
                    f"ember_qdot_{q.lower()}_{r}{suffix}"
                    for q in KERNELS
                    for r in range(1, G_MAX + 1)
                ]
                lanes = G.ISAS[isa][0]  # Q8_0F's accumulators: one vector register
                engine = G.jit_ir(module_ir(vnni, lanes, wide), names)
                fns = np.array([engine.get_function_address(n) for n in names], np.int64)
                _STATE.update(ok=True, engine=engine, vnni=vnni, wide=wide, fns=fns,
                              driver=_build(nb, vnni))  # fmt: skip
    return _STATE if _STATE["ok"] else None


def available() -> bool:
    """Whether the integer kernels run here (and ``EMBER_QUANT_DOT`` does not ask for float)."""
    if config.QUANT_DOT == "float":
        return False
    ok = _STATE.get("ok")
    return state() is not None if ok is None else ok


def check(qtype: str, w3, x, y) -> None:
    """The kernels follow raw pointers: refuse operands that would take them out of bounds."""
    if qtype not in KERNELS:
        raise DTypeError(f"qdot: no integer kernel for {qtype}")
    bs = ALL_SPECS[qtype][1]
    if not (isinstance(w3, np.ndarray) and w3.dtype == np.uint8 and w3.flags.c_contiguous):
        raise DTypeError("qdot: the weight must be C-contiguous uint8 blocks")
    if w3.ndim != 3 or w3.shape[2] != bs or w3.shape[0] < 1 or w3.shape[1] < 1:
        raise ShapeError(f"qdot: the weight must be (rows, blocks, {bs}), got {w3.shape}")
    for name, a in (("x", x), ("y", y)):
        ok = isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim == 2
        if not ok or not a.flags.c_contiguous:
            raise DTypeError(f"qdot: {name} must be a C-contiguous 2-d float32 array")
    n, nb, _ = w3.shape
    if x.shape[1] != 32 * nb or x.shape[0] < 1 or y.shape != (x.shape[0], n):
        raise ShapeError(f"qdot: x {x.shape} and y {y.shape} do not fit the weight {(n, nb * 32)}")


def product(qtype: str, w3: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    """y = x @ W.T by the kernel of qtype (operands checked here), on the pool's threads."""
    m = x.shape[0] if isinstance(x, np.ndarray) and x.ndim == 2 else 0
    if m > MAX_GROUPS_ROWS:
        for m0 in range(0, m, MAX_GROUPS_ROWS):
            product(qtype, w3, x[m0 : m0 + MAX_GROUPS_ROWS], y[m0 : m0 + MAX_GROUPS_ROWS])
        return
    bind(qtype, w3, x, y)()


def bind(qtype: str, w3: np.ndarray, x: np.ndarray, y: np.ndarray):
    """A no-argument function computing y = x @ W.T on these arrays (checked here, up to
    MAX_GROUPS_ROWS rows of x), whatever x holds when it is called: the product of a captured
    step (ember.nn.graph) is one call of it."""
    from ember.kernels.cpu import pool

    check(qtype, w3, x, y)
    m, k = x.shape
    if m > MAX_GROUPS_ROWS:
        raise ShapeError(f"qdot: {m} rows of x, at most {MAX_GROUPS_ROWS} per product")
    st = _STATE if _STATE.get("ok") else state()
    f = ALL_SPECS[qtype][0]
    mq, kq = (32, 32) if f in FLOAT_X else (m, k)  # float x is read as it is: no scratch
    xq = np.empty((mq, kq), np.int8)
    xd = np.empty((mq, kq // 32), np.float32)
    xs = np.empty((mq, kq // 32), np.float32)
    xi = np.empty((mq, kq // 32), np.int32)
    n, rowb = w3.shape[0], w3.shape[1] * w3.shape[2]
    # about CHUNK_BYTES of weight rows per chunk, per group of G_MAX rows of x that reads them
    groups = -(-m // G_MAX)
    chunk = max(2, min(n, CHUNK_BYTES // (rowb * groups)) & ~1)
    driver, fns, ctrl = st["driver"], st["fns"], pool.ctrl
    own = np.zeros(pool.CTRL_WORDS, np.int64)  # the job's block when another thread has the pool's

    def run() -> None:
        driver(f, w3, x, y, xq, xd, xs, xi, chunk, ctrl(), own, fns)

    return run
