"""Row kernels at the CPU's full vector width, in LLVM IR: softmax numerators and exact GELU.

numba compiles for the host CPU but keeps LLVM's tuning for it, and on AVX-512 CPUs that tuning
prefers 256-bit vectors: an exp or erf polynomial over a row runs at half the width the CPU
has. These two loops are most of the non-GEMM time of an encoder layer (softmax over a
1500-key row, GELU over 1536 features), so they are written in LLVM IR like sgemm's
microkernels, with <W x float> vectors (W = 16 with AVX-512, 8 with AVX2; the family follows
``sgemm``'s choice, EMBER_SGEMM_ISA included), compiled by llvmlite and called from numba
kernels through their symbols:

- ``float ember_softmax_row(i64 s, i64 n, float scale)``: s[:n] <- exp((s - max(s)) * scale),
  returns the sum. exp is Cephes' expf (Cody-Waite reduction, degree-6 polynomial, 2^k in the
  exponent bits; relative error ~2e-7). NaN scores stay NaN.
- ``void ember_gelu_row(i64 x, i64 n, i64 add, i64 has_add)``: x[:n] <- gelu(x) (+ add[:n]),
  exact GELU through ``special.erf_f32``'s rational erf (the same constants).

The full vectors of a row are loaded plainly, the last partial one with a masked load/store.
``softmax_row_reference`` and ``dense.gelu_reference`` are the numpy versions; ``symbols()``
returns None where llvmlite or AVX2+FMA are missing, and callers then use numba or numpy code.
"""

from __future__ import annotations

import numpy as np

from ember.kernels.cpu import renamed, special

_STATE: dict = {}

# Cephes expf
_EXP = dict(
    lo=-87.0, log2e=1.4426950408889634, c1=0.693359375, c2=-2.12194440e-4,
    p=(1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
       5.0000001201e-1),
)  # fmt: skip


def softmax_row_reference(s: np.ndarray, n: int, scale: float) -> float:
    """s[:n] <- exp((s - max) * scale) in place (float64 maths); returns the sum."""
    x = s[:n].astype(np.float64)
    e = np.exp((x - x.max()) * scale)
    s[:n] = e
    return float(e.astype(np.float32).sum())


def _f(x: float) -> str:
    """A float32 constant as LLVM IR hex (exact)."""
    return "0x" + np.float64(np.float32(x)).view(np.uint64).tobytes()[::-1].hex().upper()


def _splat(w: int, x: float) -> str:
    return "<" + ", ".join([f"float {_f(x)}"] * w) + ">"


def _tail_mask(w: int, name: str, rem: str) -> list[str]:
    """%name = <w x i1> lanes below rem (an i64)."""
    iota = ", ".join(f"i32 {i}" for i in range(w))
    return [
        f"  %{name}.r = trunc i64 {rem} to i32",
        f"  %{name}.i = insertelement <{w} x i32> poison, i32 %{name}.r, i32 0",
        f"  %{name}.s = shufflevector <{w} x i32> %{name}.i, <{w} x i32> poison,"
        f" <{w} x i32> zeroinitializer",
        f"  %{name} = icmp slt <{w} x i32> <{iota}>, %{name}.s",
    ]


def _softmax_ir(w: int) -> str:
    vt = f"<{w} x float>"
    it = f"<{w} x i32>"
    e = _EXP
    ninf = _splat(w, -np.inf)

    def expv(x: str, o: str) -> list[str]:
        """%o = exp(%x) (vector), Cephes' expf; NaN propagates (selects, not min/max)."""
        s = [
            f"  %{o}.lc = fcmp olt {vt} {x}, {_splat(w, e['lo'])}",
            f"  %{o}.x = select <{w} x i1> %{o}.lc, {vt} {_splat(w, e['lo'])}, {vt} {x}",
            f"  %{o}.t = call {vt} @llvm.fma.v{w}f32({vt} %{o}.x, {vt} {_splat(w, e['log2e'])},"
            f" {vt} {_splat(w, 0.5)})",
            f"  %{o}.n = call {vt} @llvm.floor.v{w}f32({vt} %{o}.t)",
            f"  %{o}.r1 = call {vt} @llvm.fma.v{w}f32({vt} %{o}.n, {vt} {_splat(w, -e['c1'])},"
            f" {vt} %{o}.x)",
            f"  %{o}.r = call {vt} @llvm.fma.v{w}f32({vt} %{o}.n, {vt} {_splat(w, -e['c2'])},"
            f" {vt} %{o}.r1)",
            f"  %{o}.z = fmul {vt} %{o}.r, %{o}.r",
        ]
        prev = _splat(w, e["p"][0])
        for i, c in enumerate(e["p"][1:]):
            s.append(
                f"  %{o}.p{i} = call {vt} @llvm.fma.v{w}f32({vt} {prev}, {vt} %{o}.r,"
                f" {vt} {_splat(w, c)})"
            )
            prev = f"%{o}.p{i}"
        s += [
            f"  %{o}.y = call {vt} @llvm.fma.v{w}f32({vt} {prev}, {vt} %{o}.z, {vt} %{o}.r)",
            f"  %{o}.y1 = fadd {vt} %{o}.y, {_splat(w, 1.0)}",
            f"  %{o}.k = fptosi {vt} %{o}.n to {it}",
            f"  %{o}.kb = add {it} %{o}.k, <" + ", ".join(["i32 127"] * w) + ">",
            f"  %{o}.ks = shl {it} %{o}.kb, <" + ", ".join(["i32 23"] * w) + ">",
            f"  %{o}.two = bitcast {it} %{o}.ks to {vt}",
            f"  %{o} = fmul {vt} %{o}.y1, %{o}.two",
        ]
        return s

    s = [
        "define float @ember_softmax_row(i64 %si, i64 %n, float %scale) #0 {",
        "entry:",
        "  %s = inttoptr i64 %si to ptr",
        f"  %nv = and i64 %n, -{w}",
        f"  %sc.i = insertelement {vt} poison, float %scale, i32 0",
        f"  %scv = shufflevector {vt} %sc.i, {vt} poison, <{w} x i32> zeroinitializer",
        f"  %n4 = and i64 %n, -{4 * w}",
        "  br label %mxl",
        # max: four vectors per step into four running maxima, then single vectors, then the
        # masked tail (a NaN is skipped here; the exp pass sees it and keeps it)
        "mxl:",
        "  %j = phi i64 [0, %entry], [%j1, %mxb]",
    ]
    s += [f"  %a{u} = phi {vt} [{ninf}, %entry], [%a{u}n, %mxb]" for u in range(4)]
    s += ["  %jc = icmp ult i64 %j, %n4", "  br i1 %jc, label %mxb, label %m1", "mxb:"]
    for u in range(4):
        s += [
            f"  %ju{u} = add i64 %j, {u * w}",
            f"  %pu{u} = getelementptr float, ptr %s, i64 %ju{u}",
            f"  %ld{u} = load {vt}, ptr %pu{u}, align 4",
            f"  %c{u} = fcmp ogt {vt} %ld{u}, %a{u}",  # a NaN compares false: skipped
            f"  %a{u}n = select <{w} x i1> %c{u}, {vt} %ld{u}, {vt} %a{u}",
        ]
    s += [f"  %j1 = add i64 %j, {4 * w}", "  br label %mxl", "m1:"]
    s += [
        f"  %m01 = call {vt} @llvm.maxnum.v{w}f32({vt} %a0, {vt} %a1)",
        f"  %m23 = call {vt} @llvm.maxnum.v{w}f32({vt} %a2, {vt} %a3)",
        f"  %m03 = call {vt} @llvm.maxnum.v{w}f32({vt} %m01, {vt} %m23)",
        "  br label %m1l",
        "m1l:",
        "  %i = phi i64 [%n4, %m1], [%i1, %m1b]",
        f"  %b = phi {vt} [%m03, %m1], [%bn, %m1b]",
        "  %ic = icmp ult i64 %i, %nv",
        "  br i1 %ic, label %m1b, label %mxe",
        "m1b:",
        "  %pi = getelementptr float, ptr %s, i64 %i",
        f"  %li = load {vt}, ptr %pi, align 4",
        f"  %ci = fcmp ogt {vt} %li, %b",
        f"  %bn = select <{w} x i1> %ci, {vt} %li, {vt} %b",
        f"  %i1 = add i64 %i, {w}",
        "  br label %m1l",
        "mxe:",
    ]
    s += ["  %rem = sub i64 %n, %nv"] + _tail_mask(w, "tm", "%rem")
    s += [
        "  %pt = getelementptr float, ptr %s, i64 %nv",
        f"  %xt = call {vt} @llvm.masked.load.v{w}f32.p0(ptr %pt, i32 4, <{w} x i1> %tm,"
        f" {vt} {ninf})",
        f"  %mall = call {vt} @llvm.maxnum.v{w}f32({vt} %b, {vt} %xt)",
        f"  %mx = call float @llvm.vector.reduce.fmax.v{w}f32({vt} %mall)",
        f"  %mx.i = insertelement {vt} poison, float %mx, i32 0",
        f"  %mxv = shufflevector {vt} %mx.i, {vt} poison, <{w} x i32> zeroinitializer",
        "  br label %ex",
        # exp((s - max) * scale) in place over whole vectors, summing
        "ex:",
        "  %k = phi i64 [0, %mxe], [%k1, %exb]",
        f"  %sum = phi {vt} [zeroinitializer, %mxe], [%sum1, %exb]",
        "  %kc = icmp ult i64 %k, %nv",
        "  br i1 %kc, label %exb, label %exe",
        "exb:",
        "  %pk = getelementptr float, ptr %s, i64 %k",
        f"  %xk = load {vt}, ptr %pk, align 4",
        f"  %dk = fsub {vt} %xk, %mxv",
        f"  %uk = fmul {vt} %dk, %scv",
    ]
    s += expv("%uk", "ek")
    s += [
        f"  store {vt} %ek, ptr %pk, align 4",
        f"  %sum1 = fadd {vt} %sum, %ek",
        f"  %k1 = add i64 %k, {w}",
        "  br label %ex",
        "exe:",
        f"  %dt = fsub {vt} %xt, %mxv",
        f"  %ut = fmul {vt} %dt, %scv",
    ]
    s += expv("%ut", "et")
    s += [
        f"  %etm = select <{w} x i1> %tm, {vt} %et, {vt} zeroinitializer",
        f"  call void @llvm.masked.store.v{w}f32.p0({vt} %etm, ptr %pt, i32 4, <{w} x i1> %tm)",
        f"  %sumt = fadd {vt} %sum, %etm",
        f"  %tot = call float @llvm.vector.reduce.fadd.v{w}f32(float 0.0, {vt} %sumt)",
        "  ret float %tot",
        "}",
    ]
    return "\n".join(s)


def _gelu_ir(w: int) -> str:
    vt = f"<{w} x float>"
    a = [float(c) for c in special._ERF_ALPHA]
    b = [float(c) for c in special._ERF_BETA]

    def gelu(x: str, o: str) -> list[str]:
        """%o = 0.5 x (1 + erf(x / sqrt 2)); the erf argument clamped to [-4, 4], NaN kept."""
        s = [
            f"  %{o}.u = fmul {vt} {x}, {_splat(w, special._RSQRT2)}",
            f"  %{o}.lc = fcmp olt {vt} %{o}.u, {_splat(w, -4.0)}",
            f"  %{o}.u1 = select <{w} x i1> %{o}.lc, {vt} {_splat(w, -4.0)}, {vt} %{o}.u",
            f"  %{o}.hc = fcmp ogt {vt} %{o}.u1, {_splat(w, 4.0)}",
            f"  %{o}.v = select <{w} x i1> %{o}.hc, {vt} {_splat(w, 4.0)}, {vt} %{o}.u1",
            f"  %{o}.v2 = fmul {vt} %{o}.v, %{o}.v",
        ]
        for name, cs in (("p", a), ("q", b)):
            prev = _splat(w, cs[0])
            for i, c in enumerate(cs[1:]):
                s.append(
                    f"  %{o}.{name}{i} = call {vt} @llvm.fma.v{w}f32({vt} %{o}.v2, {vt} {prev},"
                    f" {vt} {_splat(w, c)})"
                )
                prev = f"%{o}.{name}{i}"
        s += [
            f"  %{o}.vp = fmul {vt} %{o}.v, %{o}.p{len(a) - 2}",
            f"  %{o}.erf = fdiv {vt} %{o}.vp, %{o}.q{len(b) - 2}",
            f"  %{o}.e1 = fadd {vt} %{o}.erf, {_splat(w, 1.0)}",
            f"  %{o}.hx = fmul {vt} {x}, {_splat(w, 0.5)}",
            f"  %{o} = fmul {vt} %{o}.hx, %{o}.e1",
        ]
        return s

    s = [
        "define void @ember_gelu_row(i64 %xi, i64 %n, i64 %addi, i64 %has) #0 {",
        "entry:",
        "  %x = inttoptr i64 %xi to ptr",
        "  %ad = inttoptr i64 %addi to ptr",
        "  %hasb = icmp ne i64 %has, 0",
        f"  %nv = and i64 %n, -{w}",
        "  br label %lp",
        "lp:",
        "  %j = phi i64 [0, %entry], [%j1, %body]",
        "  %jc = icmp ult i64 %j, %nv",
        "  br i1 %jc, label %body, label %tail",
        "body:",
        "  %p = getelementptr float, ptr %x, i64 %j",
        f"  %xv = load {vt}, ptr %p, align 4",
    ]
    s += gelu("%xv", "g")
    s += [
        "  %pa = getelementptr float, ptr %ad, i64 %j",
        f"  %hm.i = insertelement <{w} x i1> poison, i1 %hasb, i32 0",
        f"  %hm = shufflevector <{w} x i1> %hm.i, <{w} x i1> poison, <{w} x i32> zeroinitializer",
        f"  %av = call {vt} @llvm.masked.load.v{w}f32.p0(ptr %pa, i32 4, <{w} x i1> %hm,"
        f" {vt} zeroinitializer)",
        f"  %gv = fadd {vt} %g, %av",
        f"  store {vt} %gv, ptr %p, align 4",
        f"  %j1 = add i64 %j, {w}",
        "  br label %lp",
        "tail:",
        "  %rem = sub i64 %n, %nv",
    ]
    s += _tail_mask(w, "tm", "%rem")
    s += [
        "  %pt = getelementptr float, ptr %x, i64 %nv",
        f"  %xt = call {vt} @llvm.masked.load.v{w}f32.p0(ptr %pt, i32 4, <{w} x i1> %tm,"
        f" {vt} zeroinitializer)",
    ]
    s += gelu("%xt", "gt")
    s += [
        "  %pat = getelementptr float, ptr %ad, i64 %nv",
        f"  %tma = select i1 %hasb, <{w} x i1> %tm, <{w} x i1> zeroinitializer",
        f"  %at = call {vt} @llvm.masked.load.v{w}f32.p0(ptr %pat, i32 4, <{w} x i1> %tma,"
        f" {vt} zeroinitializer)",
        f"  %gtv = fadd {vt} %gt, %at",
        f"  call void @llvm.masked.store.v{w}f32.p0({vt} %gtv, ptr %pt, i32 4, <{w} x i1> %tm)",
        "  ret void",
        "}",
    ]
    return "\n".join(s)


def keyed(fn, *modules):
    """A copy of fn whose qualified name carries a digest of the modules' source files.

    numba's on-disk cache is keyed on a function's own file: a kernel that calls another
    module's compiled code or external symbols (sgemm's microkernels, the row kernels here)
    would keep using a cached build made for their old signatures. Under the keyed name, a
    change to those modules gives a new cache entry instead.
    """
    import zlib
    from pathlib import Path

    digest = 0
    for m in modules:
        digest = zlib.crc32(Path(m.__file__).read_bytes(), digest)
    return renamed(fn, f"{digest:08x}")


def symbols() -> dict | None:
    """Compile the row kernels once (symbols registered for numba); None where unavailable."""
    if "ok" not in _STATE:
        _STATE["ok"] = False
        from ember.kernels.cpu import gemm as G

        if G.isa() is not None:  # llvmlite present, AVX2+FMA at least
            w = 16 if G.isa() == "avx512" else 8
            functions = [_softmax_ir(w), _gelu_ir(w)]
            engine = G.jit_ir(functions, ["ember_softmax_row", "ember_gelu_row"])
            _STATE.update(ok=True, engine=engine, width=w)  # the engine owns the machine code
    return _STATE if _STATE["ok"] else None
