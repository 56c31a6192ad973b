"""Recreate hello.wav (run once by hand; tests only read the committed file).

Needs espeak-ng (`apt-get install -y espeak-ng`) and scipy. espeak-ng speaks at 22050 Hz; the
clip is resampled to 16 kHz mono 16-bit PCM with scipy's polyphase filter.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import wave
from pathlib import Path

import numpy as np

TEXT = "Hello world, this is a test of the ember speech recognizer."
OUT = Path(__file__).with_name("hello.wav")


def main() -> None:
    """Speak TEXT with espeak-ng and write OUT."""
    from scipy.signal import resample_poly

    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.wav"
        subprocess.run(
            ["espeak-ng", "-v", "en", "-s", "150", "-g", "4", "-w", str(raw), TEXT], check=True
        )
        with wave.open(str(raw), "rb") as w:
            assert w.getnchannels() == 1 and w.getsampwidth() == 2
            rate = w.getframerate()
            x = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float64)
    g = np.gcd(rate, 16000)
    y = resample_poly(x, 16000 // g, rate // g)
    y = np.clip(np.round(y), -32768, 32767).astype("<i2")
    with wave.open(str(OUT), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(y.tobytes())
    print(f"wrote {OUT} ({len(y) / 16000:.2f} s, {OUT.stat().st_size} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
