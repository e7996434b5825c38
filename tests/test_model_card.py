"""The model card `scalerl export` writes: the recipe's changed keys, the final held-out pass rate and
the sigmoid fitted to the run's curve, from a run folder whose curve follows a known sigmoid."""

from __future__ import annotations

import json
import re
from pathlib import Path

from scalerl.assembly.model_card import changed_keys, model_card
from scalerl.assembly.run import resolve_run_config
from scalerl.config import config_to_yaml


def _sigmoid(c: float, a: float = 0.7, b: float = 1.5, c_mid: float = 1e12, r0: float = 0.2) -> float:
    return r0 + (a - r0) / (1 + (c_mid / c) ** b)  # R(C), ScaleRL eq. 1, written out


def _run(tmp_path: Path) -> tuple[Path, object]:
    run = tmp_path / "run"
    run.mkdir()
    cfg = resolve_run_config("gspo", [], ["optim.lr=3e-6", "generation.n=4", "output_dir=elsewhere"])
    (run / "config.yaml").write_text(config_to_yaml(cfg))
    rows = [{"kind": "eval", "step": 10 * i, "flops": 2e11 * i, "val_pass_rate": _sigmoid(2e11 * i)}
            for i in range(1, 31)]
    rows.insert(0, {"kind": "eval", "step": 0, "flops": 0.0, "val_pass_rate": 0.2})  # R(0) = R0
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run, cfg


def test_changed_keys_are_those_the_run_set_against_its_recipe(tmp_path: Path) -> None:
    _, cfg = _run(tmp_path)
    assert changed_keys(cfg) == {"optim.lr": (1e-4, 3e-6), "generation.n": (8, 4)}  # not output_dir


def test_the_card_states_the_final_point_and_the_fitted_asymptote(tmp_path: Path) -> None:
    run, cfg = _run(tmp_path)
    card = model_card(str(run / "checkpoints" / "step_000300"), run, cfg, merged_lora=False)
    assert "recipe: `gspo`" in card and "| `optim.lr` | `0.0001` | `3e-06` |" in card
    assert f"final: {_sigmoid(6e12):.4f} at step 300" in card
    a = float(re.search(r"fitted asymptote A = ([0-9.]+)", card).group(1))
    lo, hi = (float(x) for x in re.search(r"interval \[([0-9.]+), ([0-9.]+)\]", card).groups())
    assert abs(a - 0.7) < 0.01 and lo <= 0.7 <= hi  # the curve's own A, recovered
    assert "fit status: ok" in card


def test_a_model_of_no_run_says_so() -> None:
    from scalerl.config import RunConfig

    card = model_card("/models/x", None, RunConfig(), merged_lora=False)
    assert "belongs to no scalerl run" in card and "final:" not in card
