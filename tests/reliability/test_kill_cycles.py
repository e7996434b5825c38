"""Five SIGKILLs at random points of one `scalerl train` run, in every mode, and what must survive.

Each mode runs twice: once uninterrupted, and once killed five times (at random steps, a random
fraction of a step later: inside generation, a step, an evaluation, a checkpoint write or the
metrics log) and resumed each time with `--resume`. The killed run must end with

* a metrics log where each step appears once, in order, and each scheduled evaluation once;
* the same prompts consumed as the uninterrupted run (the reproducible schedules: in the same
  order, step by step; the threaded pipeline: as many, none twice, all from the curriculum's order);
* for the reproducible schedules (`sync`, `ppo_offpolicy`, interleaved `pipeline`), every
  non-wall-clock figure of every step row and the final weights equal to the uninterrupted run's,
  bit for bit (the checkpoint's pipeline snapshot, scalerl/pipeline/snapshot.py);
* TensorBoard event files that, read back by TensorBoard's own reader, hold each step once, and
  W&B offline logs whose sessions, replayed with W&B's rewind rule, hold each step once.

`make test-kill-cycles` (about 4 minutes on 2 cores); the seed of the kill points is printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from .helpers import (
    deterministic,
    eval_steps,
    final_weights,
    finish,
    launch,
    run_config,
    sessions,
    step_rows,
    wait_for_step,
    write_config,
)
from .sink_readers import tensorboard_steps, wandb_history

MAX_STEPS = 24
EVAL_EVERY = 4
CYCLES = 5
MODES = [("sync", "threaded", True), ("ppo_offpolicy", "threaded", True), ("pipeline", "interleaved", True),
         ("pipeline", "threaded", False)]


def _run(tmp: Path, name: str, model: str, mode: str, schedule: str, wandb: bool) -> tuple[Path, Path]:
    run_dir = tmp / name
    cfg = run_config(model, run_dir, mode, schedule, **{"logging.tensorboard": True, "logging.wandb": wandb})
    return run_dir, write_config(cfg, tmp / f"{name}.yaml")


def kill_cycles(config: Path, run_dir: Path, rng: random.Random, cycles: int) -> list[int]:
    """Run to the end through `cycles` SIGKILLs; returns the steps after which each kill came."""
    targets = sorted(rng.sample(range(1, MAX_STEPS - 4), cycles))
    for i, target in enumerate(targets):
        proc = launch(config, *(["--resume"] if i else []))
        wait_for_step(proc, run_dir, target)
        # A random point of what follows: generation, the update, an evaluation, a checkpoint write.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=rng.uniform(0.0, 0.15))
        assert proc.poll() is None, f"the run ended before kill {i + 1} (after step {target})"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
    code, err = finish(launch(config, "--resume"))
    assert code == 0, err[-3000:]
    return targets


@pytest.mark.kill_cycles
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("mode", "schedule", "reproducible"), MODES,
                         ids=[f"{m}-{s}" for m, s, _ in MODES])
def test_five_sigkills_lose_and_duplicate_nothing(
    tmp_path: Path, tiny_model: str, mode: str, schedule: str, reproducible: bool
) -> None:
    seed = int(os.environ.get("SCALERL_KILL_SEED", random.randrange(1 << 30)))
    print(f"kill-point seed {seed} (SCALERL_KILL_SEED={seed} repeats it)")
    wandb = schedule == "interleaved"  # W&B start-up costs seconds per session: one mode is enough
    ref_dir, ref_cfg = _run(tmp_path, "ref", tiny_model, mode, schedule, wandb)
    code, err = finish(launch(ref_cfg))
    assert code == 0, err[-3000:]
    run_dir, cfg = _run(tmp_path, "killed", tiny_model, mode, schedule, wandb)
    targets = kill_cycles(cfg, run_dir, random.Random(seed), CYCLES)

    starts = [s for s in sessions(run_dir) if s["event"] == "start"]
    stops = [s for s in sessions(run_dir) if s["event"] == "stop"]
    assert len(starts) == CYCLES + 1 and len(stops) == 1, f"kills after steps {targets}"

    rows, ref_rows = step_rows(run_dir), step_rows(ref_dir)
    assert [r["step"] for r in rows] == list(range(1, MAX_STEPS + 1)), f"kills after steps {targets}"
    expected_evals = list(range(0, MAX_STEPS + 1, EVAL_EVERY))
    assert eval_steps(run_dir) == expected_evals == eval_steps(ref_dir)

    consumed = [p for r in rows for p in r["prompt_ids"]]
    ref_consumed = [p for r in ref_rows for p in r["prompt_ids"]]
    assert len(consumed) == len(set(consumed)) == len(ref_consumed) == 2 * MAX_STEPS
    if reproducible:
        assert consumed == ref_consumed
        for row, ref in zip(rows, ref_rows, strict=True):
            assert deterministic(row) == deterministic(ref), f"step {row['step']} (kills after {targets})"
        w, w_ref = final_weights(run_dir, MAX_STEPS), final_weights(ref_dir, MAX_STEPS)
        assert w.keys() == w_ref.keys()
        assert all(torch.equal(w[k], w_ref[k]) for k in w)
        assert any(r["version"] > 0 for r in rows)  # the comparison is not between two untrained models
    else:
        final = json.loads((run_dir / "checkpoints" / f"step_{MAX_STEPS:06d}" / "state.json").read_text())
        gen = final["extra"]["pipeline"]["generator"]
        drawn = gen["source"]["order"][: gen["source"]["position"]]
        outstanding = [o["record"]["id"] for o in gen["outstanding"]]
        assert gen["source"]["epoch"] == 1  # one pass over the prompts: every id drawn at most once
        assert sorted(consumed + outstanding) == sorted(drawn), "a drawn prompt was lost or trained twice"

    every_step = list(range(1, MAX_STEPS + 1))
    assert tensorboard_steps(run_dir, "step/reward_mean") == every_step
    assert tensorboard_steps(run_dir, "eval/val_pass_rate") == expected_evals
    if wandb:
        history = wandb_history(run_dir)
        assert sorted(history) == list(range(0, MAX_STEPS + 1))
        assert all(history[r["step"]]["step/reward_mean"] == r["reward_mean"] for r in rows)
