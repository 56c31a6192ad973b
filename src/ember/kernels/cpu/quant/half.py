"""BF16 and F16 weights times float32 x, read straight from their 16-bit bytes (LLVM IR, pool).

A GGUF or safetensors model stored in bfloat16 or float16 keeps its linear weights as
QTensors of type ``BF16`` / ``F16`` (``ember.models._weights``): memory-mapped, never copied to
float32. For up to ``MAX_ROWS`` rows of x the ``linear_q`` op runs these kernels: each weight
row is read 32 values (64 bytes) at a time, widened to float32 exactly (bf16: the 16 bits
shifted into the upper half of a float; f16: ``vcvtph2ps``), and multiplied into one float32
accumulator per row of x, summed by a fixed tree at the end: x is not rounded (the products are
those of the float32 weights), and a row's result does not depend on the other rows of x.
Chunks of weight rows run on ``kernels.cpu.pool``.

More rows of x than ``quant._common.SMALL_M`` (a prompt; up to SMALL_M rows every row is
bitwise its product alone, which the server's batched decode relies on) run ``bf16dot``'s tiles
on AVX-512: times a BF16 weight they round x to bf16 for ``vdpbf16ps`` where the CPU has AVX-512
BF16 (3-4x faster than widening for BLAS, no copy of the weight), else (F16 weights, no BF16
instructions, ``EMBER_HALF_DOT=float``) multiply float32 x by widened weights (1.8x). Without
AVX-512 these kernels run up to MAX_ROWS rows, and L2-sized tiles of widened rows go to BLAS.
"""

from __future__ import annotations

import threading

import numpy as np

from ember.errors import ShapeError
from ember.kernels.cpu import built_once, have_numba, with_bias

QTYPES = ("BF16", "F16")
G_MAX = 4  # rows of x per kernel call (an accumulator each)
MAX_ROWS = 64  # up to this many rows of x a product runs these kernels, then tiles for BLAS
TILE_BYTES = 1 << 19  # float32 bytes of one tile of widened weight rows (stays in L2)
# weight bytes (times groups of x rows) per chunk of pool work; 1 << 15 before: TinyLlama bf16
# decode at 2 threads 20-21 tok/s with the prefetch below, 26-27 with 1 << 17 and the old
# prefetch, 23-34 with both (1 << 16 and 1 << 18 within the noise; docs/quantization.md)
CHUNK_BYTES = 1 << 17
# bytes ahead of the read position that each 64-byte step prefetches, non-temporal
# (prefetchnta); 2048 with prefetcht0 before: a 1B model's shapes from DRAM at one thread at
# 36.3-36.8 GB/s, now 41.5-42.3 (2048x5632, whose 22 KiB x the weight lines presumably evicted
# from L1 before, 28.6-28.9 -> 36.6-38.2); 4096 and 8192 within 2 GB/s, 2048 and 12288 slower
PREFETCH = 6144
_F32 = np.dtype(np.float32)
_STATE: dict = {}
_LOCK = threading.Lock()


def _kernel_ir(qtype: str, g: int) -> str:
    """``ember_half_{qtype}_{g}``: rows [r0, r1) of W times g rows of x (pool signature: the
    weight, bytes per row, 32-value blocks per row, r0, r1, x, bytes per x row, 3 unused, y,
    floats per y row)."""
    v32 = "<32 x float>"
    name = f"ember_half_{qtype.lower()}_{g}"
    s = [
        f"define void @{name}(i64 %wi, i64 %rowb, i64 %nb, i64 %r0, i64 %r1, i64 %xi, i64 %ldx,"
        " i64 %u7, i64 %u8, i64 %u9, i64 %yi, i64 %ldy) #0 {",
        "entry:",
        "  %w = inttoptr i64 %wi to ptr",
        "  %xp = inttoptr i64 %xi to ptr",
        "  %y = inttoptr i64 %yi to ptr",
    ]
    for r in range(g):
        s += [
            f"  %xo{r} = mul i64 %ldx, {r}",
            f"  %x{r} = getelementptr i8, ptr %xp, i64 %xo{r}",
            f"  %yo{r} = mul i64 %ldy, {r}",
            f"  %y{r} = getelementptr float, ptr %y, i64 %yo{r}",
        ]
    s += ["  %any = icmp ult i64 %r0, %r1", "  br i1 %any, label %row, label %done", "row:"]
    s += ["  %n = phi i64 [%r0, %entry], [%n1, %rowend]"]
    s += ["  %wo = mul i64 %n, %rowb", "  %wr = getelementptr i8, ptr %w, i64 %wo"]
    s += ["  br label %blk", "blk:", "  %b = phi i64 [0, %row], [%b1, %blk]"]
    for r in range(g):
        s += [f"  %a{r} = phi {v32} [zeroinitializer, %row], [%an{r}, %blk]"]
    s += [
        "  %bo = shl i64 %b, 6",
        "  %wb = getelementptr i8, ptr %wr, i64 %bo",
        f"  %pf = getelementptr i8, ptr %wb, i64 {PREFETCH}",
        "  call void @llvm.prefetch.p0(ptr %pf, i32 0, i32 0, i32 1)",
    ]
    if qtype == "BF16":
        s += [
            "  %wh = load <32 x i16>, ptr %wb, align 1",
            "  %wz = zext <32 x i16> %wh to <32 x i32>",
            "  %ws = shl <32 x i32> %wz, " + "<" + ", ".join(["i32 16"] * 32) + ">",
            f"  %wf = bitcast <32 x i32> %ws to {v32}",
        ]
    else:
        s += [
            "  %wh = load <32 x half>, ptr %wb, align 1",
            f"  %wf = fpext <32 x half> %wh to {v32}",
        ]
    s += ["  %xo = shl i64 %b, 7"]
    for r in range(g):
        s += [
            f"  %xb{r} = getelementptr i8, ptr %x{r}, i64 %xo",
            f"  %xv{r} = load {v32}, ptr %xb{r}, align 4",
            f"  %an{r} = call {v32} @llvm.fma.v32f32({v32} %wf, {v32} %xv{r}, {v32} %a{r})",
        ]
    s += ["  %b1 = add i64 %b, 1", "  %bc = icmp ult i64 %b1, %nb"]
    s += ["  br i1 %bc, label %blk, label %rowend", "rowend:"]
    for r in range(g):
        s += [
            f"  %t{r} = call reassoc float @llvm.vector.reduce.fadd.v32f32(float 0.0, {v32} %an{r})",
            f"  %yq{r} = getelementptr float, ptr %y{r}, i64 %n",
            f"  store float %t{r}, ptr %yq{r}, align 4",
        ]
    s += ["  %n1 = add i64 %n, 1", "  %nc = icmp ult i64 %n1, %r1"]
    s += ["  br i1 %nc, label %row, label %done", "done:", "  ret void", "}"]
    return "\n".join(s)


def state() -> dict | None:
    """Compile the kernels once: {qtype: [addresses for g = 1..G_MAX]}; None where unavailable."""
    return built_once(_STATE, _LOCK, _build)


def _build() -> dict:
    from ember.kernels.cpu import gemm as G
    from ember.kernels.cpu import pool

    if not have_numba() or G.isa() is None or pool.state() is None:
        return {"ok": False}
    names = [f"ember_half_{q.lower()}_{g}" for q in QTYPES for g in range(1, G_MAX + 1)]
    decls = ["declare <32 x float> @llvm.fma.v32f32(<32 x float>, <32 x float>, <32 x float>)",
             "declare float @llvm.vector.reduce.fadd.v32f32(float, <32 x float>)"]  # fmt: skip
    irs = [_kernel_ir(q, g) for q in QTYPES for g in range(1, G_MAX + 1)]
    engine = G.jit_ir([*decls, *irs], names)
    fns = {q: [engine.get_function_address(f"ember_half_{q.lower()}_{g}") for g in
               range(1, G_MAX + 1)] for q in QTYPES}  # fmt: skip
    return {"ok": True, "engine": engine, "fns": fns}


def _weight_bytes(qweight) -> np.ndarray:
    """The weight's bytes as (rows, K / 32, 64) uint8."""
    n, k = qweight.shape
    return np.asarray(qweight.data).reshape(-1).view(np.uint8).reshape(n, k // 32, 64)


def bind(qtype: str, w3: np.ndarray, x: np.ndarray, y: np.ndarray):
    """A no-argument function computing y = x @ W.T on these arrays (x (M, K) float32
    C-contiguous, M <= MAX_ROWS; y (M, N)), whatever x holds when it is called."""
    from ember.kernels.cpu import pool

    n, nb, _ = w3.shape
    m, k = x.shape
    if k != 32 * nb or y.shape != (m, n) or m > MAX_ROWS or not w3.flags.c_contiguous:
        raise ShapeError(f"linear({qtype}): x {x.shape}, y {y.shape} and W {(n, 32 * nb)}")
    fns = state()["fns"][qtype]
    groups = -(-m // G_MAX)
    chunk = max(1, min(n, CHUNK_BYTES // (64 * nb * groups)))
    fields = [
        (fns[min(G_MAX, m - m0) - 1], x.ctypes.data + m0 * 4 * k, y.ctypes.data + m0 * 4 * n)
        for m0 in range(0, m, G_MAX)
    ]
    common = (w3.ctypes.data, 64 * nb, nb, 4 * k, n)

    def run() -> None:
        pool.run_groups(common, fields, n, chunk)

    run.keep = (w3, x, y)  # the arrays the addresses point into
    return run


def _prefill(qtype: str, w3: np.ndarray, x2: np.ndarray, y: np.ndarray) -> None:
    """y = x2 @ W.T for many rows of x: L2-sized tiles of W widened to float32 (bf16: shifted
    into the upper half; f16: converted), each multiplied by one-thread BLAS, the tiles shared
    among ember's threads (``tiles.run_tiles``)."""
    from ember.kernels.cpu.tiles import run_tiles, scratch

    n, k = w3.shape[0], x2.shape[1]
    h16 = w3.reshape(n, -1).view(np.uint16)
    rows = max(16, TILE_BYTES // (4 * k) // 16 * 16)

    def tile(i: int) -> None:
        r0, r1 = i * rows, min(n, i * rows + rows)
        t = scratch((r1 - r0, k))
        if qtype == "BF16":
            u = t.view(np.uint32)
            u[...] = h16[r0:r1]
            u <<= 16
        else:
            t[...] = h16[r0:r1].view(np.float16)
        np.matmul(x2, t.T, out=y[:, r0:r1])

    run_tiles(tile, -(-n // rows))


def _route(qtype: str, m: int) -> str:
    """How m rows of x times a weight of this type run: "rows" (these kernels), "dot" (x
    rounded to bf16 for vdpbf16ps), "float" (bf16dot's tiles on float32 x) or "blas" (tiles)."""
    from ember.kernels.cpu.quant._common import SMALL_M

    if m <= SMALL_M:
        return "rows"
    from ember.kernels.cpu.quant import bf16dot

    if qtype == "BF16" and bf16dot.available():
        return "dot"
    if bf16dot.float_available():
        return "float"
    return "rows" if m <= MAX_ROWS else "blas"


def _dot(qtype: str, m: int) -> bool:
    """Whether m rows of x times a weight of this type run ``bf16dot`` (x rounded to bf16)."""
    return _route(qtype, m) == "dot"


def linear(x: np.ndarray, b: np.ndarray | None = None, *, qweight) -> np.ndarray:
    """``x @ W.T + b`` for float32 x (..., K) and a 2-d BF16/F16 QTensor W (the kernel)."""
    n, k = qweight.shape
    lead = x.shape[:-1]
    x2 = np.ascontiguousarray(x.reshape(-1, k), dtype=_F32)
    w3 = _weight_bytes(qweight)
    route = _route(qweight.qtype, x2.shape[0])
    if route in ("dot", "float"):
        from ember.kernels.cpu.quant import bf16dot

        w16 = w3.reshape(n, -1).view(np.uint16)
        if route == "dot":
            y = bf16dot.matmul_t(w16, x2)
        else:
            y = bf16dot.matmul_t_float(qweight.qtype, w16, x2)
    else:
        y = np.empty((x2.shape[0], n), _F32)
        if route == "rows":
            bind(qweight.qtype, w3, x2, y)()
        else:
            _prefill(qweight.qtype, w3, x2, y)
    if b is not None:
        y += b
    return y.reshape(lead + (n,))


def prepare(out: np.ndarray, x: np.ndarray, *b, qweight):
    """``linear`` into out on these arrays, bound once (a captured step, ember.nn.graph)."""
    n, k = qweight.shape
    if not (x.dtype == _F32 and x.flags.c_contiguous and out.dtype == _F32 and x.size <= MAX_ROWS * k
            and out.flags.c_contiguous and out.shape == x.shape[:-1] + (n,)
            and _route(qweight.qtype, x.size // k) == "rows"):  # fmt: skip
        return None  # (a bf16dot product runs as linear does, unbound)
    run = bind(qweight.qtype, _weight_bytes(qweight), x.reshape(-1, k), out.reshape(-1, n))
    return with_bias(run, out, b[0] if b else None)


def _when(x, *b, qweight) -> bool:
    from ember.quant.qtensor import QTensor

    if type(qweight) is not QTensor or qweight.qtype not in QTYPES or len(qweight.shape) != 2:
        return False
    n, k = qweight.shape
    return (
        x.ndim >= 1 and x.shape[-1] == k and k % 32 == 0 and x.size > 0 and n > 0
        and (not b or b[0].shape == (n,))
    )  # fmt: skip


def _reference(x: np.ndarray, b: np.ndarray | None = None, *, qweight) -> np.ndarray:
    from ember.kernels.cpu.quant._common import linear_reference

    return linear_reference(x, b, qweight=qweight)


def _available() -> bool:
    return state() is not None


def _register() -> None:
    from ember.kernels.registry import register

    register(
        "linear_q", reference=_reference, name="linear_half", when=_when, available=_available,
        prepare=prepare,
    )(linear)  # fmt: skip


_register()
