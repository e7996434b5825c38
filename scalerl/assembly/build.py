"""Build a ready-to-run training `Driver` from a `RunConfig`: the wiring `scalerl train` needs.

`build_training(config, run_dir)` loads the policy and its trainer, a generation copy of the model
in the embedded engine, the prompts (file or built-in synthetic task) with the held-out split, the
curriculum pool, the rewards router, the evaluator, the metrics log and the checkpoint hook.
`resume=` a checkpoint directory restores the trainer, the pipeline state (curriculum, counters,
outstanding prompts) and the compute meter, and keeps the original held-out split.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from scalerl.assembly.backend import Backend
from scalerl.assembly.forecast import ForecastingSink, StopAfterEval, stop_requested
from scalerl.assembly.local import local_backend
from scalerl.assembly.resolved import write_resolved
from scalerl.assembly.sections import (
    driver_settings,
    gold_free,
    load_records,
    sampling_params,
    stream_seed,
)
from scalerl.config import RunConfig
from scalerl.data import (
    PromptPool,
    PromptRecord,
    encode_prompts,
    load_heldout_ids,
    load_prompts,
    resolve_system_prompt,
    save_heldout_ids,
    split_by_ids,
    split_heldout,
)
from scalerl.data.decontaminate import overlap_ids
from scalerl.data.split import unique_subset
from scalerl.evaluation.evaluator import Evaluator
from scalerl.pipeline.collapse import CollapseDetector, RollbackHistory
from scalerl.pipeline.driver import Components, Driver, success_threshold
from scalerl.pipeline.preemption import StopRequest
from scalerl.pipeline.snapshot import SNAPSHOT_FILE
from scalerl.rewards import RewardRouter
from scalerl.rewards.groups import GroupScorer
from scalerl.rollout import Engine
from scalerl.scaling.io import run_label
from scalerl.scaling.live import LiveForecast, forecast_text
from scalerl.telemetry import RunTelemetry
from scalerl.training.trainer import Trainer

HELDOUT_IDS_FILE = "heldout_ids.json"
_log = logging.getLogger(__name__)


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


def load_snapshot(checkpoint: str | Path) -> dict[str, Any] | None:
    """The checkpoint's pipeline snapshot (`scalerl.pipeline.snapshot`), None if it has none."""
    path = Path(checkpoint) / SNAPSHOT_FILE
    if not path.is_file():
        return None
    from scalerl.training.checkpoint import load_torch_file

    return dict(load_torch_file(path))


def report_overlap(train: Sequence[PromptRecord],
                   sets: Mapping[str, Sequence[PromptRecord]]) -> dict[str, int]:
    """Evaluation prompts that are also training prompts, by content (`overlap_ids`: word for
    word, whatever their ids): a warning per set that has any, with the count. Returns set -> count."""
    counts = {name: len(overlap_ids(train, items)) for name, items in sets.items() if items}
    for name, count in counts.items():
        if count:
            _log.warning("data overlap: %d of %d prompts of %s are also training prompts (same text); "
                         "its scores measure memory as well as skill", count, len(sets[name]), name)
    return counts


def build_training(
    config: RunConfig,
    run_dir: str | Path | None = None,
    *,
    device: str | None = None,
    resume: str | Path | None = None,
    log: bool = True,
    checkpoints: bool = True,
    stop: StopRequest | None = None,
    rollbacks: RollbackHistory | None = None,
) -> Training:
    """Everything `Driver.run()` needs, from `config` (see module docstring). `stop`: a stop
    request the driver polls (`scalerl train` sets it from SIGTERM / SIGINT). `rollbacks`: the run's
    rollback history (`assembly.rollback`), stamped on its rows when `rollback.enabled`."""
    run_path = Path(run_dir if run_dir is not None else config.output_dir)
    if config.distributed.backend == "ray":
        from scalerl.assembly.ray import ray_backend

        backend = ray_backend(config, run_path, resume)
    else:
        backend = local_backend(config, run_path, device, resume)
    try:
        return _build_training(config, run_path, backend, resume=resume, log=log, checkpoints=checkpoints,
                               stop=stop, rollbacks=rollbacks)
    except BaseException:
        for closer in backend.closers:
            closer()
        raise


def _build_training(
    config: RunConfig, run_path: Path, backend: Backend, *, resume: str | Path | None, log: bool,
    checkpoints: bool, stop: StopRequest | None = None, rollbacks: RollbackHistory | None = None,
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
    train_records = train.records
    if d.max_train_prompts is not None:  # data reuse (Tan et al.): fewer unique prompts, same draws
        train_records = unique_subset(train.records, d.max_train_prompts, d.heldout_seed)
        _log.info("data.max_train_prompts=%d: training on %d of the %d usable training prompts "
                  "(%d left out)", d.max_train_prompts, len(train_records), len(train.records),
                  len(train.records) - len(train_records))
    prompt_counts = {"usable_prompts": len(train.records),
                     "max_train_prompts": d.max_train_prompts,
                     "left_out_by_max_train_prompts": len(train.records) - len(train_records)}

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
        train_records,
        stream_seed(config.seed, d.shuffle_seed),  # the run's seed moves the prompt order
        retire_threshold=config.algorithm.retire_threshold,
        no_positive_resampling=config.algorithm.no_positive_resampling,
        heldout_ids=split.heldout_ids,
        curriculum=config.algorithm.curriculum,
    )
    router = RewardRouter(config.rewards)
    router.attach_compute(meter.add_reward_model)  # reward models' tokens are the run's FLOPs too
    closers: list[Any] = [router.close]
    extra_sets = {
        name: load_prompts(extra.path, default_task=d.default_task, format=extra.format,
                           on_error=on_error, gold_free_tasks=gold_free(config), subset=extra.subset,
                           split=extra.split, keys=(f"eval.extra_sets.{name}.subset",
                                                    f"eval.extra_sets.{name}.split")).records
        for name, extra in config.eval.extra_set_sources.items()
    }
    router.check_tasks({r.task for r in records} | {r.task for s in extra_sets.values() for r in s})
    report_overlap(split.train, {"held-out split": split.heldout, **{f"eval.extra_sets.{name}": s
                                                                    for name, s in extra_sets.items()}})
    params = sampling_params(config, tokenizer)
    check_params = getattr(engine, "check_params", None)
    if callable(check_params):
        check_params(params)  # settings the engine cannot honour fail before any generation
    scorer: Any = router
    if config.agentic.environment is not None:  # multi-turn tool use: trajectories (docs/agentic.md)
        from scalerl.agentic.setup import with_context_window
        from scalerl.assembly.serve import model_context
        from scalerl.serving.setup import build_environment

        # agentic.context_fraction: the trigger as a share of the policy's context window.
        model = getattr(getattr(trainer, "policy", None), "model", None)
        window = model_context(model, None) if model is not None else None
        section = with_context_window(config.agentic, window)
        agentic = build_environment(section, tokenizer, engine, router, decode)
        engine, encode, scorer = agentic.engine, agentic.encode, agentic.scorer  # type: ignore[assignment]
        closers.append(agentic.close)

    evaluator = None
    if split.heldout:
        # Held-out samples stay out of the reward functions' per-step means (docs/rewards.md).
        held_out_scorer = router.untallied() if scorer is router else scorer
        eval_scorer = GroupScorer(held_out_scorer, decode, max_workers=config.rewards.max_workers,
                                  success_threshold=success_threshold(config.rewards))
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
            # The progress line prints the live forecast as `scalerl watch` does (one function).
            forecast_text=partial(forecast_text, a_width=config.forecast.a_width),
        )
        closers.append(telemetry.close)

    metrics: Any = telemetry
    if backend.wrap_metrics is not None and telemetry is not None:
        metrics = backend.wrap_metrics(telemetry)
    if router.reward_models and metrics is not None:
        from scalerl.assembly.local import EngineFigures

        metrics = EngineFigures(metrics, router.reward_model_figures)
    if router.functions is not None and metrics is not None:
        from scalerl.assembly.local import EngineFigures

        metrics = EngineFigures(metrics, router.reward_function_figures)
    live = None
    if config.forecast.enabled and telemetry is not None and evaluator is not None:
        # The live forecast (scaling.live): reads the rows as logged, never changes training.
        live = LiveForecast(config.forecast, run_path, run_label(run_path), rows=telemetry.log.rows())
        metrics = ForecastingSink(metrics, live)
        closers.insert(0, live.close)  # before the log closes: forecast.json is the last fit
    components = Components(
        engine=engine, trainer=trainer, source=pool, scorer=scorer, encode=encode, decode=decode,
        params=params, evaluator=evaluator, metrics=metrics,
        checkpoint=backend.checkpoint if checkpoints else None, meter=meter, channel=backend.channel,
        stop_after_eval=StopAfterEval(config.forecast, run_path, live),
        stop_after_step=stop_requested(run_path),
        collapse=(CollapseDetector(config.rollback, len(split.heldout), config.eval.k,
                                   history=rollbacks or RollbackHistory())
                  if config.rollback.enabled else None),
    )
    snapshot = load_snapshot(resume) if resume is not None else None
    driver = Driver(driver_settings(config), components, start_step=start_step, resume_state=resume_state,
                    resume_snapshot=snapshot, stop=stop)
    closers.extend(backend.closers)  # last: evaluations and the final checkpoint may still generate
    if log:  # what the built components use, read back from them (`assembly.resolved`)
        write_resolved(run_path, trainer, pool, driver, engine, data=prompt_counts)
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
