"""`ember codec encode/decode` with a tiny saved transformers EncodecModel."""

from __future__ import annotations

import wave

import numpy as np
import pytest
import torch

from ember.cli.codec import write_wav
from ember.cli.main import main
from ember.models.whisper import load_wav
from tests.models.audio.tiny import TINY, TINY_48K, save_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(folder, transformers model) of the mono 8 kHz tiny model."""
    folder = tmp_path_factory.mktemp("encodec_cli")
    return folder, save_tiny(folder, **TINY)


def _wav(path, rate: int = 8000, channels: int = 1, n: int = 803, seed: int = 0):
    x = 0.4 * np.random.default_rng(seed).standard_normal((channels, n))
    write_wav(path, x.astype(np.float32), rate)
    return load_wav(path, mono=False)[0]


def test_encode_then_decode_matches_transformers(tiny, tmp_path, capsys):
    folder, hf = tiny
    x = _wav(tmp_path / "in.wav")
    npz, out = tmp_path / "codes.npz", tmp_path / "out.wav"
    assert (
        main(
            [
                "codec",
                "encode",
                str(tmp_path / "in.wav"),
                str(npz),
                "--model",
                str(folder),
                "--bandwidth",
                "10",
            ]
        )
        == 0
    )
    assert "2 codebooks x 101 steps at 10 kbps" in capsys.readouterr().out
    with np.load(npz, allow_pickle=False) as z:
        codes, rate, length = z["codes"], int(z["sample_rate"]), int(z["length"])
        assert str(z["model"]) == str(folder.resolve()) and z["scales"].size == 0
    with torch.no_grad():
        ref = hf.encode(torch.from_numpy(x[None]), bandwidth=10.0)
        ref_audio = hf.decode(ref.audio_codes, ref.audio_scales)[0][0, :, : x.shape[-1]].numpy()
    assert codes.dtype == np.int16 and (rate, length) == (8000, 803)
    np.testing.assert_array_equal(codes, ref.audio_codes.numpy()[:, 0])
    assert main(["codec", "decode", str(npz), str(out), "-v"]) == 0
    cap = capsys.readouterr()
    assert "0.10 s of audio" in cap.out and "real-time factor" in cap.err
    with wave.open(str(out)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (8000, 1, 2)
    got = load_wav(out, mono=False)[0]
    want = np.round(np.clip(ref_audio, -1, 1) * 32767) / 32768
    assert got.shape == want.shape == (1, 803)
    assert np.abs(got - want).max() <= 1.5 / 32768  # one 16-bit step


def test_stereo_model_resamples_and_keeps_scales(tmp_path, capsys):
    folder = tmp_path / "model48"
    save_tiny(folder, **TINY_48K)
    _wav(tmp_path / "in.wav", rate=16000, channels=1, n=900)  # mono 16 kHz -> stereo 8 kHz
    npz = tmp_path / "c.npz"
    assert (
        main(["codec", "encode", str(tmp_path / "in.wav"), str(npz), "--model", str(folder)]) == 0
    )
    assert "x 4 chunks at 5 kbps" in capsys.readouterr().out
    with np.load(npz) as z:
        assert z["codes"].shape == (4, 1, 20) and z["scales"].shape == (4,)
        assert int(z["length"]) == 450 and int(z["channels"]) == 2
    assert main(["codec", "decode", str(npz), str(tmp_path / "o.wav"), "--model", str(folder)]) == 0
    got = load_wav(tmp_path / "o.wav", mono=False)[0]
    assert got.shape == (2, 450) and np.abs(got).max() > 0


def _bad_npz(path, **override):
    fields = dict(
        codes=np.zeros((1, 2, 5), np.int16),
        scales=np.zeros(0, np.float32),
        sample_rate=np.int64(8000),
        channels=np.int64(1),
        length=np.int64(40),
        last_frame_pad_length=np.int64(0),
        model=np.array("nowhere"),
    )
    fields.update(override)
    fields = {k: v for k, v in fields.items() if v is not None}
    with open(path, "wb") as f:
        np.savez(f, **fields)
    return str(path)


@pytest.mark.parametrize(
    "override, message",
    [
        (dict(codes=np.zeros((1, 2, 5), np.float32)), "codes must be integers"),
        (dict(codes=np.zeros((2, 5), np.int16)), "codes must be integers"),
        (dict(codes=np.full((1, 2, 5), -1, np.int16)), "negative indices"),
        (dict(codes=np.full((1, 2, 5), 32, np.int16)), "out of range for 32-entry"),
        (dict(codes=np.zeros((1, 3, 5), np.int16)), "3 codebooks; the model has 2"),
        (dict(codes=np.zeros((2, 2, 5), np.int16)), "2 frames; this model takes one"),
        (dict(sample_rate=np.int64(24000)), "1-channel 24000 Hz audio"),
        (dict(length=np.array([40])), "length must be a non-negative integer scalar"),
        (dict(scales=np.zeros(3, np.float32)), "scales must be 1 floats"),
        (dict(last_frame_pad_length=np.int64(5)), "last_frame_pad_length 5 >= 5 steps"),
        (dict(model=np.array([1, 2])), "model must be a string"),
        (dict(length=None), "lacks length"),
        (dict(codes=np.array([object()], dtype=object)), "not a codec .npz"),
    ],
)
def test_decode_rejects_a_malformed_npz(tiny, tmp_path, capsys, override, message):
    folder, _ = tiny
    path = _bad_npz(tmp_path / "bad.npz", **override)
    assert main(["codec", "decode", path, str(tmp_path / "o.wav"), "--model", str(folder)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ember codec: error:") and message in err
    assert not (tmp_path / "o.wav").exists()


def test_cli_errors_are_one_line(tiny, tmp_path, capsys):
    folder, _ = tiny
    wav = tmp_path / "in.wav"
    _wav(wav)
    (tmp_path / "text.npz").write_text("not a zip")
    cases = [
        (["codec", "encode", str(wav), str(tmp_path / "c.npz")], "pass --model FOLDER"),
        (
            [
                "codec",
                "encode",
                str(wav),
                str(tmp_path / "c.npz"),
                "--model",
                str(folder),
                "--bandwidth",
                "3",
            ],
            "--bandwidth 3: this model takes one of 5, 10",
        ),
        (
            ["codec", "encode", str(tmp_path / "none.wav"), "x.npz", "--model", str(folder)],
            "no such file",
        ),
        (
            ["codec", "decode", _bad_npz(tmp_path / "b.npz"), str(tmp_path / "o.wav")],
            "the .npz's model 'nowhere': no such folder",
        ),
        (
            ["codec", "decode", str(tmp_path / "text.npz"), "o.wav", "--model", str(folder)],
            "not a codec .npz",
        ),
        (
            ["codec", "encode", str(wav), str(tmp_path / "c.npz"), "--model", str(tmp_path)],
            "expected an EnCodec folder",
        ),
    ]
    for argv, message in cases:
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (argv, err)
    assert main(["codec", "transcode", "a", "b"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert main(["codec", "encode", str(wav), "c.npz", "--bandwidth", "-1"]) == 2
    assert "must be > 0" in capsys.readouterr().err
