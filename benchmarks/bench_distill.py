"""On-policy distillation vs RL alone at equal compute (docs/algorithms.md). Prints one JSON object.

Two settings (`--student`):

* `scratch` (default): the student is the embedded default's tiny model at its random init; the
  teacher is the embedded default's SFT warm start (the model `scalerl train` starts from). Arms:
  `distill` (pure distillation, `reward_weight=0` unless `--reward-weight`) and `rl` (the default
  ScaleRL recipe against the math verifier alone, from the same random init). The RL arm runs
  `--rl-steps` (default 1.3x the distillation steps; a step without signal is a no-op that costs
  generation only, so compare the reported `flops`). The teacher's held-out pass rate is measured
  once (its eval at step 0).
* `warm_start`: the setting on-policy distillation is used in (Thinking Machines 2025: a student
  with a reasonable start, a stronger teacher). The `rl` arm trains the warm start with RL for
  `--rl-steps`; its final checkpoint is the teacher, and its curve is "RL alone". The `distill`
  arm starts the same warm start and distils from that teacher. `to_teacher` gives the compute at
  which each arm's held-out pass rate first reached the teacher's (RL reaches it by its end at the
  latest, by construction).

Both arms log the held-out pass rate against the run's FLOPs (the meter counts the teacher's
forward passes in the distillation arm), with the same prompts, seeds and sampling.

    PYTHONPATH=$PWD python benchmarks/bench_distill.py --steps 30 --out /tmp/distill
    PYTHONPATH=$PWD python benchmarks/bench_distill.py --student warm_start --rl-steps 100 \
        --steps 50 --n 8 --lr 1e-4 --heldout 200 --eval-k 2 --out /tmp/distill_warm
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
        "eval": {"every": args.eval_every, "k": args.eval_k, "at_start": True},
        "logging": {"progress": False},
    }


def run(cfg: RunConfig, out: Path, checkpoints: bool = False) -> list[dict[str, Any]]:
    with build_training(cfg, out, device="cpu", checkpoints=checkpoints) as training:
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


def flops_to_reach(curve: list[tuple[int, float, float]], target: float) -> float | None:
    """The compute of the first eval whose pass rate is at least `target` (None: never)."""
    return next((f for _, f, p in curve if p >= target), None)


def warm_start_path(args: argparse.Namespace) -> str:
    """The embedded default's cached SFT warm start (trained on first use)."""
    cfg = resolve_teacher(RunConfig.model_validate(
        {**base_config(args, 1), "algorithm": {"distill": {"teacher": "warm_start"}}}))
    assert cfg.algorithm.distill.teacher is not None
    return cfg.algorithm.distill.teacher


def distill_config(args: argparse.Namespace, teacher: str, student: str | None) -> RunConfig:
    return RunConfig.model_validate({
        **base_config(args, args.steps),
        **({"model": {"name_or_path": student}} if student else {}),
        "algorithm": {"distill": {"teacher": teacher, "coef": args.coef,
                                  "reward_weight": args.reward_weight, "estimator": args.estimator}},
    })


def arm(rows: list[dict[str, Any]]) -> dict[str, Any]:
    curve = evals(rows)
    return {"curve": curve, "final_pass_rate": curve[-1][2], "flops": curve[-1][1],
            "steps": sum(r["kind"] == "step" for r in rows)}


def distill_arm(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """`arm` plus the compute per step and the per-step reverse KL."""
    steps_rows = [r for r in rows if r["kind"] == "step"]
    return {**arm(rows), "flops_per_step": evals(rows)[-1][1] / max(1, len(steps_rows)),
            "reverse_kl": [round(r["distill_reverse_kl"], 4) for r in steps_rows]}


def scratch_student(args: argparse.Namespace, teacher: str) -> dict[str, Any]:
    teacher_cfg = RunConfig.model_validate({**base_config(args, 1), "model": {"name_or_path": teacher}})
    teacher_pass = evals(run(teacher_cfg, args.out / "teacher"))[0][2]
    distill_rows = run(distill_config(args, teacher, None), args.out / "distill")
    d = distill_arm(distill_rows)
    rl_steps = args.rl_steps
    if rl_steps is None:
        # An RL step that trains costs about 8N per token against distillation's 10N (the teacher's
        # 2N): 1.3x the steps. A step without signal costs less (no training pass): see `flops`.
        rl_steps = math.ceil(args.steps * 1.3)
    rl = arm(run(RunConfig.model_validate(base_config(args, rl_steps)), args.out / "rl"))
    rl["pass_rate_at_distill_flops"] = at_flops(rl["curve"], d["flops"])
    return {"student": "scratch", "teacher_pass_rate": teacher_pass, "distill": d, "rl": rl}


def warm_student(args: argparse.Namespace, warm_start: str) -> dict[str, Any]:
    """RL from the warm start makes the teacher (its final checkpoint); the warm start distils it."""
    rl_steps = args.rl_steps
    if rl_steps is None:  # twice the distillation steps, rounded up to whole eval intervals
        rl_steps = math.ceil(2 * args.steps / args.eval_every) * args.eval_every
    rl_cfg = RunConfig.model_validate({**base_config(args, rl_steps),
                                       "model": {"name_or_path": warm_start}})
    rl = arm(run(rl_cfg, args.out / "rl", checkpoints=True))
    teacher = sorted((args.out / "rl" / "checkpoints").glob("step_*"))[-1]
    teacher_pass = rl["final_pass_rate"]  # the RL arm's last eval is of the teacher's weights
    distill_rows = run(distill_config(args, str(teacher), warm_start), args.out / "distill")
    d = distill_arm(distill_rows)
    rl["pass_rate_at_distill_flops"] = at_flops(rl["curve"], d["flops"])
    return {"student": "warm_start", "teacher": str(teacher), "teacher_pass_rate": teacher_pass,
            "start_pass_rate": rl["curve"][0][2], "distill": d, "rl": rl,
            "to_teacher": {"distill_flops": flops_to_reach(d["curve"], teacher_pass),
                           "rl_flops": flops_to_reach(rl["curve"], teacher_pass)}}


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
    p.add_argument("--eval-k", type=int, default=1, help="samples per held-out prompt (mean@k)")
    p.add_argument("--student", choices=("scratch", "warm_start"), default="scratch")
    p.add_argument("--estimator", choices=("sampled", "full"), default="sampled",
                   help="algorithm.distill.estimator: the sampled token's gap, or the full-vocabulary KL")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("/tmp/bench_distill"))
    args = p.parse_args(argv)
    if args.student == "warm_start" and args.rl_steps is not None and args.rl_steps % args.eval_every:
        p.error("--student warm_start: --rl-steps must be a multiple of --eval-every (the teacher's "
                "pass rate is the RL arm's last eval)")

    started = time.time()
    ws = warm_start_path(args)
    result = (warm_student if args.student == "warm_start" else scratch_student)(args, ws)
    result["args"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result["seconds"] = round(time.time() - started, 1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
