"""`ember finetune`'s flags are checked when parsed: one-line errors naming the flag."""

import pytest

from ember.cli.main import main


@pytest.mark.parametrize(
    "bad",
    [["--epochs", "0"], ["--lr", "nan"], ["--lr", "0"], ["--batch-size", "0"], ["--rank", "0"],
     ["--dropout", "1"], ["--max-length", "0"], ["--threads", "0"], ["--seed", "-1"]],
)  # fmt: skip
def test_bad_flags(bad, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n')
    assert main(["finetune", "--data", str(data), *bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ember finetune: error:") and bad[0] in err[0]


@pytest.mark.parametrize("which", ["missing", "folder"])
def test_data_must_be_a_file(which, tmp_path, capsys):
    path = tmp_path / "nope.jsonl" if which == "missing" else tmp_path
    assert main(["finetune", "--data", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--data" in err and "\n" not in err
