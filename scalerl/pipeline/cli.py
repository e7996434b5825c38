"""`scalerl train`: one RL run, from a recipe, config files and overrides to a fitted-ready run dir.

    scalerl train                                    # the embedded default with the scalerl recipe
    scalerl train --recipe deepseek_grpo --max-steps 200 --output-dir runs/grpo
    scalerl train -c my.yaml optim.lr=3e-5 --off-policy pipeline --max-lag 4
    scalerl train --output-dir runs/grpo --resume    # continue a killed run from its last checkpoint

Layers, lowest precedence first: the recipe, `--config` files, the flags, then `key.sub=value`
overrides. With no model given, the tiny default is warm-started by `scalerl sft` (cached). The run
directory receives `config.yaml` (the resolved config), `metrics.jsonl`, `heldout_ids.json`,
`sessions.jsonl` (when each session started and why it stopped) and `checkpoints/`;
`scalerl fit RUN_DIR` fits its held-out curve.

SIGTERM or Ctrl-C: the run stops at the next safe point, writes a checkpoint and exits with
128 + the signal number (143, 130); `--resume` continues it. `--resume` verifies the checkpoint's
manifest and falls back to the previous one, with a warning, if the latest is corrupt; a run killed
before its first checkpoint starts again from step 0 with its saved config.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from scalerl.atomic import write_atomic
from scalerl.config import (
    RunConfig,
    build_config,
    config_to_yaml,
    override_layer,
    yaml_layer,
)
from scalerl.recipes import recipe_path

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SESSIONS_FILE = "sessions.jsonl"

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
    p.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda if available)")
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


def resolve_run_config(
    recipe: str | None,
    config_files: list[str],
    overrides: list[str],
    resume_dir: Path | None = None,
) -> RunConfig:
    """Recipe, then config files, then overrides; a resumed run starts from its saved config."""
    layers = []
    if resume_dir is not None and (resume_dir / CONFIG_FILE).is_file():
        layers.append(yaml_layer(resume_dir / CONFIG_FILE))
    else:
        layers.append(yaml_layer(recipe_path(recipe or "scalerl")))
    layers.extend(yaml_layer(f) for f in config_files)
    layers.append(override_layer(overrides))
    cfg = build_config(layers)
    if recipe and cfg.recipe is None:
        cfg.recipe = recipe
    elif cfg.recipe is None and resume_dir is None:
        cfg.recipe = "scalerl"
    return cfg


def _resume_checkpoint(spec: str, run_dir: Path) -> Path | None:
    """The checkpoint `--resume` continues from: `spec`, verified, or the run's newest valid one.

    None: the run has no checkpoint yet (killed before its first one); it starts again.
    """
    from scalerl.training.checkpoint import latest_valid_checkpoint, verify_checkpoint

    if spec != "latest":
        path = Path(spec)
        if not path.is_dir():
            raise FileNotFoundError(f"--resume: checkpoint {path} not found")
        if not verify_checkpoint(path):
            print(f"train: warning: {path} has no manifest (an older scalerl wrote it); not verified",
                  file=sys.stderr)
        return path
    if not (run_dir / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"--resume: {run_dir} holds no run to resume (no {CONFIG_FILE}); "
                                "check --output-dir / output_dir")
    return latest_valid_checkpoint(run_dir, warn=lambda m: print(f"train: warning: {m}", file=sys.stderr))


def prepare_model(cfg: RunConfig) -> RunConfig:
    """The embedded default: replace 'no model' by the cached SFT warm start of the tiny model."""
    if cfg.model.name_or_path is not None:
        return cfg
    from scalerl.assembly.warm_start import warm_start_default
    from scalerl.training.sft import SFTConfig, progress_printer

    sft = SFTConfig(seed=cfg.model.init_seed)  # one base model for every RL seed
    print(f"warm start: SFT of the tiny model on synthetic reasoning traces ({sft.steps} steps the first "
          "time, then cached)", file=sys.stderr, flush=True)
    path = warm_start_default(cfg, sft, on_step=progress_printer(sft.steps, prefix="warm start"))
    print(f"warm start: {path}", file=sys.stderr, flush=True)
    out = cfg.model_copy(deep=True)
    out.model.name_or_path = str(path)
    return out


def default_name(cfg: RunConfig) -> RunConfig:
    """A run not named by the user is named after its output directory (plot and table labels)."""
    if "name" in cfg.model_fields_set:
        return cfg
    out = cfg.model_copy(deep=True)
    out.name = Path(cfg.output_dir).name or cfg.name
    return out


def run_train(args: argparse.Namespace) -> int:
    from scalerl.inputs import check_device, check_run_inputs

    overrides = [*flag_overrides(args), *args.overrides]
    probe = default_name(resolve_run_config(args.recipe, args.config, overrides))
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
            cfg = prepare_model(cfg)
        else:
            finished = _finished_step(resume, cfg)
            if finished is not None:
                print(f"train: {run_dir} already finished at step {finished} (max_steps {cfg.max_steps}); "
                      "nothing to resume (raise max_steps to train further)", file=sys.stderr)
                return 0
    else:
        if (run_dir / METRICS_FILE).exists():
            raise ValueError(
                f"output_dir: {run_dir} already holds a run ({METRICS_FILE}); pass --resume to continue it "
                f"or choose another --output-dir"
            )
        check_run_inputs(probe)  # before the warm start and before anything is written
        cfg = prepare_model(probe)
        (run_dir / SESSIONS_FILE).unlink(missing_ok=True)  # a new run's history starts here
    return train_run(cfg, run_dir, resume=resume, device=args.device)


def _finished_step(checkpoint: Path, cfg: RunConfig) -> int | None:
    """The checkpoint's step if it already reached `max_steps` (a finished run), else None."""
    from scalerl.training.checkpoint import checkpoint_step

    step = checkpoint_step(checkpoint)
    return step if step is not None and step >= cfg.max_steps else None


def _record_session(run_dir: Path, event: dict[str, Any]) -> None:
    """Append one line to `sessions.jsonl` (a session's start, and its stop unless it was killed)."""
    with (run_dir / SESSIONS_FILE).open("a", encoding="utf-8") as f:
        line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "pid": os.getpid(), **event}
        f.write(json.dumps(line) + "\n")
        f.flush()


def train_run(cfg: RunConfig, run_dir: Path, *, resume: Path | None = None, device: str | None = None) -> int:
    from scalerl.assembly.build import train
    from scalerl.model_identity import START_MODEL_FILE, model_identity
    from scalerl.pipeline.faults import FaultLimitError
    from scalerl.pipeline.preemption import StopRequest, exit_status, stop_on_signals
    from scalerl.training.checkpoint import CheckpointWriteError, latest_checkpoint
    from scalerl.training.threads import run_threads
    from scalerl.training.trainer import TrainingDivergedError

    fresh = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    if resume is None:
        write_atomic(run_dir / CONFIG_FILE, config_to_yaml(cfg))
        identity = model_identity(cfg.model.name_or_path, cfg.model.tiny.model_dump())
        write_atomic(run_dir / START_MODEL_FILE, json.dumps(identity, indent=2) + "\n")
    print(f"train: {cfg.name} (recipe {cfg.recipe}, {cfg.pipeline.off_policy} k={cfg.pipeline.k}, "
          f"{cfg.algorithm.loss_type}/{cfg.algorithm.aggregation}/{cfg.algorithm.adv_norm}) -> {run_dir}"
          + (f", resuming from {resume}" if resume else ""), file=sys.stderr, flush=True)
    started = time.monotonic()
    _record_session(run_dir, {"event": "start", "resumed_from": str(resume) if resume else None})
    stop = StopRequest()
    try:
        with stop_on_signals(stop), run_threads(cfg.model, device) as threads:
            if threads is not None:
                print(f"train: {threads} CPU thread(s) for torch (scalerl/training/threads.py)",
                      file=sys.stderr, flush=True)
            result = train(cfg, run_dir, resume=resume, device=device, stop=stop)
    except (CheckpointWriteError, FaultLimitError, TrainingDivergedError) as err:
        # Not bad input: the run itself failed. One clear line, and where to continue from.
        last = latest_checkpoint(run_dir)
        print(f"train: error: {err}" + (f"; --resume continues from {last}" if last else ""), file=sys.stderr)
        _record_session(run_dir, {"event": "stop", "stop_reason": type(err).__name__, "exit_status": 1,
                                  "error": str(err), "wall_s": time.monotonic() - started})
        return 1
    except BaseException:
        # A run that failed before its first logged row leaves no directory behind.
        if fresh and not (run_dir / METRICS_FILE).exists():
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    status = exit_status(result.signal) if result.stop_reason == "signal" and result.signal else 0
    _record_session(run_dir, {"event": "stop", "step": result.steps, "stop_reason": result.stop_reason,
                              "signal": result.signal, "exit_status": status,
                              "wall_s": time.monotonic() - started})
    summary = ", ".join(
        f"{k} {result.last_eval[k]:.3f}" for k in ("val_pass_rate", "val_pass_at_k") if k in result.last_eval
    )
    reason = result.stop_reason if result.signal is None else f"{result.signal}, checkpointed"
    print(f"train: stopped after step {result.steps} ({reason}); max version lag "
          f"{result.max_version_lag}" + (f"; last eval: {summary}" if summary else ""), file=sys.stderr)
    if status:
        print(f"train: continue with `scalerl train --output-dir {run_dir} --resume`", file=sys.stderr)
        return status
    if result.stop_reason == "max_steps" and cfg.max_time_s is not None:
        print(f"train: max_steps={cfg.max_steps} was reached before max_time_s={cfg.max_time_s:g}; raise "
              "--max-steps to train for the whole time", file=sys.stderr)
    print(f"train: fit its curve with `scalerl fit {run_dir} --x flops`", file=sys.stderr)
    return 0
