"""What every quantized format's kernels share: the f16 table, the checks, the threading split.

A format module (``q4_0.py`` ...) writes three numba bodies on the packed blocks and hands them
to :class:`QuantKernels`, which compiles them on first use and runs them:

* ``mv(w, lut, x, y, chunk)``: ``y = W @ x`` for one vector (decode), ``x`` as (blocks, lanes);
* ``dq(w, lut, unit, r0, r1, out)``: rows ``[r0, r1)`` of W into a float32 tile, which BLAS
  multiplies for a prefill (M > SMALL_M).

Q8_0, Q4_0, Q4_1, Q6_K, Q4_K and Q5_K products of any size quantize x to int8 and run the LLVM
IR kernels of ``_pdot`` on a copy of the weight repacked once in panels of 16 rows
(``_panels``, kept on the QTensor): decode, batches and prefill alike. With
``EMBER_QUANT_REPACK=0``, up to ``INT_ROWS`` rows of x, Q4_0/Q4_1 (int8 x) and Q8_0 (int8 x, or
float x: "Q8_0F" under ``EMBER_QUANT_DOT=float``) run ``_idot``'s kernels on the GGUF blocks
where they lie: one pass over the weight for all rows. The other formats' small batches
(1 < M <= SMALL_M; the K-quants' too, then) run ``mv`` once per row of x: each a
bandwidth-bound pass over the packed weight. (A numba body that
decodes each block once for all M rows was 2-8x slower: with a local decoded block and local
sums LLVM kept the loops scalar.)

``w`` is always the (rows, blocks per row, bytes per block) uint8 view of the GGUF bytes
(never a copy, never the whole matrix decoded; the panels are the one copy). The loops over rows run in ``prange`` over
chunks of rows; numba gives a parallel body ``noalias`` array arguments, which is what lets
LLVM vectorize the inner loops without run-time overlap checks.

The format's numpy reference (``dequantize_reference(blocks)``, from ``ember.quant.dequant``)
sits beside its kernels; the references of the products (``linear_reference`` and the
``*_reference`` methods) decode rows of W in blocks with it and multiply with BLAS, never
holding the whole float32 weight.

numba is not imported here: the bodies call ``f16``, ``prefetch``, ``scale_min_k4`` and
``prange``, plain-Python stand-ins that :class:`qjit` swaps for the numba versions in
``_numba_helpers`` just before it compiles a body.
"""

from __future__ import annotations

import numpy as np

from ember import config
from ember.errors import DTypeError, ShapeError
from ember.kernels.cpu import have_numba, jit, numba_or_none, with_bias
from ember.kernels.cpu.quant import _idot, _panels, _pdot
from ember.quant.formats import block_format, dequantize

F32 = np.float32
U8 = np.uint8
# Formats whose small products quantize x to int8 (kernels in _idot), as llama.cpp's do. Q8_0's
# integer kernel reads the bundled model's 49152-row head 1.6x faster than its float-x one
# (1279 vs 2080 us at 1 thread, 718 vs 1105 at 2; an ad-hoc run on Zen 5), which stays for
# EMBER_QUANT_DOT=float.
INT_DOT_FORMATS = ("Q8_0", "Q4_0", "Q4_1", "Q6_K", "Q4_K", "Q5_K")  # (the K-quants: panels only)
SMALL_M = 8  # up to this many rows of x, the matrix-vector kernel runs once per row
# up to this many rows of x the _idot kernels beat decoding float32 tiles for BLAS (an ad-hoc
# 2-thread sweep of the bundled SmolLM2's products on AVX-512 VNNI: up to 128-192 rows for
# Q4_1, 32-48 for the Q8_0 head; its 17-token prompt took 134 ms through the tiles, 75 through
# the kernels; the 256-bit loop led to about 64 rows, and was level at 128)
INT_ROWS = {"wide": 128, "int": 64, "Q8_0F": 32}
PANEL_ROWS = 1 << 62  # the panel kernels (_pdot) take every product: they are a GEMM too
TILE_ELEMENTS = 1 << 20  # a single-threaded prefill tile holds about this many float32 weights
THREAD_TILE_BYTES = 1 << 19  # a tile of a multi-threaded prefill: decoded rows stay in L2
PREFILL_TILES_PER_THREAD = 4  # ... and a weight makes at least this many tiles per thread
MIN_TILE_ROWS = 32  # while its tiles keep this many rows (BLAS is as fast on them, 1-thread)
# below this much work (weight bytes times rows of x) a product runs on one thread: a decode
# row of a small weight costs less than waking a second thread, a batch of rows does not
SERIAL_MAX_BYTES = 1 << 22
DYNAMIC_MIN_BYTES = 1 << 21  # from this weight size on, row chunks are scheduled dynamically
PREFETCH_BYTES = 6144  # how far ahead of the read position the weight bytes are prefetched
REFERENCE_ROW_ELEMENTS = 1 << 20  # the references decode about this many weights at a time

# ``unit`` is an array of ones (32 lanes) that the dq_* bodies multiply by. It changes nothing,
# but without a float load in the loop LLVM's cost model keeps those store-only loops scalar
# (measured: 2.8 -> 5.3 G weights/s for Q4_0 on one core). For the same reason Q8_0 converts
# its bytes as unsigned and fixes the sign with arithmetic: an int8 cast keeps the loop scalar.
UNIT = np.ones(32, np.float32)

FORMATS: dict[str, QuantKernels] = {}  # qtype -> its kernels, filled as format modules load
_f16_lut: np.ndarray | None = None


# Stand-ins for the numba pieces the kernel bodies use (plain Python, so that importing a format
# module imports no numba): ``qjit`` rebinds them in the body's module to the compiled helpers
# of ``_numba_helpers`` (and ``prange`` to numba's) just before numba compiles the body.
prange = range


def f16(lut, lo, hi):
    """The fp16 value of the little-endian bytes (lo, hi), through the 65536-entry table."""
    return lut[int(lo) | (int(hi) << 8)]


def prefetch(arr, i, j, k):
    """Prefetch the cache line of arr[i, j, k] (a no-op outside numba)."""


def scale_min_k4(w, n, b, j):
    """Six-bit scale and min number j of a Q4_K/Q5_K block (ggml get_scale_min_k4)."""
    if j < 4:
        return int(w[n, b, 4 + j] & 63), int(w[n, b, 8 + j] & 63)
    sc = int(w[n, b, 8 + j] & 15) | (int(w[n, b, j] >> 6) << 4)
    mn = int(w[n, b, 8 + j] >> 4) | (int(w[n, b, 4 + j] >> 6) << 4)
    return sc, mn


class qjit(jit):
    """``kernels.cpu.jit`` for a quantized kernel body: binds the numba helpers first."""

    def __call__(self, *args):
        if self._compiled is None and numba_or_none() is not None:
            from ember.kernels.cpu.quant import _numba_helpers as h

            g = self.py.__globals__
            g.update(prange=numba_or_none().prange, f16=h.f16, prefetch=h.prefetch,
                     scale_min_k4=h.scale_min_k4)  # fmt: skip
        return super().__call__(*args)


_thread_fns: tuple | None = None


def _thread_count_fns() -> tuple:
    """(get, set) numba's thread count for this thread, as cheap as numba allows.

    numba's ``get_num_threads`` / ``set_num_threads`` check the threading layer and their
    argument on every call (about 1.5 us each: a decode step makes hundreds of matrix-vector
    calls, each switching to one thread and back). Once the layer is up, its C entry points
    (``numba.np.ufunc.parallel._get_num_threads`` / ``_set_num_threads``) do the same work; the
    public functions serve when a numba version lacks them.
    """
    global _thread_fns
    if _thread_fns is None:
        nb = numba_or_none()
        get, put = nb.get_num_threads, nb.set_num_threads
        try:
            from numba.np.ufunc import parallel

            parallel._launch_threads()
            cget, cput = parallel._get_num_threads, parallel._set_num_threads
            if callable(cget) and callable(cput) and cget() == get():
                get, put = cget, cput
        except (ImportError, AttributeError):  # pragma: no cover - another numba layout
            pass
        _thread_fns = (get, put)
    return _thread_fns


def f16_table() -> np.ndarray:
    """float32 value of every fp16 bit pattern (256 KiB), built on first use."""
    global _f16_lut
    if _f16_lut is None:
        _f16_lut = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    return _f16_lut


def row_blocks(n: int, k: int, elements: int = REFERENCE_ROW_ELEMENTS):
    """(r0, r1) ranges covering n rows of k elements, about ``elements`` weights each."""
    step = max(1, elements // max(k, 1))
    for r0 in range(0, n, step):
        yield r0, min(n, r0 + step)


def _real(x: np.ndarray, what: str) -> None:
    if x.dtype.kind not in "fiub":
        raise DTypeError(f"{what}: x must hold real numbers, got dtype {x.dtype}")


def _run_chunks(fn, args: tuple, n: int, nbytes: int, rows: int = 1) -> None:
    """``fn(*args, chunk)`` over chunks of a weight's n rows (nbytes) for `rows` rows of x, on
    as many threads as pays."""
    get_threads, set_threads = _thread_count_fns()
    threads = get_threads()
    if threads == 1 or nbytes * rows < SERIAL_MAX_BYTES:
        # One thread: a team of one wakes no worker (waking a second thread costs more than
        # it saves on a small weight, and on a busy machine the caller may wait a whole time
        # slice for it). The parallel kernel, not a serial copy: numba marks a parallel
        # body's arrays noalias, and LLVM vectorizes it 15% better.
        if threads > 1:
            set_threads(1)
        try:
            fn(*args, max(n, 1))
        finally:
            if threads > 1:
                set_threads(threads)
        return
    chunk = max(4, -(-n // (8 * threads)))  # about 8 row chunks per thread
    if nbytes < DYNAMIC_MIN_BYTES:
        fn(*args, chunk)
        return
    # Hand row chunks out one at a time so that a core busy with something else does not
    # hold back the whole product (static halves would wait for the slower core).
    nb = numba_or_none()
    old = nb.set_parallel_chunksize(1)
    try:
        fn(*args, chunk)
    finally:
        nb.set_parallel_chunksize(old)


class QuantKernels:
    """One block format's kernels (matrix-vector, small-batch product, row dequantization).

    The public methods check their operands (a wrong block count or byte count is a
    ShapeError, never a read out of bounds) and take any real x; ``*_reference`` are their
    numpy references, same signatures. ``linear`` is the ``linear_q`` op's kernel.
    """

    def __init__(self, qtype: str, *, mv, dq, dequantize_reference) -> None:
        fmt = block_format(qtype)
        self.qtype = fmt.name
        self.block_size = fmt.block_size
        self.type_size = fmt.type_size
        self._mv = qjit(mv, parallel=True)
        self._dq = qjit(dq, parallel=True)
        self._dq1 = qjit(dq, suffix="serial")  # prefill tiles: one thread per tile, no team
        self.dequantize_reference = dequantize_reference
        FORMATS[self.qtype] = self

    def __repr__(self) -> str:
        return f"QuantKernels({self.qtype!r})"

    # ---------------------------------------------------------------- checks
    def blocks(self, w3: np.ndarray, what: str) -> np.ndarray:
        """w3 as a C-contiguous (rows, blocks, bytes per block) uint8 array, or ShapeError."""
        if not isinstance(w3, np.ndarray) or w3.ndim != 3 or w3.shape[2] != self.type_size:
            got = getattr(w3, "shape", type(w3).__name__)
            raise ShapeError(
                f"{what}: the weight must be a (rows, blocks, {self.type_size}) view of "
                f"{self.qtype} blocks, got {got}"
            )
        if w3.dtype != U8:
            raise DTypeError(f"{what}: the {self.qtype} blocks must be uint8, got {w3.dtype}")
        return w3 if w3.flags.c_contiguous else np.ascontiguousarray(w3)

    def _x(self, w3: np.ndarray, x: np.ndarray, what: str) -> np.ndarray:
        """x (M, K) matching w3's blocks, as C-contiguous float32."""
        k = w3.shape[1] * self.block_size
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != k:
            raise ShapeError(
                f"{what}: x must be (M, {k}) for {w3.shape[1]} {self.qtype} blocks per row, "
                f"got {x.shape}"
            )
        _real(x, what)
        return np.ascontiguousarray(x, dtype=F32)

    # ---------------------------------------------------------------- checked entry points
    def matvec(self, w3: np.ndarray, x: np.ndarray) -> np.ndarray:
        """``W @ x`` for one vector x of length K: float32 of shape (N,)."""
        w3 = self.blocks(w3, f"matvec({self.qtype})")
        x = np.asarray(x)
        if x.ndim != 1:
            raise ShapeError(f"matvec({self.qtype}): x must be 1-d, got shape {x.shape}")
        x2 = self._x(w3, x[None], f"matvec({self.qtype})")
        if w3.shape[0] == 0 or x2.size == 0 or not have_numba():
            return self.matvec_reference(w3, x)
        return self.run_matvec(w3, x2[0])

    def matmul_t(self, w3: np.ndarray, x: np.ndarray) -> np.ndarray:
        """``x @ W.T`` for x of shape (M, K): float32 (M, N), by the path M calls for."""
        w3 = self.blocks(w3, f"matmul_t({self.qtype})")
        x2 = self._x(w3, x, f"matmul_t({self.qtype})")
        if w3.shape[0] == 0 or x2.size == 0 or not have_numba():
            return self.matmul_t_reference(w3, x2)
        return self.run_matmul_t(w3, x2)

    def dequantize_rows(self, w3: np.ndarray, r0: int, r1: int, out: np.ndarray | None = None):
        """Rows ``[r0, r1)`` of W as float32 (r1 - r0, K), into ``out`` when given."""
        what = f"dequantize_rows({self.qtype})"
        w3 = self.blocks(w3, what)
        n, nb, _ = w3.shape
        r0, r1 = int(r0), int(r1)
        if not 0 <= r0 <= r1 <= n:
            raise ShapeError(f"{what}: row range [{r0}, {r1}) outside 0..{n}")
        shape = (r1 - r0, nb * self.block_size)
        if out is None:
            out = np.empty(shape, F32)
        elif out.shape != shape or out.dtype != F32 or not out.flags.c_contiguous:
            raise ShapeError(
                f"{what}: out must be a C-contiguous float32 array of shape {shape}, "
                f"got {out.dtype} {out.shape}"
            )
        if out.size == 0:
            return out
        if not have_numba() or config.KERNELS == "reference":
            out[...] = self.dequantize_rows_reference(w3, r0, r1)
            return out
        self._dq(w3, f16_table(), UNIT, r0, r1, out)
        return out

    # ---------------------------------------------------------------- numpy references
    def dequantize_rows_reference(self, w3: np.ndarray, r0: int, r1: int) -> np.ndarray:
        """Rows ``[r0, r1)`` of W decoded by the format's numpy reference."""
        w3 = self.blocks(w3, f"dequantize_rows_reference({self.qtype})")
        rows = w3[r0:r1]
        k = w3.shape[1] * self.block_size
        if rows.size == 0:
            return np.zeros((rows.shape[0], k), F32)
        return self.dequantize_reference(rows.reshape(-1, self.type_size)).reshape(-1, k)

    def matmul_t_reference(self, w3: np.ndarray, x: np.ndarray) -> np.ndarray:
        """``x @ W.T``: rows of W decoded in blocks (never all at once), multiplied by BLAS."""
        w3 = self.blocks(w3, f"matmul_t_reference({self.qtype})")
        x2 = self._x(w3, x, f"matmul_t_reference({self.qtype})")
        n, k = w3.shape[0], x2.shape[1]
        out = np.zeros((x2.shape[0], n), F32)
        if out.size == 0 or k == 0:
            return out
        for r0, r1 in row_blocks(n, k):
            with np.errstate(invalid="ignore", over="ignore"):
                out[:, r0:r1] = x2 @ self.dequantize_rows_reference(w3, r0, r1).T
        return out

    def matvec_reference(self, w3: np.ndarray, x: np.ndarray) -> np.ndarray:
        """``W @ x`` by the numpy reference."""
        return self.matmul_t_reference(w3, np.asarray(x).reshape(1, -1))[0]

    # ---------------------------------------------------------------- unchecked runners
    def run_matvec(self, w3: np.ndarray, x: np.ndarray) -> np.ndarray:
        """The matrix-vector kernel on checked operands (x float32, contiguous, length K)."""
        if self.small_kernel():
            return self._int_product(w3, x.reshape(1, -1))[0]
        y = np.empty(w3.shape[0], F32)
        self._schedule(self._mv, w3, x.reshape(w3.shape[1], -1), y)
        return y

    def int_dot(self) -> bool:
        """Whether small products (``int_rows``) run the integer kernels here."""
        if self.qtype not in INT_DOT_FORMATS:
            return False
        return self.panel_dot() or (self.qtype in _idot.SPECS and _idot.available())

    def panel_dot(self) -> bool:
        """Whether products of any size run the panel kernels (``_pdot``) on a copy of the
        weight repacked once (``_panels``)."""
        return self.qtype in INT_DOT_FORMATS and self.qtype in _pdot.FORMATS and _pdot.available()

    def int_rows(self) -> int:
        """Up to how many rows of x a product runs the ``_idot`` / ``_pdot`` kernels (0: never)."""
        if self.panel_dot():
            return PANEL_ROWS
        kernel = self.small_kernel()
        if kernel is None:
            return 0
        if kernel == "Q8_0F":
            return INT_ROWS["Q8_0F"]
        return INT_ROWS["wide" if _idot.state()["wide"] else "int"]

    def small_kernel(self) -> str | None:
        """The ``_idot`` / ``_pdot`` kernel for products of up to ``int_rows()`` rows here, if
        any: the integer one, or Q8_0's float-x one ("Q8_0F")."""
        if self.int_dot():
            return self.qtype
        if self.qtype == "Q8_0" and _idot.state() is not None:
            return "Q8_0F"
        return None

    def _int_product(self, w3: np.ndarray, x: np.ndarray, qweight=None) -> np.ndarray:
        """``x @ W.T`` by the ``_pdot`` kernels on W's panels (kept on ``qweight``, or packed for
        this call), else the ``_idot`` ones (x float32 (M, K), C-contiguous, 1 <= M)."""
        if self.panel_dot():
            n = qweight.shape[0] if w3 is None else w3.shape[0]
            y = np.empty((x.shape[0], n), F32)
            p = _panels.pack(w3, self.qtype) if qweight is None else _panels.panels_of(qweight)
            _pdot.product(self.qtype, p, n, x, y)
            return y
        if w3 is None:
            w3 = qweight.blocks3d()
        y = np.empty((x.shape[0], w3.shape[0]), F32)
        _idot.product(self.small_kernel(), w3, x, y)
        return y

    def run_matmul_t(self, w3: np.ndarray, x: np.ndarray) -> np.ndarray:
        """``x @ W.T`` on checked operands (x float32 (M, K), C-contiguous, M >= 1)."""
        m = x.shape[0]
        if m <= self.int_rows():
            return self._int_product(w3, x)
        if m == 1:
            return self.run_matvec(w3, x[0]).reshape(1, -1)
        if m <= SMALL_M:  # a few rows: one bandwidth-bound pass over the packed weight each
            y = np.empty((m, w3.shape[0]), F32)
            for i in range(m):
                y[i] = self.run_matvec(w3, x[i])
            return y
        return self._prefill(w3, x)

    def _schedule(self, kernel, w3: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
        """Run a matrix-vector style kernel over row chunks, on as many threads as pays."""
        lut = _f16_lut if _f16_lut is not None else f16_table()
        fn = kernel._compiled if kernel._compiled is not None else kernel
        _run_chunks(fn, (w3, lut, x, y), w3.shape[0], w3.nbytes)

    def _prefill(self, w3: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Decode tiles of rows into small float32 buffers and let BLAS multiply them.

        The threads take tiles in turn, each decoding (numba, no GIL) and multiplying
        (one-thread BLAS): OpenBLAS's own threads spin-wait, and on a busy machine one product
        then costs 7x. A thread that the OS preempts delays one tile, not every product.
        """
        import os

        from ember.kernels.cpu.quant import packed
        from ember.kernels.cpu.tiles import run_tiles, scratch
        from ember.threads import get_num_threads

        if x.shape[0] >= packed.MIN_ROWS and packed.available():
            return packed.matmul_t(self, w3, x)  # the packed GEMM's microkernels
        n, k = w3.shape[0], x.shape[1]
        out = np.empty((x.shape[0], n), F32)
        threads = min(get_num_threads(), os.cpu_count() or 1)
        if threads > 1:
            # tiles that stay in L2, and at least PREFILL_TILES_PER_THREAD of them per thread
            # while they keep MIN_TILE_ROWS rows (a 576-row weight made 3 tiles, a 192-row one 1)
            rows = max(16, THREAD_TILE_BYTES // (4 * k) // 16 * 16)
            few = -(-n // (PREFILL_TILES_PER_THREAD * threads))
            rows = min(rows, max(MIN_TILE_ROWS, -(-few // 16) * 16))
        else:
            rows = max(1, TILE_ELEMENTS // k)
        dq, lut = self._dq1, f16_table()

        def tile(i: int) -> None:  # decode rows [r0, r1) and multiply them
            r0, r1 = i * rows, min(n, i * rows + rows)
            w = scratch((r1 - r0, k))
            dq(w3, lut, UNIT, r0, r1, w)
            np.matmul(x, w.T, out=out[:, r0:r1])

        run_tiles(tile, -(-n // rows), threads)
        return out

    # ---------------------------------------------------------------- the linear_q kernel
    def linear(self, x: np.ndarray, b: np.ndarray | None = None, *, qweight) -> np.ndarray:
        """``x @ W.T + b`` for float32 x (..., K) and a 2-d QTensor W of this format."""
        panels = self.panel_dot()  # (then W's blocks are not needed: they may not exist)
        w3 = None if panels else qweight.blocks3d()
        n, k = qweight.shape
        if x.ndim == 0 or x.shape[-1] != k:
            raise ShapeError(f"linear({self.qtype}): x of shape {x.shape} does not fit {(n, k)}")
        lead = x.shape[:-1]
        if x.size <= self.int_rows() * k:  # decode, small batches, short prompts (all: panels)
            x2 = x.reshape(-1, k)
            if x2.dtype != F32 or not x2.flags.c_contiguous:
                x2 = np.ascontiguousarray(x2, dtype=F32)
            out = self._int_product(w3, x2, qweight)
        elif x.size == k:  # decode: one row, the matrix-vector kernel straight away
            xv = x.reshape(w3.shape[1], -1)
            if xv.dtype != F32 or not xv.flags.c_contiguous:
                xv = np.ascontiguousarray(xv, dtype=F32)
            out = np.empty(n, F32)
            self._schedule(self._mv, w3, xv, out)
        else:
            out = self.run_matmul_t(w3, np.ascontiguousarray(x.reshape(-1, k), dtype=F32))
        if b is not None:
            out += b
        return out.reshape(lead + (n,))

    def prepare_linear(self, out: np.ndarray, x: np.ndarray, *b, qweight):
        """``linear`` into out on these arrays, bound once (a captured step's product, see
        ember.nn.graph): one driver call, or None where it is not an ``_idot`` product."""
        n, k = qweight.shape
        panels = self.panel_dot()
        top = _pdot.max_rows() if panels else min(self.int_rows(), _idot.MAX_GROUPS_ROWS)
        ok = (
            x.dtype == F32 and x.flags.c_contiguous and out.dtype == F32 and out.flags.c_contiguous
            and x.size <= top * k and x.ndim >= 1 and out.shape == x.shape[:-1] + (n,)
        )  # fmt: skip
        if not ok:
            return None
        x2, y2 = x.reshape(-1, k), out.reshape(-1, n)
        if panels:
            run = _pdot.bind(self.qtype, _panels.panels_of(qweight), n, x2, y2)
        else:
            run = _idot.bind(self.small_kernel(), qweight.blocks3d(), x2, y2)
        return with_bias(run, out, b[0] if b else None)

    def register(self):
        """Register ``linear`` for the ``linear_q`` op, for QTensors of this format."""
        from ember.kernels.registry import register
        from ember.quant.qtensor import QTensor

        qtype = self.qtype

        def when(x, *b, qweight) -> bool:
            if type(qweight) is not QTensor or qweight.qtype != qtype or len(qweight.shape) != 2:
                return False
            n, k = qweight.shape
            return (
                x.ndim >= 1 and x.shape[-1] == k and x.size > 0 and n > 0
                and (not b or b[0].shape == (n,))
            )  # fmt: skip

        return register(
            "linear_q",
            reference=linear_reference,
            name=f"linear_{qtype.lower()}",
            when=when,
            available=have_numba,
            prepare=self.prepare_linear,
        )(self.linear)


def linear_reference(x: np.ndarray, b: np.ndarray | None = None, *, qweight) -> np.ndarray:
    """``x @ W.T + b`` for a QTensor W in numpy (the ``linear_q`` kernels' reference)."""
    n, k = qweight.shape
    if x.ndim == 0 or x.shape[-1] != k:
        raise ShapeError(f"linear: x of shape {x.shape} does not fit a weight {(n, k)}")
    lead = x.shape[:-1]
    x2 = np.asarray(x.reshape(-1, k), dtype=F32)
    out = np.zeros((x2.shape[0], n), F32)
    if out.size and k:
        w3 = qweight.blocks3d()
        rows = w3.reshape(n, w3.shape[1] * w3.shape[2])
        for r0, r1 in row_blocks(n, k):
            w = dequantize(rows[r0:r1], qweight.qtype, (r1 - r0, k))
            with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf in x stay so
                out[:, r0:r1] = x2 @ w.T
    if b is not None:
        out += b
    return out.reshape(lead + (n,))
