"""`scalerl train`: one RL run, from a recipe, config files and overrides to a fitted-ready run dir.

    scalerl train                                    # the embedded default with the scalerl recipe
    scalerl train --recipe deepseek_grpo --max-steps 200 --output-dir runs/grpo
    scalerl train -c my.yaml optim.lr=3e-5 --off-policy pipeline --max-lag 4
    scalerl train --output-dir runs/grpo --resume    # continue a killed run from its last checkpoint

Layers, lowest precedence first: the recipe, `--config` files, the flags, then `key.sub=value`
overrides (anywhere on the line). With no model given, the tiny default is warm-started by
`scalerl sft` (cached). The run directory receives `config.yaml` (the resolved config),
`metrics.jsonl`, `heldout_ids.json`, `resolved.json` (what the built trainer, pool and driver use,
`scalerl.assembly.resolved`), `sessions.jsonl` (when each session started and why it
stopped), `checkpoints/`, `.scalerl-owner.json` (the folder is a train run's: a folder holding
anything else is refused) and, if the run failed on our side (not bad input), `error.log` with the
traceback; `scalerl fit RUN_DIR` fits its held-out curve.

Every evaluation past the first four carries the live forecast of the curve so far (forecast_A
[lo, hi], B, C_mid, status, compute to pin A: `scalerl.scaling.live`); `--stop-when-known W` stops
at the first evaluation whose unflagged forecast pins A to an interval narrower than W, and
`stop_request.json` in the run folder (what `scalerl ablate --prune` writes) stops it there too.

SIGTERM or Ctrl-C: the run stops at the next safe point, writes a checkpoint and exits with
128 + the signal number (143, 130); `--resume` continues it. `--resume` verifies the checkpoint's
manifest and falls back to the previous one, with a warning, if the latest is corrupt; a run killed
before its first checkpoint starts again from step 0 with its saved config.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from scalerl.assembly.run import (
    CONFIG_FILE,
    ERROR_LOG,
    METRICS_FILE,
    SESSIONS_FILE,
    TRAIN_KIND,
    default_name,
    finished_step,
    prepare_model,
    resolve_run_config,
    stderr_say,
    train_run,
)
from scalerl.inputs import InputError, MissingInputError

# flag -> config key; each flag is sugar for one override.
FLAG_KEYS: dict[str, str] = {
    "max_steps": "max_steps",
    "eval_every": "eval.every",
    "off_policy": "pipeline.off_policy",
    "max_lag": "pipeline.k",
    "schedule": "pipeline.schedule",
    "model": "model.name_or_path",
    "data": "data.train_path",
    "output_dir": "output_dir",
    "seed": "seed",
    "name": "name",
    "max_time_s": "max_time_s",
    "stop_when_known": "forecast.stop_when_known",
}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "train",
        help="run RL training (recipe + config + overrides)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides (optim.lr=3e-5)")
    p.add_argument("--recipe", help="a preset from `scalerl recipes` (default: scalerl)")
    p.add_argument("-c", "--config", action="append", default=[], metavar="FILE", help="YAML (repeatable)")
    p.add_argument("--output-dir", metavar="DIR", help="run directory (config key output_dir)")
    p.add_argument("--max-steps", type=int, metavar="N")
    p.add_argument("--eval-every", type=int, metavar="N", help="steps between held-out evaluations")
    p.add_argument("--off-policy", choices=("sync", "ppo_offpolicy", "pipeline"))
    p.add_argument("--max-lag", type=int, metavar="K", help="pipeline max_lag / ppo_offpolicy k")
    p.add_argument("--schedule", choices=("threaded", "interleaved"),
                   help="pipeline mode: generator thread, or a reproducible single-thread interleaving")
    p.add_argument("--model", metavar="NAME_OR_PATH", help="HF causal LM (default: tiny, warm-started)")
    p.add_argument("--data", metavar="PATH", help="prompt file or folder (default: the synthetic math task)")
    p.add_argument("--seed", type=int)
    p.add_argument("--name", help="run name (labels in plots and tables)")
    p.add_argument("--max-time-s", "--max-time", dest="max_time_s", type=float, metavar="S",
                   help="also stop after S seconds of wall clock (default: no limit; --max-steps, "
                        "default 100, still applies)")
    p.add_argument("--stop-when-known", type=float, metavar="W",
                   help="stop at the first evaluation whose live forecast pins A to an interval "
                        "narrower than W (hi - lo) with an unflagged fit (config forecast.stop_when_known)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda if available)")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config (recipe, files, flags, overrides) as YAML and exit")
    p.add_argument("--resume", nargs="?", const="latest", metavar="CHECKPOINT",
                   help="continue from a checkpoint (default: the run directory's latest)")
    p.set_defaults(func=run_train)


def flag_overrides(args: argparse.Namespace) -> list[str]:
    """The flags as `key=value` overrides (only those given)."""
    out = []
    for attr, key in FLAG_KEYS.items():
        value = getattr(args, attr, None)
        if value is not None:
            out.append(f"{key}={value}")
    return out


def _resume_checkpoint(spec: str, run_dir: Path) -> Path | None:
    """The checkpoint `--resume` continues from: `spec`, verified, or the run's newest valid one.

    None: the run has no checkpoint yet (killed before its first one); it starts again.
    """
    from scalerl.training.checkpoint import latest_valid_checkpoint, verify_checkpoint

    if spec != "latest":
        path = Path(spec)
        if not path.is_dir():
            raise MissingInputError(f"--resume: checkpoint {path} not found")
        if not verify_checkpoint(path):
            print(f"train: warning: {path} has no manifest (an older scalerl wrote it); not verified",
                  file=sys.stderr)
        return path
    if not (run_dir / CONFIG_FILE).is_file():
        raise MissingInputError(f"--resume: {run_dir} holds no run to resume (no {CONFIG_FILE}); "
                                "check --output-dir / output_dir")
    return latest_valid_checkpoint(run_dir, warn=lambda m: print(f"train: warning: {m}", file=sys.stderr))


def run_train(args: argparse.Namespace) -> int:
    from scalerl.assembly.inputs import check_run_inputs
    from scalerl.inputs import check_device
    from scalerl.ownership import check_output_dir_owned

    overrides = [*flag_overrides(args), *args.overrides]
    probe = default_name(resolve_run_config(args.recipe, args.config, overrides))
    if args.print_config:
        from scalerl.config import config_to_yaml

        print(config_to_yaml(probe), end="")
        return 0
    from scalerl.rollout.factory import check_engine_available  # torch: imported only when running

    check_engine_available(probe.generation.engine)
    check_device(args.device)
    run_dir = Path(probe.output_dir)
    resume = None
    if args.resume is not None:
        resume = _resume_checkpoint(args.resume, run_dir)
        cfg = resolve_run_config(args.recipe, args.config, overrides, resume_dir=run_dir)
        check_run_inputs(cfg)
        if resume is None:
            print(f"train: {run_dir} has no checkpoint yet (stopped before its first one): starting it "
                  "again from step 0 with its saved config", file=sys.stderr)
            cfg = prepare_model(cfg, say=stderr_say)
        else:
            finished = finished_step(resume, cfg)
            if finished is not None:
                print(f"train: {run_dir} already finished at step {finished} (max_steps {cfg.max_steps}); "
                      "nothing to resume (raise max_steps to train further)", file=sys.stderr)
                return 0
    else:
        if (run_dir / METRICS_FILE).exists():
            raise InputError(
                f"output_dir: {run_dir} already holds a run ({METRICS_FILE}); pass --resume to continue it "
                f"or choose another --output-dir"
            )
        check_run_inputs(probe)  # before the warm start and before anything is written
        from scalerl.assembly.advice import tiny_default_advice

        for line in tiny_default_advice(probe):
            print(f"train: warning: {line}", file=sys.stderr)
        check_output_dir_owned(run_dir, TRAIN_KIND, "--output-dir")
        cfg = prepare_model(probe, say=stderr_say)
        for stale in (SESSIONS_FILE, ERROR_LOG):  # a new run's history starts here (the folder is ours)
            (run_dir / stale).unlink(missing_ok=True)
    return train_run(cfg, run_dir, resume=resume, device=args.device, say=stderr_say,
                     owner=TRAIN_KIND if resume is None and args.resume is None else None)


__all__ = ["FLAG_KEYS", "flag_overrides", "register", "run_train"]
