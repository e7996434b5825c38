"""The Python API (scalerl/api.py): `scalerl.train` on a list of dicts with a callable reward trains a
short run and returns its rows; bad input raises the exception `scalerl train` exits 2 for, naming
the key, before anything is written; `scalerl.evaluate` evaluates the run's checkpoint."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import scalerl
from tests.tiny_runs import warm_tiny_model

SMALL = {"max_steps": 2, "data.heldout_size": 2, "generation": {"n": 2, "max_new_tokens": 16,
         "max_batch_size": 8, "length_control": {"kind": "none"}},
         "pipeline.off_policy": "sync", "pipeline.prompts_per_step": 2, "eval.every": 2, "eval.k": 1,
         "logging.progress": False, "rewards.max_workers": 1}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return warm_tiny_model(tmp_path_factory)


ROWS = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i), "level": i % 3} for i in range(10)]
SEEN: list[dict[str, Any]] = []


def digit_reward(prompts: list[str], completions: list[str], answer: list[str], **kw: Any) -> list[float]:
    """A TRL-style reward: the fraction of the completion's characters that are digits."""
    SEEN.append({"prompts": prompts, "answer": answer, "level": kw.get("level")})
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def test_train_on_rows_with_a_callable_reward(tiny_model: Path, tmp_path: Path) -> None:
    SEEN.clear()
    out = tmp_path / "run"
    result = scalerl.train(model=str(tiny_model), train_dataset=ROWS, reward_funcs=[digit_reward],
                           reward_weights=[3.0], recipe="base", output_dir=out, **SMALL,
                           **{"optim.lr": 1e-5})
    assert result.exit_status == 0 and result.run_dir == out
    steps = result.step_rows
    assert [r["step"] for r in steps] == [1, 2]
    for row in steps:
        assert row["reward_mean"] == pytest.approx(3.0 * row["reward_fn/digit_reward"])
    assert [r["step"] for r in result.eval_rows] == [0, 2]
    assert result.config.optim.lr == 1e-5 and result.config.recipe == "base"
    # The rows are part of the run folder, named by its saved config; the callable saw their columns.
    assert (out / "train_dataset.jsonl").read_text().count("\n") == len(ROWS)
    assert result.config.data.train_path == str(out / "train_dataset.jsonl")
    assert SEEN and all(s["prompts"][0].startswith("What is") and s["level"] is not None for s in SEEN)
    # Two evaluations cannot fit a 3-parameter curve: no fit, and why.
    assert result.fit is None and result.fit_error

    # An importable callable is saved as its dotted path: the run folder evaluates without it.
    assert result.config.rewards.functions[0].fn.endswith("test_api:digit_reward")
    ev = scalerl.evaluate(out, k=1)
    assert ev.prompts == 2 and "pass_rate" in ev.metrics and "checkpoints" in ev.model
    datasets = pytest.importorskip("datasets")
    # A lambda is known by a name in this process; every sample scores 1.0 > 0.5: all correct.
    ev = scalerl.evaluate(out, dataset=datasets.Dataset.from_list(ROWS[:3]), k=1,
                          reward_funcs=[lambda prompts, completions, **kw: [1.0] * len(completions)])
    assert ev.prompts == 3 and ev.metrics["pass_rate"] == 1.0


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"optim.lrr": 1e-6}, "ConfigError", r"optim\.lrr"),
    ({"optim": {"lr": -1.0}}, "ConfigError", r"optim\.lr"),
    ({"reward_funcs": ["no_such_pkg.mod:f"]}, "ConfigError", r"rewards\.functions\.0\.fn"),
    ({"train_dataset": [{"prompt": "x", "answer": "1"}, "row"]}, "InputError", r"train_dataset\[1\]"),
    ({"train_dataset": [{"prompt": "x"}]}, "InputError",
     r"(?s)data\.train_path: train_dataset \(JSON lines\): 1 row.*missing answer"),
    ({"reward_funcs": [digit_reward], "reward_weights": [1.0, 2.0]}, "InputError", "reward_weights"),
])
def test_bad_input_raises_naming_the_key_and_writes_nothing(
    tiny_model: Path, tmp_path: Path, kwargs: dict[str, Any], error: str, message: str
) -> None:
    out = tmp_path / "run"
    args = {"model": str(tiny_model), "train_dataset": ROWS, "output_dir": out, **SMALL, **kwargs}
    with pytest.raises(getattr(scalerl, error), match=message):
        scalerl.train(**args)
    assert not out.exists()


def test_bad_input_found_while_building_leaves_no_run_folder(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows are written into the run folder before the run builds; bad input found then (here a
    stand-in for it) takes the folder away again, as `scalerl train` leaves none."""
    import scalerl.assembly.build as assemble

    def broken(*args: object, **kwargs: object) -> None:
        raise scalerl.ConfigError("rewards.verifiers.x: cannot import")

    monkeypatch.setattr(assemble, "train", broken)
    out = tmp_path / "run"
    with pytest.raises(scalerl.ConfigError, match="cannot import"):
        scalerl.train(model=str(tiny_model), train_dataset=ROWS, output_dir=out, **SMALL)
    assert not out.exists()


def test_import_scalerl_stays_light() -> None:
    code = ("import sys, scalerl; scalerl.train; "
            "print('torch' in sys.modules, 'scalerl.assembly' in sys.modules)")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert got.stdout.split() == ["False", "False"]
