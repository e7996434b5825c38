"""Build a ready-to-run training `Driver` from a `RunConfig`: the wiring `scalerl train` needs.

`build_training(config, run_dir)` loads the policy and its trainer, a generation copy of the model
in the embedded engine, the prompts (file or built-in synthetic task) with the held-out split, the
curriculum pool, the rewards router, the evaluator, the metrics log and the checkpoint hook.
`resume=` a checkpoint directory restores the trainer, the pipeline state (curriculum, counters,
outstanding prompts) and the compute meter, and keeps the original held-out split.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from scalerl.config import RunConfig
from scalerl.data import (
    PromptPool,
    PromptRecord,
    encode_prompts,
    load_heldout_ids,
    load_prompts,
    make_synthetic,
    resolve_system_prompt,
    save_heldout_ids,
    split_by_ids,
    split_heldout,
)
from scalerl.data.curriculum import CurriculumSpec
from scalerl.evaluation.evaluator import Evaluator
from scalerl.pipeline.driver import Components, Driver, success_threshold
from scalerl.pipeline.preemption import StopRequest
from scalerl.pipeline.snapshot import SNAPSHOT_FILE
from scalerl.rewards import RewardRouter
from scalerl.rewards.groups import GroupScorer
from scalerl.rollout import Engine, InterruptionSpec, SamplingParams
from scalerl.rollout.factory import build_engine, close_engine, spec_from_config
from scalerl.telemetry import ComputeMeter, RunTelemetry, flop_params
from scalerl.training.policy import load_policy
from scalerl.training.trainer import Trainer

HELDOUT_IDS_FILE = "heldout_ids.json"
THINK_END = "</think>"


def sampling_params(config: RunConfig, tokenizer: Any) -> SamplingParams:
    """Training sampling parameters: `generation.*`, eos as stop token, forced interruption."""
    g = config.generation
    lc = g.length_control
    interruption = None
    if lc.kind == "interruption":
        lo, hi = lc.think_budget
        interruption = InterruptionSpec(
            think_budget_lo=lo,
            think_budget_hi=hi,
            answer_budget=lc.answer_budget,
            phrase_ids=tuple(tokenizer.encode(lc.phrase, add_special_tokens=False)),
            think_end_ids=tuple(tokenizer.encode(THINK_END, add_special_tokens=False)),
        )
    params = SamplingParams(
        n=g.n,
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=g.top_k,
        max_new_tokens=g.max_new_tokens,
        stop_token_ids=(int(tokenizer.eos_token_id),),
        interruption=interruption,
    )
    return replace(params, return_support=config.algorithm.keep_sampling_mask and params.truncates_support)


def curriculum_spec(config: RunConfig) -> CurriculumSpec:
    """`algorithm.curriculum` for the prompt pool (Kimi k1.5 sampling strategies)."""
    c = config.algorithm.curriculum
    return CurriculumSpec(order=c.order, priority=c.priority, difficulty_key=c.difficulty_key,
                          harder=c.harder, ramp_prompts=c.ramp_prompts, start_fraction=c.start_fraction)


def load_records(config: RunConfig) -> list[PromptRecord]:
    d = config.data
    on_error = d.on_bad_row
    if d.train_path is not None:
        return load_prompts(d.train_path, field_map=d.field_map, default_task=d.default_task,
                            format=d.format, on_error=on_error).records
    s = d.synthetic
    # One call for every task: "math+code" caps the shared difficulty range at each task's own
    # levels (code has 5, math 8), so the default range (1, 6) is valid for the mix.
    return make_synthetic(s.task, s.num_prompts, s.seed, s.difficulty, s.weights)


@dataclass
class Training:
    """A built run: `driver.run()` trains; `close()` stops verifier workers and flushes logs."""

    driver: Driver
    trainer: Trainer
    engine: Engine
    pool: PromptPool
    router: RewardRouter
    telemetry: RunTelemetry | None
    heldout: list[PromptRecord]
    closers: list[Any] = field(default_factory=list)

    def close(self) -> None:
        for closer in self.closers:
            closer()

    def __enter__(self) -> Training:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _build_engine(config: RunConfig, trainer: Trainer, closers: list[Any]) -> Engine:
    """The generation engine, holding the trainer's current weights at the trainer's version.

    The embedded engine gets a copy of the policy. vLLM loads from a directory (the model's, or a
    temporary save of a policy built from `model.tiny`) and is then sent the trainer's weights: a
    resumed trainer's differ from the directory's, and sending them always costs one update.
    """
    policy = trainer.policy
    eos, pad = (int(policy.tokenizer.eos_token_id),), policy.pad_token_id
    if config.generation.engine == "embedded":
        spec = spec_from_config(config, model_path=config.model.name_or_path, eos_token_ids=eos,
                                pad_token_id=pad, initial_version=trainer.version)
        return build_engine(spec, model=copy.deepcopy(policy.model))
    path = config.model.name_or_path
    if path is None:
        scratch = tempfile.TemporaryDirectory(prefix="scalerl-engine-model-")
        closers.append(scratch.cleanup)
        policy.save_pretrained(scratch.name)
        path = scratch.name
    spec = spec_from_config(config, model_path=path, eos_token_ids=eos, pad_token_id=pad,
                            initial_version=trainer.version)
    engine = build_engine(spec)
    closers.append(lambda: close_engine(engine))
    engine.update_weights(trainer.weights_for_engine(), trainer.version)
    return engine


@dataclass
class Backend:
    """Where training and generation run: this process (`local_backend`) or a Ray cluster
    (`scalerl.assembly.ray.ray_backend`, for `distributed.backend: ray`)."""

    trainer: Any  # the pipeline's `Trainer` protocol
    engine: Engine
    tokenizer: Any
    meter: ComputeMeter
    start_step: int
    resume_state: dict[str, Any] | None
    checkpoint: Any  # (step, pipeline state[, snapshot=...]) -> None (see `Components.checkpoint`)
    channel: Any = None  # a `WeightChannel`; None: straight into the engine
    wrap_metrics: Any = None  # sink -> sink that adds the backend's per-step figures
    closers: list[Any] = field(default_factory=list)


def local_backend(
    config: RunConfig, run_path: Path, device: str | None, resume: str | Path | None
) -> Backend:
    """The policy and its trainer here, and a generation copy of the model in the embedded engine."""
    policy = load_policy(config.model, device)
    meter = ComputeMeter(flop_params(policy.model))
    trainer = Trainer.from_config(config, policy, meter)
    start_step, resume_state = 0, None
    if resume is not None:
        saved = trainer.load(resume)
        start_step = saved.step
        resume_state = saved.extra.get("pipeline")
        if resume_state is None:
            raise ValueError(f"{resume}: checkpoint has no pipeline state (not written by `scalerl train`?)")

    tokenizer = policy.tokenizer
    closers: list[Any] = []
    engine = _build_engine(config, trainer, closers)

    def checkpoint(step: int, state: dict[str, Any], snapshot: dict[str, Any] | None = None) -> None:
        files = {SNAPSHOT_FILE: snapshot} if snapshot is not None else None
        trainer.save(run_path, step, extra={"pipeline": state}, keep=config.checkpoint.keep, files=files)

    stats = getattr(engine, "stats", None)
    wrap = (lambda sink: EngineFigures(sink, stats)) if hasattr(stats, "figures") else None
    return Backend(trainer=trainer, engine=engine, tokenizer=tokenizer, meter=meter, start_step=start_step,
                   resume_state=resume_state, checkpoint=checkpoint, wrap_metrics=wrap, closers=closers)


class EngineFigures:
    """A metrics sink that adds the engine's cumulative figures (`stats.figures()`: vLLM's prompt
    tokens and prefix-cache hits) to every step row."""

    def __init__(self, sink: Any, stats: Any) -> None:
        self.sink = sink
        self.stats = stats

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> Any:
        return self.sink.log_step(step, {**metrics, **self.stats.figures()})

    def log_eval(self, step: int, metrics: Mapping[str, Any]) -> Any:
        return self.sink.log_eval(step, metrics)


def load_snapshot(checkpoint: str | Path) -> dict[str, Any] | None:
    """The checkpoint's pipeline snapshot (`scalerl.pipeline.snapshot`), None if it has none."""
    path = Path(checkpoint) / SNAPSHOT_FILE
    if not path.is_file():
        return None
    from scalerl.training.checkpoint import load_torch_file

    return dict(load_torch_file(path))


def build_training(
    config: RunConfig,
    run_dir: str | Path | None = None,
    *,
    device: str | None = None,
    resume: str | Path | None = None,
    log: bool = True,
    checkpoints: bool = True,
    stop: StopRequest | None = None,
) -> Training:
    """Everything `Driver.run()` needs, from `config` (see module docstring). `stop`: a stop
    request the driver polls (`scalerl train` sets it from SIGTERM / SIGINT)."""
    run_path = Path(run_dir if run_dir is not None else config.output_dir)
    if config.distributed.backend == "ray":
        from scalerl.assembly.ray import ray_backend

        backend = ray_backend(config, run_path, resume)
    else:
        backend = local_backend(config, run_path, device, resume)
    try:
        return _build_training(config, run_path, backend, resume=resume, log=log, checkpoints=checkpoints,
                               stop=stop)
    except BaseException:
        for closer in backend.closers:
            closer()
        raise


def _build_training(
    config: RunConfig, run_path: Path, backend: Backend, *, resume: str | Path | None, log: bool,
    checkpoints: bool, stop: StopRequest | None = None,
) -> Training:
    trainer, engine, tokenizer, meter = backend.trainer, backend.engine, backend.tokenizer, backend.meter
    start_step, resume_state = backend.start_step, backend.resume_state

    d = config.data
    records = load_records(config)
    ids_file = run_path / HELDOUT_IDS_FILE
    if resume is not None and ids_file.is_file():
        split = split_by_ids(records, load_heldout_ids(ids_file))
    else:
        split = split_heldout(records, d.heldout_size, d.heldout_seed)
        run_path.mkdir(parents=True, exist_ok=True)
        save_heldout_ids(split, ids_file)
    system = resolve_system_prompt(d.think_system_prompt, d.system_prompt)
    on_error = d.on_bad_row
    train = encode_prompts(split.train, tokenizer, max_prompt_tokens=d.max_prompt_tokens,
                           system_prompt=system, on_error=on_error, template=d.template)
    token_ids = dict(train.token_ids)

    def encode(record: PromptRecord) -> list[int]:
        ids = token_ids.get(record.id)
        if ids is None:
            enc = encode_prompts([record], tokenizer, max_prompt_tokens=d.max_prompt_tokens,
                                 system_prompt=system, on_error="error", template=d.template)
            ids = token_ids[record.id] = enc.token_ids[record.id]
        return ids

    def decode(ids: list[int]) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=True))

    pool = PromptPool(
        train.records,
        d.shuffle_seed,
        retire_threshold=config.algorithm.retire_threshold,
        no_positive_resampling=config.algorithm.no_positive_resampling,
        heldout_ids=split.heldout_ids,
        curriculum=curriculum_spec(config),
    )
    router = RewardRouter(config.rewards)
    closers: list[Any] = [router.close]
    extra_sets = {
        name: load_prompts(path, default_task=d.default_task, on_error=on_error).records
        for name, path in config.eval.extra_sets.items()
    }
    router.check_tasks({r.task for r in records} | {r.task for s in extra_sets.values() for r in s})
    params = sampling_params(config, tokenizer)
    check_params = getattr(engine, "check_params", None)
    if callable(check_params):
        check_params(params)  # settings the engine cannot honour fail before any generation
    scorer: Any = router
    if config.agentic.environment is not None:  # multi-turn tool use: trajectories (docs/agentic.md)
        from scalerl.agentic.setup import build_agentic

        agentic = build_agentic(config, tokenizer, engine, router, decode)
        engine, encode, scorer = agentic.engine, agentic.encode, agentic.scorer  # type: ignore[assignment]
        closers.append(agentic.close)

    evaluator = None
    if split.heldout:
        eval_scorer = GroupScorer(scorer, decode, max_workers=config.rewards.max_workers,
                                  success_threshold=success_threshold(config))
        closers.append(eval_scorer.close)
        evaluator = Evaluator(
            split.heldout, encode, eval_scorer, k=config.eval.k,
            params=replace(params, temperature=config.eval.temperature), seed=config.seed,
            extra_sets=extra_sets,
        )

    telemetry = None
    if log:
        telemetry = RunTelemetry(
            run_path, config.logging, max_steps=config.max_steps, meter=meter,
            resume_step=start_step if resume is not None else None, run_name=config.name,
            run_config=config.model_dump(mode="json"),
        )
        closers.append(telemetry.close)

    metrics = telemetry
    if backend.wrap_metrics is not None and telemetry is not None:
        metrics = backend.wrap_metrics(telemetry)
    components = Components(
        engine=engine, trainer=trainer, source=pool, scorer=scorer, encode=encode, decode=decode,
        params=params, evaluator=evaluator, metrics=metrics,
        checkpoint=backend.checkpoint if checkpoints else None, meter=meter, channel=backend.channel,
    )
    snapshot = load_snapshot(resume) if resume is not None else None
    driver = Driver(config, components, start_step=start_step, resume_state=resume_state,
                    resume_snapshot=snapshot, stop=stop)
    closers.extend(backend.closers)  # last: evaluations and the final checkpoint may still generate
    return Training(driver=driver, trainer=trainer, engine=engine, pool=pool, router=router,
                    telemetry=telemetry, heldout=list(split.heldout), closers=closers)


def train(config: RunConfig, run_dir: str | Path | None = None, **kwargs: Any) -> Any:
    """Build and run; returns the driver's `RunResult`."""
    with build_training(config, run_dir, **kwargs) as training:
        return training.driver.run()


__all__: Sequence[str] = (
    "Backend", "Training", "build_training", "load_records", "load_snapshot", "local_backend",
    "sampling_params",
    "train",
)
