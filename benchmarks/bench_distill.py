"""On-policy distillation vs RL alone, from a student initialised from scratch (docs/algorithms.md).

The student is the embedded default's tiny model at its random init (no warm start). Two arms, same
prompts, seeds and sampling:

* `distill`: `algorithm.distill.teacher=warm_start` (the embedded default's SFT warm start, the
  model `scalerl train` starts from), pure distillation (`reward_weight=0`) unless `--reward-weight`;
* `rl`: the default ScaleRL recipe against the math verifier alone.

Both log the held-out pass rate against the run's FLOPs (the meter counts the teacher's forward
passes in the distillation arm), so they can be compared at equal compute; the RL arm runs
`--rl-steps` (default 1.3x the distillation steps; an RL step without signal is a no-op that costs
generation only, so check the reported `flops` of both arms). The teacher's
own held-out pass rate is measured once (its eval at step 0). Prints one JSON object.

    PYTHONPATH=$PWD python benchmarks/bench_distill.py --steps 30 --out /tmp/distill
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from scalerl.assembly.build import build_training
from scalerl.assembly.local import resolve_teacher
from scalerl.config import RunConfig
from scalerl.telemetry import read_rows


def base_config(args: argparse.Namespace, steps: int) -> dict[str, Any]:
    return {
        "max_steps": steps,
        "seed": args.seed,
        "data": {"heldout_size": args.heldout},
        "generation": {"n": args.n, "max_new_tokens": args.max_new_tokens, "max_batch_size": 64},
        "pipeline": {"off_policy": "sync", "prompts_per_step": args.prompts},
        "optim": {"lr": args.lr, "warmup_steps": 0},
        "eval": {"every": args.eval_every, "k": 1, "at_start": True},
        "logging": {"progress": False},
    }


def run(cfg: RunConfig, out: Path) -> list[dict[str, Any]]:
    with build_training(cfg, out, device="cpu", checkpoints=False) as training:
        training.driver.run()
    return list(read_rows(out / "metrics.jsonl"))


def evals(rows: list[dict[str, Any]]) -> list[tuple[int, float, float]]:
    """(step, flops, held-out pass rate) of each eval row."""
    return [(int(r["step"]), float(r["flops"]), float(r["val_pass_rate"]))
            for r in rows if r["kind"] == "eval"]


def at_flops(curve: list[tuple[int, float, float]], flops: float) -> float:
    """The pass rate of the last eval at or below `flops`."""
    below = [p for _, f, p in curve if f <= flops * (1 + 1e-9)]
    return below[-1] if below else math.nan


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30, help="distillation steps")
    p.add_argument("--rl-steps", type=int, default=None)
    p.add_argument("--reward-weight", type=float, default=0.0)
    p.add_argument("--coef", type=float, default=1.0)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--heldout", type=int, default=64)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("/tmp/bench_distill"))
    args = p.parse_args(argv)

    started = time.time()
    distill_cfg = RunConfig.model_validate({
        **base_config(args, args.steps),
        "algorithm": {"distill": {"teacher": "warm_start", "coef": args.coef,
                                  "reward_weight": args.reward_weight}},
    })
    distill_cfg = resolve_teacher(distill_cfg)  # the cached warm start's path (trained on first use)
    teacher = distill_cfg.algorithm.distill.teacher
    assert teacher is not None

    teacher_cfg = RunConfig.model_validate({**base_config(args, 1), "model": {"name_or_path": teacher}})
    teacher_rows = run(teacher_cfg, args.out / "teacher")
    teacher_pass = evals(teacher_rows)[0][2]

    distill_rows = run(distill_cfg, args.out / "distill")
    d_curve = evals(distill_rows)
    d_flops = d_curve[-1][1]
    steps_rows = [r for r in distill_rows if r["kind"] == "step"]
    per_step = d_flops / max(1, len(steps_rows))
    rl_steps = args.rl_steps
    if rl_steps is None:
        # An RL step that trains costs about 8N per token against distillation's 10N (the teacher's
        # 2N): 1.3x the steps. A step without signal costs less (no training pass): see `flops`.
        rl_steps = math.ceil(args.steps * 1.3)
    rl_rows = run(RunConfig.model_validate(base_config(args, rl_steps)), args.out / "rl")
    r_curve = evals(rl_rows)
    result = {
        "teacher_pass_rate": teacher_pass,
        "distill": {"curve": d_curve, "final_pass_rate": d_curve[-1][2], "flops": d_flops,
                    "flops_per_step": per_step,
                    "reverse_kl": [round(r["distill_reverse_kl"], 4) for r in steps_rows]},
        "rl": {"curve": r_curve, "final_pass_rate": r_curve[-1][2], "flops": r_curve[-1][1],
               "pass_rate_at_distill_flops": at_flops(r_curve, d_flops)},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "seconds": round(time.time() - started, 1),
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
