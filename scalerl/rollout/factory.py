"""The one place that builds generation engines: `generation.engine` -> an `Engine`.

An `EngineSpec` is everything an engine needs, as plain picklable values, so the same spec builds
an engine in this process (`scalerl train`, `scalerl eval`) or in another one (a Ray engine actor).
`build_engine(spec, model=...)` takes an already loaded model for the embedded engine (the trainer's
generation copy) or loads `spec.model_path` itself.

`kind="emulated"` builds `scalerl.rollout.emulated.EmulatedEngine`, a device emulator for benchmarks
and tests (its timing and length model in `options`); `generation.engine` never selects it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from scalerl.rollout.protocol import Engine

EngineKind = Literal["embedded", "vllm", "emulated"]


@dataclass(frozen=True)
class EngineSpec:
    """What to build: the engine kind, the model and the engine's own settings.

    `model_path` is a Hugging Face directory or hub name (required by vLLM, which loads from disk;
    optional for the embedded engine when a model object is passed). `options` are engine-specific
    extras (for vLLM, `vllm.EngineArgs` fields).
    """

    kind: EngineKind
    model_path: str | None
    fp32_lm_head: bool
    seed: int
    max_batch_size: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None = None
    initial_version: int = 0
    options: dict[str, Any] = field(default_factory=dict)


def build_engine(spec: EngineSpec, model: nn.Module | None = None) -> Engine:
    """Build the engine `spec` names; `model` (embedded only) is used as is and owned by the engine."""
    if spec.kind == "embedded":
        from scalerl.rollout.embedded import EmbeddedEngine

        if model is None:
            if spec.model_path is None:
                raise ValueError("EngineSpec: the embedded engine needs a model object or a model_path")
            model = _load_generation_model(spec.model_path)
        return EmbeddedEngine(
            model.eval(),
            max_batch_size=spec.max_batch_size,
            fp32_lm_head=spec.fp32_lm_head,
            seed=spec.seed,
            eos_token_ids=spec.eos_token_ids,
            initial_version=spec.initial_version,
            pad_token_id=spec.pad_token_id,
        )
    if spec.kind == "vllm":
        if model is not None:
            raise ValueError("EngineSpec: the vLLM engine loads its model from model_path, not an object")
        if spec.model_path is None:
            raise ValueError("EngineSpec: the vLLM engine needs a model_path")
        from scalerl.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(
            spec.model_path,
            fp32_lm_head=spec.fp32_lm_head,
            seed=spec.seed,
            max_batch_size=spec.max_batch_size,
            eos_token_ids=spec.eos_token_ids,
            initial_version=spec.initial_version,
            engine_kwargs=spec.options,
        )
    if spec.kind == "emulated":
        if model is not None:
            raise ValueError("EngineSpec: the emulated engine has no model")
        from scalerl.rollout.emulated import EmulatedEngine

        return EmulatedEngine(
            max_batch_size=spec.max_batch_size,
            seed=spec.seed,
            eos_token_ids=spec.eos_token_ids or None,
            initial_version=spec.initial_version,
            **spec.options,
        )
    raise ValueError(f"generation.engine: unknown engine {spec.kind!r} (expected 'embedded' or 'vllm')")


def _load_generation_model(path: str) -> nn.Module:
    """A float32 causal LM from `path`, for generation only."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
