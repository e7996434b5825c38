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
    python benchmarks/bench_scaleout.py --ray      # + engines as Ray actors, weight sync vs model size
"""

from __future__ import annotations

import argparse
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from scalerl.assembly.sections import driver_settings
from scalerl.config import RunConfig
from scalerl.data import PromptPool, PromptRecord, make_synthetic
from scalerl.pipeline.driver import Components, Driver
from scalerl.pipeline.engine_pool import ThreadedEnginePool
from scalerl.pipeline.simulate import SimConfig, simulate
from scalerl.pipeline.staleness import ADMISSIONS
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
    token_lag_mean: float = 0.0
    token_lag_max: int = 0
    renewed: int = 0  # groups re-admitted (`admission: partial`)
    sim_stale: float = 0.0  # simulated share of trained tokens more than k versions old

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
        "pipeline": {"off_policy": mode, "k": k, "prompts_per_step": args.batch,
                     "admission": args.admission if mode == "pipeline" else "bounded"},
        "algorithm": {"zero_variance_filter": False},
        "eval": {"at_start": False},
        "logging": {"progress": False},
        "rewards": {"max_workers": 1},
    })


def _simulated(args: argparse.Namespace, mode: str, k: int, engines: int) -> tuple[float, float, float]:
    d: Devices = args.devices
    cfg = SimConfig(mode=mode, k=k, steps=args.steps, prompts_per_step=args.batch, n=args.n,  # type: ignore[arg-type]
                    num_engines=engines, slots=d.slots, max_new_tokens=d.max_new_tokens, length=d.length,
                    decode_step_s=d.step_s, decode_token_s=d.token_s, train_step_s=d.train_step_s,
                    train_token_s=d.train_token_s, weight_transfer_s=0.0, weight_update_s=d.update_s,
                    seed=args.seed, admission=args.admission if mode == "pipeline" else "bounded")
    r = simulate(cfg)
    return r.samples_per_s, r.generator_idle_frac, r.stale_token_frac()


def _token_lags(rows: _Rows) -> dict[str, Any]:
    """Per-token lag (mean over steps, max) and re-admissions, from the pipeline's step rows."""
    return {"token_lag_mean": sum(r["token_lag_mean"] for r in rows.steps) / len(rows.steps),
            "token_lag_max": int(max(r["token_lag_max"] for r in rows.steps)),
            "renewed": int(rows.steps[-1].get("groups_renewed_total", 0))}


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
        driver = Driver(driver_settings(_config(args, mode, k)), components)
        start = time.perf_counter()
        result = driver.run()
        seconds = time.perf_counter() - start
    finally:
        if pool is not None:
            pool.close()
    sim_sps, sim_idle, sim_stale = _simulated(args, mode, k, num_engines)
    return Run(
        mode=mode, k=k, engines=num_engines, steps=result.steps, seconds=seconds,
        samples=int(sum(r["batch_samples"] for r in rows.steps)),
        engine_busy_s=sum(e.stats.device_s + e.stats.update_device_s for e in engines),
        lag_mean=sum(r["version_lag_mean"] for r in rows.steps) / len(rows.steps),
        lag_max=int(max(r["version_lag_max"] for r in rows.steps)),
        sim_samples_per_s=sim_sps, sim_idle=sim_idle, **_token_lags(rows), sim_stale=sim_stale,
    )


# ---------------------------------------------------------------------------------------------
# Ray (`--ray`): the same emulated devices as engine actors (scalerl.distributed.EnginePool), and
# weight-sync seconds against model size over the object store and a gloo group. Needs the
# `distributed` extra; every figure is printed beside its in-process counterpart or its peer.

WEIGHT_SYNC_MODELS = {  # tiny Qwen2 shapes (char vocabulary) of about 1M, 16M and 100M parameters
    "1M": {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 384},
    "16M": {"hidden_size": 512, "num_layers": 5, "num_heads": 8, "num_kv_heads": 2,
            "intermediate_size": 1536},
    "100M": {"hidden_size": 1024, "num_layers": 7, "num_heads": 8, "num_kv_heads": 2,
             "intermediate_size": 4096},
    # The decoder stacks of Qwen2.5-0.5B and -1.5B (their layer shapes; the char vocabulary, so without
    # their 136M / 233M embedding parameters): for the GPU script (`--weight-sync-gpus`).
    "0.5B-layers": {"hidden_size": 896, "num_layers": 24, "num_heads": 14, "num_kv_heads": 2,
                    "intermediate_size": 4864},
    "1.5B-layers": {"hidden_size": 1536, "num_layers": 28, "num_heads": 12, "num_kv_heads": 2,
                    "intermediate_size": 8960},
}


def _ray_dist(num_engines: int, **extra: Any) -> Any:
    from scalerl.config import DistributedConfig

    # Emulated engines sleep instead of computing: a small logical CPU share each is honest.
    return DistributedConfig(backend="ray", num_engines=num_engines, engine_num_cpus=0.1,
                             trainer_num_cpus=0.5, timeout_s=120, startup_timeout_s=300, **extra)


def run_ray(args: argparse.Namespace, mode: str, k: int, num_engines: int) -> Run:
    """`run_local` with the engines in Ray actors: polls, placement and weights cross processes."""
    from scalerl.distributed.channel import RayWeightChannel
    from scalerl.distributed.engine_actor import EngineFactory
    from scalerl.distributed.pool import EnginePool
    from scalerl.rollout.factory import EngineSpec

    d: Devices = args.devices
    options = {"step_s": d.step_s, "token_s": d.token_s, "update_s": d.update_s,
               "length_median": d.length.median, "length_prompt_sigma": d.length.prompt_sigma,
               "length_sample_sigma": d.length.sample_sigma, "vocab_size": VOCAB}
    specs = [EngineSpec(kind="emulated", model_path=None, fp32_lm_head=False, seed=i, max_batch_size=d.slots,
                        eos_token_ids=(VOCAB - 1,), options=options) for i in range(num_engines)]
    factories = [EngineFactory(spec) for spec in specs]
    dist = _ray_dist(num_engines)
    pool = EnginePool.launch(factories, dist)
    rows = _Rows()
    components = Components(
        engine=pool,
        trainer=EmulatedTrainer(step_s=d.train_step_s, token_s=d.train_token_s),
        source=PromptPool(make_synthetic("math", 4096, args.seed), args.seed),
        scorer=_HashScorer(), encode=_encode, decode=_decode,
        params=SamplingParams(n=args.n, max_new_tokens=d.max_new_tokens),
        metrics=rows, channel=RayWeightChannel(pool, mode="object_store", timeout_s=dist.timeout_s),
    )
    try:
        driver = Driver(driver_settings(_config(args, mode, k)), components)
        start = time.perf_counter()
        result = driver.run()
        seconds = time.perf_counter() - start
        pool.step()  # one more poll: each engine's clocks as of the end of the run
    finally:
        pool.close()
    sim_sps, sim_idle, sim_stale = _simulated(args, mode, k, num_engines)
    return Run(
        mode=mode, k=k, engines=num_engines, steps=result.steps, seconds=seconds,
        samples=int(sum(r["batch_samples"] for r in rows.steps)),
        engine_busy_s=sum(m.busy_s for m in pool.members),
        lag_mean=sum(r["version_lag_mean"] for r in rows.steps) / len(rows.steps),
        lag_max=int(max(r["version_lag_max"] for r in rows.steps)),
        sim_samples_per_s=sim_sps, sim_idle=sim_idle, **_token_lags(rows), sim_stale=sim_stale,
    )


def weight_sync_rows(sizes: list[str], repeats: int, num_engines: int = 2, gpus: bool = False) -> None:
    """Seconds to gather a model on the trainer (FSDP2, 1 rank) and to load it into `num_engines`
    engine actors, over the object store and over a gloo group (streamed from the shards), median of
    `repeats`. `gpus`: the trainer rank and every engine on a GPU of its own and an NCCL group (needs
    1 + num_engines GPUs)."""
    import statistics

    from scalerl.assembly.sections import trainer_settings
    from scalerl.config import RunConfig
    from scalerl.distributed.channel import RayWeightChannel
    from scalerl.distributed.engine_actor import EngineFactory
    from scalerl.distributed.pool import EnginePool
    from scalerl.distributed.trainer import RayTrainer
    from scalerl.rollout.factory import EngineSpec

    group = "nccl" if gpus else "gloo"
    print(f"\nweight sync, trainer rank 0 -> {num_engines} engine actors (median of {repeats} after one "
          f"warm-up that sets the {group} group up; engine-side load into a model excluded: the emulated "
          "engines only stage the tensors; the collective sync streams from the shards, so its gather "
          "is inside its time):")
    print(f"{'model':>11} {'params':>13} {'MB':>8} {'gather s':>9} {'object store s':>15} "
          f"{group + ' streamed s':>17} {'(gather+store)/' + group:>20}")
    spec = EngineSpec(kind="emulated", model_path=None, fp32_lm_head=False, seed=0, max_batch_size=1,
                      eos_token_ids=(1,), options={"vocab_size": 2})
    for size in sizes:
        tiny = dict(WEIGHT_SYNC_MODELS[size], max_position_embeddings=512)
        extra = ({"trainer_num_gpus": 1, "engine_num_gpus": 1, "collective_backend": "nccl"} if gpus else {})
        dist = _ray_dist(num_engines, **extra).model_dump()
        cfg = RunConfig.model_validate({"model": {"tiny": tiny}, "distributed": dist})
        trainer = RayTrainer(cfg.model, trainer_settings(cfg), cfg.distributed)
        pool = EnginePool.launch([EngineFactory(spec) for _ in range(num_engines)], cfg.distributed)
        try:
            seconds: dict[str, list[float]] = {"object_store": [], "collective": [], "gather": []}
            nbytes = 0
            channels = {mode: RayWeightChannel(pool, mode=mode, backend=group,
                                               timeout_s=cfg.distributed.timeout_s)
                        for mode in ("object_store", "collective")}
            for rep in range(repeats + 1):  # the first round (the gloo group's set-up) is not counted
                for mode, channel in channels.items():
                    trainer.put_weights = mode == "object_store"
                    weights = trainer.weights_for_engine()
                    if rep == 0:
                        channel.publish(weights, trainer.version)
                        continue
                    if mode == "object_store":  # the streamed collective sync gathers inside its own time
                        seconds["gather"].append(trainer.last_gather_s)
                    nbytes = sum(b.numel * (4 if b.dtype.is_floating_point else 8) for b in weights.buckets)  # type: ignore[attr-defined]
                    channel.publish(weights, trainer.version)
                    seconds[mode].append(channel.last_seconds)
            med = {key: statistics.median(v) for key, v in seconds.items()}
            print(f"{size:>11} {trainer.n_params:>13,d} {nbytes / 2**20:>8.1f} {med['gather']:>9.3f} "
                  f"{med['object_store']:>15.3f} {med['collective']:>17.3f} "
                  f"x{(med['gather'] + med['object_store']) / med['collective']:>19.2f}", flush=True)
        finally:
            pool.close()
            trainer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (CI smoke run)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (multiple of k)")
    parser.add_argument("--k", type=int, default=None, help="k of ppo_offpolicy and pipeline (4; quick 2)")
    parser.add_argument("--batch", type=int, default=8, help="B: prompts per step")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--admission", choices=ADMISSIONS, default="bounded",
                        help="pipeline.admission of the pipeline runs (default bounded)")
    parser.add_argument("--trainer-speedup", type=float, default=1.0,
                        help="divide the emulated trainer's times by this (default 1: 0.05 s + 100 us/token)")
    parser.add_argument("--compare-admission", action="store_true",
                        help="only the pipeline under each admission rule (bounded, deadline, partial), "
                             "1/2/4 engines (with --ray: as Ray actors)")
    parser.add_argument("--ray", action="store_true",
                        help="also run every row with the engines as Ray actors, and the weight-sync table")
    parser.add_argument("--weight-sync-only", action="store_true",
                        help="only the Ray weight-sync table (no pool rows)")
    parser.add_argument("--weight-sync-sizes", default="1M,16M,100M", metavar="LIST",
                        help="with --ray: model sizes for the weight-sync table "
                             f"({', '.join(WEIGHT_SYNC_MODELS)})")
    parser.add_argument("--weight-sync-gpus", action="store_true",
                        help="the weight-sync table on GPUs: trainer rank and one engine on a GPU each, NCCL "
                             "(needs 2 GPUs; benchmarks/gpu/run_vllm_gpu.sh)")
    args = parser.parse_args()
    args.steps = args.steps or (4 if args.quick else 16)
    args.k = args.k or (2 if args.quick else 4)
    if args.steps % args.k:
        parser.error(f"--steps must be a multiple of --k={args.k} (whole ppo_offpolicy rounds)")
    if not args.trainer_speedup > 0:
        parser.error(f"--trainer-speedup: must be > 0, got {args.trainer_speedup}")
    base = Devices()
    args.devices = replace(base, train_step_s=base.train_step_s / args.trainer_speedup,
                           train_token_s=base.train_token_s / args.trainer_speedup)
    d = args.devices
    print(f"emulated devices: decode step {1e3 * d.step_s:.1f} ms + {1e3 * d.token_s:.2f} ms per sequence, "
          f"{d.slots} slots per engine, weight load {1e3 * d.update_s:.0f} ms; lengths lognormal (median "
          f"{d.length.median:.0f}) capped at {d.max_new_tokens}; trainer {d.train_step_s:.3g} s + "
          f"{1e6 * d.train_token_s:.1f} us per token; B={args.batch} x n={args.n}, "
          f"{args.steps} steps per run")

    modes = (("sync", 1), ("ppo_offpolicy", args.k), ("pipeline", args.k))
    if args.compare_admission:
        compare_admission(args)
        return
    if args.weight_sync_only:
        main_ray(args, modes, {})
        return
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
    if args.ray:
        main_ray(args, modes, runs)


def compare_admission(args: argparse.Namespace) -> None:
    """The pipeline with 1, 2, 4 engines under each admission rule, and its scaling over engines
    (in this process, or with `--ray` as Ray engine actors)."""
    runner = run_local
    if args.ray:
        import ray

        ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
        runner = run_ray
        print("engines as Ray actors (scalerl.distributed.EnginePool)")
    runs: dict[tuple[str, int], Run] = {}
    try:
        for admission in ADMISSIONS:
            args.admission = admission
            for count in ENGINE_COUNTS:
                r = runs[(admission, count)] = runner(args, "pipeline", args.k, count)
                print(f"engines={count} pipeline/{admission:<8} k={args.k}: {r.steps} steps in "
                      f"{r.seconds:6.2f}s  {r.samples_per_s:7.2f} samples/s  idle {100 * r.idle:5.1f}%  "
                      f"lag mean {r.lag_mean:.2f} max {r.lag_max}  token lag mean {r.token_lag_mean:.2f} "
                      f"max {r.token_lag_max}  renewed {r.renewed}  |  simulated {r.sim_samples_per_s:7.2f} "
                      f"samples/s  idle {100 * max(0.0, r.sim_idle):5.1f}%  "
                      f"tokens > k {100 * r.sim_stale:.1f}%",
                      flush=True)
    finally:
        if args.ray:
            ray.shutdown()
    print("\nscaling over engines (samples/s relative to 1 engine of the same rule; fraction of linear):")
    for admission in ADMISSIONS:
        one = runs[(admission, 1)].samples_per_s
        print(f"pipeline/{admission:<8}: " + "  ".join(
            f"{c} engines x{runs[(admission, c)].samples_per_s / one:.2f} "
            f"({runs[(admission, c)].samples_per_s / one / c:.2f})" for c in ENGINE_COUNTS[1:]))
    for count in ENGINE_COUNTS:
        rate = {rule: runs[(rule, count)].samples_per_s for rule in ADMISSIONS}
        print(f"engines={count}: deadline/bounded samples/s x{rate['deadline'] / rate['bounded']:.2f}"
              f"  partial/bounded x{rate['partial'] / rate['bounded']:.2f}")


def main_ray(args: argparse.Namespace, modes: Any, local: dict[tuple[str, int], Run]) -> None:
    import ray

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    try:
        if local:
            print("\nRay engine actors (same devices, same seeds); ray/in-process is the cost of the "
                  "processes:")
        for count in ENGINE_COUNTS if local else ():
            for mode, k in modes:
                r = run_ray(args, mode, k, count)
                lo = local[(mode, count)]
                print(f"ray engines={count} {mode:>14} k={k}: {r.steps} steps in {r.seconds:6.2f}s  "
                      f"{r.samples_per_s:7.2f} samples/s  idle {100 * r.idle:5.1f}%  lag mean "
                      f"{r.lag_mean:.2f} max {r.lag_max}  |  ray/in-process "
                      f"x{r.samples_per_s / lo.samples_per_s:.2f}",
                      flush=True)
        sizes = [s.strip() for s in args.weight_sync_sizes.split(",") if s.strip()]
        unknown = [s for s in sizes if s not in WEIGHT_SYNC_MODELS]
        if unknown:
            raise SystemExit(f"--weight-sync-sizes: unknown {unknown} (from {list(WEIGHT_SYNC_MODELS)})")
        weight_sync_rows(sizes, repeats=1 if args.quick else 3, num_engines=1 if args.weight_sync_gpus else 2,
                         gpus=args.weight_sync_gpus)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
