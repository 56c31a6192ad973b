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
Word j of x block b multiplies quant group ``32t + 8(c // 2) + j`` of the panel (Q5_K: 40
groups per super-block), its low nibbles for even c and its high ones for odd c, and for Q5_K
bit c of group ``32t + 32 + j`` as the value's bit 4. The kernels step two x blocks (c, c + 1)
at a time, so each of a pair's words is loaded once for both.
"""

from __future__ import annotations

from ember.kernels.cpu.quant import _panels


def _splat(ty: str, n: int, v) -> str:
    return "<" + ", ".join([f"{ty} {v}"] * n) + ">"


def block_ir(qtype: str, g: int, path: str, W: int) -> list[str]:
    """IR of x blocks %b and %b + 1 (b even: one pair of sub-blocks) for x rows r < g:
    advances ``%a{r}_{h}``, ``%m{r}_{h}`` to ``%an{r}_{h}``, ``%mn{r}_{h}`` (``_pdot.frame_ir``
    with the min sum, two blocks a step). The pair's 8 words are loaded once: their low
    nibbles serve block b, their high ones block b + 1."""
    from ember.kernels.cpu.quant._pdot import _dot_ir, splat_load_ir, x_ir

    q5 = qtype == "Q5_K"
    groups = _panels.KQUANT[qtype][1]
    H = 16 // W
    B = 4 * W
    vb, vi, vf, vh = f"<{B} x i8>", f"<{W} x i32>", f"<{W} x float>", f"<{W} x half>"
    s = [
        "  %t = lshr i64 %b, 3",  # super-block
        "  %c = and i64 %b, 7",  # sub-block (even)
        f"  %tq = mul i64 %t, {64 * groups}",
        "  %tqa = getelementptr i8, ptr %pb, i64 %tq",
        "  %pairo = shl i64 %c, 8",  # 8 groups of 64 bytes per pair of sub-blocks
        "  %qsa = getelementptr i8, ptr %tqa, i64 %pairo",
        "  %dto = shl i64 %t, 6",  # the 16 rows' d, then dmin, of super-block t
        "  %dta = getelementptr i8, ptr %mb, i64 %dto",
        "  %bb = add i64 %b, 1",
    ]
    if q5:
        s += [
            "  %qha = getelementptr i8, ptr %tqa, i64 2048",  # qh's 8 groups after the nibbles
            "  %c32 = trunc i64 %c to i32",
            f"  %hshi = insertelement {vi} poison, i32 %c32, i32 0",
            f"  %hshv = shufflevector {vi} %hshi, {vi} poison, <{W} x i32> zeroinitializer",
        ]
    nib = _splat("i32", W, 0x0F0F0F0F)
    ops: dict = {}  # (x block 0 / 1, word j, half h) -> the weight's bytes
    for j in range(8):
        for h in range(H):
            u = f"{j}_{h}"
            s += [
                f"  %qsp{u} = getelementptr i8, ptr %qsa, i64 {64 * j + B * h}",
                f"  %qsw{u} = load {vi}, ptr %qsp{u}, align {B}",
                f"  %lo{u} = and {vi} %qsw{u}, {nib}",
                f"  %hs{u} = lshr {vi} %qsw{u}, {_splat('i32', W, 4)}",
                f"  %hi{u} = and {vi} %hs{u}, {nib}",
            ]
            vals = [f"%lo{u}", f"%hi{u}"]
            if q5:  # bit c of qh for block b, bit c + 1 for b + 1, as each value's bit 4
                s += [
                    f"  %qhp{u} = getelementptr i8, ptr %qha, i64 {64 * j + B * h}",
                    f"  %qhw{u} = load {vi}, ptr %qhp{u}, align {B}",
                    f"  %qhs{u} = lshr {vi} %qhw{u}, %hshv",
                    f"  %qh4{u} = shl {vi} %qhs{u}, {_splat('i32', W, 4)}",
                    f"  %hb0{u} = and {vi} %qh4{u}, {_splat('i32', W, 0x10101010)}",
                    f"  %hs1{u} = lshr {vi} %qhs{u}, {_splat('i32', W, 1)}",
                    f"  %hs14{u} = shl {vi} %hs1{u}, {_splat('i32', W, 4)}",
                    f"  %hb1{u} = and {vi} %hs14{u}, {_splat('i32', W, 0x10101010)}",
                    f"  %q0{u} = or {vi} %lo{u}, %hb0{u}",
                    f"  %q1{u} = or {vi} %hi{u}, %hb1{u}",
                ]
                vals = [f"%q0{u}", f"%q1{u}"]
            for o in range(2):
                s += [f"  %qb{o}_{u} = bitcast {vi} {vals[o]} to {vb}"]
                ops[(o, j, h)] = f"%qb{o}_{u}"
    for h in range(H):  # the rows' d and dmin, then per block d * sc[c], -(dmin * m[c]): exact
        s += [
            f"  %dha{h} = getelementptr i8, ptr %dta, i64 {2 * W * h}",
            f"  %dh{h} = load {vh}, ptr %dha{h}, align 2",
            f"  %dw{h} = fpext {vh} %dh{h} to {vf}",
            f"  %dmha{h} = getelementptr i8, ptr %dta, i64 {32 + 2 * W * h}",
            f"  %dmh{h} = load {vh}, ptr %dmha{h}, align 2",
            f"  %dmw{h} = fpext {vh} %dmh{h} to {vf}",
            f"  %sca{h} = getelementptr i8, ptr %sb, i64 %so",
        ]
        for o in range(2):
            u = f"{o}_{h}"
            s += [
                f"  %scp{u} = getelementptr i8, ptr %sca{h}, i64 {32 * o + W * h}",
                f"  %scb{u} = load <{W} x i8>, ptr %scp{u}, align 1",
                f"  %scf{u} = uitofp <{W} x i8> %scb{u} to {vf}",
                f"  %mnp{u} = getelementptr i8, ptr %sca{h}, i64 {32 * o + 16 + W * h}",
                f"  %mnb{u} = load <{W} x i8>, ptr %mnp{u}, align 1",
                f"  %mnf{u} = uitofp <{W} x i8> %mnb{u} to {vf}",
                f"  %dsc{u} = fmul {vf} %dw{h}, %scf{u}",
                f"  %dmm{u} = fmul {vf} %dmw{h}, %mnf{u}",
                f"  %mw{u} = fneg {vf} %dmm{u}",
            ]
    kind = "u5" if q5 else "s8"
    for r in range(g):
        for o in range(2):
            t = f"{r}k{o}"  # x row r's block b + o
            s += x_ir(r, W, path, "%b" if o == 0 else "%bb", t)
            s += [f"  %xsa{t} = getelementptr i32, ptr %xs{r}, i64 {'%b' if o == 0 else '%bb'}"]
            s += splat_load_ir(f"sxv{t}", "float", f"%xsa{t}", W)
        for h in range(H):
            acc, macc = f"%a{r}_{h}", f"%m{r}_{h}"
            for o in range(2):
                t, u = f"{r}k{o}", f"{r}k{o}_{h}"
                terms = [(ops[(o, j, h)], t, j) for j in range(8)]
                nxt = f"%an{r}_{h}" if o else f"%ah{r}_{h}"
                mnxt = f"%mn{r}_{h}" if o else f"%mh{r}_{h}"
                s += _dot_ir(path, u, terms, "zeroinitializer", kind, g, W)
                s += [
                    f"  %f{u} = sitofp {vi} %i{u} to {vf}",
                    f"  %scl{u} = fmul {vf} %dsc{o}_{h}, %dxv{t}",
                    f"  {nxt} = call {vf} @llvm.fma.v{W}f32({vf} %scl{u}, {vf} %f{u}, {vf} {acc})",
                    f"  {mnxt} = call {vf} @llvm.fma.v{W}f32({vf} %mw{o}_{h}, {vf} %sxv{t},"
                    f" {vf} {macc})",
                ]
                acc, macc = nxt, mnxt
    return s
