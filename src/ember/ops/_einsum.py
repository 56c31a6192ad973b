"""einsum and tensordot: np.einsum(optimize=True) forward, one einsum per input gradient.

Re-exported by ember.ops.linalg (``ember.einsum``, ``ember.tensordot``).
"""

from __future__ import annotations

import string
from collections import Counter

import numpy as np

from ember import dtypes as _dt
from ember.autograd import Function
from ember.errors import DTypeError, ShapeError
from ember.ops._util import wrap_dim
from ember.tensor import Tensor

_LOW = _dt.HALF_FLOATS  # float16, bfloat16 (ml_dtypes not imported to ask)


def _up(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32) if a.dtype in _LOW else a


def _same_dtype(*ts) -> None:
    dt = ts[0]._data.dtype
    for t in ts[1:]:
        if t._data.dtype != dt:
            raise DTypeError(
                f"einsum: expected operands of one dtype, got {ts[0].dtype} and {t.dtype}"
            )
    if dt == np.bool_:
        raise DTypeError("einsum: not implemented for bool tensors")


def _einsum_parse(equation: str, shapes: list) -> tuple:
    """Expand '...' and implicit output; returns (terms, rhs, label sizes, squeeze per operand)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ShapeError(
            f"einsum: {equation!r} names {len(terms)} operands but {len(shapes)} were given"
        )
    used = {c for c in eq if c.isalpha()}
    for c in eq:
        if not (c.isalpha() or c in ",.->"):
            raise ValueError(f"einsum: invalid character {c!r} in equation {equation!r}")
    free = [c for c in string.ascii_letters if c not in used]
    ell_nd = 0
    for t, s in zip(terms, shapes):
        if "..." in t:
            ell_nd = max(ell_nd, len(s) - (len(t) - 3))
    ell = "".join(free[:ell_nd])
    out_terms = []
    for i, (t, s) in enumerate(zip(terms, shapes)):
        if "..." in t:
            k = len(s) - (len(t) - 3)
            if k < 0:
                raise ShapeError(
                    f"einsum: operand {i} has {len(s)} dims, fewer than the subscripts {t!r} name"
                )
            t = t.replace("...", ell[ell_nd - k :])
        if "." in t or len(t) != len(s):
            raise ShapeError(
                f"einsum: subscripts {terms[i]!r} do not match operand {i} of shape {tuple(s)}"
            )
        out_terms.append(t)
    if arrow:
        rhs = rhs.replace("...", ell)
        if "." in rhs or len(set(rhs)) != len(rhs):
            raise ValueError(f"einsum: invalid output subscripts in {equation!r}")
    else:
        counts = Counter("".join(terms).replace(".", ""))
        rhs = ell + "".join(sorted(c for c, n in counts.items() if n == 1))
    sizes: dict = {}
    for i, (t, s) in enumerate(zip(out_terms, shapes)):
        for c, n in zip(t, s):
            old = sizes.get(c, 1)
            if n != 1 and old != 1 and n != old:
                raise ShapeError(
                    f"einsum: label {c!r} has sizes {old} and {n} (operand {i}, shape {tuple(s)})"
                )
            sizes[c] = max(old, n) if n != 1 else old if c in sizes else n
    for c in rhs:
        if c not in sizes:
            raise ValueError(
                f"einsum: output label {c!r} does not appear in the inputs of {equation!r}"
            )
    # size-1 dims facing a larger size broadcast: drop them from that operand
    final, squeeze = [], []
    for t, s in zip(out_terms, shapes):
        keep = [j for j, (c, n) in enumerate(zip(t, s)) if not (n == 1 and sizes[c] != 1)]
        final.append("".join(t[j] for j in keep))
        squeeze.append(tuple(s[j] for j in keep) if len(keep) != len(t) else None)
    return final, rhs, sizes, squeeze


def _diag_view(z: np.ndarray, term: str) -> np.ndarray:
    """A writable view of z indexed by the unique labels of term (the generalised diagonal)."""
    uniq = list(dict.fromkeys(term))
    strides = [sum(z.strides[j] for j, c in enumerate(term) if c == u) for u in uniq]
    shape = [z.shape[term.index(u)] for u in uniq]
    return np.lib.stride_tricks.as_strided(z, shape, strides)


class Einsum(Function):
    """np.einsum(optimize=True) forward; each input's gradient is one more einsum."""

    def forward(self, *xs, terms, rhs, sizes, squeeze):
        self.shapes = [x.shape for x in xs]
        lo = xs[0].dtype if xs[0].dtype in _LOW else None
        xs = [_up(x) if sq is None else _up(x).reshape(sq) for x, sq in zip(xs, squeeze)]
        self.xs, self.terms, self.rhs, self.sizes, self.lo = xs, terms, rhs, sizes, lo
        out = np.asarray(np.einsum(",".join(terms) + "->" + rhs, *xs, optimize=len(xs) > 1))
        if len(xs) == 1 and np.may_share_memory(out, xs[0]):  # 'ij->ji', 'ii->i' give views
            out = out.copy()
        return out.astype(lo) if lo is not None else out

    def meta(self, *xs, terms, rhs, sizes, squeeze):
        return tuple(sizes[c] for c in rhs), xs[0].dtype

    def backward(self, g):
        g = _up(g)
        grads = []
        for k, (x, t) in enumerate(zip(self.xs, self.terms)):
            if not self.needs_input_grad[k]:
                grads.append(None)
                continue
            others = [(self.terms[j], self.xs[j]) for j in range(len(self.xs)) if j != k]
            avail = set(self.rhs).union(*(set(o[0]) for o in others))
            uniq = "".join(dict.fromkeys(t))
            target = "".join(c for c in uniq if c in avail)
            eq = ",".join([o[0] for o in others] + [self.rhs]) + "->" + target
            gk = np.asarray(np.einsum(eq, *[o[1] for o in others], g, optimize=len(others) > 0))
            if target != uniq:  # labels summed inside this operand alone: broadcast back
                gk = gk.reshape([self.sizes[c] if c in target else 1 for c in uniq])
                gk = np.broadcast_to(gk, [self.sizes[c] for c in uniq])
            if uniq != t:  # repeated labels: write onto the diagonal
                z = np.zeros(x.shape, gk.dtype)
                _diag_view(z, t)[...] = gk
                gk = z
            grads.append(np.ascontiguousarray(gk).reshape(self.shapes[k]))
        return tuple(grads)


def einsum(equation: str, *operands) -> Tensor:
    """Einstein summation (torch.einsum), with '...' and implicit output; operands or one list."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise ShapeError("einsum: expected at least one operand")
    _same_dtype(*operands)
    terms, rhs, sizes, squeeze = _einsum_parse(equation, [o._data.shape for o in operands])
    return Einsum.apply(*operands, terms=terms, rhs=rhs, sizes=sizes, squeeze=squeeze)


def tensordot(a: Tensor, b: Tensor, dims=2) -> Tensor:
    """Contract the last ``dims`` dims of a with the first of b, or the dims listed in a pair."""
    na, nb = a.ndim, b.ndim
    if isinstance(dims, (int, np.integer)):
        if dims < 0 or dims > min(na, nb):
            raise ShapeError(
                f"tensordot: dims={dims} out of range for {a._data.shape} and {b._data.shape}"
            )
        da, db = list(range(na - dims, na)), list(range(dims))
    else:
        da, db = dims
        da = [da] if isinstance(da, (int, np.integer)) else list(da)
        db = [db] if isinstance(db, (int, np.integer)) else list(db)
        if len(da) != len(db):
            raise ShapeError(f"tensordot: both dim lists need the same length, got {da} and {db}")
        da, db = [wrap_dim(d, na) for d in da], [wrap_dim(d, nb) for d in db]
    for i, j in zip(da, db):
        if a.shape[i] != b.shape[j]:
            raise ShapeError(
                f"tensordot: contracted dims differ: {tuple(a.shape)}[{i}] vs {tuple(b.shape)}[{j}]"
            )
    letters = iter(string.ascii_letters)
    ta = [next(letters) for _ in range(na)]
    tb = [next(letters) for _ in range(nb)]
    for i, j in zip(da, db):
        tb[j] = ta[i]
    out = [c for i, c in enumerate(ta) if i not in da] + [
        c for j, c in enumerate(tb) if j not in db
    ]
    return einsum("".join(ta) + "," + "".join(tb) + "->" + "".join(out), a, b)
