from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from scalerl.cli.data import register
from scalerl.data import DataError, load_prompts
from scalerl.rewards.registry import gold_free


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scalerl")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_synth_then_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "math.jsonl"
    assert _run(["data", "synth", "--task", "math", "--n", "30", "--seed", "2", "--difficulty", "2", "3",
                 "--out", str(out)]) == 0
    records = load_prompts(out).records
    assert len(records) == 30 and {r.metadata["difficulty"] for r in records} <= {2, 3}
    assert _run(["data", "check", str(out), "--max-prompt-tokens", "64"]) == 0
    text = capsys.readouterr().out
    assert "30 rows read, 30 records loaded" in text and "tasks: math 30" in text
    assert "30 fit max_prompt_tokens=64" in text
    mix = tmp_path / "mix.jsonl"
    assert _run(["data", "synth", "--n", "40", "--difficulty", "4", "8", "--weights", "3", "0", "0", "0", "1",
                 "--out", str(mix)]) == 0
    assert {r.metadata["difficulty"] for r in load_prompts(mix).records} == {4, 8}
    with pytest.raises(ValueError, match="5 non-negative weights"):
        _run(["data", "synth", "--n", "4", "--difficulty", "4", "8", "--weights", "1", "1",
              "--out", str(tmp_path / "bad.jsonl")])
    assert not (tmp_path / "bad.jsonl").exists()


def test_check_reports_bad_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"q": "What?", "a": "1"}) + "\n" + json.dumps({"q": "", "a": "2"}) + "\n")
    argv = ["data", "check", str(path), "--field-map", "prompt=q", "--field-map", "answer=a",
            "--default-task", "math"]
    with pytest.raises(DataError, match=f"{path}:2"):
        _run(argv)
    assert _run([*argv, "--skip"]) == 0
    text = capsys.readouterr().out
    assert "2 rows read, 1 records loaded" in text and "empty prompt: 1" in text
    with pytest.raises(SystemExit):
        _run(["data", "check", str(path), "--field-map", "prompt"])


def test_check_tokenizes_and_checks_lengths_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`data check --tokenizer tiny` checks prompt lengths as a run does, without being asked to."""
    path = tmp_path / "d.jsonl"
    rows = [{"prompt": "What is 2+2?", "answer": "4"}, {"prompt": "x" * 400, "answer": "1"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match="max_prompt_tokens") as err:
        _run(["data", "check", str(path), "--tokenizer", "tiny", "--default-task", "math"])
    assert "--skip" in str(err.value) and "data.on_bad_row: skip" in str(err.value)
    assert "on_error='skip'` in Python" in str(err.value)
    assert _run(["data", "check", str(path), "--default-task", "math", "--skip"]) == 0
    text = capsys.readouterr().out
    assert "prompt tokens (tiny)" in text and "1 fit max_prompt_tokens=256" in text


@pytest.mark.parametrize("rows", [
    [{"prompt": "1+1?", "answer": "2"}],  # no task column: train's default task (math) applies to both
    [{"prompt": "1+1?"}],  # no answer: both reject it
    [{"prompt": "1+1?", "answer": "2", "task": "nope"}],  # an unknown task: both reject it
])
def test_data_check_and_train_accept_the_same_files(
    rows: list[dict[str, str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One function loads the file for both (`scalerl.assembly.inputs.load_prompt_data`), from the
    same defaults, so `data check` and `train` cannot drift apart."""
    from scalerl.assembly.inputs import check_run_inputs
    from scalerl.config import RunConfig

    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    try:
        _run(["data", "check", str(path)])
        check_ok = True
    except ValueError:
        check_ok = False
    try:
        # heldout_size 0: a one-row file leaves no prompt to train on beside a held-out split
        # (its own error); what is compared here is which rows each accepts.
        check_run_inputs(RunConfig.model_validate({"data": {"train_path": str(path), "heldout_size": 0},
                                                   "output_dir": str(tmp_path / "run")}))
        train_ok = True
    except ValueError:
        train_ok = False
    assert check_ok == train_ok


@gold_free
def format_only(completion: str, record: object) -> float:
    """A verifier that reads no gold (the `@gold_free` mark): what the gold-free check must honour."""
    return float(completion.strip().endswith("."))


def test_check_accepts_gold_free_rows_exactly_as_training_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rows of a task scored by a reward model or by an `@gold_free` verifier need no answer, under
    `data check -c RUN.yaml` as under the run itself (the same loader, the same gold-free tasks);
    a math row without its answer is still refused, naming file:line."""
    from scalerl.assembly.inputs import prompt_tasks
    from scalerl.config import load_config

    rows = [{"id": "c", "task": "chat", "prompt": "Say hi"}, {"id": "f", "task": "fmt", "prompt": "End it."},
            {"id": "m", "task": "math", "prompt": "1+1", "answer": "2"}]
    path = tmp_path / "free.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "run.yaml"
    config.write_text(
        "rewards:\n"
        "  reward_models:\n    chat: {path: some/reward-model, kind: classifier}\n"
        f"  verifiers:\n    fmt: '{__name__}:format_only'\n"
    )
    # Without the run's rewards the chat row has no scorer that can do without a gold answer.
    with pytest.raises(DataError, match=rf"{path}:1.*no gold answer"):
        _run(["data", "check", str(path)])
    assert _run(["data", "check", str(path), "-c", str(config)]) == 0
    text = capsys.readouterr().out
    assert "3 rows read, 3 records loaded" in text and "tasks: chat 1, fmt 1, math 1" in text
    # The training side accepts the same file with the same config.
    run = load_config(config, overrides=[f"data.train_path={path}"])
    assert sorted(prompt_tasks(run)) == ["chat", "fmt", "math"]
    # Gold-free is per task: math keeps its verifier and needs its answer.
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "task": "chat", "prompt": "hi"}) + "\n"
                   + json.dumps({"id": "y", "task": "math", "prompt": "1+1"}) + "\n")
    with pytest.raises(DataError, match=rf"{bad}:2.*task 'math' needs a gold answer"):
        _run(["data", "check", str(bad), "-c", str(config)])
    # The config's data settings are the flags' defaults; a flag given wins.
    config.write_text(config.read_text() + "data:\n  on_bad_row: skip\n  max_prompt_tokens: 100\n")
    assert _run(["data", "check", str(bad), "-c", str(config), "--max-prompt-tokens", "50"]) == 0
    text = capsys.readouterr().out
    assert "2 rows read, 1 records loaded" in text and "fit max_prompt_tokens=50" in text
