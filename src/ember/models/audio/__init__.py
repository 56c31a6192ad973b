"""Audio models: the EnCodec neural codec (docs/models/audio.md shows it in use)."""

from __future__ import annotations

from ember.models.audio.encodec import EncodecConfig, EncodecEncoding, EncodecModel

__all__ = ["EncodecConfig", "EncodecEncoding", "EncodecModel"]
