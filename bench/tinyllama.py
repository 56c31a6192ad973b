"""TinyLlama-1.1B's configuration with random weights, as GGUF files for bench/llm.py --tinyllama.

    python bench/tinyllama.py [--dir /tmp/ember-tinyllama] [--types Q8_0,Q4_0,Q4_K,Q5_K]

Writes ``tinyllama-bf16.gguf`` (ember's writer: hidden 2048, 22 layers, 32 heads, 4 KV heads,
MLP 5632, vocab 32000, weights N(0, 0.02) rounded to bf16, norms 1), then each type twice:
``tinyllama-<type>-ember.gguf`` by ember's converter (``ember convert in.gguf out.gguf
--quantize``) and ``tinyllama-<type>-llamacpp.gguf`` by llama.cpp's own quantizer (Q4_K is
llama.cpp's Q4_K_M mix, Q5_K its Q5_K_M; Q5_K only by llama.cpp: ember does not quantize to
it). Existing files are kept. The vocabulary is a placeholder
SentencePiece one (<unk>, <s>, </s>, the 256 byte tokens, then "▁w<i>" pieces): enough for
both engines to load the file and turn a prompt into ids; the text it generates means nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

CONFIG = dict(hidden=2048, layers=22, heads=32, kv_heads=4, ffn=5632, vocab=32000, ctx=2048)
# llama.cpp's LLAMA_FTYPE_MOSTLY_*: Q4_K is its Q4_K_M mix, Q5_K its Q5_K_M
LLAMA_FTYPES = {"Q8_0": 7, "Q4_0": 2, "Q4_K": 15, "Q5_K": 17}


def _vocab(n: int) -> dict:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256  # unknown, control, control, byte
    filler = n - len(tokens)
    tokens += [f"\u2581w{i}" for i in range(filler)]
    types += [1] * filler
    scores = [0.0] * 259 + [-float(i) for i in range(filler)]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }


def write_bf16(path: Path, seed: int = 0) -> None:
    """The random-weight bf16 GGUF of TinyLlama-1.1B's configuration."""
    import ml_dtypes

    from ember.io import save_gguf

    c = CONFIG
    rng = np.random.default_rng(seed)
    hd = c["hidden"] // c["heads"]

    def w(*shape):
        return (rng.standard_normal(shape, np.float32) * np.float32(0.02)).astype(
            ml_dtypes.bfloat16
        )

    ones = np.ones(c["hidden"], np.float32)
    t = {"token_embd.weight": w(c["vocab"], c["hidden"])}
    for i in range(c["layers"]):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = ones
        t[p + "attn_q.weight"] = w(c["hidden"], c["hidden"])
        t[p + "attn_k.weight"] = w(c["kv_heads"] * hd, c["hidden"])
        t[p + "attn_v.weight"] = w(c["kv_heads"] * hd, c["hidden"])
        t[p + "attn_output.weight"] = w(c["hidden"], c["hidden"])
        t[p + "ffn_norm.weight"] = ones
        t[p + "ffn_gate.weight"] = w(c["ffn"], c["hidden"])
        t[p + "ffn_up.weight"] = w(c["ffn"], c["hidden"])
        t[p + "ffn_down.weight"] = w(c["hidden"], c["ffn"])
    t["output_norm.weight"] = ones
    t["output.weight"] = w(c["vocab"], c["hidden"])
    meta = {
        "general.architecture": "llama",
        "general.name": "TinyLlama-1.1B config, random weights",
        "general.file_type": 32,  # LLAMA_FTYPE_MOSTLY_BF16
        "llama.context_length": c["ctx"],
        "llama.embedding_length": c["hidden"],
        "llama.block_count": c["layers"],
        "llama.feed_forward_length": c["ffn"],
        "llama.attention.head_count": c["heads"],
        "llama.attention.head_count_kv": c["kv_heads"],
        "llama.rope.dimension_count": hd,
        "llama.rope.freq_base": 10000.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        **_vocab(c["vocab"]),
    }
    types = {k: "UINT32" for k in meta if isinstance(meta[k], int)}
    types.update({"llama.rope.freq_base": "FLOAT32",
                  "llama.attention.layer_norm_rms_epsilon": "FLOAT32",
                  "tokenizer.ggml.scores": "ARRAY[FLOAT32]",
                  "tokenizer.ggml.token_type": "ARRAY[INT32]"})  # fmt: skip
    save_gguf(path, meta, t, metadata_types=types)


def quantize_llamacpp(src: Path, dst: Path, qtype: str) -> None:
    """llama.cpp's quantizer (llama_model_quantize), as llama-quantize runs it."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPES[qtype]
    params.nthread = os.cpu_count() or 1
    tmp = dst.with_name(dst.name + ".tmp")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({qtype}) failed with {rc}")
    tmp.rename(dst)


def make_files(folder: Path, types: list[str]) -> list[Path]:
    """The bf16 file and each type by both quantizers (kept when already there; llama.cpp's
    alone for a type ember does not quantize to, such as Q5_K)."""
    from ember.convert.to_gguf import requantize_gguf
    from ember.quant import QUANTIZE_TYPES

    folder.mkdir(parents=True, exist_ok=True)
    bf16 = folder / "tinyllama-bf16.gguf"
    out = [bf16]
    jobs = [(bf16, lambda p: write_bf16(p))]
    for q in types:
        e, ll = folder / f"tinyllama-{q}-ember.gguf", folder / f"tinyllama-{q}-llamacpp.gguf"
        if q in QUANTIZE_TYPES:
            jobs += [(e, lambda p, q=q: requantize_gguf(bf16, p, quantize=q))]
            out += [e]
        jobs += [(ll, lambda p, q=q: quantize_llamacpp(bf16, p, q))]
        out += [ll]
    for path, make in jobs:
        if not path.is_file():
            t = time.perf_counter()
            make(path)
            print(f"wrote {path} in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/ember-tinyllama")
    ap.add_argument("--types", default="Q8_0,Q4_0,Q4_K,Q5_K")
    a = ap.parse_args()
    for p in make_files(Path(a.dir), a.types.split(",")):
        print(p)


if __name__ == "__main__":
    main()
