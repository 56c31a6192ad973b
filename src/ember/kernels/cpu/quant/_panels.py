"""Q8_0 / Q4_0 / Q4_1 / Q6_K / Q4_K / Q5_K weights repacked in panels of 16 rows, for ``_pdot``.

In GGUF order a weight row's blocks follow each other, so an integer dot product (``_idot``)
needs, for every block and every (weight row, x row) pair, its own fp16 scale conversion,
int-to-float conversion, scale multiply and FMA, and a horizontal sum per row at the end. In
a panel the 16 rows' blocks are interleaved so that one vector lane belongs to one weight row:

* panel p holds rows ``16p .. 16p + 15`` (the last panel padded with zero rows), and within
  it, for each block b in order, the block's quants as ``Q`` groups of 64 bytes (Q = 8 for
  Q8_0, 4 for Q4_0 / Q4_1): group k holds bytes ``4k .. 4k + 3`` of each of the 16 rows'
  blocks (row i at byte ``4i`` of the group), so a 32-bit lane i of a 512-bit load is row i;
* after the quants of all the panel's blocks come their fp16 scales, 16 per block (row order),
  and for Q4_1 then the fp16 mins, 16 per block; the panel is padded to a multiple of 64 bytes
  (``panel_bytes``) so that every quant group is one aligned cache line;
* Q8_0's bytes are stored plus 128 (``q ^ 0x80``: unsigned, what ``vpdpbusd`` multiplies; the
  kernels subtract ``128 * sum(q_x)``); Q4 nibbles stay as they are (byte j: element j in the
  low nibble, element j + 16 in the high one).
* Q6_K (super-blocks of 256: ql 128 bytes, qh 64, 16 int8 scales, fp16 d) has its 192 quant
  bytes as 48 such groups (ql's 32 words, then qh's 16), then per super-block its scales as
  16 x 16 bytes (scale s of the 16 rows together: one sign extension gives them as 16 lanes),
  then the fp16 d of the 16 rows.
* Q4_K / Q5_K (super-blocks of 256: fp16 d and dmin, 12 bytes of eight packed 6-bit scales and
  mins, Q5_K's 32 bytes qh of fifth bits, 128 bytes of nibbles) have their quant bytes as groups
  too: the nibbles' 32 words (group 8g + j: word j of the 32 bytes holding sub-blocks 2g (low
  nibbles) and 2g + 1 (high)), then Q5_K's 8 words of qh; then per sub-block (= x block of 32)
  the 16 rows' 6-bit scales unpacked to bytes, then their mins (32 bytes per sub-block), then
  per super-block the 16 rows' fp16 d, then their fp16 dmin (64 bytes). 2368 bytes per panel
  and super-block for Q4_K (4.63 bits per weight against the GGUF block's 4.5), 2880 for Q5_K.

A panel is about the weight's size (plus at most 15 zero rows and 63 bytes), made once per
weight: :func:`panels_of` keeps it on the QTensor (``QTensor._packed``, keyed on its data, so a
weight whose data is replaced is packed again). The GGUF bytes stay where they are (memory
mapped files stay mapped) and serve everything else: dequantization, the transposed product,
the float-x kernels, the references.

:func:`pack` / :func:`unpack` are numba-compiled loops with numpy twins (``pack_reference``,
``unpack_reference``) that the tests compare them with.
"""

from __future__ import annotations

import numpy as np

from ember.errors import DTypeError, ShapeError

ROWS = 16  # weight rows per panel (one 32-bit lane each in a 512-bit vector)
# qtype -> (bytes per block, offset of the quants in a GGUF block, quant groups of 4 bytes per
# row and block, fp16 values per row and block: d, or d and m)
SPECS = {"Q8_0": (34, 2, 8, 1), "Q4_0": (18, 2, 4, 1), "Q4_1": (20, 4, 4, 2)}
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20, "Q6_K": 210, "Q4_K": 144, "Q5_K": 176}
BLOCK_ELEMENTS = {"Q8_0": 32, "Q4_0": 32, "Q4_1": 32, "Q6_K": 256, "Q4_K": 256, "Q5_K": 256}
# Q4_K / Q5_K: offset of the nibbles in a GGUF block, quant groups (of 64 panel bytes) per
# super-block (nibbles, then Q5_K's qh), panel bytes per super-block (quants, 256 bytes of
# scales and mins, 64 of d and dmin)
KQUANT = {"Q4_K": (16, 32, 2368), "Q5_K": (48, 40, 2880)}
_STATE: dict = {}


def panel_bytes(qtype: str, nb: int) -> int:
    """Bytes of one panel of nb blocks per row (a multiple of 64)."""
    if qtype in KQUANT:
        return KQUANT[qtype][2] * nb
    return -(-(ROWS * BLOCK_BYTES[qtype] * nb) // 64) * 64


def _shape(qtype: str, n: int, nb: int) -> tuple[int, int]:
    return -(-n // ROWS), panel_bytes(qtype, nb)


def _aligned(nbytes: int) -> np.ndarray:
    """A new uint8 array of nbytes starting on a 64-byte boundary."""
    raw = np.empty(nbytes + 64, np.uint8)
    off = -raw.ctypes.data % 64
    return raw[off : off + nbytes]


# ------------------------------------------------------------------ numpy reference
def pack_reference(w3: np.ndarray, qtype: str) -> np.ndarray:
    """(n, nb, bs) GGUF blocks -> (panels, panel_bytes) uint8, in numpy (see module doc)."""
    n, nb, bs = w3.shape
    p, pb = _shape(qtype, n, nb)
    w = np.zeros((p * ROWS, nb, bs), np.uint8)
    w[:n] = w3
    w = w.reshape(p, ROWS, nb, bs)
    if qtype in KQUANT:
        return _pack_k_reference(w, qtype, pb)
    if qtype == "Q6_K":
        q = w[..., :192].reshape(p, ROWS, nb, 48, 4).transpose(0, 2, 3, 1, 4)
        parts = [q.reshape(p, -1), w[..., 192:208].transpose(0, 2, 3, 1).reshape(p, -1)]
        parts.append(w[..., 208:210].transpose(0, 2, 1, 3).reshape(p, -1))
        out = np.zeros((p, pb), np.uint8)
        body = np.concatenate(parts, axis=1)
        out[:, : body.shape[1]] = body
        return out
    _, qoff, groups, halves = SPECS[qtype]
    q = w[..., qoff:].reshape(p, ROWS, nb, groups, 4).transpose(0, 2, 3, 1, 4)
    if qtype == "Q8_0":
        q = q ^ np.uint8(0x80)
    parts = [q.reshape(p, -1)]
    for h in range(halves):  # d, then m: (p, nb, 16 rows, 2 bytes)
        parts.append(w[..., 2 * h : 2 * h + 2].transpose(0, 2, 1, 3).reshape(p, -1))
    out = np.zeros((p, pb), np.uint8)
    body = np.concatenate(parts, axis=1)
    out[:, : body.shape[1]] = body
    return out


def unpack_reference(panels: np.ndarray, qtype: str, n: int, nb: int) -> np.ndarray:
    """The GGUF blocks (n, nb, bs) back from panels, in numpy."""
    p = panels.shape[0]
    if qtype in KQUANT:
        return _unpack_k_reference(panels, qtype, nb).reshape(p * ROWS, nb, -1)[:n]
    if qtype == "Q6_K":
        w = np.empty((p, ROWS, nb, 210), np.uint8)
        q = panels[:, : nb * 3072].reshape(p, nb, 48, ROWS, 4)
        w[..., :192] = q.transpose(0, 3, 1, 2, 4).reshape(p, ROWS, nb, 192)
        sc = panels[:, nb * 3072 : nb * 3328].reshape(p, nb, 16, ROWS)
        w[..., 192:208] = sc.transpose(0, 3, 1, 2)
        d = panels[:, nb * 3328 : nb * 3360].reshape(p, nb, ROWS, 2)
        w[..., 208:210] = d.transpose(0, 2, 1, 3)
        return w.reshape(p * ROWS, nb, 210)[:n]
    bs, qoff, groups, halves = SPECS[qtype]
    qn = nb * groups * ROWS * 4
    w = np.empty((p, ROWS, nb, bs), np.uint8)
    q = panels[:, :qn].reshape(p, nb, groups, ROWS, 4)
    if qtype == "Q8_0":
        q = q ^ np.uint8(0x80)
    w[..., qoff:] = q.transpose(0, 3, 1, 2, 4).reshape(p, ROWS, nb, groups * 4)
    for h in range(halves):
        o = qn + h * nb * ROWS * 2
        w[..., 2 * h : 2 * h + 2] = (
            panels[:, o : o + nb * ROWS * 2].reshape(p, nb, ROWS, 2).transpose(0, 2, 1, 3)
        )
    return w.reshape(p * ROWS, nb, bs)[:n]


def scales_mins_reference(s12: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit scales and mins (..., 8) uint8 of Q4_K / Q5_K's 12 packed bytes (..., 12)."""
    s = s12.astype(np.uint8)
    lo, mid, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo & 63, (hi & 15) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc, mn


def packed_scales_reference(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """The 12 packed bytes (..., 12) of eight 6-bit scales and mins (..., 8): the inverse."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    lo = (sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6)
    mid = (mn[..., :4] & 63) | ((mn[..., 4:] >> 4) << 6)
    hi = (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4)
    return np.concatenate([lo, mid, hi], axis=-1).astype(np.uint8)


def _k_groups(qtype: str) -> list[int]:
    """Q4_K / Q5_K: the GGUF block offset of each quant group's 4 bytes, in panel order."""
    qoff, groups, _ = KQUANT[qtype]
    return [qoff + 4 * k for k in range(32)] + [16 + 4 * k for k in range(groups - 32)]


def _pack_k_reference(w: np.ndarray, qtype: str, pb: int) -> np.ndarray:
    """pack_reference for Q4_K / Q5_K: w (p, 16, nb, bs)."""
    p, _, nb, _ = w.shape
    offs = np.array(_k_groups(qtype))
    idx = (offs[:, None] + np.arange(4)).reshape(-1)
    q = w[..., idx].reshape(p, ROWS, nb, len(offs), 4).transpose(0, 2, 3, 1, 4)
    sc, mn = scales_mins_reference(w[..., 4:16])  # (p, 16, nb, 8) each
    sm = np.stack([sc, mn], axis=-1).transpose(0, 2, 3, 4, 1)  # (p, nb, 8, 2, 16)
    dd = w[..., 0:4].reshape(p, ROWS, nb, 2, 2).transpose(0, 2, 3, 1, 4)  # (p, nb, 2, 16, 2)
    parts = [q.reshape(p, -1), sm.reshape(p, -1), dd.reshape(p, -1)]
    out = np.zeros((p, pb), np.uint8)
    body = np.concatenate(parts, axis=1)
    out[:, : body.shape[1]] = body
    return out


def _unpack_k_reference(panels: np.ndarray, qtype: str, nb: int) -> np.ndarray:
    """unpack_reference for Q4_K / Q5_K: (p, 16, nb, bs) GGUF blocks."""
    p = panels.shape[0]
    offs = _k_groups(qtype)
    qn = nb * len(offs) * 64
    w = np.empty((p, ROWS, nb, BLOCK_BYTES[qtype]), np.uint8)
    q = panels[:, :qn].reshape(p, nb, len(offs), ROWS, 4).transpose(0, 3, 1, 2, 4)
    for k, o in enumerate(offs):
        w[..., o : o + 4] = q[..., k, :]
    sm = panels[:, qn : qn + nb * 256].reshape(p, nb, 8, 2, ROWS).transpose(0, 4, 1, 2, 3)
    w[..., 4:16] = packed_scales_reference(sm[..., 0], sm[..., 1])
    dd = panels[:, qn + nb * 256 : qn + nb * 320].reshape(p, nb, 2, ROWS, 2)
    w[..., 0:4] = dd.transpose(0, 3, 1, 2, 4).reshape(p, ROWS, nb, 4)
    return w


# ------------------------------------------------------------------ numba loops
def _pack_py(w, out, qoff, groups, halves, flip):  # pragma: no cover - compiled
    """pack_reference's loop: w (n, nb, bs) -> out (panels, panel bytes), padding zeroed."""
    n, nb, bs = w.shape
    p_count, pb = out.shape
    qn = nb * groups * 64
    for p in prange(p_count):
        o = out[p]
        o[qn + halves * nb * 32 :] = 0
        for i in range(16):
            r = 16 * p + i
            for b in range(nb):
                for k in range(groups):
                    t = (b * groups + k) * 64 + 4 * i
                    for j in range(4):
                        o[t + j] = (w[r, b, qoff + 4 * k + j] if r < n else 0) ^ flip
                for h in range(halves):
                    t = qn + h * nb * 32 + b * 32 + 2 * i
                    o[t] = w[r, b, 2 * h] if r < n else 0
                    o[t + 1] = w[r, b, 2 * h + 1] if r < n else 0


def _unpack_py(panels, w, qoff, groups, halves, flip):  # pragma: no cover - compiled
    """unpack_reference's loop: panels -> w (n, nb, bs)."""
    n, nb, bs = w.shape
    qn = nb * groups * 64
    for r in prange(n):
        p, i = r // 16, r % 16
        o = panels[p]
        for b in range(nb):
            for k in range(groups):
                t = (b * groups + k) * 64 + 4 * i
                for j in range(4):
                    w[r, b, qoff + 4 * k + j] = o[t + j] ^ flip
            for h in range(halves):
                t = qn + h * nb * 32 + b * 32 + 2 * i
                w[r, b, 2 * h] = o[t]
                w[r, b, 2 * h + 1] = o[t + 1]


def _pack_q6k_py(w, out):  # pragma: no cover - compiled
    """pack_reference's loop for Q6_K."""
    n, nb, bs = w.shape
    p_count, pb = out.shape
    qn, sn = nb * 3072, nb * 256
    for p in prange(p_count):
        o = out[p]
        o[qn + sn + nb * 32 :] = 0
        for i in range(16):
            r = 16 * p + i
            for b in range(nb):
                for k in range(48):
                    t = (b * 48 + k) * 64 + 4 * i
                    for j in range(4):
                        o[t + j] = w[r, b, 4 * k + j] if r < n else 0
                for k in range(16):
                    o[qn + b * 256 + 16 * k + i] = w[r, b, 192 + k] if r < n else 0
                t = qn + sn + b * 32 + 2 * i
                o[t] = w[r, b, 208] if r < n else 0
                o[t + 1] = w[r, b, 209] if r < n else 0


def _unpack_q6k_py(panels, w):  # pragma: no cover - compiled
    """unpack_reference's loop for Q6_K."""
    n, nb, bs = w.shape
    qn, sn = nb * 3072, nb * 256
    for r in prange(n):
        p, i = r // 16, r % 16
        o = panels[p]
        for b in range(nb):
            for k in range(48):
                t = (b * 48 + k) * 64 + 4 * i
                for j in range(4):
                    w[r, b, 4 * k + j] = o[t + j]
            for k in range(16):
                w[r, b, 192 + k] = o[qn + b * 256 + 16 * k + i]
            t = qn + sn + b * 32 + 2 * i
            w[r, b, 208] = o[t]
            w[r, b, 209] = o[t + 1]


def _pack_k_py(w, out, offs):  # pragma: no cover - compiled
    """pack_reference's loop for Q4_K / Q5_K (offs: each quant group's offset in a block)."""
    n, nb, bs = w.shape
    p_count, pb = out.shape
    ng = offs.shape[0]
    qn = nb * ng * 64
    sn = qn + nb * 256
    for p in prange(p_count):
        o = out[p]
        o[sn + nb * 64 :] = 0
        for i in range(16):
            r = 16 * p + i
            for b in range(nb):
                for k in range(ng):
                    t = (b * ng + k) * 64 + 4 * i
                    for j in range(4):
                        o[t + j] = w[r, b, offs[k] + j] if r < n else 0
                for j in range(8):
                    sc, mn = 0, 0
                    if r < n:
                        if j < 4:
                            sc, mn = w[r, b, 4 + j] & 63, w[r, b, 8 + j] & 63
                        else:
                            sc = (w[r, b, 8 + j] & 15) | ((w[r, b, j] >> 6) << 4)
                            mn = (w[r, b, 8 + j] >> 4) | ((w[r, b, 4 + j] >> 6) << 4)
                    o[qn + b * 256 + 32 * j + i] = sc
                    o[qn + b * 256 + 32 * j + 16 + i] = mn
                for h in range(2):
                    t = sn + b * 64 + 32 * h + 2 * i
                    o[t] = w[r, b, 2 * h] if r < n else 0
                    o[t + 1] = w[r, b, 2 * h + 1] if r < n else 0


def _unpack_k_py(panels, w, offs):  # pragma: no cover - compiled
    """unpack_reference's loop for Q4_K / Q5_K."""
    n, nb, bs = w.shape
    ng = offs.shape[0]
    qn = nb * ng * 64
    sn = qn + nb * 256
    for r in prange(n):
        p, i = r // 16, r % 16
        o = panels[p]
        for b in range(nb):
            for k in range(ng):
                t = (b * ng + k) * 64 + 4 * i
                for j in range(4):
                    w[r, b, offs[k] + j] = o[t + j]
            for j in range(4):
                s0 = o[qn + b * 256 + 32 * j + i]
                m0 = o[qn + b * 256 + 32 * j + 16 + i]
                s1 = o[qn + b * 256 + 32 * (j + 4) + i]
                m1 = o[qn + b * 256 + 32 * (j + 4) + 16 + i]
                w[r, b, 4 + j] = (s0 & 63) | ((s1 >> 4) << 6)
                w[r, b, 8 + j] = (m0 & 63) | ((m1 >> 4) << 6)
                w[r, b, 12 + j] = (s1 & 15) | ((m1 & 15) << 4)
            for h in range(2):
                t = sn + b * 64 + 32 * h + 2 * i
                w[r, b, 2 * h] = o[t]
                w[r, b, 2 * h + 1] = o[t + 1]


prange = range  # numba's prange once compiled (see _compiled)


def _compiled():
    if "pack" not in _STATE:
        from ember.kernels.cpu import numba_or_none

        nb = numba_or_none()
        if nb is None:
            _STATE["pack"] = None
        else:
            globals()["prange"] = nb.prange
            opts = dict(cache=True, nogil=True, parallel=True)
            fns = (_pack_py, _unpack_py, _pack_q6k_py, _unpack_q6k_py, _pack_k_py, _unpack_k_py)
            _STATE["pack"] = tuple(nb.njit(**opts)(f) for f in fns)
    return _STATE["pack"]


def _check(w3: np.ndarray, qtype: str) -> None:
    if qtype not in BLOCK_BYTES:
        raise DTypeError(f"panels: no panel layout for {qtype}")
    if not (isinstance(w3, np.ndarray) and w3.dtype == np.uint8 and w3.ndim == 3):
        raise DTypeError("panels: the weight must be (rows, blocks, bytes) uint8 blocks")
    if w3.shape[2] != BLOCK_BYTES[qtype] or w3.shape[1] < 1:
        raise ShapeError(f"panels: {qtype} blocks are {BLOCK_BYTES[qtype]} bytes, got {w3.shape}")


def pack(w3: np.ndarray, qtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """(n, nb, bs) GGUF blocks -> (panels, panel_bytes) uint8, 64-byte aligned (into out)."""
    _check(w3, qtype)
    n, nb, _ = w3.shape
    p, pb = _shape(qtype, n, nb)
    if out is None:
        out = _aligned(p * pb).reshape(p, pb)
    elif out.shape != (p, pb) or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise ShapeError(f"panels: out must be ({p}, {pb}) uint8, got {out.shape} {out.dtype}")
    fns = _compiled()
    if fns is None:
        out[...] = pack_reference(w3, qtype)
    elif qtype in KQUANT:
        fns[4](np.ascontiguousarray(w3), out, np.array(_k_groups(qtype), np.int64))
    elif qtype == "Q6_K":
        fns[2](np.ascontiguousarray(w3), out)
    else:
        _, qoff, groups, halves = SPECS[qtype]
        flip = 0x80 if qtype == "Q8_0" else 0
        fns[0](np.ascontiguousarray(w3), out, qoff, groups, halves, flip)
    return out


def unpack(panels: np.ndarray, qtype: str, n: int, nb: int) -> np.ndarray:
    """The (n, nb, bs) GGUF blocks of panels made by :func:`pack`."""
    p, pb = _shape(qtype, n, nb)
    if panels.shape != (p, pb) or panels.dtype != np.uint8:
        raise ShapeError(f"panels: expected ({p}, {pb}) uint8 for {n} rows, got {panels.shape}")
    fns = _compiled()
    if fns is None:
        return unpack_reference(panels, qtype, n, nb)
    w = np.empty((n, nb, BLOCK_BYTES[qtype]), np.uint8)
    if qtype in KQUANT:
        fns[5](panels, w, np.array(_k_groups(qtype), np.int64))
        return w
    if qtype == "Q6_K":
        fns[3](panels, w)
        return w
    _, qoff, groups, halves = SPECS[qtype]
    fns[1](panels, w, qoff, groups, halves, 0x80 if qtype == "Q8_0" else 0)
    return w


def panels_of(qweight) -> np.ndarray:
    """The panels of a 2-d QTensor of a ``SPECS`` format, packed on first use and kept on it.

    Once packed, the pages of a memory-mapped ``data`` leave the resident set (they stay
    mapped: what reads them again faults them back in).
    """
    from ember.memory import release_file_pages

    cached = qweight._packed
    if cached is not None and cached[0] is qweight._data:
        return cached[1]
    panels = pack(qweight.blocks3d(), qweight.qtype)
    qweight._packed = (qweight._data, panels)
    release_file_pages(qweight._data)
    return panels


def stacked(qweights: list):
    """One QTensor of the rows of 2-d QTensors of one format (q/k/v, gate/up) that exists only
    as panels (``QTensor.packed_only``: the stacked GGUF bytes are made again only if asked
    for); the parts' memory-mapped pages leave the resident set."""
    from ember.memory import release_file_pages
    from ember.quant.qtensor import QTensor

    qtype, k = qweights[0].qtype, qweights[0].shape[1]
    parts = [w.blocks3d() for w in qweights]
    n = sum(r.shape[0] for r in parts)
    if all(r.shape[0] % ROWS == 0 for r in parts[:-1]):  # each part's panels in place
        p, pb = _shape(qtype, n, parts[0].shape[1])
        panels = _aligned(p * pb).reshape(p, pb)
        p0 = 0
        for r in parts:
            p1 = p0 + -(-r.shape[0] // ROWS)
            pack(r, qtype, panels[p0:p1])
            p0 = p1
    else:
        panels = pack(np.concatenate(parts), qtype)  # (the GGUF-order stack a temporary)
    for w in qweights:
        release_file_pages(w._data)
    return QTensor.packed_only(qtype, (n, k), panels)


def unpack_rows(panels: np.ndarray, qtype: str, nb: int, r0: int, r1: int) -> np.ndarray:
    """Rows [r0, r1) of a weight's panels as (r1 - r0, nb, bs) GGUF blocks (r0 a multiple of
    ROWS; r1 a multiple of it too unless it is the weight's last row)."""
    if r0 % ROWS:
        raise ShapeError(f"panels: rows from {r0}, not a multiple of {ROWS}")
    return unpack(panels[r0 // ROWS : -(-r1 // ROWS)], qtype, r1 - r0, nb)


def unpacked(qweight) -> np.ndarray:
    """The GGUF bytes (rows, row bytes) of a QTensor from its panels."""
    n, k = qweight.shape
    w3 = unpack(qweight._packed[1], qweight.qtype, n, k // BLOCK_ELEMENTS[qweight.qtype])
    return w3.reshape(n, -1)
