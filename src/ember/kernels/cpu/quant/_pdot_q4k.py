"""One block of x times Q4_K / Q5_K panels, for ``_pdot``'s kernels (``_panels`` has the layout).

A Q4_K super-block holds 256 values ``d * sc[c] * q - dmin * m[c]`` in eight sub-blocks c of
32, ``q`` a nibble (Q5_K: a nibble and a fifth bit from ``qh``, 0..31), ``sc``, ``m`` 6-bit.
Sub-block c of super-block t is x block ``b = 8t + c``: x's blocks and the weight's sub-blocks
line up, so per x block (scale ``d_x``, quants ``q_x``) the product is

    ``i = sum(q q_x)`` (``vpdpbusd``: unsigned q, int8 x; exact in int32)
    ``acc = fma((d sc[c]) * d_x, float(i), acc)``
    ``macc = fma(-(dmin m[c]), d_x sum(q_x), macc)``, y = acc + macc

``d sc[c]`` and ``dmin m[c]`` are exact in float32 (an fp16 times a 6-bit integer) and made once
per block for the g rows of x; ``d_x sum(q_x)`` is ``_q8x``'s per-block float (as Q4_1's).
Word j of x block b multiplies quant group ``32t + 8(c // 2) + j`` of the panel, its low
nibbles for even c and its high ones for odd c (one 32-bit shift by 0 or 4 and a mask), and for
Q5_K bit c of group ``32t + 32 + j`` (Q5_K's groups are 40 per super-block) as the value's
bit 4.
"""

from __future__ import annotations

from ember.kernels.cpu.quant import _panels


def _splat(ty: str, n: int, v) -> str:
    return "<" + ", ".join([f"{ty} {v}"] * n) + ">"


def block_ir(qtype: str, g: int, path: str, W: int) -> list[str]:
    """IR of x block %b for x rows r < g: advances ``%a{r}_{h}``, ``%m{r}_{h}`` to
    ``%an{r}_{h}``, ``%mn{r}_{h}`` (``_pdot.frame_ir`` with the min sum)."""
    from ember.kernels.cpu.quant._pdot import _dot_ir, splat_load_ir, x_ir

    q5 = qtype == "Q5_K"
    groups = _panels.KQUANT[qtype][1]
    H = 16 // W
    B = 4 * W
    vb, vi, vf, vh = f"<{B} x i8>", f"<{W} x i32>", f"<{W} x float>", f"<{W} x half>"
    s = [
        "  %t = lshr i64 %b, 3",  # super-block
        "  %c = and i64 %b, 7",  # sub-block
        f"  %tq = mul i64 %t, {64 * groups}",
        "  %tqa = getelementptr i8, ptr %pb, i64 %tq",
        "  %pair = lshr i64 %c, 1",
        "  %pairo = shl i64 %pair, 9",  # 8 groups of 64 bytes per pair of sub-blocks
        "  %qsa = getelementptr i8, ptr %tqa, i64 %pairo",
        "  %odd = and i64 %b, 1",
        "  %nsh = shl i64 %odd, 2",  # the low nibbles, or the high ones (>> 4)
        "  %nsh32 = trunc i64 %nsh to i32",
        f"  %nshi = insertelement {vi} poison, i32 %nsh32, i32 0",
        f"  %nshv = shufflevector {vi} %nshi, {vi} poison, <{W} x i32> zeroinitializer",
        "  %dto = shl i64 %t, 6",  # the 16 rows' d, then dmin, of super-block t
        "  %dta = getelementptr i8, ptr %mb, i64 %dto",
    ]
    if q5:
        s += [
            "  %qha = getelementptr i8, ptr %tqa, i64 2048",  # qh's 8 groups after the nibbles
            "  %c32 = trunc i64 %c to i32",
            f"  %hshi = insertelement {vi} poison, i32 %c32, i32 0",
            f"  %hshv = shufflevector {vi} %hshi, {vi} poison, <{W} x i32> zeroinitializer",
        ]
    ops: dict = {}
    for j in range(8):  # the values that multiply x's word j, for each half of the rows
        for h in range(H):
            u = f"{j}_{h}"
            s += [
                f"  %qsp{u} = getelementptr i8, ptr %qsa, i64 {64 * j + B * h}",
                f"  %qsw{u} = load {vi}, ptr %qsp{u}, align {B}",
                f"  %ls{u} = lshr {vi} %qsw{u}, %nshv",
                f"  %lo{u} = and {vi} %ls{u}, {_splat('i32', W, 0x0F0F0F0F)}",
            ]
            val = f"%lo{u}"
            if q5:
                s += [
                    f"  %qhp{u} = getelementptr i8, ptr %qha, i64 {64 * j + B * h}",
                    f"  %qhw{u} = load {vi}, ptr %qhp{u}, align {B}",
                    f"  %hs{u} = lshr {vi} %qhw{u}, %hshv",
                    f"  %hb{u} = and {vi} %hs{u}, {_splat('i32', W, 0x01010101)}",
                    f"  %h4{u} = shl {vi} %hb{u}, {_splat('i32', W, 4)}",
                    f"  %q{u} = or {vi} %lo{u}, %h4{u}",
                ]
                val = f"%q{u}"
            s += [f"  %qb{u} = bitcast {vi} {val} to {vb}"]
            ops[(j, h)] = f"%qb{u}"
    for h in range(H):  # per row: d * sc[c] and -(dmin * m[c]) as floats (exact)
        s += [
            f"  %sca{h} = getelementptr i8, ptr %sb, i64 %so",
            f"  %scp{h} = getelementptr i8, ptr %sca{h}, i64 {W * h}",
            f"  %scb{h} = load <{W} x i8>, ptr %scp{h}, align 1",
            f"  %scf{h} = uitofp <{W} x i8> %scb{h} to {vf}",
            f"  %mnp{h} = getelementptr i8, ptr %sca{h}, i64 {16 + W * h}",
            f"  %mnb{h} = load <{W} x i8>, ptr %mnp{h}, align 1",
            f"  %mnf{h} = uitofp <{W} x i8> %mnb{h} to {vf}",
            f"  %dha{h} = getelementptr i8, ptr %dta, i64 {2 * W * h}",
            f"  %dh{h} = load {vh}, ptr %dha{h}, align 2",
            f"  %dw{h} = fpext {vh} %dh{h} to {vf}",
            f"  %dmha{h} = getelementptr i8, ptr %dta, i64 {32 + 2 * W * h}",
            f"  %dmh{h} = load {vh}, ptr %dmha{h}, align 2",
            f"  %dmw{h} = fpext {vh} %dmh{h} to {vf}",
            f"  %dsc{h} = fmul {vf} %dw{h}, %scf{h}",
            f"  %dmm{h} = fmul {vf} %dmw{h}, %mnf{h}",
            f"  %mw{h} = fneg {vf} %dmm{h}",
        ]
    kind = "u5" if q5 else "s8"
    for r in range(g):
        s += x_ir(r, W, path)
        s += [f"  %xsa{r} = getelementptr i32, ptr %xs{r}, i64 %b"]
        s += splat_load_ir(f"sxv{r}", "float", f"%xsa{r}", W)
        for h in range(H):
            u = f"{r}_{h}"
            terms = [(ops[(j, h)], r, j) for j in range(8)]
            s += _dot_ir(path, u, terms, "zeroinitializer", kind, g, W)
            s += [
                f"  %f{u} = sitofp {vi} %i{u} to {vf}",
                f"  %scl{u} = fmul {vf} %dsc{h}, %dxv{r}",
                f"  %an{u} = call {vf} @llvm.fma.v{W}f32({vf} %scl{u}, {vf} %f{u}, {vf} %a{u})",
                f"  %mn{u} = call {vf} @llvm.fma.v{W}f32({vf} %mw{h}, {vf} %sxv{r}, {vf} %m{u})",
            ]
    return s
