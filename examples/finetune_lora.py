"""QLoRA from Python: teach the bundled SmolLM2 (Q4_1, its weights stay quantized) a task.

The task is examples/data/orders (written by examples/data/make_orders.py): a customer's message
must be answered with the order as one line of JSON, ``{"item": ..., "qty": ..., "city": ...}``,
which the instruct model does not do by itself. The held-out records name items and cities that
no training record does. The script scores the held-out exact match before and after training
(``ember.peft.eval.exact_match``, as ``ember finetune --eval`` does), writes the adapter (peft's
files and a llama.cpp LoRA GGUF) and shows both loaded back.

    .venv/bin/python examples/finetune_lora.py [--epochs 1] [--lr 2e-3] [--batch-size 8]
        [--checkpointing] [--data examples/data/orders] [--out DIR]

The defaults are those of the `ember finetune --eval` run in docs/finetuning.md.
"""

from __future__ import annotations

import argparse
import os

import ember
from ember.generation.tokenizer import Tokenizer
from ember.models import AutoModelForCausalLM
from ember.models.hub import default_model_path
from ember.peft import (
    LoraConfig,
    PeftModel,
    get_peft_model,
    load_gguf_adapter,
    prepare_model_for_kbit_training,
    save_gguf_adapter,
)
from ember.peft.data import batches, causal_lm_loss, encode_file
from ember.peft.eval import exact_match, read_eval_file, split_record
from ember.train import Learner

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "orders")


def main() -> None:
    """Train, score before and after, save and reload the adapter."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument(
        "--checkpointing", action="store_true", help="gradient checkpointing (less memory, slower)"
    )
    p.add_argument("--data", default=DATA, help="folder with train.jsonl and test.jsonl")
    p.add_argument("--out", default="finetune-example")
    args = p.parse_args()
    ember.manual_seed(0)

    model = AutoModelForCausalLM.from_pretrained(default_model_path())
    tok = Tokenizer.from_gguf_metadata(model.gguf_metadata)
    train = encode_file(tok, os.path.join(args.data, "train.jsonl"), max_length=512)
    test = read_eval_file(os.path.join(args.data, "test.jsonl"))
    before = exact_match(model, tok, test)  # greedy, batched; the model's eval mode
    print(f"held-out exact match before: {before.accuracy:.1%} ({before.hits}/{before.total})")

    prepare_model_for_kbit_training(model, use_gradient_checkpointing=args.checkpointing)
    pm = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    pm.print_trainable_parameters()
    opt = ember.optim.AdamW([q for q in pm.parameters() if q.requires_grad], lr=args.lr)
    learner = Learner(pm, opt, causal_lm_loss, out_dir=args.out)
    learner.fit(batches(train, args.batch_size), epochs=args.epochs)

    after = exact_match(pm, tok, test)
    gain = 100 * (after.accuracy - before.accuracy)
    print(f"held-out exact match after: {after.accuracy:.1%} ({after.hits}/{after.total}, "
          f"{gain:+.1f} points)")  # fmt: skip
    for rec, answer, ok in list(zip(test, after.answers, after.matched))[:3]:
        question = split_record(rec)[0][-1]["content"]
        print(f"  {question!r} -> {answer} {'ok' if ok else 'MISS'}")

    adapter = os.path.join(args.out, "adapter")
    pm.save_pretrained(adapter)  # peft: PeftModel.from_pretrained(hf_model, adapter)
    save_gguf_adapter(pm, os.path.join(args.out, "adapter.gguf"))  # llama.cpp: --lora FILE
    again = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(default_model_path()),
                                      adapter)  # fmt: skip
    gguf = load_gguf_adapter(AutoModelForCausalLM.from_pretrained(default_model_path()),
                             os.path.join(args.out, "adapter.gguf"))  # fmt: skip
    first = test[:10]
    print(f"reloaded: {exact_match(again, tok, first).accuracy:.0%} / GGUF: "
          f"{exact_match(gguf, tok, first).accuracy:.0%} on the first 10 held-out records")  # fmt: skip


if __name__ == "__main__":
    main()
