"""Options, checks, loading and the streamed completion shared by `ember generate` and `chat`."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ember.cli._args import finite_float, int_at_least, non_empty
from ember.errors import EmberError

# `ember chat` samples as ollama does by default (its Modelfile defaults); `generate` is greedy
CHAT_SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.0, "repeat_penalty": 1.1}
DEFAULT_MAX_TOKENS = 256  # when --max-tokens is not given (less if the context has less room)
GREEDY = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0}


@dataclass(frozen=True)
class LoraSpec:
    """One --lora FILE[:SCALE]: the adapter's path as given and its scale."""

    path: str
    scale: float = 1.0

    def describe(self) -> dict:
        """The adapter as /v1/models and --json report it."""
        return {"path": self.path, "scale": self.scale}


def lora_spec(text: str) -> LoraSpec:
    """An argparse type: FILE[:SCALE], SCALE a finite number (default 1); a path is never split."""
    if text == "":
        raise argparse.ArgumentTypeError("expected FILE[:SCALE], got an empty string")
    path, colon, tail = text.rpartition(":")
    # "C:\\a.gguf" and "dir:x/a.gguf" have no scale; neither has a file whose name holds ':'
    if not colon or "/" in tail or "\\" in tail or Path(text).expanduser().exists():
        return LoraSpec(text)
    if not path:
        raise argparse.ArgumentTypeError(f"expected FILE[:SCALE], got {text!r} (no FILE)")
    try:
        scale = float(tail)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"SCALE must be a number, got {tail!r} in {text!r} (FILE[:SCALE])"
        ) from None
    if not math.isfinite(scale):
        raise argparse.ArgumentTypeError(f"SCALE must be finite, got {tail!r} in {text!r}")
    return LoraSpec(path, scale)


lora_spec.__name__ = "FILE[:SCALE]"


def add_lora(p: argparse.ArgumentParser) -> None:
    """--lora FILE[:SCALE] (repeatable), as llama.cpp's --lora / --lora-scaled."""
    p.add_argument(
        "--lora",
        action="append",
        default=[],
        type=lora_spec,
        metavar="FILE[:SCALE]",
        help="apply a LoRA adapter: a llama.cpp LoRA GGUF or a peft adapter folder, its update "
        "times SCALE (default 1); repeatable, the adapters add up. They stay unmerged beside "
        "the (quantized) base weights, as llama.cpp keeps them",
    )


def check_loras(specs: Sequence[LoraSpec]) -> list[tuple[LoraSpec, str]]:
    """(spec, 'gguf' | 'peft') per --lora, or an EmberError naming the flag (headers read only)."""
    from ember.peft.adapters import locate_adapter

    out = []
    for spec in specs:
        try:
            kind, _ = locate_adapter(spec.path)
        except FileNotFoundError:
            raise EmberError(f"--lora {spec.path!r}: no such file or folder") from None
        except OSError as e:
            raise EmberError(f"--lora {spec.path!r}: {e.strerror or e}") from None
        except EmberError as e:
            raise _naming_flag(e, spec.path) from None
        out.append((spec, kind))
    return out


def _naming_flag(e: EmberError, path: str) -> EmberError:
    """The same kind of error, its message as '--lora <path>: reason' (the path said once)."""
    message = str(e)
    message = f"--lora {message if message.startswith(path) else f'{path}: {message}'}"
    try:
        return type(e)(message)
    except TypeError:  # an error class with other constructor arguments
        return EmberError(message)


def apply_loras(model, specs: Sequence[LoraSpec]):
    """The model with every --lora adapter on it (unmerged; the model itself when none)."""
    if not specs:
        return model
    from ember.peft.adapters import load_adapter

    adapted = model
    for spec in specs:
        try:
            adapted = load_adapter(adapted, spec.path, spec.scale)
        except FileNotFoundError:
            raise EmberError(f"--lora {spec.path!r}: no such file or folder") from None
        except EmberError as e:
            raise _naming_flag(e, spec.path) from None
    # the adapted module tree itself: the wrapper adds a call and attribute look-ups per step
    return adapted.get_base_model()


def add_model_and_sampling(p: argparse.ArgumentParser, defaults: dict | None = None) -> None:
    """--model, --lora, --threads, --max-tokens, --stop, --stats and every sampler option."""
    d = {**GREEDY, **(defaults or {})}
    p.add_argument(
        "--model",
        help="GGUF file or Hugging Face folder (default: the bundled SmolLM2-135M-Instruct)",
    )
    add_lora(p)
    p.add_argument(
        "--max-tokens",
        type=int_at_least(1),
        default=None,
        metavar="N",
        help=f"most new tokens (default {DEFAULT_MAX_TOKENS}, or the room left in the context)",
    )
    p.add_argument(
        "--temperature",
        type=finite_float(0.0),
        default=d["temperature"],
        metavar="T",
        help=f"0 = greedy (default {d['temperature']:g})",
    )
    p.add_argument(
        "--top-k",
        type=int_at_least(0),
        default=d["top_k"],
        metavar="K",
        help=f"keep the K most likely tokens, 0 = all (default {d['top_k']})",
    )
    p.add_argument(
        "--top-p",
        type=finite_float(0.0, 1.0, low_open=True),
        default=d["top_p"],
        metavar="P",
        help=f"nucleus sampling, in (0, 1] (default {d['top_p']:g})",
    )
    p.add_argument(
        "--min-p",
        type=finite_float(0.0, 1.0),
        default=d["min_p"],
        metavar="P",
        help=f"drop tokens below P x the top probability, in [0, 1] (default {d['min_p']:g})",
    )
    p.add_argument(
        "--repeat-penalty",
        type=finite_float(0.0, low_open=True),
        default=d["repeat_penalty"],
        metavar="R",
        help=f"> 0; 1 = off (default {d['repeat_penalty']:g})",
    )
    p.add_argument(
        "--presence-penalty", type=finite_float(), default=0.0, metavar="X", help="(default 0)"
    )
    p.add_argument(
        "--frequency-penalty", type=finite_float(), default=0.0, metavar="X", help="(default 0)"
    )
    p.add_argument(
        "--seed", type=int_at_least(0), default=None, help="seed for sampling (default: random)"
    )
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        type=non_empty("a --stop string"),
        metavar="TEXT",
        help="stop before this text (repeatable)",
    )
    p.add_argument(
        "--threads", type=int_at_least(1), default=None, help="CPU threads (default: all cores)"
    )
    p.add_argument(
        "--parse-special",
        action="store_true",
        help="let control-token strings typed in the prompt (<|im_start|>, <s>, [INST] ...) "
        "become control tokens (default: they are plain text)",
    )
    p.add_argument(
        "--stats",
        action="store_true",
        help="print prompt and generated tokens, tokens/s and time to first token on stderr",
    )


def sampling_from(args):
    """SamplingParams from parsed (already checked) options."""
    from ember.generation.sampling import SamplingParams

    temperature = args.temperature
    min_p = args.min_p
    if min_p >= 1.0:
        # min-p 1 keeps only the most likely token: that is greedy decoding (SamplingParams
        # itself takes min_p < 1)
        temperature, min_p = 0.0, 0.0
    return SamplingParams(
        temperature=temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=min_p,
        repetition_penalty=args.repeat_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        seed=args.seed,
    )


def load(args):
    """(model, tokenizer) from --model or the bundled default, with the --lora adapters on."""
    from ember.generation.tokenizer import Tokenizer
    from ember.models import AutoModelForCausalLM
    from ember.models.hub import resolve

    loras = getattr(args, "lora", None) or []
    if args.threads:
        import ember

        ember.set_num_threads(args.threads)
    path = resolve(args.model)
    check_loras(loras)  # before the model: a wrong path fails at once
    model = AutoModelForCausalLM.from_pretrained(path)
    if getattr(model, "gguf_metadata", None) is not None:
        tok = Tokenizer.from_gguf_metadata(model.gguf_metadata)
    else:
        tok = Tokenizer.from_pretrained(path)
    return apply_loras(model, loras), tok


def context_of(model) -> int:
    """The model's context length in tokens."""
    return int(getattr(model.config, "max_position_embeddings", 1 << 30))


def check_fits(n_prompt: int, max_tokens: int, context: int) -> None:
    """An EmberError naming the flags when the prompt and --max-tokens overflow the context."""
    if max_tokens >= context:
        raise EmberError(
            f"--max-tokens {max_tokens} leaves no room for the prompt in the model's context "
            f"of {context} tokens"
        )
    if n_prompt + max_tokens > context:
        raise EmberError(
            f"the prompt ({n_prompt} tokens) and --max-tokens {max_tokens} exceed the model's "
            f"context of {context} tokens; shorten the prompt or lower --max-tokens"
        )


def budget(max_tokens: int | None, n_prompt: int, context: int) -> int:
    """How many tokens to generate: --max-tokens checked against the context, or the default."""
    if max_tokens is not None:
        check_fits(n_prompt, max_tokens, context)
        return max_tokens
    room = context - n_prompt
    if room < 1:
        raise EmberError(
            f"the prompt ({n_prompt} tokens) fills the model's context of {context} tokens; "
            "shorten the prompt"
        )
    return min(DEFAULT_MAX_TOKENS, room)


def chat_ids(tok, messages: Sequence[dict], parse_special: bool = False) -> list[int]:
    """Ids of a conversation in the chat template (only its scaffolding makes control ids)."""
    return tok.apply_chat_template(
        list(messages), add_generation_prompt=True, tokenize=True, parse_special=parse_special
    )


def text_ids(tok, text: str, parse_special: bool = False) -> list[int]:
    """Token ids of a raw prompt (bos/eos as the model's config says; control strings as text)."""
    return tok.encode(text, add_special_tokens=True, parse_special=parse_special)


@dataclass
class Completion:
    """What one streamed completion produced, and how fast."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (end of turn or a --stop string) or "length" (--max-tokens)
    first_token_s: float
    total_s: float

    def timings(self) -> dict:
        """Seconds and rates, as in --json output."""
        decode_s = self.total_s - self.first_token_s
        rate = (self.completion_tokens - 1) / decode_s if self.completion_tokens > 1 else None
        return {
            "time_to_first_token_s": round(self.first_token_s, 4),
            "total_s": round(self.total_s, 4),
            "tokens_per_s": round(rate, 2) if rate is not None and decode_s > 0 else None,
        }

    def stats_line(self) -> str:
        """One human-readable line for --stats."""
        t = self.timings()
        rate = f", {t['tokens_per_s']:.1f} tokens/s" if t["tokens_per_s"] is not None else ""
        return (
            f"[prompt {self.prompt_tokens} tokens; {self.completion_tokens} tokens in "
            f"{self.total_s:.2f} s{rate}; time to first token {self.first_token_s:.3f} s]"
        )


def complete(
    model,
    tok,
    ids: list[int],
    max_tokens: int,
    args,
    write: Callable[[str], None] | None = None,
) -> Completion:
    """Up to max_tokens after `ids`, calling write(piece) as text comes (never a --stop string)."""
    from ember.generation.generate import _stop_split, generate_tokens

    stop_ids = tok.eos_token_ids
    dec = tok.stream(skip_special_tokens=True)
    text, sent, count, finish, hit = "", 0, 0, "length", False
    t0 = time.perf_counter()
    first = None

    def emit(upto: str) -> None:
        nonlocal sent
        if len(upto) > sent:
            if write is not None:
                write(upto[sent:])
            sent = len(upto)

    for (token,) in generate_tokens(model, ids, max_tokens, sampling_from(args), stop_ids):
        if first is None:
            first = time.perf_counter() - t0
        if token is None or token in stop_ids:
            finish = "stop"
            break
        count += 1
        text += dec.put(token)
        keep, hit, hold = _stop_split(text, args.stop)
        emit(keep if hit else keep[: len(keep) - hold])
        if hit:
            finish, text = "stop", keep
            break
    if not hit:
        text, hit, _ = _stop_split(text + dec.flush(), args.stop)
        finish = "stop" if hit else finish
        emit(text)
    total = time.perf_counter() - t0
    return Completion(text, len(ids), count, finish, first or total, total)
