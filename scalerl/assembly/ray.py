"""`distributed.backend: ray`: the trainer ranks, the engine pool and the weight channel of a run.

`ray_backend(config, run_dir, resume)` is what `scalerl.assembly.build.build_training` calls
instead of building the policy and the engine in this process. It attaches to Ray (or starts it),
starts the FSDP2 trainer ranks (restoring the checkpoint on resume: DCP reshards, so the number of
engines and even the trainer's world size may differ from the run that wrote it), starts
`num_engines` engine actors through `scalerl.rollout.factory`, and loads the trainer's weights into
every engine before the first prompt is admitted (an engine built from `model.name_or_path` holds
the initial weights, not a resumed run's). Everything else (prompts, curriculum, verifier,
evaluator, metrics, driver) is the local wiring, in this controller process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from scalerl.assembly.backend import Backend
from scalerl.assembly.sections import engine_spec, trainer_settings
from scalerl.config import RunConfig
from scalerl.data.tokenize import bind_chat_template_kwargs
from scalerl.distributed.channel import RayWeightChannel
from scalerl.distributed.cluster import connect
from scalerl.distributed.engine_actor import EngineFactory
from scalerl.distributed.pool import EnginePool
from scalerl.distributed.trainer import RayTrainer
from scalerl.inputs import InputError
from scalerl.rollout.probe import SyncProbe, probe_sequences
from scalerl.rollout.vllm_versions import check_engine_devices, platform_device
from scalerl.training.policy import load_tokenizer


class StepFigures:
    """A metrics sink that adds the pool's and the channel's figures to every step row."""

    def __init__(self, sink: Any, pool: EnginePool, channel: RayWeightChannel,
                 gather_seconds: Any = lambda: 0.0) -> None:
        self.sink = sink
        self.gather_seconds = gather_seconds
        self.pool = pool
        self.channel = channel
        self._busy = 0.0
        self._idle = 0.0

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> Any:
        row = dict(metrics)
        stats = self.pool.stats()
        busy, idle = stats["pool_engine_busy_s"], stats["pool_engine_idle_s"]
        # Per-engine device time since the last row (as of each engine's last poll).
        d_busy, d_idle = busy - self._busy, idle - self._idle
        self._busy, self._idle = busy, idle
        row.update(stats)
        row["pool_engine_idle_frac"] = d_idle / (d_busy + d_idle) if d_busy + d_idle > 0 else 0.0
        row.update(self.channel.metrics())
        row["weight_gather_s"] = self.gather_seconds()
        return self.sink.log_step(step, row)

    def log_eval(self, step: int, metrics: Mapping[str, Any]) -> Any:
        return self.sink.log_eval(step, metrics)

    def log_samples(self, step: int, rows: list[Mapping[str, Any]]) -> None:
        self.sink.log_samples(step, rows)


def ray_backend(config: RunConfig, run_path: Path, resume: str | Path | None) -> Backend:
    d = config.distributed
    if config.model.name_or_path is None:
        raise InputError(
            "model.name_or_path: distributed engines load the model from a path every node can read "
            "(`scalerl train` sets it to the tiny model's warm start when none is given)"
        )
    if config.generation.engine == "vllm":
        # Checked here, before any actor starts (bad input, exit 2), and again in each engine actor
        # (a node of another cluster may hold another vLLM build).
        check_engine_devices(platform_device(), d.engine_num_gpus,
                             config.generation.vllm.tensor_parallel_size)
    ray, started = connect(d)
    closers: list[Any] = []
    try:
        trainer = RayTrainer(config.model, trainer_settings(config), d, resume=resume, lora_seed=config.seed)
        closers.append(trainer.close)
        start_step, resume_state = 0, None
        if trainer.resumed is not None:
            start_step = trainer.resumed.step
            resume_state = trainer.resumed.extra.get("pipeline")
            if resume_state is None:
                raise InputError(f"{resume}: checkpoint has no pipeline state (not from scalerl train?)")
        tokenizer = bind_chat_template_kwargs(load_tokenizer(config.model), config.data.chat_template_kwargs)
        pad = tokenizer.pad_token_id
        spec = engine_spec(
            config,
            model_path=config.model.name_or_path,
            eos_token_ids=(int(tokenizer.eos_token_id),),
            pad_token_id=int(pad if pad is not None else tokenizer.eos_token_id),
            initial_version=trainer.version,
        )
        device = "cuda" if d.engine_num_gpus > 0 else None
        tp = config.generation.vllm.tensor_parallel_size if config.generation.engine == "vllm" else 1
        if tp > 1:
            # vLLM's Ray executor places the TP workers in the engine's placement group.
            options = dict(spec.options)
            options["engine_kwargs"] = {**options.get("engine_kwargs", {}),
                                        "distributed_executor_backend": "ray"}
            spec = replace(spec, options=options)
        factories = [EngineFactory(replace(spec, seed=spec.seed + i), device, d.engine_num_cpus,
                                   d.engine_num_gpus * tp) for i in range(d.num_engines)]
        pool = EnginePool.launch(factories, d, tensor_parallel_size=tp)
        closers.append(pool.close)
        trainer.fingerprint_dtype = pool.weight_dtype  # every sync verified (rollout.fingerprint)
        probe = probe_sequences(trainer.vocab_size, config.seed)
        channel = RayWeightChannel(pool, mode=d.weight_sync, backend=d.collective_backend,
                                   timeout_s=d.timeout_s,
                                   probe=SyncProbe(probe, partial(trainer.probe_logprobs, probe),
                                                   dtype=trainer.dtype))
        channel.publish(trainer.weights_for_engine(), trainer.version)
    except BaseException:
        for closer in reversed(closers):
            closer()
        raise

    def checkpoint(step: int, state: dict[str, Any]) -> None:
        trainer.save(run_path, step, extra={"pipeline": state}, keep=config.checkpoint.keep)

    if started:
        closers.append(ray.shutdown)
    return Backend(
        trainer=trainer, engine=pool, tokenizer=tokenizer, meter=trainer.meter, start_step=start_step,
        resume_state=resume_state, checkpoint=checkpoint, channel=channel,
        wrap_metrics=lambda sink: StepFigures(sink, pool, channel, lambda: trainer.last_gather_s),
        closers=closers,
    )
