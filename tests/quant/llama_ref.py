"""Line-by-line scalar transliteration of llama.cpp's quantize_row_q4_K_ref / q6_K_ref.

Slow (pure Python on np.float32 scalars, IEEE float32 with no FMA contraction), used on a few
super-blocks to check ember's vectorized encoders byte for byte.
"""

from __future__ import annotations

import numpy as np

F = np.float32
EPS = F(1e-15)


def nearest_int(v: np.float32) -> int:
    return int(np.rint(F(v)))


def f16r(v: np.float32) -> np.float32:
    return F(np.float16(v))


def make_qkx2_quants(n, nmax, x, weights, rmin, rdelta, nstep):
    mn = x[0]
    mx = x[0]
    sum_w = weights[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < mn:
            mn = x[i]
        if x[i] > mx:
            mx = x[i]
        w = weights[i]
        sum_w += w
        sum_x += w * x[i]
    if mn > 0:
        mn = F(0)
    if mx == mn:
        return [0] * n, F(0), -mn
    iscale = F(nmax) / (mx - mn)
    scale = F(1) / iscale
    best_error = F(0)
    L = [0] * n
    for i in range(n):
        L[i] = max(0, min(nmax, nearest_int(iscale * (x[i] - mn))))
        diff = scale * F(L[i]) + mn - x[i]
        best_error += weights[i] * (diff * diff)
    for step in range(nstep + 1):
        iscale = (F(rmin) + F(rdelta) * F(step) + F(nmax)) / (mx - mn)
        laux = [0] * n
        sum_l = sum_l2 = sum_xl = F(0)
        for i in range(n):
            lv = max(0, min(nmax, nearest_int(iscale * (x[i] - mn))))
            laux[i] = lv
            w = weights[i]
            sum_l += w * F(lv)
            sum_l2 += w * F(lv) * F(lv)
            sum_xl += w * F(lv) * x[i]
        big_d = sum_w * sum_l2 - sum_l * sum_l
        if big_d > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / big_d
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / big_d
            if this_min > 0:
                this_min = F(0)
                this_scale = sum_xl / sum_l2
            cur_error = F(0)
            for i in range(n):
                diff = this_scale * F(laux[i]) + this_min - x[i]
                cur_error += weights[i] * (diff * diff)
            if cur_error < best_error:
                L = laux
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return L, scale, -mn


def quantize_q4_k_block(x: np.ndarray) -> bytes:
    x = [F(v) for v in x]
    L = [0] * 256
    scales = [F(0)] * 8
    mins = [F(0)] * 8
    max_scale = F(0)
    max_min = F(0)
    for j in range(8):
        xs = x[32 * j : 32 * j + 32]
        sum_x2 = F(0)
        for v in xs:
            sum_x2 += v * v
        av_x = np.sqrt(sum_x2 / F(32))
        weights = [av_x + abs(v) for v in xs]
        lj, scales[j], mins[j] = make_qkx2_quants(32, 15, xs, weights, -1.0, 0.1, 20)
        L[32 * j : 32 * j + 32] = lj
        if scales[j] > max_scale:
            max_scale = scales[j]
        if mins[j] > max_min:
            max_min = mins[j]
    inv_scale = F(63) / max_scale if max_scale > 0 else F(0)
    inv_min = F(63) / max_min if max_min > 0 else F(0)
    sc = [0] * 12
    for j in range(8):
        ls = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)
        lm = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
        if j < 4:
            sc[j] = ls
            sc[j + 4] = lm
        else:
            sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
            sc[j - 4] |= (ls >> 4) << 6
            sc[j] |= (lm >> 4) << 6
    d = f16r(max_scale / F(63))
    dmin = f16r(max_min / F(63))
    for j in range(8):
        if j < 4:
            s, m = sc[j] & 63, sc[j + 4] & 63
        else:
            s = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4)
            m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)
        dd = d * F(s)
        if dd == 0:
            continue
        dm = dmin * F(m)
        for ii in range(32):
            L[32 * j + ii] = max(0, min(15, nearest_int((x[32 * j + ii] + dm) / dd)))
    qs = []
    for j in range(0, 256, 64):
        qs += [L[j + i] | (L[j + i + 32] << 4) for i in range(32)]
    head = np.array([d, dmin], np.float16).tobytes()
    return head + bytes(sc) + bytes(qs)


def make_qx_quants_rmse1(n, nmax, x):
    mx = F(0)
    amax = F(0)
    for v in x:
        if abs(v) > amax:
            amax = abs(v)
            mx = v
    if amax < EPS:
        return [0] * n, F(0)
    iscale = F(-nmax) / mx
    L = [0] * n
    sumlx = suml2 = F(0)
    for i in range(n):
        lv = max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
        L[i] = lv + nmax
        w = x[i] * x[i]
        sumlx += w * x[i] * F(lv)
        suml2 += w * F(lv) * F(lv)
    scale = sumlx / suml2 if suml2 else F(0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(F(nmax) + F(0.1) * F(step)) / mx
        sumlx = suml2 = F(0)
        for i in range(n):
            lv = max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
            w = x[i] * x[i]
            sumlx += w * x[i] * F(lv)
            suml2 += w * F(lv) * F(lv)
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[i] = nmax + max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
            scale = sumlx / suml2
            best = scale * sumlx
    return L, scale


def quantize_q6_k_block(x: np.ndarray) -> bytes:
    x = [F(v) for v in x]
    L = [0] * 256
    scales = [F(0)] * 16
    max_scale = F(0)
    max_abs_scale = F(0)
    for ib in range(16):
        lb, scales[ib] = make_qx_quants_rmse1(16, 32, x[16 * ib : 16 * ib + 16])
        L[16 * ib : 16 * ib + 16] = lb
        if abs(scales[ib]) > max_abs_scale:
            max_abs_scale = abs(scales[ib])
            max_scale = scales[ib]
    if max_abs_scale < EPS:
        return bytes(210)
    iscale = F(-128) / max_scale
    d = f16r(F(1) / iscale)
    sc = [min(127, nearest_int(iscale * s)) for s in scales]
    for j in range(16):
        dd = d * F(sc[j])
        if dd == 0:
            continue
        for ii in range(16):
            L[16 * j + ii] = max(-32, min(31, nearest_int(x[16 * j + ii] / dd))) + 32
    ql = [0] * 128
    qh = [0] * 64
    for h, j in enumerate(range(0, 256, 128)):
        for i in range(32):
            q1, q2, q3, q4 = (L[j + i + 32 * s] for s in range(4))
            ql[64 * h + i] = (q1 & 0xF) | ((q3 & 0xF) << 4)
            ql[64 * h + i + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4)
            qh[32 * h + i] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)
    return bytes(ql) + bytes(qh) + np.array(sc, np.int8).tobytes() + np.float16(d).tobytes()
