"""Shared fixtures: the bundled tiny.en (CTranslate2) and the committed espeak-ng clip."""

from __future__ import annotations

from pathlib import Path

import pytest

CLIP = Path(__file__).with_name("hello.wav")
CLIP_TEXT = "Hello world, this is a test of the ember speech recognizer."


@pytest.fixture(scope="session")
def whisper():
    """(model, tokenizer) of the bundled tiny.en."""
    from ember.generation.whisper import load_whisper

    return load_whisper()


@pytest.fixture(scope="session")
def clip():
    """The clip's 16 kHz float32 samples."""
    from ember.models.whisper import load_wav

    audio, rate = load_wav(CLIP)
    assert rate == 16000
    return audio


def words(text: str) -> list[str]:
    """Lower-case words without punctuation."""
    import re

    return re.findall(r"[a-z0-9']+", text.lower())
