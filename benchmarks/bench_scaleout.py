"""Scale-out: samples/s and generator idle fraction of sync / ppo_offpolicy / pipeline with 1, 2, 4 engines.

Emulated devices in one process (no Ray): every engine is a `scalerl.rollout.emulated.EmulatedEngine`
(continuous batching, modelled decode-step time spent sleeping, seeded lognormal lengths) and the
trainer an `EmulatedTrainer` (modelled step time), so the figures stand for separate devices, not
for threads sharing this machine's cores. The real pipeline drives them: `scalerl.pipeline.Driver`
with its `Generator`, `StalenessController` and the three schedules; with more than one engine the
generator drives a `ThreadedEnginePool` (least-loaded placement, streaming, version = minimum).
Reported per run: trained samples/s (wall clock), generator idle fraction
(`1 - modelled engine busy time / (engines x wall)`), mean and max version lag of trained samples;
and, beside each, what the discrete-event simulator (`scalerl.pipeline.simulate`, same devices,
same seeds, hence the same lengths) predicts, as a check of one against the other. Then the
ratios between modes and over engine counts.

    python benchmarks/bench_scaleout.py            # k=4, 16 steps per run (about a minute)
    python benchmarks/bench_scaleout.py --quick    # k=2, 4 steps per run (CI smoke run)
"""

from __future__ import annotations

import argparse
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scalerl.config import RunConfig
from scalerl.data import PromptPool, PromptRecord, make_synthetic
from scalerl.pipeline.driver import Components, Driver
from scalerl.pipeline.engine_pool import ThreadedEnginePool
from scalerl.pipeline.simulate import SimConfig, simulate
from scalerl.rollout.emulated import EmulatedEngine, LengthModel
from scalerl.rollout.protocol import Engine, SamplingParams
from scalerl.training.emulated import EmulatedTrainer

VOCAB = 1000
ENGINE_COUNTS = (1, 2, 4)


@dataclass(frozen=True)
class Devices:
    """The emulated devices of every run (one setting: ratios compare like with like)."""

    slots: int = 16
    step_s: float = 0.004
    token_s: float = 0.0001
    update_s: float = 0.002
    length: LengthModel = field(default_factory=lambda: LengthModel(24.0, 0.5, 0.6))
    max_new_tokens: int = 96
    train_step_s: float = 0.05
    train_token_s: float = 0.0001


class _Rows:
    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.steps.append(dict(metrics))

    def log_eval(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Evaluation is off in this benchmark."""


class _HashScorer:
    """A reward that depends on the completion only (the emulated tokens mean nothing)."""

    def score(self, record: PromptRecord, completion_text: str) -> float:
        return float(zlib.crc32(completion_text.encode()) % 2)


def _encode(record: PromptRecord) -> list[int]:
    return [ord(ch) % (VOCAB - 1) for ch in record.prompt[:32]] or [1]


def _decode(ids: list[int]) -> str:
    return " ".join(map(str, ids))


@dataclass
class Run:
    mode: str
    k: int
    engines: int
    steps: int
    seconds: float
    samples: int
    engine_busy_s: float
    lag_mean: float
    lag_max: int
    sim_samples_per_s: float
    sim_idle: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds

    @property
    def idle(self) -> float:
        return max(0.0, 1.0 - self.engine_busy_s / (self.engines * self.seconds))


def _config(args: argparse.Namespace, mode: str, k: int) -> RunConfig:
    return RunConfig.model_validate({
        "seed": args.seed,
        "max_steps": args.steps,
        "generation": {"n": args.n, "max_new_tokens": args.devices.max_new_tokens, "seed": args.seed,
                       "length_control": {"kind": "none"}},
        "pipeline": {"off_policy": mode, "k": k, "prompts_per_step": args.batch},
        "algorithm": {"zero_variance_filter": False},
        "eval": {"at_start": False},
        "logging": {"progress": False},
        "rewards": {"max_workers": 1},
    })


def _simulated(args: argparse.Namespace, mode: str, k: int, engines: int) -> tuple[float, float]:
    d: Devices = args.devices
    cfg = SimConfig(mode=mode, k=k, steps=args.steps, prompts_per_step=args.batch, n=args.n,  # type: ignore[arg-type]
                    num_engines=engines, slots=d.slots, max_new_tokens=d.max_new_tokens, length=d.length,
                    decode_step_s=d.step_s, decode_token_s=d.token_s, train_step_s=d.train_step_s,
                    train_token_s=d.train_token_s, weight_transfer_s=0.0, weight_update_s=d.update_s,
                    seed=args.seed)
    r = simulate(cfg)
    return r.samples_per_s, r.generator_idle_frac


def run_local(args: argparse.Namespace, mode: str, k: int, num_engines: int) -> Run:
    d: Devices = args.devices
    engines = [
        EmulatedEngine(max_batch_size=d.slots, step_s=d.step_s, token_s=d.token_s, update_s=d.update_s,
                       length_median=d.length.median, length_prompt_sigma=d.length.prompt_sigma,
                       length_sample_sigma=d.length.sample_sigma, vocab_size=VOCAB, seed=i)
        for i in range(num_engines)
    ]
    pool = ThreadedEnginePool(engines) if num_engines > 1 else None
    engine: Engine = pool if pool is not None else engines[0]
    rows = _Rows()
    components = Components(
        engine=engine,
        trainer=EmulatedTrainer(step_s=d.train_step_s, token_s=d.train_token_s),
        source=PromptPool(make_synthetic("math", 4096, args.seed), args.seed),
        scorer=_HashScorer(),
        encode=_encode,
        decode=_decode,
        params=SamplingParams(n=args.n, max_new_tokens=d.max_new_tokens),
        metrics=rows,
    )
    try:
        driver = Driver(_config(args, mode, k), components)
        start = time.perf_counter()
        result = driver.run()
        seconds = time.perf_counter() - start
    finally:
        if pool is not None:
            pool.close()
    sim_sps, sim_idle = _simulated(args, mode, k, num_engines)
    return Run(
        mode=mode, k=k, engines=num_engines, steps=result.steps, seconds=seconds,
        samples=int(sum(r["batch_samples"] for r in rows.steps)),
        engine_busy_s=sum(e.stats.device_s + e.stats.update_device_s for e in engines),
        lag_mean=sum(r["version_lag_mean"] for r in rows.steps) / len(rows.steps),
        lag_max=int(max(r["version_lag_max"] for r in rows.steps)),
        sim_samples_per_s=sim_sps, sim_idle=sim_idle,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (CI smoke run)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (multiple of k)")
    parser.add_argument("--k", type=int, default=None, help="k of ppo_offpolicy and pipeline (4; quick 2)")
    parser.add_argument("--batch", type=int, default=8, help="B: prompts per step")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.steps = args.steps or (4 if args.quick else 16)
    args.k = args.k or (2 if args.quick else 4)
    if args.steps % args.k:
        parser.error(f"--steps must be a multiple of --k={args.k} (whole ppo_offpolicy rounds)")
    args.devices = Devices()
    d = args.devices
    print(f"emulated devices: decode step {1e3 * d.step_s:.1f} ms + {1e3 * d.token_s:.2f} ms per sequence, "
          f"{d.slots} slots per engine, weight load {1e3 * d.update_s:.0f} ms; lengths lognormal (median "
          f"{d.length.median:.0f}) capped at {d.max_new_tokens}; trainer {d.train_step_s:.2f} s + "
          f"{1e6 * d.train_token_s:.0f} us per token; B={args.batch} x n={args.n}, "
          f"{args.steps} steps per run")

    modes = (("sync", 1), ("ppo_offpolicy", args.k), ("pipeline", args.k))
    runs: dict[tuple[str, int], Run] = {}
    for count in ENGINE_COUNTS:
        for mode, k in modes:
            r = run_local(args, mode, k, count)
            runs[(mode, count)] = r
            print(f"engines={count} {mode:>14} k={k}: {r.steps} steps in {r.seconds:6.2f}s  "
                  f"{r.samples_per_s:7.2f} samples/s  idle {100 * r.idle:5.1f}%  "
                  f"lag mean {r.lag_mean:.2f} max {r.lag_max}  |  simulated {r.sim_samples_per_s:7.2f} "
                  f"samples/s  idle {100 * max(0.0, r.sim_idle):5.1f}%  measured/simulated "
                  f"x{r.samples_per_s / r.sim_samples_per_s:.2f}", flush=True)

    print("\nratios between modes (samples/s):")
    for count in ENGINE_COUNTS:
        sync, ppo, pipe = (runs[(m, count)] for m, _ in modes)
        print(f"engines={count}: ppo_offpolicy/sync x{ppo.samples_per_s / sync.samples_per_s:.2f}  "
              f"pipeline/sync x{pipe.samples_per_s / sync.samples_per_s:.2f}  "
              f"pipeline/ppo_offpolicy x{pipe.samples_per_s / ppo.samples_per_s:.2f}")
    print("\nscaling over engines (samples/s relative to 1 engine):")
    for mode, k in modes:
        one = runs[(mode, 1)].samples_per_s
        scaled = "  ".join(
            f"{c} engines x{runs[(mode, c)].samples_per_s / one:.2f}" for c in ENGINE_COUNTS[1:]
        )
        print(f"{mode:>14} k={k}: {scaled}")


if __name__ == "__main__":
    main()
