"""`ember finetune --eval`: held-out exact match before and after training, and its scorer."""

import json
import warnings

import pytest

from ember.cli.main import main
from ember.peft.data import DataError
from ember.peft.eval import exact_match, read_eval_file, split_record

SYSTEM = {"role": "system", "content": "Reply with the order as JSON."}


def _chat(user: str, answer: str) -> dict:
    return {
        "messages": [
            SYSTEM,
            {"role": "user", "content": user},
            {"role": "assistant", "content": answer},
        ]
    }


def _write(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def model_and_tok():
    from ember.generation.tokenizer import Tokenizer
    from ember.models import AutoModelForCausalLM
    from ember.models.hub import default_model_path

    model = AutoModelForCausalLM.from_pretrained(default_model_path())
    return model, Tokenizer.from_gguf_metadata(model.gguf_metadata)


def test_split_record_and_bad_eval_records(tmp_path):
    multi = {
        "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "3+3?"},
            {"role": "assistant", "content": " 6 "},
        ]
    }
    prompt, ref = split_record(multi)
    assert [m["content"] for m in prompt] == ["2+2?", "4", "3+3?"] and ref == " 6 "
    assert split_record({"prompt": "a", "completion": "b"}) == (
        [{"role": "user", "content": "a"}],
        "b",
    )
    p = tmp_path / "e.jsonl"
    _write(
        p,
        [{"prompt": "a", "completion": "b"}, {"messages": [{"role": "assistant", "content": "x"}]}],
    )
    with pytest.raises(DataError, match=r"e.jsonl:2: the assistant turn has no prompt"):
        read_eval_file(p)


def test_exact_match_against_the_generate_loop(model_and_tok):
    """A reference equal to the greedy answer (which ends) is a hit; a longer or shorter one is not."""
    from ember.generation.generate import generate_tokens

    model, tok = model_and_tok
    msgs = [{"role": "user", "content": "Say hello."}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    out, ended = [], False
    for (t,) in generate_tokens(model, ids, 48, stop_token_ids=sorted(tok.eos_token_ids)):
        if t is None or t in tok.eos_token_ids:
            ended = t is not None
            break
        out.append(t)
    assert ended, "the bundled model's greedy answer to this prompt should end within 48 tokens"
    text = tok.decode(out, skip_special_tokens=True).strip()
    half = tok.decode(out[: len(out) // 2], skip_special_tokens=True).strip()
    recs = [
        {"prompt": "Say hello.", "completion": text},
        {"prompt": "Say hello.", "completion": text + " And more."},
        {"prompt": "Say hello.", "completion": half},
    ]
    r = exact_match(model, tok, recs, batch_size=1)
    assert r.matched == [True, False, False] and (r.hits, r.total) == (1, 3)
    assert r.answers[0] == text and r.answers[2].startswith(half)
    assert r.summary()["exact_match"] == pytest.approx(1 / 3)


def test_finetune_eval_reports_before_and_after(tmp_path, capsys):
    rows = [
        _chat(f"Send {n} cups to Oslo.", json.dumps({"item": "cups", "qty": n}))
        for n in (2, 3, 5, 7)
    ]
    held = [
        _chat("Send 4 cups to Lima.", json.dumps({"item": "cups", "qty": 4})),
        {"prompt": "Send 9 cups to Rome.", "completion": json.dumps({"item": "cups", "qty": 9})},
    ]
    _write(tmp_path / "train.jsonl", rows)
    _write(tmp_path / "test.jsonl", held)
    out = tmp_path / "out"
    argv = ["finetune", "--data", str(tmp_path / "train.jsonl"), "--eval", str(tmp_path / "test.jsonl"),
            "--out", str(out), "--batch-size", "2", "--rank", "2", "--targets", "q_proj,v_proj",
            "--lr", "1e-3", "--max-length", "64"]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(argv) == 0
    text = capsys.readouterr().out
    assert "held-out exact match before:" in text and "held-out exact match after:" in text
    assert "points)" in text and str(out / "eval.json") in text
    metrics = json.loads((out / "eval.json").read_text())
    for when in ("before", "after"):
        m = metrics[when]
        assert m["total"] == 2 and 0 <= m["hits"] <= 2 and m["exact_match"] == m["hits"] / 2
    assert metrics["gain_points"] == pytest.approx(
        100 * (metrics["after"]["exact_match"] - metrics["before"]["exact_match"]), abs=0.01
    )
    assert metrics["epochs"] == 1 and metrics["eval_file"] == str(tmp_path / "test.jsonl")
    answers = [json.loads(line) for line in (out / "eval_answers.jsonl").read_text().splitlines()]
    assert [a["reference"] for a in answers] == [split_record(r)[1] for r in held]
    assert all(isinstance(a["after"], str) and isinstance(a["match_after"], bool) for a in answers)
    assert (out / "adapter" / "adapter_config.json").is_file()


def test_eval_flag_needs_a_file(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n')
    assert main(["finetune", "--data", str(data), "--eval", str(tmp_path / "nope.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--eval" in err and "\n" not in err


def test_bad_eval_record_is_one_line(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n')
    bad = tmp_path / "e.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "x"}]}\n')
    argv = ["finetune", "--data", str(data), "--eval", str(bad), "--out", str(tmp_path / "o")]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert "e.jsonl:1" in err and "\n" not in err
