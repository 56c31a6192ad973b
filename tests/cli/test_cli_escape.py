"""No terminal injection: text from files reaches the terminal with its controls escaped."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from ember.cli._text import echo, safe, safe_text
from ember.cli.main import main

OSC52 = "\x1b]52;c;cm0gLXJmIH4K\x07"  # writes "rm -rf ~" into the clipboard
CSI = "\x1b[2J\x1b[31m"  # clear the screen, red
C1_CSI = "\x9b31m"  # the one-character CSI
BIDI = "\u202egnp.exe"  # right-to-left override
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def test_safe_escapes_controls_and_keeps_the_rest():
    assert safe(OSC52) == "\\x1b]52;c;cm0gLXJmIH4K\\x07"
    assert safe(C1_CSI) == "\\x9b31m"
    assert safe(BIDI) == "\\u202egnp.exe"
    assert safe("a\nb\tc\rd") == "a\\x0ab\\x09c\\x0dd"
    assert safe("caf\udcff") == "caf\\udcff"  # a byte that was not UTF-8 (surrogateescape)
    assert safe("héllo → 世界 ✓ C:\\path") == "héllo → 世界 ✓ C:\\path"
    assert safe_text("line 1\n\tline 2\x1b[31m") == "line 1\n\tline 2\\x1b[31m"
    assert not RAW.search(safe("".join(map(chr, range(0x20))) + "\x7f\x85\x9d"))


def test_echo_writes_escaped_lines(capsys):
    echo(f"name {OSC52}")
    echo(f"gen\n{CSI}", text=True)
    echo(BIDI, err=True)
    out, err = capsys.readouterr()
    assert out == "name \\x1b]52;c;cm0gLXJmIH4K\\x07\ngen\n\\x1b[2J\\x1b[31m\n"
    assert err == "\\u202egnp.exe\n"


@pytest.fixture()
def hostile_safetensors(tmp_path) -> Path:
    from safetensors.numpy import save_file

    path = tmp_path / "hostile.safetensors"
    tensors = {f"layer{OSC52}.weight": np.zeros(2, np.float32), f"b{BIDI}": np.ones(1, np.int8)}
    save_file(tensors, str(path), metadata={f"note{CSI}": f"hi{C1_CSI}{OSC52}"})
    return path


@pytest.fixture()
def hostile_gguf(tmp_path) -> Path:
    import gguf

    path = tmp_path / "hostile.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string(f"general.name{OSC52}", f"evil{CSI}")
    w.add_array("tokenizer.ggml.tokens", [f"tok{OSC52}", "ok"])
    w.add_tensor(f"blk.0{OSC52}.weight", np.zeros((2, 2), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("fixture", ["hostile_safetensors", "hostile_gguf"])
def test_inspect_escapes_names_and_metadata(capsys, request, fixture):
    path = request.getfixturevalue(fixture)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert not RAW.search(out.replace("\n", "")), repr(out)
    assert "\\x1b]52;c;cm0gLXJmIH4K\\x07" in out  # shown, visibly
    assert out.count("\n") == len(out.splitlines())  # no line was broken by a name


@pytest.mark.parametrize("fixture", ["hostile_safetensors", "hostile_gguf"])
def test_inspect_json_round_trips_hostile_names(capsys, request, fixture):
    path = request.getfixturevalue(fixture)
    assert main(["inspect", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.isascii() and not RAW.search(out.rstrip("\n"))
    doc = json.loads(out)
    assert any(OSC52 in t["name"] for t in doc["tensors"])
    assert doc["tensor_count"] == len(doc["tensors"]) >= 1 and doc["file"] == str(path)


def test_error_messages_are_escaped(capsys, tmp_path):
    name = tmp_path / f"x{OSC52}.gguf"
    assert main(["inspect", str(name)]) == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b]52" in err and len(err.splitlines()) == 1


def test_generated_text_is_escaped(capsys, monkeypatch):
    """What a model writes comes from its vocabulary, a file: the stream is escaped too."""
    from ember.cli import _llm, generate

    class Tok:
        chat_template = None

        def encode(self, text, add_special_tokens=True, parse_special=False):
            return [1, 2]

    class Model:
        config = type("C", (), {"max_position_embeddings": 64})()

    def fake_complete(model, tok, ids, max_tokens, args, write=None):
        write(f"Paris{OSC52}\n")
        return _llm.Completion("Paris", 2, 1, "stop", 0.1, 0.2)

    monkeypatch.setattr(generate, "load", lambda args: (Model(), Tok()))
    monkeypatch.setattr(generate, "complete", fake_complete)
    assert main(["generate", "hi", "--raw"]) == 0
    out = capsys.readouterr().out
    assert out == "Paris\\x1b]52;c;cm0gLXJmIH4K\\x07\n\n"


def test_every_cli_module_prints_through_echo():
    """One helper for terminal output: no bare print() or stream writes elsewhere in the CLI."""
    cli = Path(__file__).resolve().parents[2] / "src" / "ember" / "cli"
    offenders = []
    for f in sorted(cli.glob("*.py")):
        if f.name in ("_text.py", "convert.py"):  # convert.py: another engineer's module
            continue
        src = f.read_text()
        if re.search(r"\bprint\(|\.write\(|sys\.std(out|err)\.write", src.replace(".write_", "")):
            offenders.append(f.name)
    assert offenders == []


def test_an_ascii_terminal_gets_escapes_not_an_error(tmp_path):
    import os
    import subprocess
    import sys

    from safetensors.numpy import save_file

    path = tmp_path / "café.safetensors"
    save_file({"poids.é": np.zeros(1, np.float32)}, str(path), metadata={"auteur": "Hélène"})
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    r = subprocess.run([sys.executable, "-m", "ember.cli.main", "inspect", str(path)],
                       capture_output=True, env=env, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr.decode()
    assert b"H\\xe9l\\xe8ne" in r.stdout and b"poids.\\xe9" in r.stdout
