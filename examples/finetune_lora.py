"""QLoRA from Python: teach the bundled SmolLM2 (Q4_1, its weights stay quantized) an answer format.

The task: "Label: <word>" must be answered "[WORD]" (the word upper-cased in brackets), which the
instruct model does not do by itself. Training words and held-out words are disjoint; the script
prints the held-out exact-match accuracy before and after training, writes the adapter (peft's
files and a llama.cpp LoRA GGUF) and shows it loaded back.

    .venv/bin/python examples/finetune_lora.py [--epochs 2] [--train 80] [--test 30] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import random

import ember
from ember.generation.generate import generate_tokens
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
from ember.peft.data import batches, causal_lm_loss, encode_record
from ember.train import Learner

WORDS = """apple river stone cloud tiger lemon window garden pencil rocket silver forest
candle bridge planet coffee dragon market violin mirror island summer winter autumn spring
castle pepper butter guitar hammer ladder magnet needle orange parrot rabbit saddle tomato
velvet wallet yellow zipper anchor basket cactus donkey engine falcon ginger harbor igloo
jacket kettle lizard meadow napkin oyster pillow quartz ribbon spider tunnel umbrella valley
walnut yogurt bamboo cobalt desert ember fossil glacier helmet insect jungle koala lantern
marble nectar orchid pirate quiver rhythm sphinx temple unicorn vortex whisker xenon yacht
zebra almond beacon cinder dolphin eclipse feather goblin hollow iris jasmine kayak lotus
mango nutmeg olive pebble quill raven salmon thistle tulip urchin vanilla willow""".split()


def record(word: str) -> dict:
    """One chat record of the task."""
    return {"prompt": f"Label: {word}", "completion": f"[{word.upper()}]"}


def exact_match(model, tok, words: list[str]) -> float:
    """Share of words whose greedy answer is exactly "[WORD]"."""
    hits = 0
    for w in words:
        msgs = [{"role": "user", "content": f"Label: {w}"}]
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        out = []
        for (t,) in generate_tokens(model, ids, 8, stop_token_ids=[tok.eos_token_id]):
            if t is None or t == tok.eos_token_id:
                break
            out.append(t)
        hits += tok.decode(out, skip_special_tokens=True).strip() == f"[{w.upper()}]"
    return hits / len(words)


def main() -> None:
    """Train, score before and after, save and reload the adapter."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--train", type=int, default=80, help="training words")
    p.add_argument("--test", type=int, default=30, help="held-out words")
    p.add_argument("--out", default="finetune-example")
    args = p.parse_args()
    words = list(WORDS)
    random.Random(0).shuffle(words)
    test, train = words[: args.test], words[args.test : args.test + args.train]
    ember.manual_seed(0)

    model = AutoModelForCausalLM.from_pretrained(default_model_path())
    tok = Tokenizer.from_gguf_metadata(model.gguf_metadata)
    with ember.no_grad():
        before = exact_match(model, tok, test)
    print(f"held-out exact match before: {before:.0%}")

    prepare_model_for_kbit_training(model)  # freeze, gradient checkpointing
    pm = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    pm.print_trainable_parameters()
    examples = [encode_record(tok, record(w)) for w in train]
    opt = ember.optim.AdamW([q for q in pm.parameters() if q.requires_grad], lr=2e-3)
    Learner(pm, opt, causal_lm_loss, out_dir=args.out).fit(batches(examples, 8), epochs=args.epochs)

    pm.eval()
    with ember.no_grad():
        after = exact_match(pm, tok, test)
    print(f"held-out exact match after: {after:.0%} ({100 * (after - before):+.0f} points)")

    adapter = os.path.join(args.out, "adapter")
    pm.save_pretrained(adapter)  # peft: PeftModel.from_pretrained(hf_model, adapter)
    save_gguf_adapter(pm, os.path.join(args.out, "adapter.gguf"))  # llama.cpp: --lora FILE
    fresh = AutoModelForCausalLM.from_pretrained(default_model_path())
    again = PeftModel.from_pretrained(fresh, adapter)
    gguf = load_gguf_adapter(AutoModelForCausalLM.from_pretrained(default_model_path()),
                             os.path.join(args.out, "adapter.gguf"))  # fmt: skip
    with ember.no_grad():
        print(f"reloaded: {exact_match(again, tok, test[:10]):.0%} / GGUF: "
              f"{exact_match(gguf, tok, test[:10]):.0%} on the first 10 held-out words")  # fmt: skip


if __name__ == "__main__":
    main()
