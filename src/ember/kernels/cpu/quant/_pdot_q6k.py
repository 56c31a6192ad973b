"""One block of x times Q6_K panels, for ``_pdot``'s kernels (see ``_panels`` for the layout).

A Q6_K super-block holds 256 values ``d * sc[s] * (q - 32)``, ``q`` 6 bits (low 4 in ``ql``,
high 2 in ``qh``), one int8 scale ``sc[s]`` per 16 values. x block b (32 values) is values
``32c .. 32c + 31`` of super-block ``t = b // 8`` (``c = b % 8``; ``h = c // 4``, ``k = c % 4``):
its value l takes its low nibble from ql byte ``64h + 32(k % 2) + l`` (the low nibble for
k < 2, the high one after) and its high bits from qh byte ``32h + l`` (bits 2k, 2k + 1), and
scales ``sc[2c]`` (l < 16) and ``sc[2c + 1]``. So word j of x block b multiplies ql word
``16h + 8(k % 2) + j`` and qh word ``8h + j`` of each row, rebuilt into bytes ``q`` (0..63):

    ``i_A = sum_{j < 4} q . x_j - 32 sum(q_x[0:16])``, ``i_B`` likewise for words 4..7
    ``i = sc[2c] * i_A + sc[2c + 1] * i_B`` (exact in int32), then as every format:
    ``acc = fma(d_w * d_x, float(i), acc)``

The ``-32 sum`` terms of each half block are x's (``_pdot``'s driver makes them once per call).
"""

from __future__ import annotations


def _splat(ty: str, n: int, v) -> str:
    return "<" + ", ".join([f"{ty} {v}"] * n) + ">"


def block_ir(g: int, path: str, W: int) -> list[str]:
    """IR of x block %b for x rows r < g: advances ``%a{r}_{h}`` to ``%an{r}_{h}``."""
    from ember.kernels.cpu.quant._pdot import _dot_ir, splat_load_ir, x_ir

    H = 16 // W
    B = 4 * W
    vb, vi, vf, vh = f"<{B} x i8>", f"<{W} x i32>", f"<{W} x float>", f"<{W} x half>"
    s = [
        "  %t = lshr i64 %b, 3",  # super-block
        "  %c = and i64 %b, 7",
        "  %hh = lshr i64 %c, 2",
        "  %k = and i64 %c, 3",
        "  %k1 = and i64 %k, 1",
        "  %k2 = lshr i64 %k, 1",
        "  %tq = mul i64 %t, 3072",  # the super-block's quants
        "  %tqa = getelementptr i8, ptr %pb, i64 %tq",
        "  %wl0 = shl i64 %hh, 4",  # ql word 16h + 8(k % 2), qh word 32 + 8h (groups of 64)
        "  %wl1 = shl i64 %k1, 3",
        "  %wl = add i64 %wl0, %wl1",
        "  %wlo = shl i64 %wl, 6",
        "  %qla = getelementptr i8, ptr %tqa, i64 %wlo",
        "  %wh0 = shl i64 %hh, 3",
        "  %wh = add i64 %wh0, 32",
        "  %who = shl i64 %wh, 6",
        "  %qha = getelementptr i8, ptr %tqa, i64 %who",
        "  %lsh = shl i64 %k2, 2",  # low nibble: >> 0 or 4
        "  %lsh32 = trunc i64 %lsh to i32",
        f"  %lshi = insertelement {vi} poison, i32 %lsh32, i32 0",
        f"  %lshv = shufflevector {vi} %lshi, {vi} poison, <{W} x i32> zeroinitializer",
        "  %hsh = shl i64 %k, 1",  # high bits: >> 2k, then << 4
        "  %hsh32 = trunc i64 %hsh to i32",
        f"  %hshi = insertelement {vi} poison, i32 %hsh32, i32 0",
        f"  %hshv = shufflevector {vi} %hshi, {vi} poison, <{W} x i32> zeroinitializer",
        "  %dto = shl i64 %t, 5",  # the 16 rows' d of super-block t
        "  %dta = getelementptr i8, ptr %mb, i64 %dto",
    ]
    ops: dict = {}
    for j in range(8):  # the 6-bit values that multiply x's word j, for each half
        for h in range(H):
            u = f"{j}_{h}"
            s += [
                f"  %qlp{u} = getelementptr i8, ptr %qla, i64 {64 * j + B * h}",
                f"  %qlw{u} = load {vi}, ptr %qlp{u}, align 64",
                f"  %qhp{u} = getelementptr i8, ptr %qha, i64 {64 * j + B * h}",
                f"  %qhw{u} = load {vi}, ptr %qhp{u}, align 64",
                f"  %ls{u} = lshr {vi} %qlw{u}, %lshv",
                f"  %lo{u} = and {vi} %ls{u}, {_splat('i32', W, 0x0F0F0F0F)}",
                f"  %hs{u} = lshr {vi} %qhw{u}, %hshv",
                f"  %hs4{u} = shl {vi} %hs{u}, {_splat('i32', W, 4)}",
                f"  %hi{u} = and {vi} %hs4{u}, {_splat('i32', W, 0x30303030)}",
                f"  %q{u} = or {vi} %lo{u}, %hi{u}",
                f"  %qb{u} = bitcast {vi} %q{u} to {vb}",
            ]
            ops[(j, h)] = f"%qb{u}"
    for h in range(H):  # scales of the block's halves (int32 lanes) and d (floats)
        for x in range(2):
            s += [
                f"  %sco{x}_{h} = add i64 %so, {16 * x + W * h}",
                f"  %sca{x}_{h} = getelementptr i8, ptr %sb, i64 %sco{x}_{h}",
                f"  %scb{x}_{h} = load <{W} x i8>, ptr %sca{x}_{h}, align 1",
                f"  %sc{x}_{h} = sext <{W} x i8> %scb{x}_{h} to {vi}",
            ]
        s += [
            f"  %dha{h} = getelementptr i8, ptr %dta, i64 {2 * W * h}",
            f"  %dh{h} = load {vh}, ptr %dha{h}, align 2",
            f"  %dw{h} = fpext {vh} %dh{h} to {vf}",
        ]
    for r in range(g):
        s += x_ir(r, W, path)
        for x in range(2):  # -32 sum(q_x) of each half of the block
            s += [
                f"  %xho{r}_{x} = shl i64 %b, 1",
                f"  %xhi{r}_{x} = add i64 %xho{r}_{x}, {x}",
                f"  %xha{r}_{x} = getelementptr i32, ptr %xs{r}, i64 %xhi{r}_{x}",
            ]
            s += splat_load_ir(f"of{r}_{x}", "i32", f"%xha{r}_{x}", W)
        for h in range(H):
            u = f"{r}_{h}"
            for x in range(2):
                terms = [(ops[(j, h)], r, j) for j in range(4 * x, 4 * x + 4)]
                s += _dot_ir(path, f"{u}_{x}", terms, f"%of{r}_{x}", "u6", g, W)
                s += [f"  %is{u}_{x} = mul {vi} %i{u}_{x}, %sc{x}_{h}"]
            s += [
                f"  %i{u} = add {vi} %is{u}_0, %is{u}_1",
                f"  %f{u} = sitofp {vi} %i{u} to {vf}",
                f"  %scl{u} = fmul {vf} %dw{h}, %dxv{r}",
                f"  %an{u} = call {vf} @llvm.fma.v{W}f32({vf} %scl{u}, {vf} %f{u}, {vf} %a{u})",
            ]
    return s
