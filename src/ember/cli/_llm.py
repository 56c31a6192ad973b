"""Options and loading shared by `ember generate` and `ember chat`."""

from __future__ import annotations

import argparse


def add_model_and_sampling(p: argparse.ArgumentParser) -> None:
    """--model and every sampler option."""
    p.add_argument(
        "--model",
        help="GGUF file or Hugging Face folder (default: the bundled SmolLM2-135M-Instruct)",
    )
    p.add_argument("--max-tokens", type=int, default=256, help="most new tokens (default 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")


def sampling_from(args):
    """SamplingParams from parsed options."""
    from ember.generation.sampling import SamplingParams

    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repeat_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        seed=args.seed,
    )


def load(args):
    """(model, tokenizer) from --model or the bundled default."""
    from ember.generation.tokenizer import Tokenizer
    from ember.models import AutoModelForCausalLM
    from ember.models.hub import resolve

    if args.threads:
        import ember

        ember.set_num_threads(args.threads)
    path = resolve(args.model)
    model = AutoModelForCausalLM.from_pretrained(path)
    if getattr(model, "gguf_metadata", None) is not None:
        tok = Tokenizer.from_gguf_metadata(model.gguf_metadata)
    else:
        tok = Tokenizer.from_pretrained(path)
    return model, tok
