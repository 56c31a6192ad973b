"""One row of x times a packed weight, on the pool: a classifier's batch-1 product.

ResNet-50's classifier at batch 1 is a (1, 2048) x (2048, 1000) product: 8 MB of weight for
2 MFLOP, and in a whole pass the weight comes from DRAM (the network's 100 MB of weights
evicted it), so the product runs at the speed the cores pull its panels from memory. The packed
GEMM (``kernels.cpu.gemm``) ran it as one-row tiles, ~300 us of the pass at 1 and 2 threads:
~45 us of Python around the kernel (cold in a pass), and the pool's worker joining 70-150 us
late (the pass's Python between the last conv's job and this one outlasted its spin, and it
slept; traced with the cycle counter at each panel's start).

``RowProduct`` is one call into machine code: the channel mean of a global average pool first
where the classifier's node includes it (``rows`` > 0; summed in float64 like
``conv.channel_mean``: ~9 us for 7x7x2048 in the pass), then the panels as tasks of one pool job,
the caller from the first and the worker from the last (kernels.cpu.pool), so each streams its
part in order. The task is in effect the GEMM's one-row microkernel: per vector of a panel row
one FMA chain, k in order from zero, then the bias; so the result is bitwise the packed GEMM's
row for the same x (batch invariance with the m > 1 products) at any thread count. The chain
(4 cycles per 128 bytes) outruns DRAM twice over. In ResNet-50 b1's pass (Zen 5, traced): a
256 KB panel took ~6.5 us on one thread (~40 GB/s, the job ~220 us), ~7 and ~12 us on the two
threads together (~60 GB/s, ~170 us). Software prefetches 1-64 KB ahead, into L1 or L2, did
not change the time (ad hoc, one process alternating 8 variants after 100 MB of other
products: 196-217 us at 1 thread, 154-164 at 2): the hardware prefetchers keep up.

The output is written over the panels' padded width (``out`` holds P * NR floats, the mean's
K after them) and the product is the first O; the bias is kept padded the same way.
"""

from __future__ import annotations

import threading

import numpy as np

from ember.kernels.cpu import built_once

_F32 = np.float32
UNROLL = 4  # k steps per trip of the task's loop (one FMA chain: the order stays k's)
# the task's descriptor words (the pool job's first argument)
D_PANELS, D_K, D_BIAS, D_WORDS = 0, 1, 2, 4
_STATE: dict = {}
_LOCK = threading.Lock()


def _splat(vt: str, w: int, name: str, scalar: str, ty: str = "float") -> list[str]:
    return [
        f"  %{name}0 = insertelement {vt} poison, {ty} {scalar}, i32 0",
        f"  %{name} = shufflevector {vt} %{name}0, {vt} poison, <{w} x i32> zeroinitializer",
    ]


def _task_ir(w: int, nv: int) -> str:
    """``ember_gemv_task``, the pool's chunk function: out[p*NR:(p+1)*NR] = x @ panel p +
    bias[p*NR:...] for panels r0..r1-1 (NR = nv * w floats a panel row; x at xq, out at y)."""
    nr, vt = nv * w, f"<{w} x float>"
    row = nr * 4
    s = [
        "define void @ember_gemv_task(i64 %desc, i64 %a1, i64 %a2, i64 %r0, i64 %r1, i64 %xa,"
        " i64 %a6, i64 %a7, i64 %a8, i64 %a9, i64 %oa, i64 %a11) #0 {",
        "entry:",
        "  %d = inttoptr i64 %desc to ptr",
    ]
    for name, i in (("pa", D_PANELS), ("k", D_K), ("ba", D_BIAS)):
        s += [f"  %{name}_w = getelementptr i64, ptr %d, i64 {i}"]
        s += [f"  %{name} = load i64, ptr %{name}_w, align 8"]
    s += ["  %x = inttoptr i64 %xa to ptr", f"  %kun = and i64 %k, {-UNROLL}"]
    s += [f"  %pstride = mul i64 %k, {row}", "  %any = icmp ult i64 %r0, %r1"]
    s += ["  br i1 %any, label %panel, label %done", "panel:"]
    s += ["  %p = phi i64 [%r0, %entry], [%p1, %pend]", "  %po = mul i64 %p, %pstride"]
    s += ["  %pb0 = add i64 %pa, %po", "  %pb = inttoptr i64 %pb0 to ptr"]
    s += ["  %hasu = icmp ne i64 %kun, 0", "  br i1 %hasu, label %ku, label %kmid", "ku:"]
    s += ["  %i = phi i64 [0, %panel], [%i1, %ku]"]
    s += [f"  %A{v} = phi {vt} [zeroinitializer, %panel], [%B{UNROLL - 1}_{v}, %ku]"
          for v in range(nv)]  # fmt: skip
    s += [f"  %ib = mul i64 %i, {row}", "  %rw = getelementptr i8, ptr %pb, i64 %ib"]
    for u in range(UNROLL):
        s += [f"  %xi{u} = add i64 %i, {u}", f"  %xq{u} = getelementptr float, ptr %x, i64 %xi{u}"]
        s += [f"  %xs{u} = load float, ptr %xq{u}, align 4"]
        s += _splat(vt, w, f"xv{u}", f"%xs{u}")
        for v in range(nv):
            acc = f"%A{v}" if u == 0 else f"%B{u - 1}_{v}"
            s += [f"  %wq{u}_{v} = getelementptr i8, ptr %rw, i64 {u * row + v * w * 4}"]
            s += [f"  %wv{u}_{v} = load {vt}, ptr %wq{u}_{v}, align 4"]
            s += [f"  %B{u}_{v} = call {vt} @llvm.fma.v{w}f32({vt} %xv{u}, {vt} %wv{u}_{v},"
                  f" {vt} {acc})"]  # fmt: skip
    s += [f"  %i1 = add i64 %i, {UNROLL}", "  %more = icmp ult i64 %i1, %kun"]
    s += ["  br i1 %more, label %ku, label %kmid", "kmid:"]
    s += [f"  %C{v} = phi {vt} [zeroinitializer, %panel], [%B{UNROLL - 1}_{v}, %ku]"
          for v in range(nv)]  # fmt: skip
    s += ["  %rem = icmp ult i64 %kun, %k", "  br i1 %rem, label %kr, label %pend", "kr:"]
    s += ["  %j = phi i64 [%kun, %kmid], [%j1, %kr]"]
    s += [f"  %R{v} = phi {vt} [%C{v}, %kmid], [%S{v}, %kr]" for v in range(nv)]
    s += [f"  %jb = mul i64 %j, {row}", "  %rj = getelementptr i8, ptr %pb, i64 %jb"]
    s += ["  %xjq = getelementptr float, ptr %x, i64 %j", "  %xjs = load float, ptr %xjq, align 4"]
    s += _splat(vt, w, "xj", "%xjs")
    for v in range(nv):
        s += [f"  %wjq{v} = getelementptr i8, ptr %rj, i64 {v * w * 4}"]
        s += [f"  %wj{v} = load {vt}, ptr %wjq{v}, align 4"]
        s += [f"  %S{v} = call {vt} @llvm.fma.v{w}f32({vt} %xj, {vt} %wj{v}, {vt} %R{v})"]
    s += ["  %j1 = add i64 %j, 1", "  %jm = icmp ult i64 %j1, %k"]
    s += ["  br i1 %jm, label %kr, label %pend", "pend:"]
    s += [f"  %E{v} = phi {vt} [%C{v}, %kmid], [%S{v}, %kr]" for v in range(nv)]
    s += [f"  %bo = mul i64 %p, {row}"]
    for v in range(nv):  # the bias after the sum, as the GEMM's store adds it
        s += [f"  %bo{v} = add i64 %bo, {v * w * 4}"]
        s += [f"  %bq{v}i = add i64 %ba, %bo{v}", f"  %bq{v} = inttoptr i64 %bq{v}i to ptr"]
        s += [f"  %bv{v} = load {vt}, ptr %bq{v}, align 4", f"  %y{v} = fadd {vt} %E{v}, %bv{v}"]
        s += [f"  %oq{v}i = add i64 %oa, %bo{v}", f"  %oq{v} = inttoptr i64 %oq{v}i to ptr"]
        s += [f"  store {vt} %y{v}, ptr %oq{v}, align 4"]
    s += ["  %p1 = add i64 %p, 1", "  %pm = icmp ult i64 %p1, %r1"]
    s += ["  br i1 %pm, label %panel, label %done", "done:", "  ret void", "}"]
    return "\n".join(s)


def _mean_ir(w: int) -> str:
    """``ember_gemv_mean(x, rows, k, out)``: out[c] = float32(sum_r x[r, c] / rows), the sums
    in float64 (x: rows x k float32, C order)."""
    vf, vd = f"<{w} x float>", f"<{w} x double>"
    s = [
        "define void @ember_gemv_mean(i64 %xa, i64 %rows, i64 %k, i64 %oa) #0 {",
        "entry:",
        "  %x = inttoptr i64 %xa to ptr",
        "  %o = inttoptr i64 %oa to ptr",
        "  %rd = uitofp i64 %rows to double",
    ]
    s += _splat(vd, w, "rdv", "%rd", "double")
    s += [f"  %kv = and i64 %k, {-w}", "  %hasv = icmp ne i64 %kv, 0"]
    s += ["  br i1 %hasv, label %cv, label %tail0", "cv:"]
    s += ["  %c = phi i64 [0, %entry], [%c1, %cvend]", "  br label %rv", "rv:"]
    s += [
        "  %r = phi i64 [0, %cv], [%r1, %rv]",
        f"  %a = phi {vd} [zeroinitializer, %cv], [%a1, %rv]",
    ]
    s += [
        "  %ro = mul i64 %r, %k",
        "  %ix = add i64 %ro, %c",
        "  %xp = getelementptr float, ptr %x, i64 %ix",
    ]
    s += [f"  %xv = load {vf}, ptr %xp, align 4", f"  %xd = fpext {vf} %xv to {vd}"]
    s += [f"  %a1 = fadd {vd} %a, %xd", "  %r1 = add i64 %r, 1", "  %rm = icmp ult i64 %r1, %rows"]
    s += ["  br i1 %rm, label %rv, label %cvend", "cvend:"]
    s += [f"  %m = fdiv {vd} %a1, %rdv", f"  %mf = fptrunc {vd} %m to {vf}"]
    s += ["  %op = getelementptr float, ptr %o, i64 %c", f"  store {vf} %mf, ptr %op, align 4"]
    s += [f"  %c1 = add i64 %c, {w}", "  %cm = icmp ult i64 %c1, %kv"]
    s += ["  br i1 %cm, label %cv, label %tail0", "tail0:"]
    s += ["  %hast = icmp ult i64 %kv, %k", "  br i1 %hast, label %ct, label %done", "ct:"]
    s += ["  %t = phi i64 [%kv, %tail0], [%t1, %ctend]", "  br label %rt", "rt:"]
    s += ["  %q = phi i64 [0, %ct], [%q1, %rt]", "  %b = phi double [0.0, %ct], [%b1, %rt]"]
    s += [
        "  %qo = mul i64 %q, %k",
        "  %qx = add i64 %qo, %t",
        "  %qp = getelementptr float, ptr %x, i64 %qx",
    ]
    s += ["  %qv = load float, ptr %qp, align 4", "  %qd = fpext float %qv to double"]
    s += ["  %b1 = fadd double %b, %qd", "  %q1 = add i64 %q, 1", "  %qm = icmp ult i64 %q1, %rows"]
    s += ["  br i1 %qm, label %rt, label %ctend", "ctend:"]
    s += ["  %n = fdiv double %b1, %rd", "  %nf = fptrunc double %n to float"]
    s += ["  %np = getelementptr float, ptr %o, i64 %t", "  store float %nf, ptr %np, align 4"]
    s += ["  %t1 = add i64 %t, 1", "  %tm = icmp ult i64 %t1, %k"]
    s += ["  br i1 %tm, label %ct, label %done", "done:", "  ret void", "}"]
    return "\n".join(s)


def _run_ir() -> str:
    """``ember_gemv_run(desc, x, rows, xbuf, out, ctrl, own, panels)``: [the mean of x's rows
    into xbuf, then] the panels as tasks of one pool job (``own``, the caller's block, where
    another thread holds the pool's ``ctrl``)."""
    from ember.kernels.cpu import pool as PL

    s = [
        "declare i64 @ember_pool_run(i64, i64, i64)",
        "declare i64 @ember_pool_acquire(i64)",
        "define void @ember_gemv_run(i64 %desc, i64 %x, i64 %rows, i64 %xbuf, i64 %out,"
        " i64 %ctrl, i64 %own, i64 %np) #0 {",
        "entry:",
        "  %mean = icmp ne i64 %rows, 0",
        "  br i1 %mean, label %m, label %job",
        "m:",
        "  %d = inttoptr i64 %desc to ptr",
        f"  %kw = getelementptr i64, ptr %d, i64 {D_K}",
        "  %k = load i64, ptr %kw, align 8",
        "  call void @ember_gemv_mean(i64 %x, i64 %rows, i64 %k, i64 %xbuf)",
        "  br label %job",
        "job:",
        "  %xa = phi i64 [%x, %entry], [%xbuf, %m]",
        "  %shared = call i64 @ember_pool_acquire(i64 %ctrl)",
        "  %isown = icmp eq i64 %shared, 0",
        "  %blk = select i1 %isown, i64 %own, i64 %ctrl",
        "  %p = inttoptr i64 %blk to ptr",
    ]
    words = {PL.CHUNK: "1", PL.ROWS: "%np", PL.GROUPS: "1", PL.WI: "%desc", PL.ROWB: "0",
             PL.NB: "0", PL.LDX: "0", PL.LDD: "0", PL.LDY: "0",
             PL.GROUP0: "%fn", PL.GROUP0 + 1: "%xa", PL.GROUP0 + 2: "0", PL.GROUP0 + 3: "0",
             PL.GROUP0 + 4: "%out"}  # fmt: skip
    s += ["  %fn = ptrtoint ptr @ember_gemv_task to i64"]
    for i, (word, val) in enumerate(words.items()):
        s += [
            f"  %w{i} = getelementptr i64, ptr %p, i64 {word}",
            f"  store i64 {val}, ptr %w{i}, align 8",
        ]
    s += ["  %waited = call i64 @ember_pool_run(i64 %blk, i64 %np, i64 %shared)", "  ret void", "}"]
    return "\n".join(s)


_run = None  # ember_gemv_run (a numba ExternalFunction), bound by _build
_pool = None  # kernels.cpu.pool, bound by _build (no import on each call)


def _call_py(desc, x, rows, out, xoff, ctrl, own, np_):  # pragma: no cover - compiled
    """ember_gemv_run on these arrays: the mean (rows > 0) into out[xoff:], then the product
    into out[:panels * NR]. A numba call unboxes two arrays for ~0.4 us where ctypes took
    ~1.4 us per address and ~1.3 per call (hot; in a whole pass each cost several times that)."""
    oa = out.ctypes.data
    _run(desc, x.ctypes.data, rows, oa + 4 * xoff, oa, ctrl, own, np_)


def _build() -> dict:
    import sys

    from ember.kernels.cpu import gemm as G
    from ember.kernels.cpu import numba_or_none, pool, vecmath

    nb = numba_or_none()
    isa = G.isa()
    if nb is None or isa is None or pool.state() is None:
        return {"ok": False}
    w, nv, _ = G.ISAS[isa]
    engine = G.jit_ir([_task_ir(w, nv), _mean_ir(w), _run_ir()], ["ember_gemv_run"])
    i64 = nb.types.int64
    g = globals()
    g["_pool"] = pool
    g["_run"] = nb.types.ExternalFunction("ember_gemv_run", nb.types.void(*([i64] * 8)))
    call = nb.njit(cache=True, nogil=True)(vecmath.keyed(_call_py, sys.modules[__name__], pool))
    ctrl = pool.state()["ctrl"].ctypes.data  # the pool's block: one address for the process
    return {"ok": True, "engine": engine, "call": call, "nr": nv * w, "ctrl": ctrl}


def state() -> dict | None:
    """Compile the kernels once; None where they cannot run here (no numba, llvmlite,
    AVX2+FMA or pool; EMBER_SGEMM_ISA=none)."""
    return built_once(_STATE, _LOCK, _build)


_own = threading.local()  # a thread's own job block, for when another thread holds the pool's


def _own_block() -> int:
    blk = getattr(_own, "blk", None)
    if blk is None:
        arr = np.zeros(_pool.CTRL_WORDS, np.int64)
        blk = _own.blk = (arr, arr.ctypes.data)
    return blk[1]


class RowProduct:
    """x @ W.T + b for one row x, on the panels of a PackedWeight W (see the module doc).

    Built once per weight (the bias padded to the panels' width); each call takes x as a
    C-contiguous 1-D float32 array of K values, or, with ``rows``, of rows * K values (a
    (rows, K) matrix, C order) whose mean over the rows is x (a channels-last global average
    pool of batch 1), and returns a new (O,) float32 array.
    """

    __slots__ = ("panels", "o", "k", "bias", "desc", "addr", "call")

    def __init__(self, panels: np.ndarray, o: int, bias: np.ndarray | None) -> None:
        st = state()
        if st is None or panels.ndim != 3 or panels.shape[2] != st["nr"]:
            raise ValueError("RowProduct: no kernels here, or panels of another width")
        if panels.dtype != _F32 or not panels.flags.c_contiguous:
            raise ValueError("RowProduct: panels must be C-contiguous float32")
        p, k, nr = panels.shape
        if not 0 < o <= p * nr or k < 1 or (bias is not None and bias.shape != (o,)):
            raise ValueError(f"RowProduct: {o} outputs, bias {None if bias is None else bias.shape}"
                             f" do not fit panels {panels.shape}")  # fmt: skip
        self.panels, self.o, self.k = panels, o, k
        self.bias = np.zeros(p * nr, _F32)
        if bias is not None:
            self.bias[:o] = bias
        self.desc = np.zeros(D_WORDS, np.int64)
        self.desc[D_PANELS], self.desc[D_K], self.desc[D_BIAS] = (
            panels.ctypes.data, k, self.bias.ctypes.data)  # fmt: skip
        self.addr, self.call = self.desc.ctypes.data, st["call"]

    def __deepcopy__(self, memo) -> RowProduct:
        """A copy on copied panels (the descriptor holds addresses: never share it)."""
        import copy

        b = self.bias[: self.o].copy()
        return RowProduct(copy.deepcopy(self.panels, memo), self.o, b)

    def __call__(self, x: np.ndarray, rows: int = 0) -> np.ndarray:
        """The (O,) product of x (K floats; or rows x K whose row mean is x)."""
        n = self.k * rows if rows > 0 else self.k
        if x.dtype != _F32 or x.ndim != 1 or x.size != n or not x.flags.c_contiguous or rows < 0:
            raise ValueError(f"RowProduct: x must be {n} contiguous float32 values")
        pad = self.bias.size
        out = np.empty(pad + self.k if rows else pad, _F32)  # [the mean after the product's]
        _pool.ctrl()  # the workers started for the thread count
        self.call(self.addr, x, rows, out, pad, _STATE["ctrl"], _own_block(), self.panels.shape[0])
        return out[: self.o]
