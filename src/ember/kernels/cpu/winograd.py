"""Winograd F(4x4, 3x3) for stride-1 3x3 convolutions over NHWC, on the packed GEMM's
microkernel.

An output tile of m x m pixels is A^T [ (G g G^T) * (B^T d B) ] A, with d the (m+2) x (m+2)
input patch and g the 3 x 3 filter: per tile and channel pair, (m+2)^2 products instead of 9 m^2
(m = 4: 36 against 144). Over channels the elementwise product is, for each of the 36 positions
xi, a GEMM (tiles x C) @ (C x O) on the transformed weight U[xi] = G g G^T, packed once into the
GEMM's NR-wide panels (``pack``; ``weights`` keeps it on the PackedWeight: 4x the weight).

One task (a block of about TILE_BLOCK tiles x a group of panels) does all three steps while its
data is in cache: the input transform of its tiles into V (tiles, xi, C), the 36 products on
the microkernel into M (tiles, xi, the group's columns), and the output transform with bias,
residual and ReLU/ReLU6 into the NHWC output; only the input, U and the output go through
memory. The transforms are F(4x4)'s B^T and A^T written out (each pass reads six vectors of
channels and writes six); a loop over general coefficients kept its sums in memory and took
longer than the products. Their constants are float32: as Python floats they made numba compute
in float64, converting every value there and back (28x28x128, 1 thread: 0.52 -> 0.46 ms).
Tasks run on ember's pool (``pool_tasks.run_task``).

Schedule (``_plan``): the tiles are split into blocks of TILE_BLOCK to TILE_BLOCK + 11 (the
remainder spread over them: 49 tiles are 12 + 12 + 12 + 13, not four of 12 and one of 1 that
reads all of U for one tile), a block's rows into microkernel calls of even size (13: 7 + 6),
and the panels into groups only where there are fewer than GROUP_TASKS blocks per thread: a
task of a group redoes its tiles' input transform, which cost more than the shared reads of U
saved. ResNet-50 b1 in the network (2 threads, per node, alternating in one process):
28x28x128 0.32-0.38 ms with groups of 2 panels and blocks of 12 (the earlier plan) against
0.22-0.26 now, 56x56x64 0.31-0.37 against 0.26-0.33; the earlier code, float64 constants
included: 0.39 and 0.35-0.40 (onnxruntime: 0.46, 0.45); 1 thread, against the earlier code:
0.55-0.63 -> 0.37-0.41 and 0.69-0.77 -> 0.41-0.49 (the network: 37.8 -> 35.3 ms).
Measured and left out (28x28x128, same setting): the input transform of all tiles first as a
pool job of its own, then tasks by panel group over it (level in one run, 0.43-0.47 against
0.36-0.37 in another); blocks of 24 tiles (level); software prefetch of the next U panels (level
to 0.03 ms worse); one task per panel over all 49 tiles (0.41-0.47 against 0.28-0.31). The
14x14x256 layers at b1 (16 tiles, one block in four panel groups) took 0.41-0.52 ms against the
direct conv's 0.52-0.55, but the whole network was level (20.41 against 20.39 ms: their U, 9.4
MB each, evicts the other layers' data), so conv.WINOGRAD_MIN_TILES still keeps them direct.
Batch 8 (same setting, one run each): 56x56x64 3.4 -> 2.3 ms, 28x28x128 2.2-2.4 -> 1.7-1.95,
14x14x256 2.6 -> 2.4. V and M are tile-major, so a transform pass's six streams lie C apart (V's
row pass alone, 49 tiles: 7.4 us against 10-50 for xi-major, whose speed hung on how LLVM took
the code around it; the whole conv level or a little ahead: b8 28x28x128, 1 thread, 3.02 -> 2.94
ms).
"""

from __future__ import annotations

import numpy as np

from ember.kernels.cpu import FASTMATH, numba_or_none
from ember.kernels.cpu import gemm as G

_STATE: dict = {}
_micro = _task = (
    None  # gemm's microkernel dispatcher, bound before compiling (numba caches on globals)
)
# tiles per task (at least; see the module doc): one microkernel tile of rows; 24 left more of
# the 14x14 layers' work on one task at batch 1 (alone, 2 threads: 56x56x64 0.33 ms either way,
# 28x28x128 0.31-0.44 against 0.38, 14x14x256 0.40 against 0.55; ResNet-50 b1 22.0 / 23.9 ms
# against 23.9 / 25.4, b8 160 / 170 against 164 / 182, alternating runs of
# bench/onnx_models.py)
TILE_BLOCK = 12
# tasks per thread below which the panels are split into groups too
GROUP_TASKS = 2


def matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B^T (a x a), G (a x 3), A^T (m x a)) of F(m, 3), a = m + 2, in float64 (Toom-Cook on
    the points 0, 1, -1, 2, -2, 1/2, ... and infinity)."""
    a = m + 2
    pts = [0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0][: a - 1]
    p = np.array(pts)
    # A^T: evaluate the m output polynomials at the points (columns), infinity last
    at = np.zeros((m, a))
    for i in range(m):
        at[i, : a - 1] = p**i
    at[m - 1, a - 1] = 1.0
    # G: the filter's value at each point, scaled by 1 / prod(p_k - p_j); infinity: g[2]
    g = np.zeros((a, 3))
    for k in range(a - 1):
        den = np.prod([p[k] - p[j] for j in range(a - 1) if j != k])
        g[k] = p[k] ** np.arange(3) / den
    g[a - 1, 2] = 1.0
    # B^T: the Lagrange basis (times the same denominators) as polynomial coefficients
    bt = np.zeros((a, a))
    for k in range(a - 1):
        coef = np.array([1.0])
        for j in range(a - 1):
            if j != k:
                coef = np.convolve(coef, [-p[j], 1.0])  # increasing powers
        bt[k, : a - 1] = coef
    full = np.array([1.0])
    for j in range(a - 1):
        full = np.convolve(full, [-p[j], 1.0])
    bt[a - 1, :] = full  # the point at infinity: the node polynomial, degree a - 1
    return bt, g, at


def reference(x, w, bias, res, act: int, m: int) -> np.ndarray:
    """The Winograd conv in float64 numpy: x (N, H, W, C), w (O, C, 3, 3), pad 1 -> (N, H, W, O)."""
    bt, g, at = matrices(m)
    a = m + 2
    n, h, wd, c = x.shape
    th, tw = -(-h // m), -(-wd // m)
    xp = np.zeros((n, th * m + 2, tw * m + 2, c))
    xp[:, 1 : h + 1, 1 : wd + 1] = x
    u = np.einsum("ik,ockl,jl->ijco", g, w.astype(np.float64), g)  # (a, a, C, O)
    out = np.zeros((n, th * m, tw * m, w.shape[0]))
    for ty in range(th):
        for tx in range(tw):
            d = xp[:, ty * m : ty * m + a, tx * m : tx * m + a]  # (n, a, a, c)
            v = np.einsum("ik,nklc,jl->nijc", bt, d, bt)
            mm = np.einsum("nijc,ijco->nijo", v, u)
            out[:, ty * m : ty * m + m, tx * m : tx * m + m] = np.einsum(
                "ik,nklo,jl->nijo", at, mm, at
            )
    y = out[:, :h, :wd] + bias
    if res is not None:
        y = y + res
    if act == 1:
        y = np.maximum(y, 0)
    elif act == 2:
        y = np.clip(y, 0, 6)
    return y.astype(np.float32)


def pack(w: np.ndarray, m: int, nr: int) -> np.ndarray:
    """(O, C, 3, 3) -> U packed: (a*a, panels, C, nr), U[xi] = (G g G^T)[xi] as (C, O) panels."""
    _, g, _ = matrices(m)
    a = m + 2
    o, c = w.shape[:2]
    u = np.einsum("ik,ockl,jl->ijco", g, w.astype(np.float64), g).reshape(a * a, c, o)
    return np.stack([G.pack_weight(u[i].astype(np.float32), nr) for i in range(a * a)])


def _task_py(
    xf, u, bias, rf, of, has_res, act, n, oh, ow, o, c, hp, wp, nblocks, groups, mr, blk, grp
):  # pragma: no cover - compiled
    """One task: block blk of the nblocks blocks of tiles by group grp of the panels (input
    transform, products, output transform; see the module doc). xf: the padded NHWC input
    (N, hp, wp, C), rf/of: the residual and the output (N, oh, ow, O), all flat; u: the packed
    weight (36, panels, C, NR)."""
    nxi, panels, _, nr = u.shape
    th, tw = (oh + 3) // 4, (ow + 3) // 4
    ntiles = n * th * tw
    lo = np.float32(-np.inf if act == 0 else 0.0)
    hi = np.float32(6.0 if act == 2 else np.inf)
    ninf, pinf = np.float32(-np.inf), np.float32(np.inf)
    f2, f4, f5, f8 = np.float32(2.0), np.float32(4.0), np.float32(5.0), np.float32(8.0)
    tb = (ntiles + nblocks - 1) // nblocks
    t0, t1 = ntiles * blk // nblocks, ntiles * (blk + 1) // nblocks
    nt = t1 - t0
    j0, j1 = panels * grp // groups, panels * (grp + 1) // groups
    oc0, oc1 = j0 * nr, min(o, j1 * nr)
    ldm = (j1 - j0) * nr
    # V (tiles, xi, C) and M (tiles, xi, the group's columns) tile-major: a transform pass's
    # six streams lie C (or ldm) apart, and the products read rows 36 C apart
    vt, vx, mt, mx = nxi * c, c, nxi * ldm, ldm
    v = np.empty(nxi * tb * c, np.float32)
    tmp = np.empty(36 * c, np.float32)
    mm = np.empty(nxi * tb * ldm, np.float32)
    acc = np.empty(24 * ldm, np.float32)
    yrow = np.empty(4 * ldm, np.float32)
    rowoff = np.arange(tb) * vt
    tap0 = np.zeros(1, np.int64)
    u64 = np.uint64  # unsigned indices: no wraparound checks, the channel loops vectorise
    # input transform V = BT d BT^T, F(4x4, 3x3)'s BT written out: each pass reads 6 vectors
    # of channels and writes 6 (a loop over general coefficients kept its sums in memory)
    for t in range(t0, t1):
        b = t // (th * tw)
        r = t - b * th * tw
        y0 = (r // tw) * 4
        x0 = (r % tw) * 4
        rs = wp * c
        for l in range(6):  # columns: tmp[i, l] = sum_k BT[i, k] d[k, l]
            s0 = ((b * hp + y0) * wp + x0 + l) * c
            d0 = l * c
            for q in range(c):
                e0 = xf[u64(s0 + q)]
                e1 = xf[u64(s0 + rs + q)]
                e2 = xf[u64(s0 + 2 * rs + q)]
                e3 = xf[u64(s0 + 3 * rs + q)]
                e4 = xf[u64(s0 + 4 * rs + q)]
                e5 = xf[u64(s0 + 5 * rs + q)]
                tmp[u64(d0 + q)] = f4 * e0 - f5 * e2 + e4
                tmp[u64(d0 + 6 * c + q)] = -f4 * (e1 + e2) + e3 + e4
                tmp[u64(d0 + 12 * c + q)] = f4 * (e1 - e2) - e3 + e4
                tmp[u64(d0 + 18 * c + q)] = f2 * (e3 - e1) - e2 + e4
                tmp[u64(d0 + 24 * c + q)] = f2 * (e1 - e3) - e2 + e4
                tmp[u64(d0 + 30 * c + q)] = f4 * e1 - f5 * e3 + e5
        for i in range(6):  # rows: V[i*6 + j] = sum_l tmp[i, l] BT[j, l]
            s0 = i * 6 * c
            d0 = (t - t0) * vt + i * 6 * vx
            for q in range(c):
                e0 = tmp[u64(s0 + q)]
                e1 = tmp[u64(s0 + c + q)]
                e2 = tmp[u64(s0 + 2 * c + q)]
                e3 = tmp[u64(s0 + 3 * c + q)]
                e4 = tmp[u64(s0 + 4 * c + q)]
                e5 = tmp[u64(s0 + 5 * c + q)]
                v[u64(d0 + q)] = f4 * e0 - f5 * e2 + e4
                v[u64(d0 + vx + q)] = -f4 * (e1 + e2) + e3 + e4
                v[u64(d0 + 2 * vx + q)] = f4 * (e1 - e2) - e3 + e4
                v[u64(d0 + 3 * vx + q)] = f2 * (e3 - e1) - e2 + e4
                v[u64(d0 + 4 * vx + q)] = f2 * (e1 - e3) - e2 + e4
                v[u64(d0 + 5 * vx + q)] = f4 * e1 - f5 * e3 + e5
    # the 36 products, tiles of MR rows on the microkernel
    va, ma, ra, ta, ua = (
        v.ctypes.data,
        mm.ctypes.data,
        rowoff.ctypes.data,
        tap0.ctypes.data,
        u.ctypes.data,
    )
    ncalls = (nt + mr - 1) // mr
    for xi in range(nxi):
        for j in range(j0, j1):
            bp = ua + ((xi * panels + j) * c * nr) * 4
            nc = min(nr, o - j * nr)
            for k in range(ncalls):  # rows split evenly: 13 as 7 + 6, not 12 + 1
                p, p1 = nt * k // ncalls, nt * (k + 1) // ncalls
                cp = ma + (p * mt + xi * mx + (j - j0) * nr) * 4
                args = (va + (xi * vx) * 4, ra + p * 8, ta, 1, c, bp)
                args2 = (cp, mt, nc, bp, cp, 0, ninf, pinf, bp, 0)
                _micro(p1 - p, args + args2)
    # output transform Y = AT M AT^T (written out as above), + bias [+ res], clamp, stored
    # where it lies inside the output
    w_ = oc1 - oc0
    for t in range(t0, t1):
        b = t // (th * tw)
        r = t - b * th * tw
        y0 = (r // tw) * 4
        x0 = (r % tw) * 4
        for l in range(6):  # columns: acc[i, l] = sum_k AT[i, k] M[k*6 + l]
            s0 = (t - t0) * mt + l * mx
            d0 = l * ldm
            for q in range(w_):
                e0 = mm[u64(s0 + q)]
                e1 = mm[u64(s0 + 6 * mx + q)]
                e2 = mm[u64(s0 + 12 * mx + q)]
                e3 = mm[u64(s0 + 18 * mx + q)]
                e4 = mm[u64(s0 + 24 * mx + q)]
                e5 = mm[u64(s0 + 30 * mx + q)]
                p12, m12 = e1 + e2, e1 - e2
                p34, m34 = e3 + e4, e3 - e4
                acc[u64(d0 + q)] = e0 + p12 + p34
                acc[u64(d0 + 6 * ldm + q)] = m12 + f2 * m34
                acc[u64(d0 + 12 * ldm + q)] = p12 + f4 * p34
                acc[u64(d0 + 18 * ldm + q)] = m12 + f8 * m34 + e5
        for i in range(4):  # rows: Y[i, j] = sum_l acc[i, l] AT[j, l] + bias
            if y0 + i >= oh:
                break
            s0 = i * 6 * ldm
            for q in range(w_):
                e0 = acc[u64(s0 + q)]
                e1 = acc[u64(s0 + ldm + q)]
                e2 = acc[u64(s0 + 2 * ldm + q)]
                e3 = acc[u64(s0 + 3 * ldm + q)]
                e4 = acc[u64(s0 + 4 * ldm + q)]
                e5 = acc[u64(s0 + 5 * ldm + q)]
                bq = bias[u64(oc0 + q)]
                p12, m12 = e1 + e2, e1 - e2
                p34, m34 = e3 + e4, e3 - e4
                yrow[u64(q)] = e0 + p12 + p34 + bq
                yrow[u64(ldm + q)] = m12 + f2 * m34 + bq
                yrow[u64(2 * ldm + q)] = p12 + f4 * p34 + bq
                yrow[u64(3 * ldm + q)] = m12 + f8 * m34 + e5 + bq
            for j in range(min(4, ow - x0)):
                o0 = ((b * oh + y0 + i) * ow + x0 + j) * o + oc0
                y0q = j * ldm
                if has_res:
                    for q in range(w_):
                        yrow[u64(y0q + q)] += rf[u64(o0 + q)]
                for q in range(w_):
                    of[u64(o0 + q)] = min(max(yrow[u64(y0q + q)], lo), hi)


def _pool_task_py(p, a1, a2, r0, r1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover
    """Tasks r0..r1-1 of the conv whose parameter block (``conv``'s) is at address p."""
    n, oh, ow, o, c = _ld(p, 7), _ld(p, 8), _ld(p, 9), _ld(p, 10), _ld(p, 11)
    hp, wp, panels, nr = _ld(p, 12), _ld(p, 13), _ld(p, 14), _ld(p, 15)
    nblocks, groups, mr = _ld(p, 16), _ld(p, 17), _ld(p, 18)
    xf = carray(_vptr(_ld(p, 0)), (n * hp * wp * c,), np.float32)
    u = carray(_vptr(_ld(p, 1)), (36, panels, c, nr), np.float32)
    bias = carray(_vptr(_ld(p, 2)), (o,), np.float32)
    rf = carray(_vptr(_ld(p, 3)), (n * oh * ow * o,), np.float32)
    of = carray(_vptr(_ld(p, 4)), (n * oh * ow * o,), np.float32)
    has_res, act = _ld(p, 5) != 0, _ld(p, 6)
    for task in range(r0, r1):  # group-major: a thread keeps to its panels' U
        blk, grp = task % nblocks, task // nblocks
        _task(xf, u, bias, rf, of, has_res, act, n, oh, ow, o, c, hp, wp, nblocks, groups, mr,
              blk, grp)  # fmt: skip


def _serial_py(
    xf, u, bias, rf, of, has_res, act, n, oh, ow, o, c, hp, wp, nblocks, groups, mr
):  # pragma: no cover - compiled
    """Every task on the calling thread."""
    for task in range(nblocks * groups):
        blk, grp = task % nblocks, task // nblocks
        _task(xf, u, bias, rf, of, has_res, act, n, oh, ow, o, c, hp, wp, nblocks, groups, mr,
              blk, grp)  # fmt: skip


_ld = _vptr = carray = None  # pool_tasks' intrinsics and numba.carray, bound by _build


def _build(nb) -> dict:
    from numba import types

    from ember.kernels.cpu import pool_tasks

    g = globals()
    mk = G.microkernel()
    if mk is None or pool_tasks.state() is None:
        return {"ok": False}
    g.update(_micro=mk[0], _ld=pool_tasks._ld, _vptr=pool_tasks._vptr, carray=nb.carray)
    opts = dict(nogil=True, cache=True, fastmath=set(FASTMATH))
    g["_task"] = nb.njit(**opts)(_task_py)
    task = nb.cfunc(types.void(*([types.int64] * 12)), nopython=True, cache=True)(_pool_task_py)
    return {
        "ok": True,
        "mr": mk[1],
        "nr": mk[2],
        "task": task,
        "serial": nb.njit(**opts)(_serial_py),
    }


def state() -> dict | None:
    """The compiled kernel once (None where numba or the microkernels are missing)."""
    if "ok" not in _STATE:
        nb = numba_or_none()
        _STATE.update(_build(nb) if nb is not None else {"ok": False})
    return _STATE if _STATE["ok"] else None


def weights(w) -> np.ndarray:
    """The transformed, packed weight of a ``gemm.PackedWeight`` conv weight (O, C, 3, 3), made
    once and kept on it (remade if its panels were dropped or replaced: written in place)."""
    cached = getattr(w, "_winograd", None)
    if cached is not None and cached[0] is w.panels:
        return cached[1]
    u = pack(np.asarray(w, np.float32).view(np.ndarray), 4, state()["nr"])
    w._winograd = (w.panels, u)
    return u


def conv(x, u, bias, res, act: int, out) -> np.ndarray:
    """out (N, H, W, O) = act(conv3x3(x, pad 1) + bias [+ res]) by F(4x4, 3x3), tasks on
    ember's pool. x: (N, H, W, C) float32; u from ``pack``; bias (O,), res None or like out,
    out (N, H, W, O): contiguous float32."""
    from ember.kernels.cpu import pool_tasks
    from ember.kernels.cpu.conv import _padded
    from ember.threads import get_num_threads

    st = state()
    n, h, wd, c = x.shape
    o = out.shape[3]
    th, tw = -(-h // 4), -(-wd // 4)
    ntiles = n * th * tw
    xp = _padded(x, 1, th * 4 + 1 - h, 1, tw * 4 + 1 - wd)
    panels = u.shape[1]
    threads = get_num_threads()
    nblocks, groups = _plan(ntiles, panels, threads)
    r = out if res is None else res
    if threads == 1:
        st["serial"](xp.reshape(-1), u, bias, r.reshape(-1), out.reshape(-1), res is not None,
                     act, n, h, wd, o, c, xp.shape[1], xp.shape[2], nblocks, groups,
                     st["mr"])  # fmt: skip
    else:
        params = np.array(
            [xp.ctypes.data, u.ctypes.data, bias.ctypes.data, r.ctypes.data, out.ctypes.data,
             int(res is not None), act, n, h, wd, o, c, xp.shape[1], xp.shape[2], panels,
             u.shape[3], nblocks, groups, st["mr"]], np.int64,
        )  # fmt: skip
        pool_tasks.run_task(st["task"].address, params, nblocks * groups, 1)
    return out


def _plan(ntiles: int, panels: int, threads: int) -> tuple[int, int]:
    """(blocks of tiles, groups of panels): tasks of about TILE_BLOCK tiles (the remainder
    spread over them), split by panels too only where there are too few blocks."""
    nblocks = max(1, ntiles // TILE_BLOCK)
    return nblocks, min(panels, -(-GROUP_TASKS * threads // nblocks)) if threads > 1 else 1
