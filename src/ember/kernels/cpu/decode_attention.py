"""Attention of a few new queries over the KV cache (decode steps) in LLVM IR, on ember's pool.

The ``cached_attention`` op's kernel takes this path when a step has fewer than
``cached_attention.BLOCKED_MIN_QUERIES`` queries, a cache, no padding and no soft-capping, a
head size that is a multiple of the vector width and at most ``MAX_REP`` query heads per key
head. One *item* is one query row of one key/value head: its ``rep`` query heads are held in
vector registers (scaled), each key is loaded once for all of them (``rep`` dot products, a
fixed tree per lane group), the scores of each head go through vecmath's
``ember_softmax_row`` (exp over whole vectors), and each value row is loaded once and added into
``rep`` accumulators. Items run on ``kernels.cpu.pool`` (a batch of 8 rows of a 3-key-head
model: 24 items): the caller never waits for a thread that is not there.

Each item's float operations are the same whatever the batch, so a batched step's row is
bitwise that row alone. The numba kernel of ``cached_attention`` stays the fallback (and the
path for padding, soft-capping and other head shapes).

The same kernel is ``scaled_dot_product_attention``'s for one query per head over fixed,
contiguous keys and values (a decoder's cross-attention to the encoder's output), without a
store: ``sdpa_one_query`` below.
"""

from __future__ import annotations

import threading

import numpy as np

from ember.kernels.cpu import have_numba
from ember.kernels.registry import register

MAX_REP = 8  # query heads per key/value head held in registers
SCRATCH_KEYS = 256  # the scores scratch grows by this many keys at a time
# descriptor words (int64) the kernels read
(D_Q, D_QSB, D_QST, D_QSH, D_OUT, D_KC, D_VC, D_ROWS, D_PAST, D_HK, D_MAXLEN, D_NT, D_WINDOW,
 D_SCALE, D_SCR, D_NCAP) = range(16)  # fmt: skip
D_WORDS = 16

_STATE: dict = {}
_LOCK = threading.Lock()


def _kernel_ir(w: int, d: int, rep: int) -> str:
    """``ember_dattn_{d}_{rep}``: items [r0, r1) of a step (the pool's 12-argument signature:
    the descriptor's address first, the item range 4th and 5th, the rest unused)."""
    vt = f"<{w} x float>"
    nv = d // w
    name = f"ember_dattn_{d}_{rep}"
    s = [
        f"define void @{name}(i64 %desc, i64 %u1, i64 %u2, i64 %r0, i64 %r1, i64 %u5, i64 %u6,"
        " i64 %u7, i64 %u8, i64 %u9, i64 %u10, i64 %u11) #0 {",
        "entry:",
        "  %dp = inttoptr i64 %desc to ptr",
    ]
    words = {"q": D_Q, "qsb": D_QSB, "qst": D_QST, "qsh": D_QSH, "out": D_OUT, "kc": D_KC,
             "vc": D_VC, "rows": D_ROWS, "past": D_PAST, "hk": D_HK, "maxlen": D_MAXLEN,
             "nt": D_NT, "win": D_WINDOW, "scb": D_SCALE, "scr": D_SCR, "ncap": D_NCAP}  # fmt: skip
    for k, i in words.items():
        s += [f"  %{k}.p = getelementptr i64, ptr %dp, i64 {i}", f"  %{k} = load i64, ptr %{k}.p"]
    s += [
        "  %sc32 = trunc i64 %scb to i32",
        "  %scale = bitcast i32 %sc32 to float",
        f"  %scv.i = insertelement {vt} poison, float %scale, i32 0",
        f"  %scv = shufflevector {vt} %scv.i, {vt} poison, <{w} x i32> zeroinitializer",
        "  %hknt = mul i64 %hk, %nt",
        "  %hq = mul i64 %hk, " + str(rep),
        "  %any = icmp ult i64 %r0, %r1",
        "  br i1 %any, label %item, label %done",
        "item:",
        "  %it = phi i64 [%r0, %entry], [%it1, %stored]",
        "  %b = udiv i64 %it, %hknt",
        "  %rem = urem i64 %it, %hknt",
        "  %g = udiv i64 %rem, %nt",
        "  %i = urem i64 %rem, %nt",
        "  %rowsp = inttoptr i64 %rows to ptr",
        "  %cp = getelementptr i64, ptr %rowsp, i64 %b",
        "  %c = load i64, ptr %cp",
        "  %pastp = inttoptr i64 %past to ptr",
        "  %pp = getelementptr i64, ptr %pastp, i64 %b",
        "  %pb = load i64, ptr %pp",
        "  %qpos = add i64 %pb, %i",
        "  %hi = add i64 %qpos, 1",
        "  %haswin = icmp sgt i64 %win, 0",
        "  %lo0 = sub i64 %hi, %win",
        "  %lo1 = call i64 @llvm.smax.i64(i64 %lo0, i64 0)",
        "  %lo = select i1 %haswin, i64 %lo1, i64 0",
        "  %n = sub i64 %hi, %lo",
        # cache rows of this key head: ((c * hk + g) * maxlen + lo) * d floats
        "  %cg0 = mul i64 %c, %hk",
        "  %cg = add i64 %cg0, %g",
        "  %cgl = mul i64 %cg, %maxlen",
        "  %cgo = add i64 %cgl, %lo",
        f"  %koff = mul i64 %cgo, {d}",
        "  %kcp = inttoptr i64 %kc to ptr",
        "  %vcp = inttoptr i64 %vc to ptr",
        "  %kb = getelementptr float, ptr %kcp, i64 %koff",
        "  %vb = getelementptr float, ptr %vcp, i64 %koff",
        # the item's scores: rep rows of ncap floats in the scratch
        f"  %sro = mul i64 %it, {rep}",
        "  %sro2 = mul i64 %sro, %ncap",
        "  %scrp = inttoptr i64 %scr to ptr",
        "  %sb = getelementptr float, ptr %scrp, i64 %sro2",
        # the query heads g * rep + r of row (b, i), scaled
        "  %qo0 = mul i64 %b, %qsb",
        "  %qo1 = mul i64 %i, %qst",
        "  %qo = add i64 %qo0, %qo1",
        "  %qp = inttoptr i64 %q to ptr",
    ]
    for r in range(rep):
        s += [
            f"  %gr{r}0 = mul i64 %g, {rep}",
            f"  %gr{r} = add i64 %gr{r}0, {r}",
            f"  %qh{r}0 = mul i64 %gr{r}, %qsh",
            f"  %qh{r} = add i64 %qo, %qh{r}0",
            f"  %qhp{r} = getelementptr float, ptr %qp, i64 %qh{r}",
        ]
        for v in range(nv):
            s += [
                f"  %qv{r}_{v}p = getelementptr float, ptr %qhp{r}, i64 {v * w}",
                f"  %qv{r}_{v}l = load {vt}, ptr %qv{r}_{v}p, align 4",
                f"  %qv{r}_{v} = fmul {vt} %qv{r}_{v}l, %scv",
            ]
    # scores: s[r][j] = dot(q_r, k_j), keys lo..hi
    s += ["  br label %sl", "sl:", "  %j = phi i64 [0, %item], [%j1, %sl]"]
    s += [f"  %ko = mul i64 %j, {d}", "  %kj = getelementptr float, ptr %kb, i64 %ko"]
    for v in range(nv):
        s += [
            f"  %k{v}p = getelementptr float, ptr %kj, i64 {v * w}",
            f"  %k{v} = load {vt}, ptr %k{v}p, align 4",
        ]
    for r in range(rep):
        acc = f"%m{r}_0"
        s += [f"  %m{r}_0 = fmul {vt} %qv{r}_0, %k0"]
        for v in range(1, nv):
            s += [
                f"  %m{r}_{v} = call {vt} @llvm.fma.v{w}f32({vt} %qv{r}_{v}, {vt} %k{v},"
                f" {vt} {acc})"
            ]
            acc = f"%m{r}_{v}"
        s += [
            f"  %dot{r} = call reassoc float @llvm.vector.reduce.fadd.v{w}f32(float 0.0, {vt} {acc})",
            f"  %so{r}0 = mul i64 %ncap, {r}",
            f"  %so{r} = add i64 %so{r}0, %j",
            f"  %sp{r} = getelementptr float, ptr %sb, i64 %so{r}",
            f"  store float %dot{r}, ptr %sp{r}, align 4",
        ]
    s += [
        "  %j1 = add i64 %j, 1",
        "  %jm = icmp ult i64 %j1, %n",
        "  br i1 %jm, label %sl, label %sm",
    ]
    # softmax of each head's scores (exp, in place), the sums
    s += ["sm:"]
    for r in range(rep):
        s += [
            f"  %row{r}o = mul i64 %ncap, {r}",
            f"  %row{r} = getelementptr float, ptr %sb, i64 %row{r}o",
            f"  %row{r}i = ptrtoint ptr %row{r} to i64",
            f"  %tot{r} = call float @ember_softmax_row(i64 %row{r}i, i64 %n, float 1.0)",
            f"  %inv{r} = fdiv float 1.0, %tot{r}",
        ]
    # values: o_r += p_rj * v_j
    s += ["  br label %vl", "vl:", "  %jv = phi i64 [0, %sm], [%jv1, %vl]"]
    for r in range(rep):
        for v in range(nv):
            s += [f"  %o{r}_{v} = phi {vt} [zeroinitializer, %sm], [%on{r}_{v}, %vl]"]
    s += [f"  %vo = mul i64 %jv, {d}", "  %vj = getelementptr float, ptr %vb, i64 %vo"]
    for v in range(nv):
        s += [
            f"  %v{v}p = getelementptr float, ptr %vj, i64 {v * w}",
            f"  %v{v} = load {vt}, ptr %v{v}p, align 4",
        ]
    for r in range(rep):
        s += [
            f"  %pr{r}o = add i64 %row{r}o, %jv",
            f"  %pr{r}p = getelementptr float, ptr %sb, i64 %pr{r}o",
            f"  %pr{r} = load float, ptr %pr{r}p, align 4",
            f"  %pb{r}i = insertelement {vt} poison, float %pr{r}, i32 0",
            f"  %pb{r} = shufflevector {vt} %pb{r}i, {vt} poison, <{w} x i32> zeroinitializer",
        ]
        for v in range(nv):
            s += [
                f"  %on{r}_{v} = call {vt} @llvm.fma.v{w}f32({vt} %pb{r}, {vt} %v{v},"
                f" {vt} %o{r}_{v})"
            ]
    s += ["  %jv1 = add i64 %jv, 1", "  %jvm = icmp ult i64 %jv1, %n"]
    s += ["  br i1 %jvm, label %vl, label %st", "st:"]
    # out[b, i, (g * rep + r) * d ...] = o_r / tot_r
    s += [
        "  %ob0 = mul i64 %b, %nt",
        "  %ob1 = add i64 %ob0, %i",
        "  %ob2 = mul i64 %ob1, %hq",
        "  %outp = inttoptr i64 %out to ptr",
    ]
    for r in range(rep):
        s += [
            f"  %iv{r}i = insertelement {vt} poison, float %inv{r}, i32 0",
            f"  %iv{r} = shufflevector {vt} %iv{r}i, {vt} poison, <{w} x i32> zeroinitializer",
            f"  %oh{r}0 = add i64 %ob2, %gr{r}",
            f"  %oh{r} = mul i64 %oh{r}0, {d}",
            f"  %ohp{r} = getelementptr float, ptr %outp, i64 %oh{r}",
        ]
        for v in range(nv):
            s += [
                f"  %of{r}_{v} = fmul {vt} %on{r}_{v}, %iv{r}",
                f"  %op{r}_{v} = getelementptr float, ptr %ohp{r}, i64 {v * w}",
                f"  store {vt} %of{r}_{v}, ptr %op{r}_{v}, align 4",
            ]
    s += [
        "  br label %stored",
        "stored:",
        "  %it1 = add i64 %it, 1",
        "  %more = icmp ult i64 %it1, %r1",
        "  br i1 %more, label %item, label %done",
        "done:",
        "  ret void",
        "}",
    ]
    return "\n".join(s)


def _compiled(d: int, rep: int) -> int | None:
    """The address of the kernel for head size d and rep query heads per key head, compiled on
    first use; None where it cannot run here."""
    key = (d, rep)
    if key in _STATE:
        return _STATE[key]
    with _LOCK:
        if key not in _STATE:
            _STATE[key] = _build(d, rep)
    return _STATE[key]


def _build(d: int, rep: int) -> int | None:
    from ember.kernels.cpu import gemm as G
    from ember.kernels.cpu import pool, vecmath

    isa = G.isa()
    if isa is None or pool.state() is None or vecmath.symbols() is None:
        return None
    w = G.ISAS[isa][0]
    if d % w or not 1 <= rep <= MAX_REP:
        return None
    decls = [
        "declare float @ember_softmax_row(i64, i64, float)",
        "declare i64 @llvm.smax.i64(i64, i64)",
    ]
    name = f"ember_dattn_{d}_{rep}"
    engine = G.jit_ir([*decls, _kernel_ir(w, d, rep)], [name])
    _STATE.setdefault("engines", []).append(engine)  # the engine owns the machine code
    return engine.get_function_address(name)


def applies(q, kc, pad, softcap) -> bool:
    """Whether a step takes this kernel (see the module docstring)."""
    nb, nt, hq, d = q.shape
    hk = kc.shape[1]
    return (
        pad is None and not softcap and q.dtype == np.float32 and hq % hk == 0
        and q.strides[3] == 4 and all(x % 4 == 0 for x in q.strides)
        and _compiled(d, hq // hk) is not None
    )  # fmt: skip


def _descriptor(q, out, kc, vc, rows, past, window: int, scale: float, scratch) -> np.ndarray:
    """The kernels' descriptor of a step (addresses and sizes; the arrays must outlive it)."""
    desc = np.empty(D_WORDS, np.int64)
    st = q.strides
    desc[D_Q], desc[D_QSB], desc[D_QST], desc[D_QSH] = (
        q.ctypes.data,
        st[0] // 4,
        st[1] // 4,
        st[2] // 4,
    )
    desc[D_OUT], desc[D_KC], desc[D_VC] = out.ctypes.data, kc.ctypes.data, vc.ctypes.data
    desc[D_ROWS], desc[D_PAST] = rows.ctypes.data, past.ctypes.data
    desc[D_HK], desc[D_MAXLEN], desc[D_NT], desc[D_WINDOW] = (
        kc.shape[1],
        kc.shape[2],
        q.shape[1],
        window,
    )
    desc[D_SCALE] = int(np.float32(scale).view(np.int32))
    desc[D_SCR], desc[D_NCAP] = scratch.ctypes.data, scratch.shape[1]
    return desc


def attend(q, kc, vc, rows, past, n_keys: int, window: int, scale: float) -> np.ndarray:
    """(B, T, Hq * D) attention of q (B, T, Hq, D) over the cache (the new keys already stored);
    rows, past: (B,) int64 arrays; ``applies`` said yes."""
    from ember.kernels.cpu import pool
    from ember.kernels.cpu.workspace import local

    nb, nt, hq, d = q.shape
    hk = kc.shape[1]
    rep = hq // hk
    out = np.empty((nb, nt, hq * d), np.float32)
    items = nb * hk * nt
    ncap = -(-n_keys // SCRATCH_KEYS) * SCRATCH_KEYS
    scratch = local()("decode_attention", (items * rep, ncap))
    desc = _descriptor(q, out, kc, vc, rows, past, window, scale, scratch)
    pool.run_items(_compiled(d, rep), desc.ctypes.data, items)
    return out


def bind(q, k, v, kc, vc, rows, past, window: int, scale: float, out):
    """A captured step's attention (ember.nn.graph): a no-argument function that stores k, v
    at the positions ``past`` holds when it is called and attends into out, on these arrays.
    k, v None: nothing is stored (keys and values fixed, e.g. cross-attention)."""
    from ember.errors import ShapeError
    from ember.kernels.cpu import jit, pool

    nb, nt, hq, d = q.shape
    hk, max_len = kc.shape[1], kc.shape[2]
    rep = hq // hk
    items = nb * hk * nt
    scratch = np.empty((items * rep, max_len), np.float32)  # room for every key the cache holds
    desc = _descriptor(q, out, kc, vc, rows, past, window, scale, scratch)
    fn, addr = _compiled(d, rep), desc.ctypes.data
    store = _STATE.get("store")
    if store is None:
        store = _STATE["store"] = jit(_store_py)

    def run() -> None:
        end = int(past.max()) + nt
        if end > max_len or past.min() < 0:
            raise ShapeError(
                f"KV cache overflow: {end} positions needed, the cache holds {max_len}"
            )
        if k is not None:
            store(kc, vc, k, v, past, rows)
        pool.run_items(fn, addr, items)

    run.keep = (scratch, desc)  # alive as long as the function
    return run


def _store_py(kc, vc, k, v, past, rows):  # pragma: no cover - compiled
    """k, v (B, T, Hk, D) into cache rows rows[b] at past[b].. (bounds checked by the caller)."""
    nb_, nt, hk, d = k.shape
    for b in range(nb_):
        c, p = rows[b], past[b]
        for h in range(hk):
            for t in range(nt):
                for e in range(d):
                    kc[c, h, p + t, e] = k[b, t, h, e]
                    vc[c, h, p + t, e] = v[b, t, h, e]


# ------------------------------------------------------------------ scaled_dot_product_attention
# One query per (batch row, head) over fixed keys: a decoder's cross-attention step. The kernel
# computes it as the causal attention of a query at the last position of a "cache" holding
# exactly these keys (so it sees them all); each item is one (batch row, key head) with its
# query heads in registers. (More queries go to kernels.cpu.attention's blocked kernel.)


def _sdpa_one_query(q, k, v, *m, scale, causal, rep, dropout_p) -> bool:
    if m or causal or dropout_p or q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        return False
    b, h, lq, d = q.shape
    if lq != 1 or k.shape[0] != b or k.shape[1] * rep != h or k.shape[3] != d:
        return False
    if v.shape != k.shape or k.shape[2] < 1 or not (k.flags.c_contiguous and v.flags.c_contiguous):
        return False
    return applies(q.transpose(0, 2, 1, 3), k, None, None)


def _one_query_args(q, k, b: int):
    """q as token-major (B, 1, H, D), each batch row's cache row, and its position."""
    rows = np.arange(b, dtype=np.int64)
    past = np.full(b, k.shape[2] - 1, np.int64)  # the last position: every key is seen
    return q.transpose(0, 2, 1, 3), rows, past


def sdpa_one_query_reference(q, k, v, *m, scale, causal, rep, dropout_p) -> np.ndarray:
    """One query per head against all keys (B, H, 1, D), in numpy."""
    b, h, lq, d = q.shape
    qg = q.reshape(b, h // rep, rep, lq, d).astype(np.float64)
    s = np.matmul(qg, k[:, :, None].swapaxes(-1, -2).astype(np.float64)) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.matmul(p, v[:, :, None].astype(np.float64)).reshape(b, h, lq, d).astype(np.float32)


def _prepare_one_query(out, q, k, v, *m, scale, causal, rep, dropout_p):
    """A captured step's cross-attention: ``decode_attention.bind`` on these arrays, writing
    into out (B, H, 1, D), whose (B, 1, H, D) view must be C-contiguous."""
    b, h, _, d = q.shape
    ot = out.transpose(0, 2, 1, 3)
    if out.dtype != np.float32 or not ot.flags.c_contiguous:
        return None
    qt, rows, past = _one_query_args(q, k, b)
    run = bind(qt, None, None, k, v, rows, past, 0, float(scale), ot.reshape(b, 1, h * d))
    keep = run.keep
    run.keep = (*keep, rows, past)
    return run


@register(
    "scaled_dot_product_attention",
    reference=sdpa_one_query_reference,
    name="sdpa_one_query",
    dtypes=(np.float32,),
    when=_sdpa_one_query,  # decode_attention.applies: compiled for this head size here
    available=have_numba,
    prepare=_prepare_one_query,
)
def sdpa_one_query(q, k, v, *m, scale, causal, rep, dropout_p) -> np.ndarray:
    """(B, H, 1, D) attention of one query per head over every key (k, v C-contiguous (B, Hk,
    S, D)), by the decode-attention kernel on the worker pool."""
    b, h, _, d = q.shape
    qt, rows, past = _one_query_args(q, k, b)
    y = attend(qt, k, v, rows, past, k.shape[2], 0, float(scale))
    return y.reshape(b, 1, h, d).transpose(0, 2, 1, 3)
