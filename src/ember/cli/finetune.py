"""`ember finetune --data FILE.jsonl`: LoRA / QLoRA fine-tuning on the Learner.

The model's weights stay as they are (a GGUF's stay quantized); LoRA adapters are trained on the
assistant tokens of chat ``messages`` or ``prompt``/``completion`` records, with the model's chat
template applied. The Learner writes its progress bar, CSV log, curves and resumable
checkpoints to --out; the adapter goes to --out/adapter (peft's files) and, with --gguf, to a
llama.cpp LoRA GGUF. With --eval, held-out records are answered greedily before and after
training and scored by exact match of the assistant's answer (--out/eval.json, with every answer
in --out/eval_answers.jsonl).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from ember.cli._args import existing_file, finite_float, int_at_least
from ember.cli._text import echo
from ember.errors import EmberError

DEFAULT_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def _file(flag: str):
    """An argparse type: an existing file (the error names the flag)."""

    def parse(text: str) -> str:
        try:
            return str(existing_file(text, flag))
        except EmberError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register this command's options."""
    p.add_argument(
        "--data",
        required=True,
        type=_file("--data"),
        help="training records, one JSON object a line",
    )
    p.add_argument(
        "--valid",
        type=_file("--valid"),
        help="held-out records (same format) for the validation loss",
    )
    p.add_argument(
        "--eval",
        type=_file("--eval"),
        metavar="FILE",
        help="held-out records (same format): greedy exact match of the last assistant answer, "
        "scored before and after training (--out/eval.json)",
    )
    p.add_argument("--model", help="GGUF file or Hugging Face folder (default: bundled SmolLM2)")
    p.add_argument("--out", default="finetune-out", help="output folder (default finetune-out)")
    p.add_argument("--epochs", type=int_at_least(1), default=1)
    p.add_argument("--lr", type=finite_float(0.0, low_open=True), default=2e-4)
    p.add_argument("--batch-size", type=int_at_least(1), default=4)
    p.add_argument("--rank", "-r", type=int_at_least(1), default=8, help="LoRA rank r (default 8)")
    p.add_argument(
        "--alpha",
        type=finite_float(0.0, low_open=True),
        default=None,
        help="lora_alpha (default 2 * rank)",
    )
    p.add_argument(
        "--dropout",
        type=finite_float(0.0, 1.0, high_open=True),
        default=0.0,
        help="lora_dropout (default 0)",
    )
    p.add_argument(
        "--targets", default=DEFAULT_TARGETS, help="comma-separated module names, or all-linear"
    )
    p.add_argument(
        "--max-length", type=int_at_least(1), default=512, help="tokens per record (default 512)"
    )
    p.add_argument(
        "--on-bad-line", choices=["error", "skip"], default="error",
        help="a malformed JSONL line: stop with its line number (default) or skip it with a warning",
    )  # fmt: skip
    p.add_argument(
        "--on-long", choices=["truncate", "skip", "error"], default="truncate",
        help="a record longer than --max-length: truncate it (default, with a warning), skip, or stop",
    )  # fmt: skip
    p.add_argument("--resume", action="store_true", help="continue from --out/last.safetensors")
    p.add_argument(
        "--no-checkpointing", action="store_true",
        help="keep every layer's activations (faster, more memory) instead of recomputing them",
    )  # fmt: skip
    p.add_argument("--gguf", metavar="FILE", help="also write the adapter as a llama.cpp LoRA GGUF")
    p.add_argument("--threads", type=int_at_least(1), default=None)
    p.add_argument("--seed", type=int_at_least(0), default=0)


def run(args) -> int:
    """Fine-tune and write the adapter; returns the exit status."""
    import ember
    from ember.cli._llm import load
    from ember.errors import EmberError
    from ember.peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from ember.peft.data import batches, causal_lm_loss, encode_file
    from ember.peft.eval import read_eval_file
    from ember.train import Learner

    start = time.perf_counter()
    ember.manual_seed(args.seed)
    model, tok = load(args)
    context = int(getattr(model.config, "max_position_embeddings", args.max_length))
    max_len = min(args.max_length, context)
    kw = dict(on_error=args.on_bad_line, on_long=args.on_long)
    train = encode_file(tok, args.data, max_len, **kw)
    valid = encode_file(tok, args.valid, max_len, **kw) if args.valid else None
    held_out = read_eval_file(args.eval, args.on_bad_line) if args.eval else None
    before = _score(model, tok, held_out, "before") if held_out else None
    if not args.no_checkpointing:
        prepare_model_for_kbit_training(model)
    targets = args.targets if args.targets == "all-linear" else args.targets.split(",")
    cfg = LoraConfig(
        r=args.rank, lora_alpha=args.alpha if args.alpha is not None else 2 * args.rank,
        lora_dropout=args.dropout, target_modules=targets,
    )  # fmt: skip
    pm = get_peft_model(model, cfg)
    t, a = pm.get_nb_trainable_parameters()
    echo(f"{len(train)} training records; trainable params: {t:,} of {a:,} ({100 * t / a:.3f}%)")
    pad = tok.pad_token_id if getattr(tok, "pad_token_id", None) is not None else 0
    opt = ember.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=args.lr)
    learner = Learner(pm, opt, causal_lm_loss, out_dir=args.out)
    learner.fit(
        batches(train, args.batch_size, pad),
        batches(valid, args.batch_size, pad) if valid else None,
        epochs=args.epochs,
        resume=True if args.resume else None,
    )
    adapter_dir = os.path.join(args.out, "adapter")
    pm.save_pretrained(adapter_dir)
    echo(f"adapter written to {adapter_dir} (adapter_config.json, adapter_model.safetensors)")
    if held_out and not learner.interrupted:
        after = _score(pm, tok, held_out, "after")
        _write_eval(args, held_out, before, after, learner, time.perf_counter() - start)
    if args.gguf:
        try:
            from ember.peft import save_gguf_adapter

            save_gguf_adapter(pm, args.gguf)
            echo(f"llama.cpp adapter written to {args.gguf}")
        except EmberError as e:
            echo(f"no GGUF adapter: {e}")
            return 1
    return 130 if learner.interrupted else 0


def _score(model, tok, records, when: str):
    """Exact match on the held-out records, printed."""
    from ember.peft.eval import exact_match

    echo(f"scoring {len(records)} held-out records ({when} training) ...")
    r = exact_match(model, tok, records)
    echo(f"held-out exact match {when}: {r.accuracy:.1%} ({r.hits}/{r.total}, {r.seconds:.0f} s)")
    return r


def _write_eval(args, records, before, after, learner, seconds: float) -> None:
    """--out/eval.json (the scores) and --out/eval_answers.jsonl (every answer)."""
    from ember.peft.eval import split_record

    gain = 100 * (after.accuracy - before.accuracy)
    echo(
        f"held-out exact match: {before.accuracy:.1%} -> {after.accuracy:.1%} ({gain:+.1f} points)"
    )
    last = learner.history[-1] if learner.history else {}
    metrics = {
        "eval_file": str(args.eval),
        "before": before.summary(),
        "after": after.summary(),
        "gain_points": round(gain, 2),
        "epochs": learner.epoch,
        "train_loss": None if last.get("train_loss") is None else float(last["train_loss"]),
        "wall_seconds": round(seconds, 1),
    }
    out = Path(args.out)
    (out / "eval.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    rows = [
        {
            "reference": split_record(rec)[1],
            "before": before.answers[i],
            "after": after.answers[i],
            "match_before": before.matched[i],
            "match_after": after.matched[i],
        }
        for i, rec in enumerate(records)
    ]
    lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    (out / "eval_answers.jsonl").write_text(lines, encoding="utf-8")
    echo(f"scores written to {os.path.join(args.out, 'eval.json')} (answers: eval_answers.jsonl)")
