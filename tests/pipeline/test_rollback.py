"""Rollback on collapse (ScaleRL A.17.4) in a real run driven into collapse on purpose.

The tiny model trains with a dense verifier; from its third optimizer update the test hook
(`rollback_helpers.diverge_from`) multiplies the rate by 1e12, the weights go non-finite, and the
next updates are skipped. The detector fires after `rollback.nonfinite_steps` = 2 of them, the run
restores the stable checkpoint of step 2 with `optim.lr` x `rollback.lr_scale` (1e-12: the hooked
rate is back to 1e-4) and finishes, counted and logged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import scalerl.training.optim as optim
from scalerl.assembly.rollback import ROLLBACK_FILE
from scalerl.assembly.run import SESSIONS_FILE, train_run
from scalerl.assembly.warm_start import warm_start_default
from scalerl.config import RunConfig
from scalerl.telemetry import read_rows
from scalerl.training.checkpoint import checkpoint_dir, list_checkpoints
from scalerl.training.sft import SFTConfig

from . import rollback_helpers
from .rollback_helpers import LR, MAX_STEPS, TINY, collapse_config

HERE = Path(__file__).resolve().parent
BOOST = 1e12


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    base = RunConfig.model_validate({"model": {"tiny": TINY}, "data": {"synthetic": {"num_prompts": 60}}})
    cache = tmp_path_factory.mktemp("warm")
    return str(warm_start_default(base, SFTConfig(steps=2, batch_size=4), cache_dir=cache))


@pytest.fixture
def diverging(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))  # `rollback_helpers:digit_share`, the verifier
    monkeypatch.setattr(optim, "warmup_factor", lambda s, w: BOOST if s >= 2 else 1.0)


def _rollback(run: Path) -> dict:
    return json.loads((run / ROLLBACK_FILE).read_text())


def _sessions(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / SESSIONS_FILE).read_text().splitlines()]


@pytest.mark.usefixtures("diverging")
def test_collapse_rolls_back_to_the_stable_checkpoint_with_a_lower_rate_and_recovers(
    model: str, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    cfg = collapse_config(model, run, lr_scale=1e-12, nonfinite_steps=2)
    assert train_run(cfg, run) == 0

    # Steps 1-2 train, update 3 (step 3) breaks the weights, steps 4 and 5 are skipped as non-finite:
    # the detector fires at step 5; the checkpoint of step 4 (one bad step seen) is not stable.
    (event,) = _rollback(run)["events"]
    assert event["trigger"] == "nonfinite" and event["step"] == 5 and event["restored_step"] == 2
    assert event["steps_lost"] == 3 and event["discarded_checkpoints"] == [4]
    assert event["lr"] == pytest.approx(LR * 1e-12)
    assert _rollback(run)["pending"] is None
    kinds = [s["event"] for s in _sessions(run)]
    assert kinds == ["start", "rollback", "stop"] and _sessions(run)[-1]["stop_reason"] == "max_steps"

    rows = read_rows(run / "metrics.jsonl")
    steps = [r for r in rows if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, MAX_STEPS + 1))  # the lost steps' rows are gone
    for r in steps[:2]:
        assert (r["rollbacks"], r["rollback_trigger"], r["rollback_steps_lost"]) == (0, "", 0)
        assert r["lr"] == pytest.approx(LR)
    for r in steps[2:]:
        assert (r["rollbacks"], r["rollback_trigger"], r["rollback_steps_lost"]) == (1, "nonfinite", 3)
        assert r["lr"] == pytest.approx(LR * 1e-12 * BOOST)  # the hooked rate, scaled back down
        assert r["skipped_nonfinite"] == 0.0 and r["batch_tokens"] > 0  # recovered: it trains
    state = json.loads((checkpoint_dir(run) / f"step_{MAX_STEPS:06d}" / "state.json").read_text())
    assert state["extra"]["pipeline"]["collapse"]["stable_steps"] == [2, 4, 6, 8]

    # A session killed between recording a rollback and deleting its checkpoints: `--resume` (the
    # newest checkpoint, step 8) finishes the deletion and continues from the recorded step.
    record = _rollback(run)
    record["pending"] = {"restore": 4, "discard": [6, 8]}
    (run / ROLLBACK_FILE).write_text(json.dumps(record))
    assert train_run(cfg, run, resume=checkpoint_dir(run) / f"step_{MAX_STEPS:06d}") == 0
    assert _rollback(run)["pending"] is None and len(_rollback(run)["events"]) == 1
    assert _sessions(run)[-2]["resumed_from"].endswith(f"step_{MAX_STEPS:06d}")
    steps = [r for r in read_rows(run / "metrics.jsonl") if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, MAX_STEPS + 1))
    assert all(r["skipped_nonfinite"] == 0.0 and r["rollbacks"] == 1 for r in steps[2:])
    assert [s for s, _ in list_checkpoints(run)] == [2, 4, 6, 8]


@pytest.mark.usefixtures("diverging")
def test_rollbacks_are_bounded_and_an_unchanged_rate_collapses_again(model: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = collapse_config(model, run, lr_scale=1.0, max_rollbacks=1, nonfinite_steps=2)
    assert train_run(cfg, run) == 1
    (event,) = _rollback(run)["events"]  # one rollback, then the same collapse again: stop
    assert event["restored_step"] == 2 and event["lr"] == pytest.approx(LR)
    stop = _sessions(run)[-1]
    assert stop["stop_reason"] == "collapsed" and stop["trigger"] == "nonfinite" and stop["exit_status"] == 1


def test_rollback_keys_that_cannot_work_are_refused() -> None:
    from scalerl.config import ConfigError, build_config, override_layer

    with pytest.raises(ConfigError, match=r"checkpoint\.every"):
        build_config([override_layer(["rollback.enabled=true", "checkpoint.every=0"])])
    with pytest.raises(ConfigError, match=r"rollback\.nonfinite_steps"):
        build_config([override_layer(["rollback.enabled=true", "checkpoint.every=2",
                                      "rollback.nonfinite_steps=5", "optim.max_consecutive_bad_steps=5"])])


def test_the_helper_module_is_the_verifier_the_config_names() -> None:
    assert rollback_helpers.digit_share("a1b2", None) == 0.5
