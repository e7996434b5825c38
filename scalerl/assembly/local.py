"""`distributed.backend: local`: the policy, its trainer and the generation engine in this process."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scalerl.assembly.backend import Backend
from scalerl.assembly.sections import engine_spec, trainer_settings
from scalerl.config import RunConfig
from scalerl.data.tokenize import bind_chat_template_kwargs
from scalerl.inputs import InputError
from scalerl.pipeline.local import ColocatedWeightChannel, EngineWeightChannel
from scalerl.pipeline.snapshot import SNAPSHOT_FILE
from scalerl.rollout import Engine
from scalerl.rollout.factory import build_engine, close_engine
from scalerl.rollout.probe import ProbeLogprobs, SyncProbe, probe_sequences
from scalerl.telemetry import ComputeMeter, flop_params
from scalerl.training.policy import Policy, apply_lora, load_policy
from scalerl.training.trainer import Trainer


def _build_engine(config: RunConfig, trainer: Trainer, closers: list[Any]) -> Engine:
    """The generation engine, holding the trainer's current weights at the trainer's version.

    The embedded engine gets a copy of the policy. vLLM loads from a directory (the model's, or a
    temporary save of a policy built from `model.tiny`) and is then sent the trainer's weights
    through the channel (`local_backend`): a resumed trainer's differ from the directory's, and
    sending them (verified) always costs one update.
    """
    policy = trainer.policy
    eos, pad = (int(policy.tokenizer.eos_token_id),), policy.pad_token_id
    if config.generation.engine == "embedded":
        spec = engine_spec(config, model_path=config.model.name_or_path, eos_token_ids=eos,
                                pad_token_id=pad, initial_version=trainer.version)
        # A LoRA policy's engine holds the merged weights (`Policy.generation_copy`).
        return build_engine(spec, model=policy.generation_copy())
    path = config.model.name_or_path
    if path is None:
        scratch = tempfile.TemporaryDirectory(prefix="scalerl-engine-model-")
        closers.append(scratch.cleanup)
        policy.save_pretrained(scratch.name)
        path = scratch.name
    spec = engine_spec(config, model_path=path, eos_token_ids=eos, pad_token_id=pad,
                            initial_version=trainer.version)
    engine = build_engine(spec)
    closers.append(lambda: close_engine(engine))
    return engine


def trainer_probe(config: RunConfig, trainer: Trainer) -> SyncProbe:
    """The run's weight-sync probe (`scalerl.rollout.probe`: drawn from the run's seed over the
    model's vocabulary) with the trainer's side of it: the probe scored by the in-process policy,
    which must be at the version being verified (every publish sends the trainer's current weights)."""
    vocab = int(trainer.policy.model.get_input_embeddings().weight.shape[0])
    probe = probe_sequences(vocab, config.seed)

    def reference(version: int) -> ProbeLogprobs:
        if trainer.version != version:
            raise RuntimeError(f"weight-sync probe: the trainer is at version {trainer.version}, "
                               f"the sync being verified is version {version}")
        return trainer.probe_logprobs(probe)

    return SyncProbe(probe, reference, dtype=trainer.policy.dtype)


def weight_channel(config: RunConfig, engine: Engine, probe: SyncProbe | None = None) -> EngineWeightChannel:
    """The channel into the engine of this process: a colocated vLLM engine's
    (`generation.vllm.colocate`: it sleeps between rounds and is woken, handed the trainer's device
    tensors and verified by `ColocatedWeightChannel`), else the plain one. Both check every sync's
    fingerprints and, given `probe`, the engine's probe log-probs against the trainer's."""
    v = config.generation.vllm
    model = config.model.name_or_path or "model.tiny"
    if config.generation.engine == "vllm" and v.colocate:
        return ColocatedWeightChannel(engine, level=v.sleep_level, timeout_s=v.sleep_timeout_s,
                                      name=f"colocated vLLM engine ({model})", probe=probe)
    kind = {"embedded": "embedded", "vllm": "vLLM"}.get(config.generation.engine, config.generation.engine)
    return EngineWeightChannel(engine, probe, name=f"{kind} engine ({model})")


def policy_meter(policy: Policy) -> ComputeMeter:
    """The run's compute meter; a LoRA policy's training tokens are priced at `4N + 2 N_adapter`
    and its generation and reference passes at the base's N (`scalerl.telemetry.compute`)."""
    n = flop_params(policy.model)
    if not policy.lora:
        return ComputeMeter(n)
    adapter = flop_params(policy.model, trainable_only=True)
    return ComputeMeter(n, trainable_params=adapter, generation_params=n - adapter)


def local_backend(
    config: RunConfig, run_path: Path, device: str | None, resume: str | Path | None
) -> Backend:
    """The policy and its trainer here, and a generation copy of the model in the embedded engine."""
    config = resolve_teacher(config)
    policy = apply_lora(load_policy(config.model, device), config.model.lora, seed=config.seed)
    meter = policy_meter(policy)
    trainer = Trainer.from_settings(trainer_settings(config), policy, meter)
    start_step, resume_state = 0, None
    if resume is not None:
        saved = trainer.load(resume)
        # The checkpoint's optimizer carries the rate it was saved with; the run's config decides
        # (a rollback lowers it: `rollback.lr_scale`).
        trainer.set_lr(trainer_settings(config).optim.lr)
        start_step = saved.step
        resume_state = saved.extra.get("pipeline")
        if resume_state is None:
            raise InputError(f"{resume}: checkpoint has no pipeline state (not written by `scalerl train`?)")

    tokenizer = bind_chat_template_kwargs(policy.tokenizer, config.data.chat_template_kwargs)
    closers: list[Any] = []
    engine = _build_engine(config, trainer, closers)
    # Every sync is verified (scalerl.rollout.fingerprint: the tensors the engine can read back;
    # scalerl.rollout.probe: what it computes); the vLLM engine gets the trainer's weights before its
    # first prompt, the first check of its loader.
    channel = weight_channel(config, engine, trainer_probe(config, trainer))
    if config.generation.engine != "embedded":
        channel.publish(trainer.weights_for_engine(), trainer.version)

    def checkpoint(step: int, state: dict[str, Any], snapshot: dict[str, Any] | None = None) -> None:
        files = {SNAPSHOT_FILE: snapshot} if snapshot is not None else None
        trainer.save(run_path, step, extra={"pipeline": state}, keep=config.checkpoint.keep, files=files)

    stats = getattr(engine, "stats", None)
    figures = stats.figures if hasattr(stats, "figures") else dict
    return Backend(trainer=trainer, engine=engine, tokenizer=tokenizer, meter=meter, start_step=start_step,
                   resume_state=resume_state, checkpoint=checkpoint, channel=channel,
                   wrap_metrics=lambda sink: EngineFigures(sink, figures, channel.metrics), closers=closers)


def resolve_teacher(config: RunConfig) -> RunConfig:
    """`algorithm.distill.teacher: warm_start` becomes the path of the embedded default's SFT warm
    start for `model.tiny` (trained and cached on first use, as `scalerl train` does without a model)."""
    if config.algorithm.distill.teacher != "warm_start":
        return config
    from scalerl.assembly.warm_start import warm_start_default

    base = config.model_copy(deep=True)
    base.model.name_or_path = None
    out = config.model_copy(deep=True)
    out.algorithm.distill.teacher = str(warm_start_default(base))
    return out


class EngineFigures:
    """A metrics sink that adds the engine's cumulative figures (`stats.figures()`: vLLM's prompt
    tokens and prefix-cache hits) and the weight channel's (syncs and their verification) to every
    step row."""

    def __init__(self, sink: Any, *figures: Any) -> None:
        self.sink = sink
        self.figures = figures

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> Any:
        row = dict(metrics)
        for figures in self.figures:
            row.update(figures())
        return self.sink.log_step(step, row)

    def log_eval(self, step: int, metrics: Mapping[str, Any]) -> Any:
        return self.sink.log_eval(step, metrics)

    def log_samples(self, step: int, rows: list[Mapping[str, Any]]) -> None:
        self.sink.log_samples(step, rows)
