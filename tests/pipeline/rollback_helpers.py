"""A run driven into collapse on purpose, for the rollback tests.

`diverge_from(step, factor)` is the test hook: it replaces the warm-up schedule's factor
(`scalerl.training.optim.warmup_factor`, looked up at every scheduler step) so that from the
`step`-th optimizer update (0-based) on the rate is `optim.lr` x `factor`. With `factor` 1e12 the
third update throws the tiny model's weights to infinity and the next updates are skipped as
non-finite; a rollback with `rollback.lr_scale` 1e-12 brings the rate back to `optim.lr`.
`digit_share` is a dense verifier (spread in every group), so every step takes an optimizer step.

Run as a script (`python rollback_helpers.py STEP FACTOR -- scalerl train ARGS`), it installs the
hook and runs the `scalerl` command in this process: the SIGKILL test's subprocess.
"""

from __future__ import annotations

import sys
from pathlib import Path

from scalerl.config import RunConfig

MAX_STEPS = 8
LR = 1e-4
TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64,
        "max_position_embeddings": 256}


def digit_share(completion: str, record: object) -> float:
    """The share of digits among the completion's characters."""
    return sum(ch.isdigit() for ch in completion) / len(completion) if completion else 0.0


def diverge_from(step: int, factor: float) -> None:
    import scalerl.training.optim as optim

    optim.warmup_factor = lambda s, warmup_steps: factor if s >= step else 1.0


def collapse_config(model_path: str, out: Path, **rollback: object) -> RunConfig:
    return RunConfig.model_validate({
        "max_steps": MAX_STEPS,
        "output_dir": str(out),
        "model": {"name_or_path": model_path},
        "data": {"synthetic": {"num_prompts": 60, "difficulty": [1, 3]}, "heldout_size": 4},
        "generation": {"n": 2, "max_new_tokens": 24, "max_batch_size": 8, "length_control": {"kind": "none"}},
        "pipeline": {"off_policy": "sync", "prompts_per_step": 2},
        "eval": {"every": 2, "k": 1},
        "checkpoint": {"every": 2, "keep": 10},
        "logging": {"progress": False},
        "rewards": {"max_workers": 1, "partial_credit": True,
                    "verifiers": {"math": "rollback_helpers:digit_share"}},
        "optim": {"lr": LR, "warmup_steps": 0},
        "rollback": {"enabled": True, **rollback},
    })


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    diverge_from(int(sys.argv[1]), float(sys.argv[2]))
    from scalerl.cli import main

    sys.exit(main(sys.argv[4:]))
