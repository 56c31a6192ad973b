"""ember generate / chat / info on the bundled SmolLM2."""

import io
import sys

from ember.cli.main import main


def test_generate_greedy(capsys):
    assert main(["generate", "Name the capital of France.", "--chat", "--max-tokens", "12"]) == 0
    assert "Paris" in capsys.readouterr().out


def test_generate_sampling_options_and_stop(capsys):
    args = ["generate", "Once upon a time", "--max-tokens", "16", "--temperature", "0.8", "--top-k", "40",
            "--top-p", "0.9", "--min-p", "0.05", "--repeat-penalty", "1.1", "--seed", "3", "--stop", "."]  # fmt: skip
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first  # seeded
    assert "." not in first


def test_chat_history_and_reset(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Name the capital of France.\n/reset\n/exit\n"))
    assert main(["chat", "--max-tokens", "12", "--temperature", "0"]) == 0
    captured = capsys.readouterr()
    assert "Paris" in captured.out and "history cleared" in captured.err


def test_info(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "LlamaForCausalLM" in out and "Q4_1" in out and "134.5 M" in out


def test_missing_model_is_a_clear_error(capsys, tmp_path):
    assert main(["generate", "hi", "--model", str(tmp_path / "nope.gguf")]) == 1
    assert "does not exist" in capsys.readouterr().err
