"""Chat templates: render a conversation to a prompt string with jinja2, the way transformers does.

A chat template is untrusted code from a model file, so it runs in jinja2's
`ImmutableSandboxedEnvironment` with the same settings and helpers as transformers'
`apply_chat_template` (trim_blocks, lstrip_blocks, loopcontrols, `raise_exception`,
`strftime_now`, a `tojson` that keeps non-ASCII text, safe `dict` and `namespace`). The same
template and messages therefore render to the same string in ember and in transformers.

The rendered prompt is a `ChatPrompt`: a str that also remembers where control-token strings
(`<|im_start|>`, `<s>`, ...) written by the user ended up, so that the tokenizer turns only the
template's own scaffolding into control ids (llama.cpp's `parse_special`, per span). Before
rendering, each such string in the conversation's data is wrapped in two marker characters that
appear nowhere else; after rendering, the markers are removed and their places recorded. Only the
control-token strings are wrapped, never whole messages, so template filters such as `trim` or
`split` see the same text as without markers (a test on the token itself, such as
`content.startswith('<|im_end|>')`, or slicing by position sees the markers, as with
transformers' `sanitize_control_tokens`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from ember.errors import FormatError

# transformers' old default, used when a model ships no template of its own.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _raise_exception(message: str) -> None:
    """Template helper: abort rendering with the template's own message."""
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """Template filter: JSON without jinja's HTML escaping (as transformers overrides it)."""
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    """Template helper: the current local time formatted with `fmt`."""
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """`dict(...)` for templates, without exposing the `dict` type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        """Build a plain dict."""
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        """`dict.fromkeys`."""
        return dict.fromkeys(*args, **kwargs)


@lru_cache(maxsize=32)
def compile_chat_template(template: str) -> Any:
    """Compile a chat template into a sandboxed jinja2 Template (cached per template string)."""
    import jinja2
    import jinja2.ext
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Namespace(jinja2.utils.Namespace):
        """A jinja namespace that refuses underscore attributes (no route to CPython internals)."""

        def __init__(*args: Any, **kwargs: Any) -> None:
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                _Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            _Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot set underscore attributes on a namespace: {name!r}"
                )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise FormatError(f"chat template does not parse: {e} (line {e.lineno})") from e


def _plain(value: Any) -> Any:
    """Rebuild `value` from plain JSON-like types, so the sandbox sees no foreign objects."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _plain(value.item())
    return f"<{type(value).__name__}>"


class ChatPrompt(str):
    """A rendered chat prompt: the text, plus the spans of control-token strings the user wrote.

    `text_spans` holds (start, end) character ranges that `Tokenizer.encode` keeps as text; the
    rest is parsed for control tokens. String operations (`+`, slicing, formatting) return a
    plain str, which `encode` treats as user text throughout.
    """

    text_spans: tuple[tuple[int, int], ...]

    def __new__(cls, text: str, text_spans: Sequence[tuple[int, int]] = ()) -> ChatPrompt:
        """Wrap `text`; `text_spans` are the ranges to keep as text."""
        self = super().__new__(cls, text)
        self.text_spans = tuple((int(a), int(b)) for a, b in text_spans)
        return self

    def __reduce__(self) -> tuple:
        """Pickle with the spans."""
        return (ChatPrompt, (str(self), self.text_spans))


@lru_cache(maxsize=32)
def _token_pattern(tokens: tuple[str, ...]) -> re.Pattern:
    """A regex matching any of `tokens`, longest first."""
    return re.compile("|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True)))


def _strings_of(value: Any, out: list[str]) -> list[str]:
    """Every str inside `value` (dict keys and values, list items), appended to `out`."""
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            _strings_of(k, out)
            _strings_of(v, out)
    elif isinstance(value, list):
        for v in value:
            _strings_of(v, out)
    return out


def _markers(texts: Sequence[str]) -> tuple[str, str]:
    """Two private-use characters that occur in none of `texts`."""
    joined = "".join(texts)
    for cp in range(0xE000, 0xF8FF, 2):
        if chr(cp) not in joined and chr(cp + 1) not in joined:
            return chr(cp), chr(cp + 1)
    raise FormatError("chat data uses every private-use character; cannot mark control tokens")


def _mark(value: Any, pattern: re.Pattern, open_: str, close: str) -> Any:
    """`value` with every match of `pattern` in its strings wrapped in the two markers."""
    if isinstance(value, str):
        return pattern.sub(lambda m: open_ + m.group(0) + close, value)
    if isinstance(value, dict):
        return {
            _mark(k, pattern, open_, close): _mark(v, pattern, open_, close)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_mark(v, pattern, open_, close) for v in value]
    return value


def _unmark(text: str, open_: str, close: str) -> ChatPrompt:
    """Remove the markers; the ranges they enclosed become the prompt's text spans.

    A marker the template cut off (an opening one without its closing one) protects the text up
    to the end, so a lost marker can only make more of the prompt plain text.
    """
    parts = re.split(f"([{re.escape(open_)}{re.escape(close)}])", text)
    clean: list[str] = []
    spans: list[tuple[int, int]] = []
    at, depth, start = 0, 0, 0
    for part in parts:
        if part == open_:
            if depth == 0:
                start = at
            depth += 1
        elif part == close:
            if depth > 0:
                depth -= 1
                if depth == 0 and at > start:
                    spans.append((start, at))
        else:
            clean.append(part)
            at += len(part)
    if depth > 0 and at > start:
        spans.append((start, at))
    return ChatPrompt("".join(clean), spans)


def _normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Messages as plain dicts, without keys whose value is None (OpenAI's `content=None`)."""
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(f"chat message {i} should be a dict, got {type(message).__name__}")
        out.append({k: _plain(v) for k, v in message.items() if v is not None})
    return out


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    literal_tokens: Collection[str] = (),
    **variables: Any,
) -> ChatPrompt:
    """Render `messages` with a chat template; `variables` (bos_token, ...) are passed on.

    Occurrences of `literal_tokens` (the tokenizer's control-token strings) in the messages,
    tools and documents are recorded in the result's `text_spans`, so they encode as text.
    """
    compiled = compile_chat_template(template)
    data = {
        "messages": _normalize_messages(messages),
        "tools": _plain(tools),
        "documents": _plain(documents),
    }
    variables = {k: _plain(v) for k, v in variables.items()}
    tokens = tuple(sorted({t for t in literal_tokens if t}))
    if not tokens:
        text = compiled.render(**data, add_generation_prompt=add_generation_prompt, **variables)
        return ChatPrompt(text)
    user = _strings_of(list(data.values()), [])
    open_, close = _markers([template, *user, *_strings_of(variables, []), *tokens])
    pattern = _token_pattern(tokens)
    marked = {k: _mark(v, pattern, open_, close) for k, v in data.items()}
    text = compiled.render(**marked, add_generation_prompt=add_generation_prompt, **variables)
    return _unmark(text, open_, close)
