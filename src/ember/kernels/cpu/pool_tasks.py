"""Kernels as tasks on ember's worker pool: a late thread never holds a layer up.

The packed GEMM's products (``gemm.gemm``), the NHWC depthwise convolution and the pass after a
fused conv's GEMM (hard swish/SiLU, scale and shift: ``conv.post``) ran as numba ``prange``
regions, one task per thread. A region ends at OpenMP's barrier, so when another process holds
a core the caller waits for the preempted thread: on the shared 2-core machine the ONNX benches
run on, a MobileNetV2 or PP-OCR pass took as long at 2 threads as at 1 (onnxruntime: 1.9x
faster at 2). Here the work is cut into tasks that ``kernels.cpu.pool`` hands out by work
claiming: the caller takes tasks from the front, workers that are awake from the back, and a
worker that was asleep or preempted simply finds fewer left (see pool's docstring for its
waiting and solo rules). All three run on the one pool: a second pool of spinning threads
(numba's) beside it would take the cores its workers need.

A task function is a numba ``cfunc`` with the pool's chunk-function signature; the operands
reach it as one int64 parameter block (addresses and sizes), arrays rebuilt with ``carray``.
The GEMM's task is ``gemm._driver_py``'s loop body for ``ROWS`` output pixels times a group of
panels; the depthwise and post tasks run rows of ``dwconv._rows`` (the vector kernels) /
``conv._post_rows``.
"""

from __future__ import annotations

import numpy as np

from ember.kernels.cpu import gemm as G

# the parameter block's words
(P_A, P_ROWOFF, P_TAPOFF, P_KC, P_PANELS, P_BIAS, P_RES, P_HAS_RES, P_ACT, P_OUT, P_MR,
 P_TASKS_P, P_ROWS, P_KBLOCK, P_M, P_O, P_NPANELS, P_KK, P_NR, P_NT, P_WORDS) = range(21)  # fmt: skip
PANEL_MAJOR = 32  # the flag (in the has_res word): tasks ordered panel by panel
TASKS_PER_THREAD = 4  # a product is cut into at least this many tasks per thread (when it can)
# multiply-adds a GEMM task does at most (~40 us): the pool's master goes solo for a while
# after waiting ~1 ms for a worker's task, so a task must be far shorter than that; with
# ViT-B/16 b8's 1 ms tasks it went solo after most products (2 threads ran as fast as 1)
TASK_MACS = 1 << 23  # (depthwise tasks: 1/32 of it, ~8 x slower per multiply-add; post: 1/128)

_STATE: dict = {}
carray = None  # numba.carray, bound by _build
_ld = _vptr = _block = _rows_first = _run = _acquire = _dw_rows = _post_rows = _maxpool_rows = None
_run_jit = None  # _run_py compiled (for _rerun_py), bound by _build
_CHUNK = _ROWS = _GROUPS = _WI = _GROUP0 = _CTRL_WORDS = 0  # the pool's words, bound by _build


def _gemm_task_py(p, a1, a2, r0, r1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover - compiled
    """Tasks r0..r1-1 of the product whose parameter block is at address p."""
    aa, ra, ta, kc, ba = (
        _ld(p, P_A),
        _ld(p, P_ROWOFF),
        _ld(p, P_TAPOFF),
        _ld(p, P_KC),
        _ld(p, P_PANELS),
    )
    bsa, rsa, has_res, act, oa = (
        _ld(p, P_BIAS),
        _ld(p, P_RES),
        _ld(p, P_HAS_RES),
        _ld(p, P_ACT),
        _ld(p, P_OUT),
    )
    mr, tasks_p, rows, kblock = _ld(p, P_MR), _ld(p, P_TASKS_P), _ld(p, P_ROWS), _ld(p, P_KBLOCK)
    m_total, o, panels, kk, nr, nt = (
        _ld(p, P_M),
        _ld(p, P_O),
        _ld(p, P_NPANELS),
        _ld(p, P_KK),
        _ld(p, P_NR),
        _ld(p, P_NT),
    )
    g = max(1, kblock // kc)  # taps per block of K, or
    ncs = 1 if kc <= kblock else (kc + kblock - 1) // kblock  # channel slices per tap
    nkb = (nt + g - 1) // g if ncs == 1 else nt * ncs
    lo_act = np.float32(-np.inf if act == 0 else 0.0)
    hi_act = np.float32(6.0 if act == 2 else np.inf)
    last_flags = (6 if has_res & 1 else 2) | (has_res & 8)  # 8: streaming stores
    rows_first = has_res & G.ROWS_FIRST and nkb == 1 and panels > 1 and tasks_p == 1
    tasks_m = (m_total + rows - 1) // rows
    for task in range(r0, r1):
        if has_res & PANEL_MAJOR:  # a panel's row blocks one after another (conv's _gemm_plan)
            tm, tp = task % tasks_m, task // tasks_m
        else:
            tm, tp = task // tasks_p, task % tasks_p
        q0 = tm * rows
        q1 = min(m_total, q0 + rows)
        j0, j1 = panels * tp // tasks_p, panels * (tp + 1) // tasks_p
        if rows_first:  # gemm.ROWS_FIRST_BYTES
            _rows_first(q0, q1, panels, aa, ra, ta, ba, oa, bsa, rsa, o, kk, nr, nt, kc, mr,
                        last_flags, lo_act, hi_act)  # fmt: skip
        else:
            _block(q0, q1, j0, j1, aa, ra, ta, ba, oa, bsa, rsa, o, kk, nr, nt, kc, g, ncs, nkb,
                   mr, last_flags, lo_act, hi_act)  # fmt: skip


def _dw_task_py(p, a1, a2, r0, r1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover - compiled
    """Output rows r0..r1-1 of the depthwise conv whose parameter block is at address p."""
    n, h, wd, c = _ld(p, 4), _ld(p, 5), _ld(p, 6), _ld(p, 7)
    kh, kw, oh, ow = _ld(p, 8), _ld(p, 9), _ld(p, 10), _ld(p, 11)
    x = carray(_vptr(_ld(p, 0)), (n, h, wd, c), np.float32)
    w = carray(_vptr(_ld(p, 1)), (kh, kw, c), np.float32)
    b = carray(_vptr(_ld(p, 2)), (c,), np.float32)
    out = carray(_vptr(_ld(p, 3)), (n, oh, ow, c), np.float32)
    _dw_rows(x, w, b, out, _ld(p, 12), _ld(p, 13), _ld(p, 14), _ld(p, 15), _ld(p, 16), r0, r1)


def _maxpool_task_py(p, a1, a2, r0, r1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover
    """Output rows r0..r1-1 of the NHWC max pool whose parameter block is at address p."""
    n, h, wd, c, oh, ow = _ld(p, 2), _ld(p, 3), _ld(p, 4), _ld(p, 5), _ld(p, 6), _ld(p, 7)
    x = carray(_vptr(_ld(p, 0)), (n, h, wd, c), np.float32)
    out = carray(_vptr(_ld(p, 1)), (n, oh, ow, c), np.float32)
    _maxpool_rows(x, out, _ld(p, 8), _ld(p, 9), _ld(p, 10), _ld(p, 11), _ld(p, 12), _ld(p, 13),
                  r0, r1)  # fmt: skip


def _post_task_py(p, a1, a2, r0, r1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover - compiled
    """Rows r0..r1-1 of the post pass whose parameter block is at address p."""
    y = carray(_vptr(_ld(p, 0)), (_ld(p, 1), _ld(p, 2)), np.float32)
    st = carray(_vptr(_ld(p, 4)), (2,), np.float32)  # scale, shift
    _post_rows(y, _ld(p, 3), st[0], st[1], r0, r1)


def _run_py(ctrl, own, params, fn, rows, chunk):  # pragma: no cover - compiled
    """Run fn over rows in chunks on the pool (on ``own`` alone when another thread holds it)."""
    shared = _acquire(ctrl.ctypes.data)
    if shared == 0:
        ctrl = own
    ctrl[_CHUNK] = chunk
    ctrl[_ROWS] = rows
    ctrl[_GROUPS] = 1
    ctrl[_WI] = params.ctypes.data
    ctrl[_GROUP0] = fn
    return _run(ctrl.ctypes.data, (rows + chunk - 1) // chunk, shared)


def _rerun_py(ctrl, job, fn, tasks, a, out, res):  # pragma: no cover - compiled
    """rerun_gemm's call: a copy of the kept block with this call's addresses, on the pool (the
    three ``ctypes.data`` and the control block made here, not in Python: ~3 us a call)."""
    params = job.copy()
    params[P_A], params[P_OUT], params[P_RES] = a.ctypes.data, out.ctypes.data, res.ctypes.data
    return _run_jit(ctrl, np.zeros(_CTRL_WORDS, np.int64), params, fn, tasks, 1)


def _build(nb) -> dict:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    from ember.kernels.cpu import conv, pool

    @intrinsic
    def ld(typingctx, addr, index):
        """The int64 at addr + 8 * index."""
        sig = types.int64(types.int64, types.int64)

        def codegen(context, builder, signature, args):
            ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
            return builder.load(builder.gep(ptr, [args[1]]))

        return sig, codegen

    @intrinsic
    def vptr(typingctx, addr):
        """The address as a void pointer (for carray)."""

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], ir.IntType(8).as_pointer())

        return types.voidptr(types.int64), codegen

    if conv._kernels() is None:
        return {"ok": False}
    g = globals()
    i64 = types.int64
    g.update(_ld=ld, _vptr=vptr, _block=G.block_kernel(), carray=nb.carray)
    g.update(_rows_first=G._rows_first)
    from ember.kernels.cpu import dwconv

    # the depthwise rows on dwconv's vector kernels (they build wherever the GEMM's do)
    g.update(_dw_rows=dwconv.state()["rows"], _post_rows=conv._post_rows)
    g.update(_maxpool_rows=conv._maxpool_rows)
    pool.bind(g, "CHUNK", "ROWS", "GROUPS", "WI", "GROUP0")
    sig = types.void(*([i64] * 12))
    tasks = {k: nb.cfunc(sig, nopython=True, cache=True)(f) for k, f in
             (("gemm", _gemm_task_py), ("dw", _dw_task_py), ("post", _post_task_py),
              ("maxpool", _maxpool_task_py))}  # fmt: skip
    g["_CTRL_WORDS"] = pool.CTRL_WORDS
    run = nb.njit(nogil=True, cache=True)(_run_py)
    g["_run_jit"] = run
    rerun = nb.njit(nogil=True, cache=True)(_rerun_py)
    fn = {k: t.address for k, t in tasks.items()}
    return {"ok": True, "tasks": tasks, "fn": fn, "run": run, "rerun": rerun}


def state() -> dict | None:
    """Compile the task functions and the driver once; None where the pool cannot run."""
    if "ok" not in _STATE:
        _STATE["ok"] = False
        from ember.kernels.cpu import numba_or_none, pool

        nb = numba_or_none()
        if nb is not None and G.isa() is not None and pool.state() is not None:
            _STATE.update(_build(nb))
    return _STATE if _STATE["ok"] else None


def _go(kind: str, params: np.ndarray, rows: int, chunk: int) -> None:
    from ember.kernels.cpu import pool

    st = _STATE
    own = np.zeros(pool.CTRL_WORDS, np.int64)
    st["run"](pool.ctrl(), own, params, st["fn"][kind], rows, max(1, chunk))


def run_task(fn: int, params: np.ndarray, rows: int, chunk: int) -> None:
    """Rows [0, rows) in chunks of ``chunk`` on the pool, by a task function of another module
    (a cfunc with the chunk-function signature, its address ``fn``; params: its int64 block)."""
    from ember.kernels.cpu import pool

    own = np.zeros(pool.CTRL_WORDS, np.int64)
    _STATE["run"](pool.ctrl(), own, params, fn, rows, max(1, chunk))


def _chunk(rows: int, threads: int, per_row: int, most: int) -> int:
    """Rows per task: at least TASKS_PER_THREAD tasks per thread, at most `most` work each."""
    return max(1, min(-(-rows // (TASKS_PER_THREAD * threads)), most // max(per_row, 1)))


def gemm(
    a,
    rowoff,
    tapoff,
    kc,
    packed,
    bias,
    res,
    act,
    out,
    threads: int,
    rows: int | None = None,
    stream: bool = False,
    kblock: int | None = None,
) -> None:
    """gemm.gemm's product (operands checked by it) as tasks on the pool; rows: the output
    rows of a task (default CHUNK_PIXELS, rounded down to whole tiles); stream: non-temporal
    stores (gemm.STREAM_BYTES); kblock: channels per block of K (default gemm.k_block's)."""
    _go("gemm", *gemm_params(a, rowoff, tapoff, kc, packed, bias, res, act, out, threads, rows,
                              stream, kblock), 1)  # fmt: skip


def rerun_gemm(job: tuple, a: np.ndarray, out: np.ndarray, res: np.ndarray | None) -> None:
    """A kept job of gemm_params (its operand checks passed once) on new a, out and res of the
    shapes, dtype and layout it was built for: only their addresses change."""
    from ember.kernels.cpu import pool

    st = _STATE  # the kept block is copied there: another thread may run the same job
    st["rerun"](pool.ctrl(), job[0], st["fn"]["gemm"], job[1], a, out, out if res is None else res)


def gemm_params(
    a,
    rowoff,
    tapoff,
    kc,
    packed,
    bias,
    res,
    act,
    out,
    threads: int,
    rows: int | None = None,
    stream: bool = False,
    kblock: int | None = None,
) -> tuple[np.ndarray, int]:
    """The parameter block and task count of gemm's product."""
    g = G._state()
    m, o = out.shape
    panels, kk, nr = packed.shape
    mr = g["mr"]
    rows = max(mr, (G.CHUNK_PIXELS // mr) * mr) if rows is None else max(1, rows)
    tasks_m = -(-m // rows)
    want = TASKS_PER_THREAD * threads
    tasks_p = min(panels, -(-want // tasks_m)) if tasks_m < want else 1
    per_panel = min(rows, m) * kk * nr  # multiply-adds of one panel over a task's rows
    tasks_p = max(tasks_p, min(panels, -(-panels * per_panel // TASK_MACS)))
    r = out if res is None else res
    params = np.array(
        [a.ctypes.data, rowoff.ctypes.data, tapoff.ctypes.data, kc, packed.ctypes.data,
         bias.ctypes.data, r.ctypes.data, G.job_flags(res is not None, stream, m, o, kk), act,
         out.ctypes.data, mr, tasks_p, rows, kblock or G.k_block(panels, kk), m, o, panels, kk, nr,
         len(tapoff)],
        np.int64,
    )  # fmt: skip
    return params, tasks_m * tasks_p


def depthwise(x, w, bias, out, sh, sw, pt, pl, act: int, threads: int) -> None:
    """conv.depthwise_nhwc on the pool (contiguous float32 operands, checked by the caller)."""
    n, h, wd, c = x.shape
    kh, kw = w.shape[:2]
    oh, ow = out.shape[1:3]
    params = np.array([x.ctypes.data, w.ctypes.data, bias.ctypes.data, out.ctypes.data, n, h, wd,
                       c, kh, kw, oh, ow, sh, sw, pt, pl, act], np.int64)  # fmt: skip
    _go("dw", params, n * oh, _chunk(n * oh, threads, ow * c * kh * kw, TASK_MACS >> 5))


def post(y, act: int, scale: float, shift: float, threads: int) -> None:
    """conv.post on the pool (y (M, C) contiguous float32)."""
    m, c = y.shape
    st = np.array([scale, shift], np.float32)
    params = np.array([y.ctypes.data, m, c, act, st.ctypes.data], np.int64)
    _go("post", params, m, _chunk(m, threads, c, TASK_MACS >> 7))


def maxpool(x, out, kh: int, kw: int, sh: int, sw: int, pt: int, pl: int, threads: int) -> None:
    """conv.maxpool_nhwc on the pool (contiguous float32 operands, checked by the caller)."""
    n, h, wd, c = x.shape
    oh, ow = out.shape[1:3]
    params = np.array([x.ctypes.data, out.ctypes.data, n, h, wd, c, oh, ow, kh, kw, sh, sw, pt,
                       pl], np.int64)  # fmt: skip
    _go("maxpool", params, n * oh, _chunk(n * oh, threads, ow * c * kh * kw, TASK_MACS >> 5))
