"""The OpenAI request bodies ember accepts: checked field by field into plain dataclasses.

Every mistake becomes an `APIError` carrying the HTTP status and the OpenAI error JSON
(`{"error": {"message", "type", "param", "code"}}`); nothing here touches the model. Fields the
OpenAI API defines but ember does not implement are refused with a 400 that names them, never
silently ignored; fields it does not know at all are ignored, as OpenAI's own server does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ember.errors import EmberError
from ember.generation.sampling import SamplingParams

MAX_STOP = 4  # OpenAI's limit on stop strings
MAX_TOP_LOGPROBS = 20  # chat; completions allow 5
ROLES = ("system", "user", "assistant", "tool", "developer")


class APIError(EmberError):
    """A request the server refuses: HTTP status plus the OpenAI error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type,
            param,
            code,
        )
        self.headers = headers or {}

    def body(self) -> dict:
        """The OpenAI error JSON."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """A 400 invalid_request_error."""
    return APIError(400, message, param=param, code=code)


def json_object(body: Any) -> dict:
    """body, which must be a JSON object (a 400 otherwise)."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    return body


def unknown_model(model: Any, served: str) -> APIError:
    """The 404 for a model name other than the one this route serves."""
    return APIError(
        404,
        f"the model '{model}' does not exist; this server serves '{served}'",
        param="model",
        code="model_not_found",
    )


@dataclass
class ModelLimits:
    """What request checks need to know about the loaded model."""

    name: str
    context_length: int
    max_n: int = 16
    encode: Callable[[str], list[int]] = field(default=lambda s: [])  # a rendered chat prompt
    encode_prompt: Callable[[str], list[int]] = field(default=lambda s: [])  # a completion prompt
    render_chat: Callable[[list[dict]], str] = field(default=lambda m: "")
    vocab_size: int = 1 << 30


@dataclass
class GenerationRequest:
    """A checked chat or text completion: prompts as token ids and how to continue them."""

    prompts: list[list[int]]
    n: int
    max_tokens: list[int]  # per prompt (the context left when the client gave none)
    sampling: SamplingParams
    stop: list[str]
    logprobs: int | None  # None: off; k >= 0: the chosen token's logprob and the top k
    stream: bool
    include_usage: bool
    model: str
    ignore_eos: bool = False
    grammar: str | None = None  # llguidance grammar from response_format (structured output)


# --- field readers ---------------------------------------------------------------------------


def _type_name(t: type | tuple) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "a boolean"}
    ts = t if isinstance(t, tuple) else (t,)
    return " or ".join(names.get(x, x.__name__) for x in ts)


def _get(body: dict, name: str, types: type | tuple, default: Any = None) -> Any:
    """body[name] checked against types (bool is not a number); default when absent or null."""
    v = body.get(name)
    if v is None:
        return default
    ts = types if isinstance(types, tuple) else (types,)
    if isinstance(v, bool) and bool not in ts:
        ok = False
    elif float in ts and isinstance(v, int):
        ok, v = True, float(v)
    else:
        ok = isinstance(v, ts)
    if not ok:
        raise bad(f"'{name}' must be {_type_name(types)}, got {type(v).__name__}", name)
    return v


def _in_range(name: str, v: float, lo: float, hi: float, lo_open: bool = False) -> None:
    if v < lo or v > hi or (lo_open and v == lo):
        left = "(" if lo_open else "["
        raise bad(f"'{name}' must be in {left}{lo}, {hi}], got {v}", name)


def _sampling(body: dict, extra_top_k: bool = True) -> SamplingParams:
    temperature = _get(body, "temperature", float, 1.0)
    _in_range("temperature", temperature, 0.0, 2.0)
    top_p = _get(body, "top_p", float, 1.0)
    _in_range("top_p", top_p, 0.0, 1.0, lo_open=True)
    top_k = _get(body, "top_k", int, 0)
    if top_k < -1:
        raise bad(f"'top_k' must be -1, 0 (off) or positive, got {top_k}", "top_k")
    min_p = _get(body, "min_p", float, 0.0)
    if not 0.0 <= min_p < 1.0:
        raise bad(f"'min_p' must be in [0, 1), got {min_p}", "min_p")
    presence = _get(body, "presence_penalty", float, 0.0)
    _in_range("presence_penalty", presence, -2.0, 2.0)
    frequency = _get(body, "frequency_penalty", float, 0.0)
    _in_range("frequency_penalty", frequency, -2.0, 2.0)
    repetition = _get(body, "repetition_penalty", float, 1.0)
    if repetition <= 0:
        raise bad(f"'repetition_penalty' must be > 0, got {repetition}", "repetition_penalty")
    seed = _get(body, "seed", int)
    return SamplingParams(
        temperature=temperature,
        top_k=max(top_k, 0),
        top_p=top_p,
        min_p=min_p,
        repetition_penalty=repetition,
        presence_penalty=presence,
        frequency_penalty=frequency,
        seed=seed,
    )


def _stop(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise bad("'stop' must be a string or a list of strings", "stop")
    if len(v) > MAX_STOP:
        raise bad(f"'stop' takes at most {MAX_STOP} strings, got {len(v)}", "stop")
    return [s for s in v if s]


def _unsupported(body: dict, names: Sequence[str]) -> None:
    for name in names:
        v = body.get(name)
        if v not in (None, False, [], {}):
            raise bad(f"'{name}' is not supported by this server", name, "unsupported")


def response_format(body: dict) -> str | None:
    """The llguidance grammar that `response_format` asks for (None: free text)."""
    rf = body.get("response_format")
    param = "response_format"
    if rf is None:
        return None
    if not isinstance(rf, dict):
        raise bad("'response_format' must be an object such as {'type': 'json_object'}", param)
    kind = rf.get("type")
    if kind == "text":
        return None
    schema = None
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict):
            raise bad(
                "'response_format.json_schema' must be an object with 'name' and 'schema'", param
            )
        if not isinstance(js.get("name"), str) or not js["name"]:
            raise bad("'response_format.json_schema.name' must be a non-empty string", param)
        if js.get("strict") is not None and not isinstance(js["strict"], bool):
            raise bad("'response_format.json_schema.strict' must be a boolean", param)
        schema = js.get("schema")
        if not isinstance(schema, dict):
            got = "nothing" if schema is None else type(schema).__name__
            raise bad(
                f"'response_format.json_schema.schema' must be a JSON Schema object, got {got}",
                param,
            )
    elif kind != "json_object":
        raise bad(
            f"'response_format.type' must be 'text', 'json_object' or 'json_schema', got {kind!r}",
            param,
        )
    from ember.serve.structured import GrammarError, grammar_for

    try:
        return grammar_for(kind, schema)
    except GrammarError as e:
        raise bad(str(e), param) from e


def _max_tokens(body: dict, prompt_len: int, limits: ModelLimits, param_prompt: str) -> int:
    name = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    mt = _get(body, name, int)
    ctx = limits.context_length
    if prompt_len >= ctx:
        raise bad(
            f"the prompt is {prompt_len} tokens; this model's context is {ctx} tokens",
            param_prompt,
            "context_length_exceeded",
        )
    if mt is None:
        return ctx - prompt_len
    if mt < 1:
        raise bad(f"'{name}' must be at least 1, got {mt}", name)
    if mt > ctx:
        raise bad(f"'{name}' is {mt}; this model's context is {ctx} tokens", name)
    if prompt_len + mt > ctx:
        raise bad(
            f"the prompt ({prompt_len} tokens) plus '{name}' ({mt}) is past this model's "
            f"context of {ctx} tokens",
            name,
            "context_length_exceeded",
        )
    return mt


def _common(body: Any, limits: ModelLimits) -> tuple[str, int, bool, bool]:
    json_object(body)
    model = _get(body, "model", str, limits.name)
    if model != limits.name:
        raise unknown_model(model, limits.name)
    n = _get(body, "n", int, 1)
    if not 1 <= n <= limits.max_n:
        raise bad(f"'n' must be between 1 and {limits.max_n}, got {n}", "n")
    stream = _get(body, "stream", bool, False)
    opts = _get(body, "stream_options", dict, {})
    include_usage = _get(opts, "include_usage", bool, False)
    if opts and not stream:
        raise bad("'stream_options' is only allowed when 'stream' is true", "stream_options")
    return model, n, stream, include_usage


# --- chat ------------------------------------------------------------------------------------


def _message_text(i: int, content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise bad(
                    f"messages[{i}].content: only text parts are supported",
                    f"messages[{i}].content",
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise bad(f"messages[{i}].content: a text part needs a string 'text'")
            parts.append(text)
        return "".join(parts)
    raise bad(f"messages[{i}].content must be a string or a list of text parts")


def chat_messages(body: dict) -> list[dict]:
    """The conversation as plain {role, content} dicts (text parts joined)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        raise bad("'messages' must be a list of messages", "messages")
    if not msgs:
        raise bad("'messages' must not be empty", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}] must be an object", "messages")
        role = m.get("role")
        if role not in ROLES:
            raise bad(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}")
        content = m.get("content")
        text = "" if content is None and role == "assistant" else _message_text(i, content)
        out.append({"role": "system" if role == "developer" else role, "content": text})
    return out


def parse_chat(body: Any, limits: ModelLimits) -> GenerationRequest:
    """Check a /v1/chat/completions body and render its prompt."""
    model, n, stream, include_usage = _common(body, limits)
    _unsupported(body, ("tools", "functions", "logit_bias", "audio", "prediction"))
    messages = chat_messages(body)
    try:
        prompt_text = limits.render_chat(messages)
    except EmberError:
        raise
    except Exception as e:  # the model's own template refusing the conversation
        raise bad(f"the chat template refused these messages: {e}", "messages") from e
    prompt = limits.encode(prompt_text)
    logprobs = None
    if _get(body, "logprobs", bool, False):
        k = _get(body, "top_logprobs", int, 0)
        if not 0 <= k <= MAX_TOP_LOGPROBS:
            raise bad(f"'top_logprobs' must be in [0, {MAX_TOP_LOGPROBS}], got {k}", "top_logprobs")
        logprobs = k
    elif body.get("top_logprobs") is not None:
        raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return _request(body, limits, [prompt], "messages", model, n, stream, include_usage, logprobs)


# --- completions -----------------------------------------------------------------------------


def _is_ids(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)


def completion_prompts(body: dict, limits: ModelLimits) -> list[list[int]]:
    """The prompt(s) as token ids: a string, a list of strings, ids, or a list of id lists."""
    p = body.get("prompt")
    if isinstance(p, str):
        prompts = [limits.encode_prompt(p)]
    elif _is_ids(p) and p:
        prompts = [list(p)]
    elif isinstance(p, list) and p and all(isinstance(x, str) for x in p):
        prompts = [limits.encode_prompt(x) for x in p]
    elif isinstance(p, list) and p and all(_is_ids(x) for x in p):
        prompts = [list(x) for x in p]
    else:
        raise bad(
            "'prompt' must be a string, a list of strings, a list of token ids or a list of "
            "token id lists (not empty)",
            "prompt",
        )
    for ids in prompts:
        if not ids:
            raise bad("'prompt' must not be empty", "prompt")
        if any(not 0 <= t < limits.vocab_size for t in ids):
            raise bad(f"'prompt' has token ids outside [0, {limits.vocab_size})", "prompt")
    return prompts


def parse_completion(body: Any, limits: ModelLimits) -> GenerationRequest:
    """Check a /v1/completions body."""
    model, n, stream, include_usage = _common(body, limits)
    _unsupported(body, ("logit_bias", "suffix"))
    if _get(body, "echo", bool, False):
        raise bad("'echo' is not supported by this server", "echo", "unsupported")
    best_of = _get(body, "best_of", int)
    if best_of is not None and best_of != n:
        raise bad("'best_of' other than n is not supported by this server", "best_of")
    prompts = completion_prompts(body, limits)
    if len(prompts) * n > limits.max_n:
        raise bad(f"{len(prompts)} prompts x n={n} is more than {limits.max_n} sequences", "prompt")
    logprobs = _get(body, "logprobs", int)
    if logprobs is not None and not 0 <= logprobs <= 5:
        raise bad(f"'logprobs' must be in [0, 5], got {logprobs}", "logprobs")
    return _request(body, limits, prompts, "prompt", model, n, stream, include_usage, logprobs)


def _request(body, limits, prompts, param, model, n, stream, include_usage, logprobs):
    """The GenerationRequest of a checked chat or completion body (its shared fields)."""
    return GenerationRequest(
        prompts=prompts,
        n=n,
        max_tokens=[_max_tokens(body, len(p), limits, param) for p in prompts],
        sampling=_sampling(body),
        stop=_stop(body),
        logprobs=logprobs,
        stream=stream,
        include_usage=include_usage,
        model=model,
        ignore_eos=_get(body, "ignore_eos", bool, False),
        grammar=response_format(body),
    )
