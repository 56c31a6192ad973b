"""ember's CLIP tokenizer on CLIP's real 49,408-token vocabulary (the one every SD 1.x/2.x folder has).

The vocabulary ships in open-clip-torch (``open_clip/bpe_simple_vocab_16e6.txt.gz``: CLIP's
merges); vocab.json and merges.txt are rebuilt from it the way CLIP defines them (the 256 byte
symbols, the same with ``</w>``, one token per merge, the two special tokens), then ember and
transformers read the same two files.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from ember.models.diffusion import CLIPTokenizer

SPEC = importlib.util.find_spec("open_clip")
pytestmark = pytest.mark.skipif(SPEC is None, reason="open-clip-torch (CLIP's BPE merges) is not installed")  # fmt: skip

PROMPTS = [
    "a photo of a cat",
    "An astronaut riding a horse on Mars, highly detailed, 8k, trending on artstation",
    "portrait of a woman, oil painting by Rembrandt -- ugly, blurry, (worst quality:1.4)",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u65e5\u672c\u8a9e \U0001f680\U0001f308 don't can't I'm we'll",
    "x " * 100,  # truncated to 77
]


def _byte_symbols() -> list[str]:
    """CLIP's (GPT-2's) byte -> printable symbol table, in byte-value order of assignment."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    order, chars, extra = list(keep), list(keep), 0
    for b in range(256):
        if b not in keep:
            order.append(b)
            chars.append(256 + extra)
            extra += 1
    return [chr(c) for c in chars]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("clip_vocab")
    gz = Path(SPEC.origin).parent / "bpe_simple_vocab_16e6.txt.gz"
    lines = gzip.open(gz, "rt", encoding="utf-8").read().split("\n")
    merges = [tuple(m.split()) for m in lines[1 : 49152 - 256 - 2 + 1]]
    symbols = _byte_symbols()
    tokens = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")  # fmt: skip
    return folder


def test_real_vocabulary_matches_transformers(files):
    from transformers import CLIPTokenizer as Ref

    ref = Ref(str(files / "vocab.json"), str(files / "merges.txt"))
    kw = dict(bos_token="<|startoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok = CLIPTokenizer.from_files(files / "vocab.json", files / "merges.txt", **kw)
    assert tok.backend.get_vocab_size() == 49408
    want = ref(PROMPTS, padding="max_length", max_length=77, truncation=True).input_ids
    assert tok.encode(PROMPTS).tolist() == want
    assert tok.encode("a photo of a cat")[0, :7].tolist() == [49406, 320, 1125, 539, 320, 2368, 49407]  # fmt: skip
