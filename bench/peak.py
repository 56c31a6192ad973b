"""This CPU's ceilings, and what "2.5x transformers" on a TinyLlama-1.1B row would need of them.

    python bench/peak.py [--threads 1 2] [--gguf /tmp/ember-tinyllama/tinyllama-bf16.gguf]
        [--no-append]

Measured here, in one run:

- the arithmetic peak of each core: a JIT-compiled loop (llvmlite, the same compiler ember's
  kernels use) of 16 independent multiply-adds per iteration, so that neither latency nor
  memory limits it: float32 FMA (512-bit on AVX-512, else 256-bit), bf16 pair dot products
  (``vdpbf16ps``, where the CPU has avx512_bf16) and int8 dot products (``vpdpbusd``, where it
  has avx512_vnni). Several threads run the loop at once (ctypes drops the GIL);
- the read bandwidth from DRAM: numpy's ``a.sum()`` over 1 GiB (what bench/quant.py reports
  kernels against) and a JIT loop that only loads and adds 512-bit vectors, the most a kernel
  could stream;
- with ``--gguf`` (a bf16 TinyLlama file from bench/tinyllama.py), transformers' bf16 prefill
  and decode on it, run by bench/llm.py's own engine runner in a child process.

Then, for that model's matrices: operations per prompt token (2 per weight per token; the
matrices of the layers, and the output matrix once per prompt as ember computes it, or at every
position as a plain ``model(ids)`` call does), bytes read per decoded token, the tokens/s that
each peak allows, and the share of those ceilings that 2.5x transformers' bf16 speed would take.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import append  # noqa: E402

UNROLL = 16  # independent accumulators: more than FMA latency x pipes on any CPU seen
ITERS = 40_000_000
BW_BYTES = 1 << 30

# name -> (accumulator type, operand type, instruction, multiply-adds per instruction, feature)
LOOPS = {
    "float32 FMA": ("<16 x float>", "<16 x float>", "fma", 16, "avx512f"),
    "bf16 dot (vdpbf16ps)": ("<16 x float>", "<32 x bfloat>", "dpbf16ps", 32, "avx512bf16"),
    "int8 dot (vpdpbusd)": ("<16 x i32>", "<16 x i32>", "vpdpbusd", 64, "avx512vnni"),
}


def _compile(ir: list[str], name: str):
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    mod = llvm.parse_assembly("\n".join(ir))
    mod.verify()
    tm = llvm.Target.from_default_triple().create_target_machine(
        llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(), opt=3
    )
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    return engine, engine.get_function_address(name)


def _peak_ir(acc: str, opnd: str, op: str, wide: bool) -> list[str]:
    """@loop(n): n iterations of UNROLL independent multiply-adds of one kind."""
    if not wide:  # AVX2: the same loop on 256-bit float vectors
        acc = opnd = "<8 x float>"
    if op == "fma":
        decl = f"declare {acc} @llvm.fma.{'v16f32' if wide else 'v8f32'}({acc}, {acc}, {acc})"
        call = f"call {acc} @llvm.fma.{'v16f32' if wide else 'v8f32'}({acc} %a{{i}}, {acc} %x, {acc} %x)"
        init = [
            f"  %x = fadd {acc} zeroinitializer, <{', '.join(['float 1.0'] * (16 if wide else 8))}>"
        ]
        add = "fadd"
    else:
        fn = (
            "llvm.x86.avx512bf16.dpbf16ps.512"
            if op == "dpbf16ps"
            else "llvm.x86.avx512.vpdpbusd.512"
        )
        decl = f"declare {acc} @{fn}({acc}, {opnd}, {opnd})"
        call = f"call {acc} @{fn}({acc} %a{{i}}, {opnd} %x, {opnd} %x)"
        ones = ", ".join(["i32 16843009"] * 16)  # 0x01010101: small, never overflows
        init = [f"  %x = bitcast <16 x i32> <{ones}> to {opnd}"]
        add = "fadd" if "float" in acc else "add"
    ir = [decl, "define i64 @loop(i64 %n) #0 {", "entry:", *init, "  br label %body", "body:",
          "  %k = phi i64 [0, %entry], [%k1, %body]"]  # fmt: skip
    ir += [f"  %a{i} = phi {acc} [zeroinitializer, %entry], [%b{i}, %body]" for i in range(UNROLL)]
    ir += [f"  %b{i} = " + call.format(i=i) for i in range(UNROLL)]
    ir += ["  %k1 = add i64 %k, 1", "  %more = icmp ult i64 %k1, %n",
           "  br i1 %more, label %body, label %done", "done:"]  # fmt: skip
    last = "%b0"
    for i in range(1, UNROLL):
        ir.append(f"  %s{i} = {add} {acc} {last}, %b{i}")
        last = f"%s{i}"
    bits = 512 if wide else 256
    ir += [f"  %r = bitcast {acc} {last} to <{bits // 64} x i64>",
           f"  %e = extractelement <{bits // 64} x i64> %r, i32 0", "  ret i64 %e", "}",
           'attributes #0 = { "min-legal-vector-width"="512" "prefer-vector-width"="512" }']  # fmt: skip
    return ir


def _stream_ir() -> list[str]:
    """@loop(p, n): the sum of n 512-bit vectors from p, 8 loads in flight."""
    v = "<16 x float>"
    ir = ["define i64 @loop(ptr %p, i64 %n) #0 {", "entry:", "  br label %body", "body:",
          "  %k = phi i64 [0, %entry], [%k1, %body]"]  # fmt: skip
    ir += [f"  %a{i} = phi {v} [zeroinitializer, %entry], [%b{i}, %body]" for i in range(8)]
    for i in range(8):
        ir += [f"  %j{i} = add i64 %k, {i}", f"  %q{i} = getelementptr {v}, ptr %p, i64 %j{i}",
               f"  %l{i} = load {v}, ptr %q{i}, align 64", f"  %b{i} = fadd {v} %a{i}, %l{i}"]  # fmt: skip
    ir += ["  %k1 = add i64 %k, 8", "  %more = icmp ult i64 %k1, %n",
           "  br i1 %more, label %body, label %done", "done:"]  # fmt: skip
    last = "%b0"
    for i in range(1, 8):
        ir.append(f"  %s{i} = fadd {v} {last}, %b{i}")
        last = f"%s{i}"
    ir += [f"  %r = bitcast {v} {last} to <8 x i64>", "  %e = extractelement <8 x i64> %r, i32 0",
           "  ret i64 %e", "}",
           'attributes #0 = { "min-legal-vector-width"="512" "prefer-vector-width"="512" }']  # fmt: skip
    return ir


def _together(calls: list) -> float:
    """Run the calls in threads at once; the wall time of the whole."""
    ts = [threading.Thread(target=c) for c in calls]
    t = time.perf_counter()
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    return time.perf_counter() - t


def peaks(threads: int) -> dict[str, float | None]:
    """Multiply-adds' operations per second (2 per multiply-add) on `threads` cores, by kind."""
    import llvmlite.binding as llvm

    feats = llvm.get_host_cpu_features()
    out: dict[str, float | None] = {}
    for name, (acc, opnd, op, macs, need) in LOOPS.items():
        wide = bool(feats.get("avx512f"))
        if op != "fma" and not feats.get(need):
            out[name] = None
            continue
        engine, addr = _compile(_peak_ir(acc, opnd, op, wide), "loop")
        fn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(addr)
        fn(1000)
        lanes = macs if wide or op != "fma" else 8
        best = min(_together([lambda f=fn: f(ITERS)] * threads) for _ in range(3))
        out[name] = threads * ITERS * UNROLL * lanes * 2 / best
        del engine
    return out


def bandwidth(threads: int) -> dict[str, float]:
    """Read GB/s from DRAM over 1 GiB split among `threads` threads: numpy sum and a JIT stream."""
    import numpy as np

    a = np.ones(BW_BYTES // 4, np.float32)
    parts = np.array_split(a, threads)
    numpy_s = min(_together([p.sum for p in parts]) for _ in range(5))
    engine, addr = _compile(_stream_ir(), "loop")
    fn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)(addr)
    vecs = a.size // 16 // threads // 8 * 8
    base = a.ctypes.data
    calls = [lambda i=i: fn(base + i * vecs * 64, vecs) for i in range(threads)]
    jit_s = min(_together(calls) for _ in range(9))  # the best: the rate varies run to run
    del engine
    return {"numpy": a.nbytes / numpy_s / 1e9, "jit": threads * vecs * 64 / jit_s / 1e9}


def model_sizes(path: str) -> dict[str, float]:
    """Weights of the layers' matrices and of the output matrix; bytes read per decoded token."""
    from ember.io import open_gguf

    f = open_gguf(path)
    layers = nbytes = 0
    for name, t in f.tensors.items():
        if len(t.shape) != 2:
            nbytes += t.nbytes
            continue
        if name != "token_embd.weight":  # an embedding reads one row per token
            layers += t.shape[0] * t.shape[1] * (name != "output.weight")
            nbytes += t.nbytes
    head = f.tensors.get("output.weight") or f.tensors["token_embd.weight"]  # tied or not
    out = head.shape[0] * head.shape[1]
    nbytes += head.nbytes * ("output.weight" not in f.tensors)
    return {"layers": layers, "output": out, "bytes": nbytes}


def torch_bf16(path: str, threads: int, prompt: int) -> dict | None:
    """transformers bf16 on the file, by bench/llm.py's runner in its own process."""
    cmd = [sys.executable, os.path.join(os.path.dirname(__file__), "llm.py"), "--engine",
           "torch_bf16", "--gguf", path, "--threads", str(threads), "--prompt-tokens",
           str(prompt), "--new-tokens", "16", "--repeat", "2"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
    if p.returncode:
        print(f"torch_bf16 failed: {p.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--gguf", help="a bf16 TinyLlama GGUF (bench/tinyllama.py) for the model part")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--no-append", action="store_true")
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    rows = ["| threads | " + " | ".join(f"{k}, G ops/s" for k in LOOPS)
            + " | read GB/s, numpy sum | read GB/s, JIT stream |",
            "|---:|" + "---:|" * (len(LOOPS) + 2)]  # fmt: skip
    got = {}
    for t in a.threads:
        p, bw = peaks(t), bandwidth(t)
        got[t] = (p, bw)
        cells = " | ".join("-" if v is None else f"{v / 1e9:.0f}" for v in p.values())
        rows.append(f"| {t} | {cells} | {bw['numpy']:.1f} | {bw['jit']:.1f} |")
    table = "\n".join(rows)
    table += (f"\n\nMultiply-adds count 2 operations; each thread runs {UNROLL} independent "
              f"accumulators. Load average {load0:.1f} at start.")  # fmt: skip
    if a.gguf:
        table += "\n\n" + model_part(a, got)
    table += f" Load average {os.getloadavg()[0]:.1f} at the end ({os.cpu_count()} cores)."
    print(table)
    if not a.no_append:
        append("CPU ceilings and the 2.5x-transformers goal (bench/peak.py)", table)


def model_part(a, got: dict) -> str:
    """The ceilings of one bf16 model file and what 2.5x transformers bf16 would take of them."""
    s = model_sizes(a.gguf)
    t = max(a.threads)
    p, bw = got[t]
    per_tok = 2 * (s["layers"] + s["output"] / a.prompt_tokens)  # ember: logits of the last one
    per_tok_all = 2 * (s["layers"] + s["output"])  # model(ids): logits at every position
    ref = torch_bf16(a.gguf, t, a.prompt_tokens)
    lines = [
        f"Model: {os.path.basename(a.gguf)}: {s['layers'] / 1e6:.0f} M weights in the layers' "
        f"matrices, {s['output'] / 1e6:.1f} M in the output matrix, {s['bytes'] / 1e9:.2f} GB read "
        f"per decoded token; a {a.prompt_tokens}-token prompt costs {per_tok / 1e9:.3f} G ops per "
        f"token with the last position's logits, {per_tok_all / 1e9:.3f} G with every "
        f"position's (attention adds under 1 % at this length). {t} threads:",
        "",
        "| | tokens/s |",
        "|---|---:|",
    ]
    lines += [f"| prefill ceiling, {name} peak | {v / per_tok:.0f} |" for name, v in p.items() if v]
    lines.append(f"| decode ceiling, JIT stream read | {bw['jit'] * 1e9 / s['bytes']:.1f} |")
    if ref:
        pre = a.prompt_tokens / ref["prefill_s"]
        dec = ref["decode_tok_s"]
        lines += [f"| transformers bf16, prefill (logits at every position) | {pre:.0f} |",
                  f"| transformers bf16, decode | {dec:.1f} |",
                  f"| 2.5x transformers bf16, prefill | {2.5 * pre:.0f} |",
                  f"| 2.5x transformers bf16, decode | {2.5 * dec:.1f} |"]  # fmt: skip
        bf = p.get("bf16 dot (vdpbf16ps)")
        notes = [f"transformers' bf16 prefill runs at {pre * per_tok_all / 1e9:.0f} G ops/s"]
        if bf:
            notes.append(f"{100 * pre * per_tok_all / bf:.0f} % of the bf16 peak; 2.5x its speed "
                         f"needs {100 * 2.5 * pre * per_tok / bf:.0f} % of that peak even with "
                         f"the last position's logits only")  # fmt: skip
        i8 = p.get("int8 dot (vpdpbusd)")
        if i8:
            notes.append(f"{100 * 2.5 * pre * per_tok / i8:.0f} % of the int8 peak")
        notes.append(f"2.5x its decode needs {2.5 * dec * s['bytes'] / 1e9:.1f} GB/s read, "
                     f"{100 * 2.5 * dec * s['bytes'] / 1e9 / bw['jit']:.0f} % of the JIT stream's")  # fmt: skip
        lines += ["", "; ".join(notes) + "."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
