"""Integer products of Q8_0 / Q4_0 / Q4_1 / Q6_K / Q4_K / Q5_K weight panels and int8 x.

x is quantized by ``_q8x`` (Q8 blocks of 32: int8 ``q``, scale ``d``, and per block ``sum(q)``
as an integer and ``d * sum(q)`` as a float). For weight row n, x row r, block b the kernels
form the block's exact integer dot product, then one float step:

* Q8_0:  ``i = sum((q_w + 128) q_x) - 128 sum(q_x)``  (= ``sum(q_w q_x)``)
* Q4_0:  ``i = sum(n_w q_x) - 8 sum(q_x)``            (= ``sum((n_w - 8) q_x)``)
* Q4_1:  ``i = sum(n_w q_x)``, and the min term ``m_w * (d_x sum(q_x))`` in its own sum
* Q6_K:  each half block's ``sum(q_w q_x) - 32 sum(q_x)`` times its int8 scale (``_pdot_q6k``)
* Q4_K / Q5_K: ``i = sum(q_w q_x)`` per sub-block (= x block) with scale ``d_w sc`` and the min
  term ``-(dmin_w m) * (d_x sum(q_x))`` in its own sum (``_pdot_q4k``)
* ``acc[n, r] = fma(d_w * d_x, float(i), acc[n, r])`` block after block; y = acc (+ the min sum)

One 32-bit lane is one weight row: a 512-bit ``vpdpbusd`` multiplies 4 bytes of each of a
panel's 16 rows by the same 4 bytes of x (a broadcast), so a block's integer sums arrive
already per row (no horizontal sums), and the scales of 16 rows are one conversion and one
multiply. Per block and x row that is 8 ``vpdpbusd`` (16 rows x 32 values) and 4 float
instructions, against ``_idot``'s per-row conversion, multiply and FMA for every block and row.
The weight's bytes are decoded (Q4's nibbles split) once per block for the g rows of x that one
call carries (``g <= G_MAX``): with g = 8 this is a GEMM microkernel for prefill as much as a
decode loop (a 128-row prompt through a TinyLlama layer: ~350 GMAC/s per core on Zen 5, 65% of
its two 512-bit ``vpdpbusd`` per cycle; each block and row also takes a conversion, a multiply
and an FMA). ``_driver_py`` quantizes x and hands chunks of rows to ``kernels.cpu.pool``'s
threads; each chunk runs every group of g rows of x while its panels stay in cache.

Paths, by host: AVX-512 VNNI + BW: 512-bit ``vpdpbusd`` (``"zmm"``); AVX-VNNI or AVX-512 VNNI
with VL (or ``EMBER_QUANT_DOT=int8-256``): 256-bit ``vpdpbusd``, each panel as two halves of 8
rows (``"ymm"``); AVX2: ``vpmaddubsw`` + ``vpmaddwd`` (Q8_0 through the sign trick, ``|q_w|``
times ``sign(q_w) q_x``: no int16 saturation) (``"avx2"``). All three form the same integers
and then the same float operations in the same order, so their results are bitwise equal.

Batch invariance: every (weight row, x row) pair sees the same operations in the same order
whatever the number of rows of x, the group it falls in, the thread or the chunk of rows: row i
of an M-row product is bitwise the product of x[i] alone.
"""

from __future__ import annotations

import sys

import numpy as np

from ember import config
from ember.errors import DTypeError, ShapeError
from ember.kernels.cpu.quant import _idot, _panels

FORMATS = ("Q8_0", "Q4_0", "Q4_1", "Q6_K", "Q4_K", "Q5_K")  # format id = index
G_MAX = {"zmm": 8, "ymm": 4, "avx2": 4}  # x rows per kernel call, by path
# weight bytes per chunk of pool work, for one group of x rows. 1 << 16 before: 1 << 18 took
# a 1B model's decode shapes (bench/quant.py, M = 1, 2 threads, configurations alternated in
# one process) from 98-101% to 108-111% of the read bandwidth for Q4_K / Q5_K, Q8_0 128 -> 139%,
# Q4_0 108 -> 115%, Q4_1 107 -> 117%, Q6_K 98 -> 111%, M = 4 and 16 a few % faster, 1 thread
# unchanged (1 << 19 alike; a quarter of the weight per chunk 2-4% more). A chunk runs every
# group of x rows, so with more groups it covers fewer weight bytes, down to a quarter of
# CHUNK_BYTES (the old 64 KiB): with 1 << 18 whatever the groups, a 128-row prefill's chunks
# (16 groups, ~60 M multiply-adds each) left the pool's master solo in 3 of 4 runs (2 threads
# as slow as 1: Q4_0 15.5 ms against 8.7); now as before (8.9 / 8.4-9.3 ms). A weight under
# MIN_CHUNKS chunks gets chunks of 1 / MIN_CHUNKS of it, again not under a quarter of
# CHUNK_BYTES (a 135M model's 576 x 576 products, ~200 KB, split among the threads as before)
CHUNK_BYTES = 1 << 18
MIN_CHUNKS = 8
# bytes ahead of the current block that each block step prefetches, every line of it: one
# line per block at 1024 bytes left Q4_0 at M = 4 reading 13 GB/s from DRAM on one thread,
# every line at 8192 about 25; 16384 gave 2 threads a few GB/s more again at M = 1-8 (ad-hoc
# sweeps of bench/quant.py's layer, loaded machine; 32768 and chunks of 16-128 KB no better)
PREFETCH = 16384
_STATE: dict = {}


# ------------------------------------------------------------------ LLVM IR
def _splat(ty: str, n: int, v) -> str:
    return "<" + ", ".join([f"{ty} {v}"] * n) + ">"


def kernel_ir(qtype: str, g: int, path: str) -> str:
    """y[r, n] for the panels holding rows [r0, r1) and x rows r < g (see module doc).

    Arguments as kernels.cpu.pool calls them: (w, panel bytes, blocks of x, r0, r1, xq, ldx,
    xd, xs, ldd, y, ldy); xs holds the offset's correction -128 sum(q) (Q8_0) or -8 sum(q)
    (Q4_0) as int32, d * sum(q) as float32 (Q4_1, Q4_K, Q5_K), or -32 sum(q) of each half
    block (Q6_K).
    """
    W = 16 if path == "zmm" else 8  # lanes (rows) per vector
    if qtype == "Q6_K":
        from ember.kernels.cpu.quant import _pdot_q6k

        return frame_ir(qtype, g, path, 384, 2, False, _pdot_q6k.block_ir(g, path, W))
    if qtype in _panels.KQUANT:
        from ember.kernels.cpu.quant import _pdot_q4k

        qn = _panels.KQUANT[qtype][1] * 8  # quant bytes of a panel per x block
        body = _pdot_q4k.block_ir(qtype, g, path, W)
        return frame_ir(qtype, g, path, qn, 1, True, body, step=2)
    groups = _panels.SPECS[qtype][2]
    body = _block_ir(qtype, g, path, W)
    return frame_ir(qtype, g, path, 64 * groups, 1, qtype == "Q4_1", body)


def frame_ir(
    qtype, g: int, path: str, qn: int, xs_rows: int, minsum: bool, body, step: int = 1
) -> str:
    """The loops every format shares: over the panels of rows [r0, r1), over the blocks of x
    (``%b``: quants at ``%qa`` = panel + b * qn, scales at ``%sb`` + 32 b, ``%mb`` after them;
    ``step`` blocks per iteration, nb a multiple of it),
    the accumulators ``%a{r}_{h}`` (and ``%m{r}_{h}``: Q4_1's min term) that ``body`` (the IR of
    one block) advances to ``%an{r}_{h}`` / ``%mn{r}_{h}``, and the stores (masked in the last
    panel). x row r's sums at ``%xs{r}`` are ``xs_rows`` rows of ldd int32 apart.
    """
    W = 16 if path == "zmm" else 8
    H = 16 // W
    vf = f"<{W} x float>"
    name = f"ember_pdot_{qtype.lower()}_{g}_{path}"
    s = [
        f"define void @{name}(i64 %wi, i64 %pbytes, i64 %nb, i64 %r0, i64 %r1, i64 %xqi,"
        " i64 %ldx, i64 %xdi, i64 %xsi, i64 %ldd, i64 %yi, i64 %ldy) #0 {",
        "entry:",
        "  %w = inttoptr i64 %wi to ptr",
        "  %xq = inttoptr i64 %xqi to ptr",
        "  %xd = inttoptr i64 %xdi to ptr",
        "  %xs = inttoptr i64 %xsi to ptr",
        "  %y = inttoptr i64 %yi to ptr",
        f"  %qall = mul i64 %nb, {qn}",
        "  %dall = shl i64 %nb, 5",
    ]
    for r in range(g):
        s += [
            f"  %xqo{r} = mul i64 %ldx, {r}",
            f"  %xq{r} = getelementptr i8, ptr %xq, i64 %xqo{r}",
            f"  %xdo{r} = mul i64 %ldd, {r}",
            f"  %xd{r} = getelementptr float, ptr %xd, i64 %xdo{r}",
            f"  %xso{r} = mul i64 %ldd, {xs_rows * r}",
            f"  %xs{r} = getelementptr i32, ptr %xs, i64 %xso{r}",
            f"  %yo{r} = mul i64 %ldy, {r}",
            f"  %y{r} = getelementptr float, ptr %y, i64 %yo{r}",
        ]
    s += [
        "  %p0 = lshr i64 %r0, 4",
        "  %r1e = add i64 %r1, 15",
        "  %p1 = lshr i64 %r1e, 4",
        "  %any = icmp ult i64 %p0, %p1",
        "  br i1 %any, label %panel, label %done",
        "panel:",
        "  %p = phi i64 [%p0, %entry], [%pn, %stored]",
        "  %po = mul i64 %p, %pbytes",
        "  %pb = getelementptr i8, ptr %w, i64 %po",
        "  %sb = getelementptr i8, ptr %pb, i64 %qall",
        "  %mb = getelementptr i8, ptr %sb, i64 %dall",
        "  br label %blk",
        "blk:",
        "  %b = phi i64 [0, %panel], [%b1, %blk]",
    ]
    accs = [(r, h) for r in range(g) for h in range(H)]
    for r, h in accs:
        s += [f"  %a{r}_{h} = phi {vf} [zeroinitializer, %panel], [%an{r}_{h}, %blk]"]
        if minsum:
            s += [f"  %m{r}_{h} = phi {vf} [zeroinitializer, %panel], [%mn{r}_{h}, %blk]"]
    s += [
        f"  %qo = mul i64 %b, {qn}",
        "  %qa = getelementptr i8, ptr %pb, i64 %qo",
        "  %so = shl i64 %b, 5",
    ]
    for k in range(step * qn // 64):  # every line of the blocks' quants, PREFETCH bytes ahead
        s += [
            f"  %pf{k} = getelementptr i8, ptr %qa, i64 {PREFETCH + 64 * k}",
            f"  call void @llvm.prefetch.p0(ptr %pf{k}, i32 0, i32 3, i32 1)",
        ]
    s += [  # and the scales' line (two blocks' scales; Q4_1's mins on the next line)
        "  %pfs = getelementptr i8, ptr %sb, i64 %so",
        f"  %pfs1 = getelementptr i8, ptr %pfs, i64 {PREFETCH // 8}",
        "  call void @llvm.prefetch.p0(ptr %pfs1, i32 0, i32 3, i32 1)",
    ]
    s += body
    s += [
        f"  %b1 = add i64 %b, {step}",
        "  %more = icmp ult i64 %b1, %nb",
        "  br i1 %more, label %blk, label %store",
        "store:",
        "  %n0 = shl i64 %p, 4",
        "  %left = sub i64 %r1, %n0",
        "  %full = icmp uge i64 %left, 16",
        "  br i1 %full, label %sfull, label %spart",
        "sfull:",
    ]
    outs = {}
    for r, h in accs:
        u = f"{r}_{h}"
        if minsum:
            s += [f"  %o{u} = fadd {vf} %an{u}, %mn{u}"]
            outs[(r, h)] = f"%o{u}"
        else:
            outs[(r, h)] = f"%an{u}"
    # (the fadd above is in sfull's block; spart recomputes it: each block defines its own)
    for r, h in accs:
        u = f"{r}_{h}"
        s += [
            f"  %yn{u} = add i64 %n0, {W * h}",
            f"  %ya{u} = getelementptr float, ptr %y{r}, i64 %yn{u}",
            f"  store {vf} {outs[(r, h)]}, ptr %ya{u}, align 4",
        ]
    s += ["  br label %stored", "spart:"]
    iota = ", ".join(f"i64 {j}" for j in range(W))
    s += [
        f"  %li = insertelement <{W} x i64> poison, i64 %left, i32 0",
        f"  %lv = shufflevector <{W} x i64> %li, <{W} x i64> poison, <{W} x i32> zeroinitializer",
    ]
    for h in range(H):
        s += [
            f"  %ix{h} = add <{W} x i64> <{iota}>, {_splat('i64', W, W * h)}",
            f"  %mk{h} = icmp ult <{W} x i64> %ix{h}, %lv",
        ]
    for r, h in accs:
        u = f"{r}_{h}"
        val = f"%an{u}"
        if minsum:
            s += [f"  %op{u} = fadd {vf} %an{u}, %mn{u}"]
            val = f"%op{u}"
        s += [
            f"  %ypn{u} = add i64 %n0, {W * h}",
            f"  %ypa{u} = getelementptr float, ptr %y{r}, i64 %ypn{u}",
            f"  call void @llvm.masked.store.v{W}f32.p0({vf} {val}, ptr %ypa{u}, i32 4,"
            f" <{W} x i1> %mk{h})",
        ]
    s += [
        "  br label %stored",
        "stored:",
        "  %pn = add i64 %p, 1",
        "  %pmore = icmp ult i64 %pn, %p1",
        "  br i1 %pmore, label %panel, label %done",
        "done:",
        "  ret void",
        "}",
    ]
    return "\n".join(s)


def x_ir(r: int, W: int, path: str, b: str = "%b", tag=None) -> list[str]:
    """x row r's block ``b``: its scale broadcast (``%dxv{tag}``) and its 8 words of int8 each
    broadcast to every lane (``%ev{tag}_{j}``; ``%eb{tag}_{j}`` as bytes on AVX2); tag: r."""
    vf, vi = f"<{W} x float>", f"<{W} x i32>"
    t = r if tag is None else tag
    s = [
        f"  %xo{t} = shl i64 {b}, 5",
        f"  %xb{t} = getelementptr i8, ptr %xq{r}, i64 %xo{t}",
        f"  %dxa{t} = getelementptr float, ptr %xd{r}, i64 {b}",
        f"  %dx{t} = load float, ptr %dxa{t}, align 4",
        f"  %dxi{t} = insertelement {vf} poison, float %dx{t}, i32 0",
        f"  %dxv{t} = shufflevector {vf} %dxi{t}, {vf} poison, <{W} x i32> zeroinitializer",
    ]
    for j in range(8):
        s += [
            f"  %ea{t}_{j} = getelementptr i8, ptr %xb{t}, i64 {4 * j}",
            f"  %e{t}_{j} = load i32, ptr %ea{t}_{j}, align 4",
            f"  %ei{t}_{j} = insertelement {vi} poison, i32 %e{t}_{j}, i32 0",
            f"  %ev{t}_{j} = shufflevector {vi} %ei{t}_{j}, {vi} poison,"
            f" <{W} x i32> zeroinitializer",
        ]
        if path == "avx2":
            s += [f"  %eb{t}_{j} = bitcast {vi} %ev{t}_{j} to <{4 * W} x i8>"]
    return s


def splat_load_ir(name: str, ty: str, ptr: str, W: int) -> list[str]:
    """%{name}: the value of type ty at ptr broadcast to W lanes."""
    return [
        f"  %{name}s = load {ty}, ptr {ptr}, align 4",
        f"  %{name}i = insertelement <{W} x {ty}> poison, {ty} %{name}s, i32 0",
        f"  %{name} = shufflevector <{W} x {ty}> %{name}i, <{W} x {ty}> poison,"
        f" <{W} x i32> zeroinitializer",
    ]


def _block_ir(qtype: str, g: int, path: str, W: int) -> list[str]:
    """One block of Q8_0 / Q4_0 / Q4_1 (see module doc) for x rows r < g."""
    _, _, groups, _ = _panels.SPECS[qtype]
    H = 16 // W  # vectors per panel row set
    B = 4 * W  # bytes per vector
    vb, vi, vf, vh = f"<{B} x i8>", f"<{W} x i32>", f"<{W} x float>", f"<{W} x half>"
    q4 = qtype != "Q8_0"
    minsum = qtype == "Q4_1"
    s = []
    # the weight's vectors: operand (k, h) is what multiplies x's 4-byte word k for half h
    ops: dict = {}
    for k in range(groups):
        for h in range(H):
            u = f"{k}_{h}"
            s += [
                f"  %va{u} = getelementptr i8, ptr %qa, i64 {64 * k + B * h}",
                f"  %v{u} = load {vb}, ptr %va{u}, align 64",
            ]
            if q4:
                s += [
                    f"  %lo{u} = and {vb} %v{u}, {_splat('i8', B, 15)}",
                    f"  %hi{u} = lshr {vb} %v{u}, {_splat('i8', B, 4)}",
                ]
                ops[(k, h)], ops[(4 + k, h)] = f"%lo{u}", f"%hi{u}"
            elif path == "avx2":  # signed q_w back (xor 128), |q_w| for the sign trick
                s += [
                    f"  %sw{u} = xor {vb} %v{u}, {_splat('i8', B, -128)}",
                    f"  %aw{u} = call {vb} @llvm.abs.v{B}i8({vb} %sw{u}, i1 false)",
                ]
                ops[(k, h)] = (f"%aw{u}", f"%sw{u}")
            else:
                ops[(k, h)] = f"%v{u}"
    for h in range(H):  # the 16 rows' scales (and mins), as W floats per half
        for nm, base in (("d", "%sb"), ("mw", "%mb")) if minsum else (("d", "%sb"),):
            s += [
                f"  %{nm}o{h} = add i64 %so, {2 * W * h}",
                f"  %{nm}a{h} = getelementptr i8, ptr {base}, i64 %{nm}o{h}",
                f"  %{nm}h{h} = load {vh}, ptr %{nm}a{h}, align 2",
                f"  %{nm}w{h} = fpext {vh} %{nm}h{h} to {vf}",
            ]
    for r in range(g):
        s += x_ir(r, W, path)
        s += [f"  %xsa{r} = getelementptr i32, ptr %xs{r}, i64 %b"]
        if minsum:
            s += splat_load_ir(f"sxv{r}", "float", f"%xsa{r}", W)
        elif path != "avx2" or q4:  # the offset's correction (AVX2's Q8_0 dots are signed;
            s += splat_load_ir(f"ofv{r}", "i32", f"%xsa{r}", W)  # the driver multiplied it)
        init = f"%ofv{r}" if (not minsum and (path != "avx2" or q4)) else "zeroinitializer"
        for h in range(H):
            u = f"{r}_{h}"
            terms = [(ops[(j, h)], r, j) for j in range(8)]
            s += _dot_ir(path, u, terms, init, "s8" if q4 else "sign", g, W)
            s += [
                f"  %f{u} = sitofp {vi} %i{u} to {vf}",
                f"  %sc{u} = fmul {vf} %dw{h}, %dxv{r}",
                f"  %an{u} = call {vf} @llvm.fma.v{W}f32({vf} %sc{u}, {vf} %f{u}, {vf} %a{u})",
            ]
            if minsum:
                s += [f"  %mn{u} = call {vf} @llvm.fma.v{W}f32({vf} %mww{h}, {vf} %sxv{r},"
                      f" {vf} %m{u})"]  # fmt: skip
    return s


def _dot_ir(path: str, u: str, terms: list, init: str, kind: str, g: int, W: int) -> list[str]:
    """%i{u}: init + the sum of the terms (weight operand, x row, x word) as int32 lanes.

    On AVX2 (``vpmaddubsw``: int16 pairs, then ``vpmaddwd``) by the weight's range, ``kind``:
    "s8" (nibbles: 8 products of |pair| <= 2 * 15 * 127 summed in int16), "u5" (Q5_K's 5-bit
    values: |pair| <= 2 * 31 * 127, four at a time), "u6" (Q6_K's 6-bit values:
    |pair| <= 2 * 63 * 127, two at a time), "sign" (Q8_0: weight operands are
    (|q_w|, q_w) for the sign trick, |pair| <= 2 * 128 * 127, each widened alone).
    """
    B = 4 * W
    vb, vi = f"<{B} x i8>", f"<{W} x i32>"
    s = []
    if path in ("zmm", "ymm"):
        bits = 32 * W
        chains = 2 if g <= 2 else 1  # a single row of x: two dependency chains
        cur = [init] + ["zeroinitializer"] * (chains - 1)
        for t, (wop, r, j) in enumerate(terms):
            c = t % chains
            s += [
                f"  %wb{u}_{t} = bitcast {vb} {wop} to {vi}",
                f"  %c{u}_{t} = call {vi} @llvm.x86.avx512.vpdpbusd.{bits}({vi} {cur[c]},"
                f" {vi} %wb{u}_{t}, {vi} %ev{r}_{j})",
            ]
            cur[c] = f"%c{u}_{t}"
        if chains == 2:
            s += [f"  %i{u} = add {vi} {cur[0]}, {cur[1]}"]
        else:
            s += [f"  %i{u} = add {vi} {cur[0]}, zeroinitializer"]
        return s
    ones = _splat("i16", 16, 1)
    prods = []
    for t, (wop, r, j) in enumerate(terms):
        xop = f"%eb{r}_{j}"
        if kind == "sign":  # |q_w| (unsigned) times sign(q_w) * q_x
            wop, sw = wop
            s += [f"  %sg{u}_{t} = call {vb} @llvm.x86.avx2.psign.b({vb} %eb{r}_{j}, {vb} {sw})"]
            xop = f"%sg{u}_{t}"
        s += [f"  %pm{u}_{t} = call <16 x i16> @llvm.x86.avx2.pmadd.ub.sw({vb} {wop}, {vb} {xop})"]
        prods.append(f"%pm{u}_{t}")
    per = {"s8": len(prods), "u5": 4, "u6": 2, "sign": 1}[kind]  # products one int16 sum can take
    acc = init
    for c in range(0, len(prods), per):
        part = prods[c]
        for t, p in enumerate(prods[c + 1 : c + per]):
            s += [f"  %ps{u}_{c}_{t} = add <16 x i16> {part}, {p}"]
            part = f"%ps{u}_{c}_{t}"
        s += [
            f"  %pw{u}_{c} = call {vi} @llvm.x86.avx2.pmadd.wd(<16 x i16> {part}, <16 x i16> {ones})",
            f"  %pa{u}_{c} = add {vi} {acc}, %pw{u}_{c}",
        ]
        acc = f"%pa{u}_{c}"
    s += [f"  %i{u} = add {vi} {acc}, zeroinitializer"]
    return s


def declarations(path: str, have: list[str]) -> list[str]:
    """The intrinsics the kernels of a path use that ``have`` (gemm's) does not declare."""
    W = 16 if path == "zmm" else 8
    vf = f"<{W} x float>"
    d = [
        f"declare {vf} @llvm.fma.v{W}f32({vf}, {vf}, {vf})",
        f"declare void @llvm.masked.store.v{W}f32.p0({vf}, ptr, i32, <{W} x i1>)",
        "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)",
    ]
    if path == "avx2":
        d += [
            "declare <32 x i8> @llvm.abs.v32i8(<32 x i8>, i1)",
            "declare <32 x i8> @llvm.x86.avx2.psign.b(<32 x i8>, <32 x i8>)",
            "declare <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8>, <32 x i8>)",
            "declare <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16>, <16 x i16>)",
        ]
    else:
        bits = 32 * W
        d += [
            f"declare <{W} x i32> @llvm.x86.avx512.vpdpbusd.{bits}(<{W} x i32>, <{W} x i32>,"
            f" <{W} x i32>)"
        ]
    have_names = {h.split("@")[1].split("(")[0] for h in have}
    return [x for x in d if x.split("@")[1].split("(")[0] not in have_names]


def module_ir(path: str, have: list[str] = ()) -> list[str]:
    """Every kernel of a path (every format x 1..G_MAX rows) with the declarations needed."""
    fns = [kernel_ir(q, g, path) for q in FORMATS for g in range(1, G_MAX[path] + 1)]
    return declarations(path, list(have)) + fns


def _path(features: dict, isa: str) -> str:
    """ "zmm", "ymm" or "avx2" (see module doc) for this host and the EMBER_* switches."""
    if _idot._has_vnni(features, isa):
        return "zmm" if _idot._has_wide(features, isa) else "ymm"
    return "avx2"


# ------------------------------------------------------------------ numba driver
_q8 = None  # _q8x's ember_q8_rows (ExternalFunction)
_submit = None  # _idot's job submission (compiled): fills the pool's job block and runs it


def _driver_py(
    f, w, n, nb, x, y, xq, xd, xs, xi, xh, chunk, ctrl, own, fns, gmax
):  # pragma: no cover
    """y (M, n) = x @ W.T for W's panels w (format f, n rows), x float32 (M, 32 nb).

    Quantizes x, then hands chunks of ``chunk`` rows (a multiple of 16) to kernels.cpu.pool;
    each chunk runs the kernel for every group of up to gmax rows of x (fns: the kernels for
    1..gmax rows, format-major). xq, xd, xs, xi, xh: scratch for x's blocks from the caller
    (xh: Q6_K's half-block sums). ``ctrl``: the pool's job block; ``own``: the caller's, used
    alone when another thread holds the pool's. Returns the cycles the caller waited.
    """
    m, k = x.shape
    _q8(x.ctypes.data, m, k, xq.ctypes.data, xd.ctypes.data, xs.ctypes.data, xi.ctypes.data)
    sa = xi.ctypes.data
    if f == 0 or f == 1:  # the offsets' corrections: -128 sum(q) (Q8_0's unsigned bytes), -8
        off = -128 if f == 0 else -8
        for i in range(m):
            for b in range(nb):
                xi[i, b] *= off
    elif f == 2 or f >= 4:  # Q4_1, Q4_K, Q5_K: d * sum(q) for the min term
        sa = xs.ctypes.data
    else:  # Q6_K: -32 sum(q) of each half block (a scale covers 16 values)
        sa = xh.ctypes.data
        for i in range(m):
            for b in range(2 * nb):
                t = 0
                for j in range(16):
                    t += xq[i, 16 * b + j]
                xh[i, b] = -32 * t
    job = (w.ctypes.data, w.shape[1], nb, chunk, n, m, gmax, gmax * f)
    sb = 8 if f == 3 else 4
    return _submit(ctrl, own, fns, job, xq.ctypes.data, k, xd.ctypes.data, sa, sb, y.ctypes.data)


def _build(nb):
    from ember.kernels.cpu import pool, vecmath
    from ember.kernels.cpu.quant import _q8x

    g = globals()
    g["_q8"], g["_submit"] = _idot.q8_symbol(), _idot._submit
    opts = dict(cache=True, nogil=True, error_model="numpy")
    return nb.njit(**opts)(vecmath.keyed(_driver_py, sys.modules[__name__], pool, _idot, _q8x))


def state() -> dict | None:
    """Compile the kernels, the pool and the driver once; None where they cannot run here."""
    if "ok" not in _STATE:
        _STATE["ok"] = False
        st = _idot.state()  # llvmlite, AVX2+FMA, the pool
        if st is not None:
            import llvmlite.binding as llvm

            from ember.kernels.cpu import gemm as G
            from ember.kernels.cpu import numba_or_none

            isa = G.isa()
            path = _path(llvm.get_host_cpu_features(), isa)
            gmax = G_MAX[path]
            names = [
                f"ember_pdot_{q.lower()}_{r}_{path}" for q in FORMATS for r in range(1, gmax + 1)
            ]
            have = G._declarations(G.ISAS[isa][0])
            engine = G.jit_ir(module_ir(path, have), names)
            fns = np.array([engine.get_function_address(n) for n in names], np.int64)
            _STATE.update(ok=True, engine=engine, path=path, gmax=gmax, fns=fns,
                          driver=_build(numba_or_none()))  # fmt: skip
    return _STATE if _STATE["ok"] else None


def available() -> bool:
    """Whether the panel kernels run here (and ``EMBER_QUANT_DOT`` does not ask for float)."""
    if config.QUANT_DOT == "float" or not config.QUANT_REPACK:
        return False
    ok = _STATE.get("ok")
    return state() is not None if ok is None else ok


def check(qtype: str, panels: np.ndarray, n: int, x: np.ndarray, y: np.ndarray) -> None:
    """The kernels follow raw pointers: refuse operands that would take them out of bounds."""
    if qtype not in FORMATS:
        raise DTypeError(f"pdot: no panel kernel for {qtype}")
    for name, a in (("x", x), ("y", y)):
        ok = isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim == 2
        if not ok or not a.flags.c_contiguous:
            raise DTypeError(f"pdot: {name} must be a C-contiguous 2-d float32 array")
    k = x.shape[1]
    e = _panels.BLOCK_ELEMENTS[qtype]
    want = (-(-n // 16), _panels.panel_bytes(qtype, k // e))
    ok = isinstance(panels, np.ndarray) and panels.dtype == np.uint8 and panels.flags.c_contiguous
    if not ok or k % e or k < e or panels.shape != want:
        raise ShapeError(f"pdot: panels {getattr(panels, 'shape', None)} do not fit ({n}, {k})")
    if x.shape[0] < 1 or y.shape != (x.shape[0], n) or panels.ctypes.data % 64:
        raise ShapeError(f"pdot: x {x.shape} and y {y.shape} do not fit the weight {(n, k)}")


def max_rows() -> int:
    """Rows of x one pool job carries (kernels.cpu.pool.MAX_GROUPS groups of G_MAX)."""
    from ember.kernels.cpu import pool

    st = _STATE if _STATE.get("ok") else state()
    return pool.MAX_GROUPS * st["gmax"]


def bind(qtype: str, panels: np.ndarray, n: int, x: np.ndarray, y: np.ndarray):
    """A no-argument function computing y = x @ W.T on these arrays (checked here, up to
    max_rows() rows of x), whatever x holds when it is called (a captured step's product)."""
    from ember.kernels.cpu import pool

    check(qtype, panels, n, x, y)
    m, k = x.shape
    if m > max_rows():
        raise ShapeError(f"pdot: {m} rows of x, at most {max_rows()} per product")
    st = _STATE if _STATE.get("ok") else state()
    nb = k // 32
    xq = np.empty((m, k), np.int8)
    xd = np.empty((m, nb), np.float32)
    xs = np.empty((m, nb), np.float32)
    xi = np.empty((m, nb), np.int32)
    xh = np.empty((m, 2 * nb) if qtype == "Q6_K" else (1, 1), np.int32)
    rowb = panels.shape[1] // 16
    least = CHUNK_BYTES >> 2
    per = max(CHUNK_BYTES // -(-m // st["gmax"]), least)  # bytes per chunk (see CHUNK_BYTES)
    per = min(per, max(least, panels.nbytes // MIN_CHUNKS))
    chunk = max(16, (per // rowb) & ~15)
    driver, f, fns, ctrl, gmax = (
        st["driver"],
        FORMATS.index(qtype),
        st["fns"],
        pool.ctrl,
        st["gmax"],
    )

    own = np.zeros(pool.CTRL_WORDS, np.int64)  # the job's block when another thread has the pool's

    def run() -> None:
        driver(f, panels, n, nb, x, y, xq, xd, xs, xi, xh, chunk, ctrl(), own, fns, gmax)

    return run


def product(qtype: str, panels: np.ndarray, n: int, x: np.ndarray, y: np.ndarray) -> None:
    """y = x @ W.T for W's panels (operands checked here), on the pool's threads."""
    m = x.shape[0] if isinstance(x, np.ndarray) and x.ndim == 2 else 0
    top = max_rows()
    if m > top:
        for m0 in range(0, m, top):
            product(qtype, panels, n, x[m0 : m0 + top], y[m0 : m0 + top])
        return
    bind(qtype, panels, n, x, y)()
