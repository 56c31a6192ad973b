"""Many rows of x times a BF16 weight with ``vdpbf16ps`` (AVX-512 BF16), or times a BF16/F16
weight in float32 (AVX-512F): LLVM IR tiles in dot form, tasks on ember's pool.

A prompt's prefill multiplies hundreds of rows of x by each bf16 weight. The weight stays
where it lies (a memory-mapped GGUF/safetensors tensor, rows of K bf16 values): no float32 copy,
no repacked copy. Instead of widening weight rows to float32 for BLAS (``half._prefill``), x is
rounded to bf16 once per product (``vcvtneps2bf16``: round to nearest even, NaN kept quiet,
denormals flushed to zero) into a buffer of rows padded to a multiple of 32 values, and
``vdpbf16ps`` multiplies 32 bf16 pairs per instruction into 16 float32 lanes:

* the microkernel is a tile of MR rows of x by NR rows of W in *dot* form: one 512-bit
  accumulator per (x row, W row) pair, each step loading 32 values (64 bytes) of every row of
  the tile and doing MR x NR ``vdpbf16ps``; at the end each accumulator is summed across its
  lanes and stored (or added, for the second and later blocks of K). A row of W is read in its
  own order, so nothing is repacked; the last step of a row masks the load of W (K need not be
  a multiple of 32, and no load passes the weight's end);
* a task is a run of NR-row groups of W (``n_chunk`` rows) times a block of ``m_block`` rows
  of x (their bf16 rows, about ``X_BYTES``, stay in L2): for each group, for each block of K
  (``K_STEPS`` steps of 32: the group's rows stay in L1), for each MR rows of x, the tile;
* tasks run on ``kernels.cpu.pool`` (``run_items``), at least TASKS_PER_THREAD per thread and
  at most about ``TASK_MACS`` multiply-adds each.

``matmul_t_float`` runs the same tiles and tasks on float32 x, unrounded, for BF16 or F16
weights: a step is 16 weights widened exactly to float32 (bf16: shifted into the upper half;
f16: ``vcvtph2ps``) and one FMA per (x row, W row) pair, x's last step masked like W's. It is
what F16 weights, AVX-512 CPUs without the BF16 instructions and ``EMBER_HALF_DOT=float`` run.

The task loops, the tiles for every (mr <= MR, nr <= NR) of each kind and the conversion of x
are one LLVM IR module (``state``), compiled for the host with ``gemm.jit_ir``. It exists where
the packed GEMM runs its AVX-512 family (the ``vdpbf16ps`` kind where the host also reports
``avx512bf16`` and EMBER_HALF_DOT is not ``float``); elsewhere ``half`` keeps its own kernels
and BLAS.

Accuracy: the products are those of the bf16-rounded x with the bf16 weights, accumulated in
float32 (the reference is ``reference``: float64 of the rounded operands). Rounding x to bf16
costs a relative error of up to 2^-9 per term: measured on TinyLlama's shapes with random data,
an error of 1.7e-3 of the outputs' RMS (docs/quantization.md).
"""

from __future__ import annotations

import threading

import numpy as np

from ember import config
from ember.errors import ShapeError
from ember.kernels.cpu import built_once

MR, NR = 4, 6  # rows of x, rows of W per tile (MR x NR accumulators in zmm registers)
K_STEPS = 96  # 32-value steps per block of K (NR rows x 6 KB of W stay in L1)
X_BYTES = 1 << 19  # bf16 bytes of the rows of x a task keeps in L2
TASK_MACS = 1 << 23  # multiply-adds per pool task, about (far below the pool's 1 ms solo wait)
TASKS_PER_THREAD = 4
# the task's parameter block
(D_W, D_LDW, D_X, D_LDX, D_Y, D_LDY, D_M, D_N, D_TASKS_N, D_NCHUNK, D_MBLOCK, D_KSTEPS, D_NK,
 D_KT, D_NKB, D_WORDS) = range(16)  # fmt: skip
_STATE: dict = {}
_LOCK = threading.Lock()
_V16, _B32 = "<16 x float>", "<32 x bfloat>"


# kind -> (values per step, W bytes per step, x bytes per step): "dot" multiplies bf16 x by
# vdpbf16ps; "bf16" / "f16" widen 16 weights to float32 per step for FMAs with float32 x
KINDS = {"dot": (32, 64, 64), "bf16": (16, 32, 64), "f16": (16, 32, 64)}


def _tile_ir(kind: str, mr: int, nr: int) -> str:
    """``ember_{kind}_tile_{mr}_{nr}``: y[i, j] (+)= sum_k x[i, k] * w[j, k] for a tile."""
    acc = [(i, j) for i in range(mr) for j in range(nr)]
    vals, wstep, xstep = KINDS[kind]
    dp = "@llvm.x86.avx512bf16.dpbf16ps.512"
    wshift, xshift = wstep.bit_length() - 1, xstep.bit_length() - 1

    def load_w(j: int, ptr: str, tag: str, masked: bool) -> list[str]:
        """%{tag}{j}: the step's weights as the multiply's operand (masked: %mask's lanes)."""
        it = f"<{vals} x i16>"
        if masked:
            out = [f"  %{tag}h{j} = call {it} @llvm.masked.load.v{vals}i16.p0(ptr {ptr}, i32 2,"
                   f" <{vals} x i1> %mask, {it} zeroinitializer)"]  # fmt: skip
        else:
            out = [f"  %{tag}h{j} = load {it}, ptr {ptr}, align 2"]
        if kind == "dot":
            return out + [f"  %{tag}{j} = bitcast {it} %{tag}h{j} to {_B32}"]
        if kind == "bf16":
            sh = "<" + ", ".join(["i32 16"] * 16) + ">"
            return out + [f"  %{tag}z{j} = zext {it} %{tag}h{j} to <16 x i32>",
                          f"  %{tag}s{j} = shl <16 x i32> %{tag}z{j}, {sh}",
                          f"  %{tag}{j} = bitcast <16 x i32> %{tag}s{j} to {_V16}"]  # fmt: skip
        return out + [f"  %{tag}c{j} = bitcast {it} %{tag}h{j} to <16 x half>",
                      f"  %{tag}{j} = fpext <16 x half> %{tag}c{j} to {_V16}"]  # fmt: skip

    def load_x(i: int, ptr: str, tag: str, masked: bool) -> list[str]:
        """%{tag}{i}: the step's x (bf16, zero-padded rows; or float32, masked at the end)."""
        if kind == "dot":
            return [f"  %{tag}{i} = load {_B32}, ptr {ptr}, align 64"]
        if masked:
            return [f"  %{tag}{i} = call {_V16} @llvm.masked.load.v16f32.p0(ptr {ptr}, i32 4,"
                    f" <16 x i1> %mask, {_V16} zeroinitializer)"]  # fmt: skip
        return [f"  %{tag}{i} = load {_V16}, ptr {ptr}, align 4"]

    def madd(out: str, a: str, xv: str, wv: str) -> str:
        if kind == "dot":
            return f"  {out} = call {_V16} {dp}({_V16} {a}, {_B32} {xv}, {_B32} {wv})"
        return f"  {out} = call {_V16} @llvm.fma.v16f32({_V16} {xv}, {_V16} {wv}, {_V16} {a})"

    s = [
        f"define internal void @ember_{kind}_tile_{mr}_{nr}(ptr %w, i64 %ldw, ptr %x, i64 %ldx,"
        " i64 %nk, i64 %kt, ptr %y, i64 %ldy, i64 %add) #0 {",
        "entry:",
    ]
    for j in range(nr):
        s += [f"  %wo{j} = mul i64 %ldw, {j}", f"  %w{j} = getelementptr i8, ptr %w, i64 %wo{j}"]
    for i in range(mr):
        s += [f"  %xo{i} = mul i64 %ldx, {i}", f"  %x{i} = getelementptr i8, ptr %x, i64 %xo{i}"]
    s += ["  %any = icmp ugt i64 %nk, 0", "  br i1 %any, label %loop, label %tail", "loop:"]
    s += ["  %b = phi i64 [0, %entry], [%b1, %loop]"]
    s += [f"  %A{i}_{j} = phi {_V16} [zeroinitializer, %entry], [%N{i}_{j}, %loop]" for i, j in acc]
    s += [f"  %offw = shl i64 %b, {wshift}", f"  %offx = shl i64 %b, {xshift}"]
    for j in range(nr):
        s += [f"  %wp{j} = getelementptr i8, ptr %w{j}, i64 %offw"]
        s += load_w(j, f"%wp{j}", "wv", False)
    for i in range(mr):
        s += [f"  %xp{i} = getelementptr i8, ptr %x{i}, i64 %offx"]
        s += load_x(i, f"%xp{i}", "xv", False)
        s += [madd(f"%N{i}_{j}", f"%A{i}_{j}", f"%xv{i}", f"%wv{j}") for j in range(nr)]
    s += ["  %b1 = add i64 %b, 1", "  %more = icmp ult i64 %b1, %nk"]
    s += ["  br i1 %more, label %loop, label %tail", "tail:"]
    s += [f"  %T{i}_{j} = phi {_V16} [zeroinitializer, %entry], [%N{i}_{j}, %loop]" for i, j in acc]
    s += ["  %ht = icmp ne i64 %kt, 0", "  br i1 %ht, label %last, label %store", "last:"]
    # the last, partial step: W's load masked to the kt values left (and float32 x's; bf16 x's
    # rows are zero-padded)
    iota = ", ".join(f"i32 {c}" for c in range(vals))
    vi = f"<{vals} x i32>"
    s += [f"  %toffw = shl i64 %nk, {wshift}", f"  %toffx = shl i64 %nk, {xshift}"]
    s += ["  %kt32 = trunc i64 %kt to i32", f"  %kti = insertelement {vi} poison, i32 %kt32, i32 0"]
    s += [f"  %kts = shufflevector {vi} %kti, {vi} poison, {vi} zeroinitializer"]
    s += [f"  %mask = icmp ult {vi} <{iota}>, %kts"]
    for j in range(nr):
        s += [f"  %tp{j} = getelementptr i8, ptr %w{j}, i64 %toffw"]
        s += load_w(j, f"%tp{j}", "tv", True)
    for i in range(mr):
        s += [f"  %tx{i} = getelementptr i8, ptr %x{i}, i64 %toffx"]
        s += load_x(i, f"%tx{i}", "txv", True)
        s += [madd(f"%U{i}_{j}", f"%T{i}_{j}", f"%txv{i}", f"%tv{j}") for j in range(nr)]
    s += ["  br label %store", "store:"]
    s += [f"  %S{i}_{j} = phi {_V16} [%T{i}_{j}, %tail], [%U{i}_{j}, %last]" for i, j in acc]
    s += ["  %addf = icmp ne i64 %add, 0"]
    for i, j in acc:
        s += [
            f"  %r{i}_{j} = call reassoc float @llvm.vector.reduce.fadd.v16f32(float -0.0,"
            f" {_V16} %S{i}_{j})",
            f"  %yo{i}_{j} = mul i64 %ldy, {i}",
            f"  %yi{i}_{j} = add i64 %yo{i}_{j}, {j}",
            f"  %yp{i}_{j} = getelementptr float, ptr %y, i64 %yi{i}_{j}",
            f"  %old{i}_{j} = load float, ptr %yp{i}_{j}, align 4",
            f"  %sum{i}_{j} = fadd float %old{i}_{j}, %r{i}_{j}",
            f"  %v{i}_{j} = select i1 %addf, float %sum{i}_{j}, float %r{i}_{j}",
            f"  store float %v{i}_{j}, ptr %yp{i}_{j}, align 4",
        ]
    s += ["  ret void", "}"]
    return "\n".join(s)


def _task_ir(kind: str) -> str:
    """``ember_{kind}_task``: pool tasks [t0, t1) of the product whose parameter block is at %d
    (the pool's chunk-function signature)."""
    _, wstep, xstep = KINDS[kind]
    s = [
        f"define void @ember_{kind}_task(i64 %d, i64 %u1, i64 %u2, i64 %t0, i64 %t1, i64 %u5,"
        " i64 %u6, i64 %u7, i64 %u8, i64 %u9, i64 %u10, i64 %u11) #0 {",
        "entry:",
        "  %dp = inttoptr i64 %d to ptr",
    ]
    words = {"wi": D_W, "ldw": D_LDW, "xi": D_X, "ldx": D_LDX, "yi": D_Y, "ldy": D_LDY, "m": D_M,
             "n": D_N, "tn": D_TASKS_N, "nch": D_NCHUNK, "mbl": D_MBLOCK, "ks": D_KSTEPS,
             "nk": D_NK, "kt": D_KT, "nkb": D_NKB}  # fmt: skip
    for name, idx in words.items():
        s += [
            f"  %{name}p = getelementptr i64, ptr %dp, i64 {idx}",
            f"  %{name} = load i64, ptr %{name}p",
        ]
    s += ["  %w = inttoptr i64 %wi to ptr", "  %x = inttoptr i64 %xi to ptr"]
    s += ["  %y = inttoptr i64 %yi to ptr"]
    s += ["  %tany = icmp ult i64 %t0, %t1", "  br i1 %tany, label %task, label %done"]
    # task t: rows [m0, m1) of x (block t / tn), rows [n0, n1) of W (chunk t % tn)
    s += ["task:", "  %t = phi i64 [%t0, %entry], [%tn1, %tend]"]
    s += ["  %mb = udiv i64 %t, %tn", "  %nb = urem i64 %t, %tn"]
    s += ["  %m0 = mul i64 %mb, %mbl", "  %m0e = add i64 %m0, %mbl"]
    s += ["  %m1c = icmp ult i64 %m0e, %m", "  %m1 = select i1 %m1c, i64 %m0e, i64 %m"]
    s += ["  %n0 = mul i64 %nb, %nch", "  %n0e = add i64 %n0, %nch"]
    s += ["  %n1c = icmp ult i64 %n0e, %n", "  %n1 = select i1 %n1c, i64 %n0e, i64 %n"]
    s += ["  br label %ng"]
    # a group of up to NR rows of W
    s += ["ng:", "  %j = phi i64 [%n0, %task], [%j1, %ngend]"]
    s += [f"  %je = add i64 %j, {NR}", "  %jc = icmp ult i64 %je, %n1"]
    s += ["  %j1 = select i1 %jc, i64 %je, i64 %n1", "  %nr = sub i64 %j1, %j"]
    s += ["  %wro = mul i64 %j, %ldw", "  %wr = getelementptr i8, ptr %w, i64 %wro"]
    s += ["  br label %kb"]
    # a block of K: ks steps (the last block: the rest, and the tail)
    s += ["kb:", "  %q = phi i64 [0, %ng], [%q1, %kbend]"]
    s += ["  %q1 = add i64 %q, 1", "  %lastb = icmp eq i64 %q1, %nkb"]
    s += ["  %s0 = mul i64 %q, %ks", "  %rest = sub i64 %nk, %s0"]
    s += ["  %steps = select i1 %lastb, i64 %rest, i64 %ks"]
    s += ["  %ktb = select i1 %lastb, i64 %kt, i64 0", "  %qnz = icmp ne i64 %q, 0"]
    s += ["  %addk = zext i1 %qnz to i64"]  # blocks after the first add onto y
    s += [f"  %kow = mul i64 %s0, {wstep}", "  %wk = getelementptr i8, ptr %wr, i64 %kow"]
    s += [f"  %kox = mul i64 %s0, {xstep}"]
    s += ["  br label %mg"]
    # MR rows of x (or fewer): the tile for (mr, nr)
    s += ["mg:", "  %i = phi i64 [%m0, %kb], [%i1, %mgend]"]
    s += [f"  %ie = add i64 %i, {MR}", "  %ic = icmp ult i64 %ie, %m1"]
    s += ["  %i1 = select i1 %ic, i64 %ie, i64 %m1", "  %mr = sub i64 %i1, %i"]
    s += ["  %xro = mul i64 %i, %ldx", "  %xr0 = getelementptr i8, ptr %x, i64 %xro"]
    s += ["  %xk = getelementptr i8, ptr %xr0, i64 %kox"]
    s += ["  %yo = mul i64 %i, %ldy", "  %yo2 = add i64 %yo, %j"]
    s += ["  %yt = getelementptr float, ptr %y, i64 %yo2"]
    s += [
        "  %mr1 = sub i64 %mr, 1",
        f"  %sel0 = mul i64 %mr1, {NR}",
        "  %sel1 = add i64 %sel0, %nr",
    ]
    s += ["  %sel = sub i64 %sel1, 1"]
    cases = [(a, b) for a in range(1, MR + 1) for b in range(1, NR + 1)]
    targets = " ".join(f"i64 {(a - 1) * NR + b - 1}, label %c{a}_{b}" for a, b in cases)
    s += [f"  switch i64 %sel, label %mgend [ {targets} ]"]
    for a, b in cases:
        s += [
            f"c{a}_{b}:",
            f"  call void @ember_{kind}_tile_{a}_{b}(ptr %wk, i64 %ldw, ptr %xk, i64 %ldx,"
            " i64 %steps, i64 %ktb, ptr %yt, i64 %ldy, i64 %addk)",
            "  br label %mgend",
        ]
    s += ["mgend:", "  %mc = icmp ult i64 %i1, %m1", "  br i1 %mc, label %mg, label %kbend"]
    s += ["kbend:", "  %kc = icmp ult i64 %q1, %nkb", "  br i1 %kc, label %kb, label %ngend"]
    s += ["ngend:", "  %nc = icmp ult i64 %j1, %n1", "  br i1 %nc, label %ng, label %tend"]
    s += ["tend:", "  %tn1 = add i64 %t, 1", "  %tc = icmp ult i64 %tn1, %t1"]
    s += ["  br i1 %tc, label %task, label %done", "done:", "  ret void", "}"]
    return "\n".join(s)


def _convert_ir() -> str:
    """``ember_bf16_round``: rows [r0, r1) of x (k floats, ldx floats apart) rounded to bf16
    (``vcvtneps2bf16``) into rows of kp values (a multiple of 32, zero-padded), ldo bytes apart
    (the pool's chunk-function signature: %d points at x, ldx, out, ldo, k, kp)."""
    iota = ", ".join(f"i32 {c}" for c in range(16))
    return "\n".join([
        "define void @ember_bf16_round(i64 %d, i64 %u1, i64 %u2, i64 %r0, i64 %r1, i64 %u5,"
        " i64 %u6, i64 %u7, i64 %u8, i64 %u9, i64 %u10, i64 %u11) #0 {",
        "entry:",
        "  %dp = inttoptr i64 %d to ptr",
        "  %xi = load i64, ptr %dp",
        "  %p1 = getelementptr i64, ptr %dp, i64 1", "  %ldx = load i64, ptr %p1",
        "  %p2 = getelementptr i64, ptr %dp, i64 2", "  %oi = load i64, ptr %p2",
        "  %p3 = getelementptr i64, ptr %dp, i64 3", "  %ldo = load i64, ptr %p3",
        "  %p4 = getelementptr i64, ptr %dp, i64 4", "  %k = load i64, ptr %p4",
        "  %p5 = getelementptr i64, ptr %dp, i64 5", "  %kp = load i64, ptr %p5",
        "  %x = inttoptr i64 %xi to ptr", "  %o = inttoptr i64 %oi to ptr",
        "  %any = icmp ult i64 %r0, %r1", "  br i1 %any, label %row, label %done",
        "row:",
        "  %r = phi i64 [%r0, %entry], [%rn, %rowend]",
        "  %xo = mul i64 %r, %ldx", "  %xr = getelementptr float, ptr %x, i64 %xo",
        "  %oo = mul i64 %r, %ldo", "  %or = getelementptr i8, ptr %o, i64 %oo",
        "  br label %col",
        "col:",
        "  %c = phi i64 [0, %row], [%cn, %col]",
        "  %left = sub i64 %k, %c",
        "  %lc = icmp slt i64 %left, 16", "  %lm = select i1 %lc, i64 %left, i64 16",
        "  %lp = icmp sgt i64 %lm, 0", "  %l0 = select i1 %lp, i64 %lm, i64 0",
        "  %l32 = trunc i64 %l0 to i32",
        "  %li = insertelement <16 x i32> poison, i32 %l32, i32 0",
        "  %ls = shufflevector <16 x i32> %li, <16 x i32> poison, <16 x i32> zeroinitializer",
        f"  %mask = icmp ult <16 x i32> <{iota}>, %ls",
        "  %xp = getelementptr float, ptr %xr, i64 %c",
        f"  %v = call {_V16} @llvm.masked.load.v16f32.p0(ptr %xp, i32 4, <16 x i1> %mask,"
        f" {_V16} zeroinitializer)",
        f"  %h = call <16 x bfloat> @llvm.x86.avx512bf16.cvtneps2bf16.512({_V16} %v)",
        "  %op = getelementptr bfloat, ptr %or, i64 %c",
        "  store <16 x bfloat> %h, ptr %op, align 32",
        "  %cn = add i64 %c, 16", "  %cc = icmp ult i64 %cn, %kp",
        "  br i1 %cc, label %col, label %rowend",
        "rowend:",
        "  %rn = add i64 %r, 1", "  %rc = icmp ult i64 %rn, %r1",
        "  br i1 %rc, label %row, label %done",
        "done:", "  ret void", "}",
    ])  # fmt: skip


def _build() -> dict:
    from ember.kernels.cpu import gemm as G
    from ember.kernels.cpu import have_numba, pool

    if not have_numba() or G.isa() != "avx512" or pool.state() is None:
        return {"ok": False}
    import llvmlite.binding as llvm

    dot = config.HALF_DOT == "bf16" and bool(llvm.get_host_cpu_features().get("avx512bf16"))
    kinds = ["bf16", "f16"] + (["dot"] if dot else [])
    decls = ["declare <16 x i16> @llvm.masked.load.v16i16.p0(ptr, i32, <16 x i1>, <16 x i16>)"]
    if dot:
        decls += [
            f"declare {_V16} @llvm.x86.avx512bf16.dpbf16ps.512({_V16}, {_B32}, {_B32})",
            f"declare <16 x bfloat> @llvm.x86.avx512bf16.cvtneps2bf16.512({_V16})",
            "declare <32 x i16> @llvm.masked.load.v32i16.p0(ptr, i32, <32 x i1>, <32 x i16>)",
        ]
    irs = [_tile_ir(kd, a, b) for kd in kinds for a in range(1, MR + 1) for b in range(1, NR + 1)]
    irs += [_task_ir(kd) for kd in kinds] + ([_convert_ir()] if dot else [])
    names = [f"ember_{kd}_task" for kd in kinds] + (["ember_bf16_round"] if dot else [])
    engine = G.jit_ir([*decls, *irs], names)
    fns = {n: engine.get_function_address(n) for n in names}
    return {"ok": True, "dot": dot, "engine": engine, "fns": fns}


def state() -> dict | None:
    """Compile the kernels once: {"dot": bool, "fns": {name: address}}; None where none can
    run here (no AVX-512 family, llvmlite, numba or pool)."""
    return built_once(_STATE, _LOCK, _build)


def available() -> bool:
    """Whether ``matmul_t`` runs here (AVX-512 BF16, llvmlite, numba; EMBER_HALF_DOT=bf16)."""
    st = state()
    return st is not None and st["dot"]


def float_available() -> bool:
    """Whether ``matmul_t_float`` runs here (AVX-512F, llvmlite, numba)."""
    return state() is not None


def _aligned(shape: tuple[int, int]) -> np.ndarray:
    """A new uint16 array of this shape starting on a 64-byte boundary."""
    nbytes = 2 * shape[0] * shape[1]
    raw = np.empty(nbytes + 64, np.uint8)
    off = -raw.ctypes.data % 64
    return raw[off : off + nbytes].view(np.uint16).reshape(shape)


def round_x(x: np.ndarray) -> np.ndarray:
    """x (M, K) float32 rounded to bf16 (the kernel's conversion), as uint16 rows of a multiple
    of 32 values (zero-padded), starting on 64-byte boundaries."""
    from ember.kernels.cpu import pool

    m, k = x.shape
    kp = -(-k // 32) * 32
    out = _aligned((m, kp))
    x = np.ascontiguousarray(x, np.float32)
    desc = np.array([x.ctypes.data, k, out.ctypes.data, 2 * kp, k, kp], np.int64)
    if m:
        pool.run_items(state()["fns"]["ember_bf16_round"], desc.ctypes.data, m, max(1, m // 8))
    return out


def _plan(m: int, n: int, xrow: int, k: int, threads: int) -> tuple[int, int]:
    """(rows of x per task, rows of W per task): x's block (xrow bytes a row) about X_BYTES,
    at least TASKS_PER_THREAD tasks per thread, each about TASK_MACS multiply-adds or fewer."""
    m_block = max(MR, min(m, X_BYTES // xrow) // MR * MR)
    m_blocks = -(-m // m_block)
    groups = -(-n // NR)
    want = -(-TASKS_PER_THREAD * threads // m_blocks)
    by_size = -(-m_block * groups * NR * k // TASK_MACS)
    tasks_n = min(groups, max(want, by_size, 1))
    return m_block, -(-groups // tasks_n) * NR


def _check(w16: np.ndarray, x: np.ndarray) -> np.ndarray:
    n, k = w16.shape
    if x.ndim != 2 or x.shape[1] != k or w16.dtype != np.uint16 or not w16.flags.c_contiguous:
        raise ShapeError(f"16-bit weight product: x {x.shape} and W {w16.shape} ({w16.dtype})")
    y = np.empty((x.shape[0], n), np.float32)
    if k == 0:
        y[...] = 0
    return y


def _run(kind: str, w16: np.ndarray, xi: int, ldx: int, y: np.ndarray, threads: int | None):
    """The pool tasks of ``y = x @ W.T``, x's rows at address xi, ldx bytes apart."""
    from ember.kernels.cpu import pool
    from ember.threads import get_num_threads

    (n, k), m = w16.shape, y.shape[0]
    vals = KINDS[kind][0]
    ksteps = K_STEPS * 32 // vals  # a block of K: the same bytes of W whatever the kind
    threads = max(1, get_num_threads() if threads is None else threads)
    m_block, n_chunk = _plan(m, n, ldx, k, threads)
    tasks_n = -(-n // n_chunk)
    nk, kt = divmod(k, vals)
    nkb = max(1, -(-nk // ksteps))
    if kt and nk == nkb * ksteps:  # the tail alone would make one more block
        nkb += 1
    desc = np.zeros(D_WORDS, np.int64)
    desc[[D_W, D_LDW, D_X, D_LDX, D_Y, D_LDY]] = (w16.ctypes.data, 2 * k, xi, ldx,
                                                  y.ctypes.data, n)  # fmt: skip
    desc[[D_M, D_N, D_TASKS_N, D_NCHUNK, D_MBLOCK]] = (m, n, tasks_n, n_chunk, m_block)
    desc[[D_KSTEPS, D_NK, D_KT, D_NKB]] = (ksteps, nk, kt, nkb)
    tasks = -(-m // m_block) * tasks_n
    pool.run_items(state()["fns"][f"ember_{kind}_task"], desc.ctypes.data, tasks, 1)


def matmul_t(w16: np.ndarray, x: np.ndarray, threads: int | None = None) -> np.ndarray:
    """``x @ W.T`` (M, N) float32 for W (N, K) bf16 bits (uint16, C-contiguous) and x (M, K)
    float32: x rounded to bf16, products accumulated in float32 (see module doc)."""
    y = _check(w16, x)
    if y.size and w16.shape[1]:
        xb = round_x(x)
        _run("dot", w16, xb.ctypes.data, 2 * xb.shape[1], y, threads)
    return y


def matmul_t_float(
    qtype: str, w16: np.ndarray, x: np.ndarray, threads: int | None = None
) -> np.ndarray:
    """``x @ W.T`` (M, N) float32 for W (N, K) BF16 or F16 bits (uint16, C-contiguous) and x
    (M, K) float32, not rounded: the weights widened exactly, FMAs in float32 (module doc)."""
    y = _check(w16, x)
    if y.size and w16.shape[1]:
        x = np.ascontiguousarray(x, np.float32)
        _run(qtype.lower(), w16, x.ctypes.data, 4 * x.shape[1], y, threads)
    return y


def bf16_round_reference(x: np.ndarray) -> np.ndarray:
    """x float32 rounded to bf16 bits (uint16) in numpy: nearest even, NaN kept (quiet),
    float32 denormals flushed to signed zero (as ``vcvtneps2bf16`` does)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = np.where(nan, (u >> 16) | 0x40, r)
    den = (u & 0x7F800000) == 0
    r = np.where(den, (u >> 16) & 0x8000, r)
    return r.astype(np.uint16)


def bf16_to_float(h: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) as float32 (exact)."""
    return (h.astype(np.uint32) << 16).view(np.float32)


def reference(w16: np.ndarray, x: np.ndarray) -> np.ndarray:
    """float64 (bf16-rounded x) @ W.T, the product ``matmul_t`` rounds to float32."""
    xr = bf16_to_float(bf16_round_reference(x)).astype(np.float64)
    return xr @ bf16_to_float(w16).astype(np.float64).T
