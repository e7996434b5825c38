"""Off-policy schedules side by side: trained samples per second and generator idle fraction.

`sync`, `ppo_offpolicy` (k=8) and `pipeline` (max_lag k=8) run one after the other in this process
with the real pieces (`scalerl.assembly.build.build_training`: embedded engine, trainer, prompt
pool, rewards router) on the same tiny model, the same synthetic math task, the same seeds and
the same B, n and step count (a multiple of 8, so ppo_offpolicy runs whole rounds). Evaluation and
checkpoints are off. Reported per mode: trained samples/s over the whole run, generated tokens/s,
generator idle fraction (wall time the engine had nothing to run / wall time), mean and max
version lag; then each mode's ratios to `sync`.

The tiny model learns nothing here (zero-variance filtering is off so every step really updates);
this measures the systems side only. On a CPU the generator thread and the trainer share the same
cores, so the pipeline's overlap buys less than on an accelerator, where the two otherwise take
turns on idle hardware.

    python benchmarks/bench_pipeline.py            # default sizes
    python benchmarks/bench_pipeline.py --quick    # smoke run (about a minute per mode on 2 CPU cores)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from scalerl.assembly.build import build_training
from scalerl.config import RunConfig

MODES = (("sync", 1), ("ppo_offpolicy", 8), ("pipeline", 8))


class _Rows:
    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.steps.append(dict(metrics))

    def log_eval(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Evaluation is off in this benchmark."""


@dataclass
class ModeResult:
    mode: str
    k: int
    steps: int
    seconds: float
    samples: int
    gen_tokens: float
    idle_seconds: float
    lag_mean: float
    lag_max: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds

    @property
    def idle_frac(self) -> float:
        return self.idle_seconds / self.seconds


def make_config(args: argparse.Namespace, mode: str, k: int) -> RunConfig:
    small = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 128}
    default = {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2,
               "intermediate_size": 384}
    tiny: dict[str, int] = {**(small if args.quick else default), "max_position_embeddings": 1024}
    return RunConfig.model_validate(
        {
            "seed": args.seed,
            "max_steps": args.steps,
            "model": {"tiny": tiny},
            "data": {"synthetic": {"num_prompts": 4096}, "heldout_size": 0},
            "generation": {"n": args.n, "max_new_tokens": args.max_new_tokens,
                           "max_batch_size": args.slots, "seed": args.seed,
                           "length_control": {"kind": "none"}},
            "pipeline": {"off_policy": mode, "k": k, "prompts_per_step": args.batch},
            "algorithm": {"zero_variance_filter": False},
            "optim": {"lr": 1e-5},
            "eval": {"at_start": False},
            "logging": {"progress": False},
            "rewards": {"max_workers": 2},
        }
    )


def run_mode(args: argparse.Namespace, mode: str, k: int) -> ModeResult:
    torch.manual_seed(args.seed)
    cfg = make_config(args, mode, k)
    with tempfile.TemporaryDirectory() as tmp, build_training(
        cfg, tmp, device=args.device, log=False, checkpoints=False
    ) as run:
        rows = _Rows()
        run.driver.c.metrics = rows
        start = time.perf_counter()
        result = run.driver.run()
        seconds = time.perf_counter() - start
    walls = [r["step_wall_s"] for r in rows.steps]
    return ModeResult(
        mode=mode,
        k=k,
        steps=result.steps,
        seconds=seconds,
        samples=int(sum(r["batch_samples"] for r in rows.steps)),
        gen_tokens=sum(r["gen_tokens"] for r in rows.steps),
        idle_seconds=sum(r["gen_idle_frac"] * w for r, w in zip(rows.steps, walls, strict=True)),
        lag_mean=sum(r["version_lag_mean"] for r in rows.steps) / len(rows.steps),
        lag_max=max(r["version_lag_max"] for r in rows.steps),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small model and run (smoke test)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per mode (multiple of 8)")
    parser.add_argument("--batch", type=int, default=None, help="B: prompts per step")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--slots", type=int, default=None, help="engine max_batch_size")
    parser.add_argument("--device", default=None, help="cpu / cuda (default: cuda if available)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.steps = args.steps or (16 if args.quick else 32)
    args.batch = args.batch or (2 if args.quick else 8)
    args.max_new_tokens = args.max_new_tokens or (24 if args.quick else 96)
    args.slots = args.slots or (16 if args.quick else 64)
    if args.steps % 8:
        parser.error("--steps must be a multiple of 8 (whole ppo_offpolicy rounds)")

    results = []
    for mode, k in MODES:
        r = run_mode(args, mode, k)
        results.append(r)
        print(f"{mode:>14} k={k}: {r.steps} steps in {r.seconds:6.1f}s  {r.samples_per_s:7.2f} samples/s  "
              f"{r.gen_tokens / r.seconds:8.1f} gen tok/s  idle {r.idle_frac:5.1%}  "
              f"lag mean {r.lag_mean:.2f} max {r.lag_max:.0f}", flush=True)
    base = results[0]
    print("\nratios to sync:")
    for r in results:
        print(f"{r.mode:>14} k={r.k}: samples/s x{r.samples_per_s / base.samples_per_s:5.2f}   "
              f"generator idle x{r.idle_frac / base.idle_frac if base.idle_frac else float('nan'):5.2f}")


if __name__ == "__main__":
    main()
