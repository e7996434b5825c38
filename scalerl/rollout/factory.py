"""The one place that builds generation engines: `generation.engine` -> an `Engine`.

An `EngineSpec` is everything an engine needs, as plain picklable values, so the same spec builds
an engine in this process (`scalerl train`, `scalerl eval`) or in another one (a Ray engine actor).
`spec_from_config` builds it from the `generation` and `model` sections; `build_engine(spec,
model=...)` takes an already loaded model for the embedded engine (the trainer's generation copy)
or loads `spec.model_path` itself. `check_engine_available(kind)` is what a command calls first,
so that asking for an engine that is not installed fails before any work.

`kind="emulated"` builds `scalerl.rollout.emulated.EmulatedEngine`, a device emulator for benchmarks
and tests (its timing and length model in `options`); `generation.engine` never selects it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from torch import nn

from scalerl.rollout.protocol import Engine

if TYPE_CHECKING:
    from scalerl.config import GenerationConfig, ModelConfig

EngineKind = Literal["embedded", "vllm", "emulated"]


class EngineUnavailableError(ValueError):
    """The engine `generation.engine` names cannot be imported here (CLI: exit 2)."""


def check_engine_available(kind: str) -> None:
    """Raise `EngineUnavailableError` (naming the key and the install command) unless `kind` can run.

    For vLLM this imports it (and checks its release): a broken install, such as CUDA builds of
    torchvision beside a CPU torch, fails here rather than after the warm start.
    """
    if kind != "vllm":
        return
    from scalerl.rollout.vllm_engine import import_vllm

    try:
        import_vllm()
    except ImportError as err:
        raise EngineUnavailableError(f"generation.engine=vllm: vLLM is not usable here: {err}") from None
    except Exception as err:  # a broken install raises anything at import time
        from scalerl.rollout.vllm_engine import VLLM_INSTALL_HINT

        raise EngineUnavailableError(
            f"generation.engine=vllm: importing vLLM failed ({type(err).__name__}: {err}); "
            f"{VLLM_INSTALL_HINT}"
        ) from None


@dataclass(frozen=True)
class EngineSpec:
    """What to build: the engine kind, the model and the engine's own settings.

    `model_path` is a Hugging Face directory or hub name (required by vLLM, which loads from disk;
    optional for the embedded engine when a model object is passed). `dtype` and `max_model_len`
    matter to vLLM only (the embedded engine runs the model object as it is and has no length
    limit of its own). `options` are engine-specific extras (for vLLM: `enforce_eager` (None: by
    platform), `tensor_parallel_size`, `prefix_caching`, `block_size`, `kv_cache_bytes`,
    `sleep_mode` (the colocated layout), `engine_kwargs` for further `vllm.EngineArgs` fields).
    """

    kind: EngineKind
    model_path: str | None
    fp32_lm_head: bool
    seed: int
    max_batch_size: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None = None
    initial_version: int = 0
    dtype: str = "float32"
    max_model_len: int | None = None
    options: dict[str, Any] = field(default_factory=dict)


def spec_from_config(
    generation: GenerationConfig,
    model: ModelConfig,
    *,
    max_prompt_tokens: int,
    model_path: str | None,
    eos_token_ids: tuple[int, ...],
    pad_token_id: int | None,
    initial_version: int = 0,
) -> EngineSpec:
    """The engine `generation` asks for, for the model at `model_path` (`model`: its dtype and FP32
    head).

    vLLM's length limit is the longest prompt the data admits (`max_prompt_tokens`, the run's
    `data.max_prompt_tokens`) plus the response budget (forced interruption never makes a sample
    longer than `max_new_tokens`).
    """
    g = generation
    options: dict[str, Any] = {"enforce_eager": g.vllm.enforce_eager, "prefix_caching": g.vllm.prefix_caching,
                               "tensor_parallel_size": g.vllm.tensor_parallel_size}
    if g.vllm.block_size is not None:
        options["block_size"] = g.vllm.block_size
    if g.vllm.kv_cache_gib is not None:
        options["kv_cache_bytes"] = int(g.vllm.kv_cache_gib * 2**30)
    if g.engine == "vllm" and g.vllm.colocate:
        options["sleep_mode"] = True  # the colocated layout sleeps it between rounds
    return EngineSpec(
        kind=g.engine,
        model_path=model_path,
        fp32_lm_head=model.fp32_lm_head,
        seed=g.seed,
        max_batch_size=g.max_batch_size,
        eos_token_ids=eos_token_ids,
        pad_token_id=pad_token_id,
        initial_version=initial_version,
        dtype=model.dtype,
        max_model_len=max_prompt_tokens + g.max_new_tokens,
        options=options,
    )


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
            raise ValueError(
                "generation.engine=vllm loads the model from a saved directory: set model.name_or_path "
                "(the tiny default is saved by its SFT warm start)"
            )
        check_engine_available("vllm")
        from scalerl.rollout.vllm_engine import VLLMEngine

        options = dict(spec.options)
        kv_cache_bytes = options.pop("kv_cache_bytes", None)
        enforce_eager = options.pop("enforce_eager", None)  # None: by platform (vllm_versions)
        tensor_parallel_size = int(options.pop("tensor_parallel_size", 1))
        prefix_caching = bool(options.pop("prefix_caching", True))
        block_size = options.pop("block_size", None)
        engine_kwargs = options.pop("engine_kwargs", None)
        sleep_mode = bool(options.pop("sleep_mode", False))
        if options:
            raise ValueError(f"EngineSpec.options: unknown vLLM engine options {sorted(options)}")
        return VLLMEngine(
            spec.model_path,
            fp32_lm_head=spec.fp32_lm_head,
            seed=spec.seed,
            max_batch_size=spec.max_batch_size,
            max_model_len=spec.max_model_len,
            dtype=spec.dtype,
            eos_token_ids=spec.eos_token_ids,
            initial_version=spec.initial_version,
            kv_cache_bytes=kv_cache_bytes,
            enforce_eager=None if enforce_eager is None else bool(enforce_eager),
            tensor_parallel_size=tensor_parallel_size,
            prefix_caching=prefix_caching,
            block_size=block_size,
            engine_kwargs=engine_kwargs,
            sleep_mode=sleep_mode,
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


def close_engine(engine: Engine) -> None:
    """Release what an engine holds beyond memory (vLLM's engine core); a no-op for the others."""
    close = getattr(engine, "close", None)
    if callable(close):
        close()


def _load_generation_model(path: str) -> nn.Module:
    """A float32 causal LM from `path`, for generation only."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
