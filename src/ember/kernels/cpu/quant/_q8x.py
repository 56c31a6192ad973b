"""Rows of x to Q8 blocks, as the integer products (``_idot``, ``_pdot``) read them.

For each block of 32 floats: ``d = max|x| / 127``, ``q = rint(x / d)`` as int8 (computed as
``x * (1 / d)``, clamped to +-127), and the block's ``sum(q)`` as an int32 and ``d * sum(q)`` as
a float32. A block holding NaN or inf gets scale NaN, q = 0 and sum 0 (its products are NaN,
as the float product would be non-finite); an all-zero block scale 0.

The loop is LLVM IR (``quantize_ir``: 32 floats as two 512-bit or four 256-bit vectors, a max
reduction, one conversion with round-half-even), called by the numba drivers as the external
symbol ``ember_q8_rows``; :func:`quantize_reference` is its numpy twin, same float32 operations,
so the two agree bitwise (the tests check it).
"""

from __future__ import annotations

import numpy as np

from ember.errors import ShapeError

_STATE: dict = {}


def quantize_reference(x: np.ndarray):
    """x (M, K) float32 -> (q int8 (M, K), d, d * sum(q) float32 and sum(q) int32 (M, K / 32))."""
    x = np.asarray(x, dtype=np.float32)
    m, k = x.shape
    xb = x.reshape(m, k // 32, 32)
    bad = ~np.isfinite(xb).all(axis=2)
    amax = np.where(np.isnan(xb), np.float32(0), np.abs(xb)).max(axis=2, initial=np.float32(0))
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
        p = xb * inv[..., None]
        q = np.clip(np.rint(np.where(np.isnan(p), np.float32(0), p)), -127, 127)
    q = np.where(bad[..., None], 0, q).astype(np.int8)
    t = q.astype(np.int32).sum(axis=2, dtype=np.int32)
    d = np.where(bad, np.float32(np.nan), d).astype(np.float32)
    with np.errstate(over="ignore"):
        s = (d * t.astype(np.float32)).astype(np.float32)
    return q.reshape(m, k), d, s, t


def quantize_ir(w: int) -> str:
    """``ember_q8_rows(x, m, k, xq, xd, xs, xi)``: the rows of x (M, K) to Q8 blocks; w: floats
    per vector (16 or 8)."""
    c = 32 // w
    vf, vi, vb = f"<{w} x float>", f"<{w} x i32>", f"<{w} x i8>"
    inf = "0x7FF0000000000000"
    s = [
        "define void @ember_q8_rows(i64 %xi0, i64 %m, i64 %k, i64 %qi0, i64 %di0, i64 %si0,"
        " i64 %ti0) #0 {",
        "entry:",
        "  %x = inttoptr i64 %xi0 to ptr",
        "  %xq = inttoptr i64 %qi0 to ptr",
        "  %xd = inttoptr i64 %di0 to ptr",
        "  %xs = inttoptr i64 %si0 to ptr",
        "  %xt = inttoptr i64 %ti0 to ptr",
        "  %kb = lshr i64 %k, 5",
        "  %nblk = mul i64 %m, %kb",  # rows are contiguous: all blocks in one loop
        "  %any = icmp ne i64 %nblk, 0",
        "  br i1 %any, label %blk, label %done",
        "blk:",
        "  %b = phi i64 [0, %entry], [%b1, %blk]",
        "  %o = shl i64 %b, 5",
        "  %xp = getelementptr float, ptr %x, i64 %o",
    ]
    for j in range(c):
        s += [
            f"  %p{j} = getelementptr float, ptr %xp, i64 {w * j}",
            f"  %v{j} = load {vf}, ptr %p{j}, align 4",
            f"  %a{j} = call {vf} @llvm.fabs.v{w}f32({vf} %v{j})",
            f"  %nf{j} = fcmp ueq {vf} %a{j}, " + "<" + ", ".join([f"float {inf}"] * w) + ">",
            f"  %ab{j} = bitcast {vf} %a{j} to {vi}",  # |x| orders as its bits do
            f"  %z{j} = select <{w} x i1> %nf{j}, {vi} zeroinitializer, {vi} %ab{j}",
        ]
    mx, bad = "%z0", "%nf0"
    for j in range(1, c):
        s += [
            f"  %mx{j} = call {vi} @llvm.umax.v{w}i32({vi} {mx}, {vi} %z{j})",
            f"  %bd{j} = or <{w} x i1> {bad}, %nf{j}",
        ]
        mx, bad = f"%mx{j}", f"%bd{j}"
    s += [
        f"  %amaxi = call i32 @llvm.vector.reduce.umax.v{w}i32({vi} {mx})",
        "  %amax = bitcast i32 %amaxi to float",
        f"  %isbad = call i1 @llvm.vector.reduce.or.v{w}i1(<{w} x i1> {bad})",
        "  %d = fdiv float %amax, 1.270000e+02",
        "  %dz = fcmp oeq float %d, 0.0",
        "  %r = fdiv float 1.0, %d",
        "  %inv = select i1 %dz, float 0.0, float %r",
        f"  %ivi = insertelement {vf} poison, float %inv, i32 0",
        f"  %iv = shufflevector {vf} %ivi, {vf} poison, <{w} x i32> zeroinitializer",
        "  %qp = getelementptr i8, ptr %xq, i64 %o",
    ]
    lo = "<" + ", ".join(["float -1.270000e+02"] * w) + ">"
    hi = "<" + ", ".join(["float 1.270000e+02"] * w) + ">"
    tot = None
    for j in range(c):
        s += [
            f"  %s{j} = fmul {vf} %v{j}, %iv",
            f"  %rr{j} = call {vf} @llvm.roundeven.v{w}f32({vf} %s{j})",
            f"  %un{j} = fcmp uno {vf} %s{j}, %s{j}",  # 0 * inf (1 / d overflowed): 0
            f"  %r{j} = select <{w} x i1> %un{j}, {vf} zeroinitializer, {vf} %rr{j}",
            f"  %c{j} = call {vf} @llvm.maxnum.v{w}f32({vf} %r{j}, {vf} {lo})",
            f"  %e{j} = call {vf} @llvm.minnum.v{w}f32({vf} %c{j}, {vf} {hi})",
            f"  %i{j} = fptosi {vf} %e{j} to {vi}",
            f"  %ib{j} = select i1 %isbad, {vi} zeroinitializer, {vi} %i{j}",
            f"  %q{j} = trunc {vi} %ib{j} to {vb}",
            f"  %qa{j} = getelementptr i8, ptr %qp, i64 {w * j}",
            f"  store {vb} %q{j}, ptr %qa{j}, align 1",
        ]
        if tot is None:
            tot = f"%ib{j}"
        else:
            s += [f"  %tt{j} = add {vi} {tot}, %ib{j}"]
            tot = f"%tt{j}"
    s += [
        f"  %t = call i32 @llvm.vector.reduce.add.v{w}i32({vi} {tot})",
        "  %dd = select i1 %isbad, float 0x7FF8000000000000, float %d",
        "  %tf = sitofp i32 %t to float",
        "  %sv = fmul float %dd, %tf",
        "  %dp = getelementptr float, ptr %xd, i64 %b",
        "  store float %dd, ptr %dp, align 4",
        "  %sp = getelementptr float, ptr %xs, i64 %b",
        "  store float %sv, ptr %sp, align 4",
        "  %tp = getelementptr i32, ptr %xt, i64 %b",
        "  store i32 %t, ptr %tp, align 4",
        "  %b1 = add i64 %b, 1",
        "  %more = icmp ult i64 %b1, %nblk",
        "  br i1 %more, label %blk, label %done",
        "done:",
        "  ret void",
        "}",
    ]
    return "\n".join(s)


def declarations(w: int) -> list[str]:
    vf = f"<{w} x float>"
    return [
        f"declare {vf} @llvm.fabs.v{w}f32({vf})",
        f"declare {vf} @llvm.roundeven.v{w}f32({vf})",
        f"declare {vf} @llvm.minnum.v{w}f32({vf}, {vf})",
        f"declare i1 @llvm.vector.reduce.or.v{w}i1(<{w} x i1>)",
        f"declare i32 @llvm.vector.reduce.add.v{w}i32(<{w} x i32>)",
        f"declare i32 @llvm.vector.reduce.umax.v{w}i32(<{w} x i32>)",
        f"declare <{w} x i32> @llvm.umax.v{w}i32(<{w} x i32>, <{w} x i32>)",
    ]


def state() -> dict | None:
    """Compile ``ember_q8_rows`` once (registered for numba); None without the IR kernels."""
    if "ok" not in _STATE:
        _STATE["ok"] = False
        from ember.kernels.cpu import gemm as G

        isa = G.isa()
        if isa is not None:
            import ctypes

            w = G.ISAS[isa][0]
            engine = G.jit_ir([*declarations(w), quantize_ir(w)], ["ember_q8_rows"])
            addr = engine.get_function_address("ember_q8_rows")
            fn = ctypes.CFUNCTYPE(None, *[ctypes.c_int64] * 7)(addr)
            _STATE.update(ok=True, engine=engine, fn=fn)
    return _STATE if _STATE["ok"] else None


def quantize_rows(x: np.ndarray):
    """x (M, K) float32 as the kernels quantize it: (q int8 (M, K), d, d * sum(q), sum(q))."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % 32:
        raise ShapeError(f"quantize_rows: x must be (M, K) with K a multiple of 32, got {x.shape}")
    st = state()
    if st is None:
        return quantize_reference(x)
    m, k = x.shape
    out = (np.empty((m, k), np.int8), np.empty((m, k // 32), np.float32),
           np.empty((m, k // 32), np.float32), np.empty((m, k // 32), np.int32))  # fmt: skip
    st["fn"](x.ctypes.data, m, k, *(a.ctypes.data for a in out))
    return out
