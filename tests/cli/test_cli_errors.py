"""Every `ember` command refuses bad input with one line, `ember <command>: error: ...`.

No model is loaded for these: the arguments are checked first, so the tests stay fast.
"""

from __future__ import annotations

import io
import struct
import subprocess
import sys

import numpy as np
import pytest

from ember.cli import main as cli
from ember.cli.main import main
from ember.errors import EmberError


def one_line_error(capsys, argv, command, status=None):
    """Run argv; assert a non-zero exit and stderr of exactly one error line; return it."""
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc != 0 if status is None else rc == status, (rc, err)
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"ember {command}: error: "), err
    return lines[0]


def bytes_stdin(monkeypatch, data: bytes):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def write_wav(path, fmt: int, bits: int, data: bytes, channels: int = 1, rate: int = 16000):
    block = channels * bits // 8
    fmt_chunk = struct.pack("<HHIIHH", fmt, channels, rate, rate * block, block, bits)
    body = (
        b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt_chunk))
        + fmt_chunk
        + b"data"
        + struct.pack("<I", len(data))
        + data
    )
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)


BAD_SAMPLING = [
    (["--max-tokens", "0"], "--max-tokens"),
    (["--max-tokens", "-3"], "--max-tokens"),
    (["--temperature", "-0.1"], "--temperature"),
    (["--temperature", "nan"], "--temperature"),
    (["--temperature", "inf"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.01"], "--top-p"),
    (["--top-p", "nan"], "--top-p"),
    (["--top-k", "-1"], "--top-k"),
    (["--top-k", "2.5"], "--top-k"),
    (["--min-p", "-0.1"], "--min-p"),
    (["--min-p", "1.5"], "--min-p"),
    (["--repeat-penalty", "0"], "--repeat-penalty"),
    (["--repeat-penalty", "-1"], "--repeat-penalty"),
    (["--repeat-penalty", "nan"], "--repeat-penalty"),
    (["--presence-penalty", "nan"], "--presence-penalty"),
    (["--frequency-penalty", "inf"], "--frequency-penalty"),
    (["--threads", "0"], "--threads"),
    (["--seed", "-1"], "--seed"),
    (["--stop", ""], "--stop"),
]


@pytest.mark.parametrize("command", ["generate", "chat"])
@pytest.mark.parametrize(("flags", "flag"), BAD_SAMPLING)
def test_bad_sampling_options_name_the_flag(capsys, command, flags, flag):
    argv = (
        [command, "hello", *flags] if command == "generate" else [command, "--once", "hi", *flags]
    )
    line = one_line_error(capsys, argv, command, status=2)
    assert f"argument {flag}:" in line


@pytest.mark.parametrize(
    ("argv", "command", "needle"),
    [
        (["generate", ""], "generate", "the prompt is empty"),
        (["generate"], "generate", "required: prompt"),
        (["generate", "hi", "--raw", "--chat"], "generate", "not allowed with"),
        (["generate", "hi", "--raw", "--system", "be brief"], "generate", "--system"),
        (["chat", "--once", ""], "chat", "--once"),
        (["chat", "--bogus"], "chat", "unrecognized arguments: --bogus"),
        (["embed", ""], "embed", "TEXT 1 is empty"),
        (["embed", "a", "--batch-size", "0"], "embed", "--batch-size"),
        (["embed", "a", "--threads", "0"], "embed", "--threads"),
        (["classify", "x.png", "--top", "0"], "classify", "--top"),
        (["classify", "x.png", "--threads", "-2"], "classify", "--threads"),
        (["transcribe", "x.wav", "--temperature", "nan"], "transcribe", "--temperature"),
        (["transcribe", "x.wav", "--threads", "0"], "transcribe", "--threads"),
        (["inspect", "x.gguf", "--limit", "-1"], "inspect", "--limit"),
        (["serve", "--threads", "0"], "serve", "--threads"),
        (["serve", "--port", "70000"], "serve", "--port"),
        (["serve", "--timeout", "nan"], "serve", "--timeout"),
        (["serve", "--shutdown-grace", "-1"], "serve", "--shutdown-grace"),
        (["list", "--bogus"], "list", "--bogus"),
        (["frobnicate"], "", "invalid choice"),
    ],
)
def test_bad_arguments_are_one_line(capsys, argv, command, needle):
    prog = f"ember {command}".strip()
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"{prog}: error: ") and needle in err, err


def test_missing_files_and_folders_for_files(capsys, tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    text = tmp_path / "t.txt"
    text.write_text("hello")
    for argv, command, needle in [
        (["inspect", str(tmp_path / "nope.gguf")], "inspect", "no such file"),
        (["inspect", str(folder)], "inspect", "is a folder; expected a file"),
        (["inspect", str(text)], "inspect", "unknown model file type"),
        (["transcribe", str(tmp_path / "nope.wav")], "transcribe", "no such file"),
        (["transcribe", str(folder)], "transcribe", "is a folder"),
        (["classify", str(tmp_path / "nope.png")], "classify", "no such file"),
        (["classify", str(folder)], "classify", "is a folder"),
        (["embed", "a", "--model", str(text)], "embed", "is a file; expected a folder"),
        (["embed", "a", "--model", str(tmp_path / "no")], "embed", "no such folder"),
        (["embed", "a", "--output", str(folder)], "embed", "is a folder; expected a file name"),
        (["embed", "a", "--output", str(tmp_path / "x" / "v.npy")], "embed", "does not exist"),
        (["embed", "a", "--output", str(tmp_path / "v.txt")], "embed", ".npy or .json"),
        (["generate", "hi", "--model", str(tmp_path / "no.gguf")], "generate", "does not exist"),
        (["generate", "hi", "--model", str(text)], "generate", "expected a .gguf file"),
        (["info", "--model", str(folder)], "info", "config.json"),
        (["serve", "--api-key-file", str(folder)], "serve", "is a folder"),
        (["serve", "--embedding-model", str(text)], "serve", "expected a folder"),
    ]:
        line = one_line_error(capsys, argv, command)
        assert needle in line, line


def test_unsupported_wav_encodings(capsys, tmp_path):
    write_wav(tmp_path / "float.wav", 3, 32, np.zeros(160, np.float32).tobytes())
    write_wav(tmp_path / "alaw.wav", 6, 8, bytes(160))
    write_wav(tmp_path / "empty.wav", 1, 16, b"")
    (tmp_path / "text.wav").write_text("not audio")
    for name, needle in [
        ("float.wav", "pcm_s16le"),
        ("alaw.wav", "pcm_s16le"),
        ("empty.wav", "no samples"),
        ("text.wav", "WAV"),
    ]:
        line = one_line_error(capsys, ["transcribe", str(tmp_path / name)], "transcribe")
        assert needle in line and name in line, line


def test_invalid_utf8_in_argv(capsys):
    bad = b"caf\xff".decode("utf-8", "surrogateescape")  # what Python makes of such argv bytes
    line = one_line_error(capsys, ["generate", bad], "generate", status=2)
    assert "not valid UTF-8" in line and "\\xff" in line


@pytest.mark.parametrize(
    ("argv", "command"),
    [(["generate", "-"], "generate"), (["chat", "--once", "-"], "chat"), (["embed", "-"], "embed")],
)
def test_invalid_utf8_on_stdin(capsys, monkeypatch, argv, command):
    bytes_stdin(monkeypatch, b"caf\xff\n")
    line = one_line_error(capsys, argv, command)
    assert "not valid UTF-8" in line


@pytest.mark.parametrize(
    ("argv", "command"),
    [(["generate", "-"], "generate"), (["chat", "--once", "-"], "chat"), (["embed", "-"], "embed")],
)
def test_empty_stdin(capsys, monkeypatch, argv, command):
    bytes_stdin(monkeypatch, b"\n")
    line = one_line_error(capsys, argv, command)
    assert "empty" in line


def test_unexpected_exceptions_are_one_line_with_a_hint(capsys, monkeypatch):
    from ember.cli import inspect

    def boom(args):
        raise ValueError("something odd")

    monkeypatch.setattr(inspect, "run", boom)
    line = one_line_error(capsys, ["inspect", "x.gguf"], "inspect", status=1)
    assert "unexpected ValueError: something odd" in line and "--debug" in line


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback(capsys, monkeypatch, where):
    from ember.cli import inspect

    def boom(args):
        raise EmberError("the file is odd")

    monkeypatch.setattr(inspect, "run", boom)
    argv = (
        ["--debug", "inspect", "x.gguf"] if where == "before" else ["inspect", "x.gguf", "--debug"]
    )
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "boom" in err
    assert err.splitlines()[-1] == "ember inspect: error: the file is odd"


def test_version(capsys):
    import ember

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"ember {ember.__version__}"


def test_keyboard_interrupt_and_broken_pipe_are_quiet(capsys, monkeypatch):
    from ember.cli import inspect

    for exc, status in [(KeyboardInterrupt, 130), (BrokenPipeError, 141)]:

        def raise_it(args, exc=exc):
            raise exc()

        monkeypatch.setattr(inspect, "run", raise_it)
        assert main(["inspect", "x.gguf"]) == status
        assert capsys.readouterr().err == ""


def test_help_returns_instead_of_exiting(capsys):
    assert cli.main(["--help"]) == 0
    assert cli.main(["generate", "--help"]) == 0
    assert "--parse-special" in capsys.readouterr().out


def _ember(*args: str | bytes, stdin: bytes = b"") -> subprocess.CompletedProcess:
    cmd = [sys.executable.encode(), b"-m", b"ember.cli.main"]
    cmd += [a if isinstance(a, bytes) else a.encode() for a in args]
    return subprocess.run(cmd, input=stdin, capture_output=True, timeout=120)


def test_subprocess_errors_are_one_line():
    for args, status in [
        (("generate", "hi", "--top-p", "2"), 2),
        (("generate", b"caf\xff"), 2),
        (("inspect", "/nonexistent/x.gguf"), 1),
    ]:
        r = _ember(*args)
        err = r.stderr.decode()
        assert r.returncode == status, err
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert err.startswith(f"ember {args[0]}: error: "), err


def test_subprocess_debug_prints_the_traceback(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 10)
    r = _ember("--debug", "inspect", str(bad))
    err = r.stderr.decode()
    assert r.returncode == 1 and "Traceback" in err
    assert err.splitlines()[-1].startswith("ember inspect: error: ")
