"""`ember info --model PATH`: architecture, parameters, quantization, memory."""

from __future__ import annotations

import argparse
from collections import Counter

from ember.cli._text import echo, to_json


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register this command's options."""
    p.add_argument("--model", help="GGUF file or Hugging Face folder (default: the bundled model)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def describe(model) -> dict:
    """Architecture, parameter count, bytes by storage type, and the config."""
    from ember.quant import QTensor

    kinds: Counter = Counter()
    nbytes: Counter = Counter()
    params = 0
    seen = set()
    for mod in model.modules():
        for _name, w in list(mod._parameters.items()) + [("weight", getattr(mod, "weight", None))]:
            if w is None or id(w) in seen:
                continue
            seen.add(id(w))
            if isinstance(w, QTensor):
                n = w.shape[0] * w.shape[1]
                kinds[w.qtype] += n
                nbytes[w.qtype] += w.nbytes
            elif hasattr(w, "numel"):
                n = w.numel()
                kinds[w.dtype.name] += n
                nbytes[w.dtype.name] += w.nbytes
            else:
                continue
            params += n
    return {
        "architecture": type(model).__name__,
        "parameters": params,
        "by_type": dict(kinds),
        "bytes": dict(nbytes),
    }


def run(args) -> int:
    """Print the description."""
    from ember.models import AutoModelForCausalLM
    from ember.models.hub import resolve

    path = resolve(args.model)
    model = AutoModelForCausalLM.from_pretrained(path)
    d = describe(model)
    cfg = model.config
    theta = getattr(cfg, "rope_theta", None)
    if args.json:
        echo(
            to_json(
                {
                    "model": str(path),
                    **d,
                    "model_type": cfg.model_type,
                    "layers": cfg.num_hidden_layers,
                    "hidden_size": cfg.hidden_size,
                    "heads": cfg.num_attention_heads,
                    "kv_heads": cfg.num_key_value_heads,
                    "ffn_size": cfg.intermediate_size,
                    "vocab_size": cfg.vocab_size,
                    "context": cfg.max_position_embeddings,
                    "rope_theta": theta,
                }
            )
        )
        return 0
    echo(f"model:        {path}")
    echo(f"architecture: {d['architecture']} ({cfg.model_type})")
    echo(
        f"layers:       {cfg.num_hidden_layers}, hidden {cfg.hidden_size}, "
        f"heads {cfg.num_attention_heads} (kv {cfg.num_key_value_heads}), "
        f"ffn {cfg.intermediate_size}"
    )
    rope = f", rope theta {theta:g}" if theta else ""
    echo(f"vocab:        {cfg.vocab_size}, context {cfg.max_position_embeddings}{rope}")
    echo(f"parameters:   {d['parameters'] / 1e6:.1f} M")
    for k in sorted(d["by_type"]):
        echo(f"  {k:8s} {d['by_type'][k] / 1e6:8.2f} M params  {d['bytes'][k] / 2**20:8.1f} MiB")
    echo(f"weights:      {sum(d['bytes'].values()) / 2**20:.1f} MiB (memory-mapped)")
    return 0
