"""The vLLM engine (optional `vllm` extra, one GPU) behind the same protocol as the embedded engine.

Written against vLLM's V1 engine (>= 0.10.2, the release that added `logprobs_mode`):

- The engine is `vllm.v1.engine.llm_engine.LLMEngine` run in-process
  (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set here before it is built) with synchronous scheduling
  (`async_scheduling=False`, `stream_interval=1`) and `RequestOutputKind.DELTA` outputs, so each
  `step()` is exactly one scheduler iteration whose new tokens were all computed by the weights of
  that step: that is what makes the per-token `versions` exact.
- In-flight weight updates: between two steps, `collective_rpc` runs a function on the (in-process)
  worker that calls the vLLM model's `load_weights`; running requests keep their KV blocks and
  continue under the new weights (PipelineRL). Prefix caching is off by default so that a request
  admitted after an update never reuses prompt blocks computed by older weights.
- Behaviour log-probs: `SamplingParams(logprobs=0)` with `logprobs_mode="processed_logprobs"`, i.e.
  the log-prob of the sampled token after temperature and top-k/top-p (renormalised over the kept
  support), which is what the sampler drew from. Greedy requests get vLLM's untruncated log-probs.
- FP32 LM head: every `LogitsProcessor` in the model gets its `_get_logits` replaced by a float32
  projection (hidden states and a cached float32 copy of the unquantized head weight), the same
  arithmetic as `scalerl.models.lm_head.lm_head_logits(fp32=True)`; recent vLLM also offers
  `hf_overrides={"head_dtype": "float32"}`, which this does not rely on.
- Sampling support (keep-sampling-mask): recorded when `top_k > 0` by asking for the `top_k` most
  likely processed log-probs (finite = in the support); top-p without top-k cannot be recovered
  from vLLM's outputs and is refused when `return_support` is set.
- Forced interruption: vLLM cannot append tokens to a running request, so a sample first runs with
  `max_tokens = budget`; if it reached the budget without closing `</think>`, the phrase is appended
  and a continuation request (prompt + tokens so far + phrase) answers within `answer_budget`. The
  continuation's prefill recomputes the KV cache under the current weights (the embedded engine keeps
  the stale cache instead). The phrase tokens carry log-prob 0.0 (forced, loss-masked).

Everything here imports vLLM lazily: this module imports without it. It is exercised only on a GPU
machine with vLLM installed (tests marked `gpu`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from scalerl.rollout.base import Finished, SteppingEngine
from scalerl.rollout.interruption import draw_think_budget, ends_with
from scalerl.rollout.protocol import Completion, FinishReason, GenerationRequest, SamplingParams

_MIN_VLLM = "0.10.2"


def import_vllm() -> Any:
    """Import vLLM, with an actionable error when the optional extra is missing."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            f"VLLMEngine needs vLLM >= {_MIN_VLLM} on a CUDA machine: pip install 'scalerl[vllm]'"
        ) from exc
    return vllm


def contains_subsequence(tokens: Sequence[int], pattern: Sequence[int]) -> bool:
    """Whether `pattern` occurs contiguously in `tokens`."""
    n = len(pattern)
    return n > 0 and any(ends_with(tokens[: i + 1], pattern) for i in range(n - 1, len(tokens)))


def phase_seed(base: int, sample_index: int, phase: int) -> int:
    """Per-sample, per-phase vLLM seed (phases: 0 = first request, 1 = continuation)."""
    state = np.random.SeedSequence(entropy=base % 2**64, spawn_key=(sample_index, phase)).generate_state(
        1, np.uint64
    )
    return int(state[0] & 0x7FFF_FFFF)


# ----------------------------------------------------------------------------- worker-side functions
# These run inside vLLM's worker (in this process) through `collective_rpc`.


def _worker_model(worker: Any) -> nn.Module:
    runner = getattr(worker, "model_runner", None)
    for owner, name in ((worker, "get_model"), (runner, "get_model")):
        getter = getattr(owner, name, None)
        if callable(getter):
            return getter()
    model = getattr(runner, "model", None)
    if model is None:
        raise RuntimeError("cannot find the model inside the vLLM worker")
    return model


def _fp32_get_logits(
    self: Any, hidden_states: torch.Tensor, lm_head: nn.Module, embedding_bias: torch.Tensor | None
) -> torch.Tensor | None:
    """`LogitsProcessor._get_logits` in float32: `float(h) @ float(W)^T (+ float(b))`, then vLLM's
    own tensor-parallel gather and vocabulary-padding slice."""
    weight = self._scalerl_fp32_weight
    if weight is None:
        weight = lm_head.weight.detach().float()
        self._scalerl_fp32_weight = weight
    bias = embedding_bias.float() if embedding_bias is not None else None
    logits = torch.nn.functional.linear(hidden_states.float(), weight, bias)
    logits = self._gather_logits(logits)
    if logits is not None:
        logits = logits[..., : self.org_vocab_size]
    return logits


def install_fp32_lm_head(worker: Any) -> int:
    """Patch every `LogitsProcessor` of the worker's model to project in float32; returns how many."""
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    count = 0
    for module in _worker_model(worker).modules():
        if isinstance(module, LogitsProcessor):
            for attr in ("_get_logits", "_gather_logits", "org_vocab_size"):
                if not hasattr(module, attr):
                    raise RuntimeError(f"this vLLM's LogitsProcessor has no {attr}; cannot install fp32 head")
            module._scalerl_fp32_weight = None
            module._get_logits = types.MethodType(_fp32_get_logits, module)
            count += 1
    return count


def check_unquantized_head(worker: Any) -> None:
    """The fp32 head casts the head weight; a quantized head has no plain weight to cast."""
    for module in _worker_model(worker).modules():
        quant = getattr(module, "quant_method", None)
        is_head = type(module).__name__ == "ParallelLMHead" and quant is not None
        if is_head and type(quant).__name__ != "UnquantizedEmbeddingMethod":
            raise RuntimeError("the fp32 LM head needs an unquantized lm_head")


def load_weights_in_worker(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> int:
    """Load (name, tensor) pairs with the vLLM model's own `load_weights` (Hugging Face names;
    vLLM maps them onto its fused q/k/v and gate/up parameters) and drop the cached fp32 head."""
    model = _worker_model(worker)
    model.load_weights(weights=iter(weights))
    for module in model.modules():
        if hasattr(module, "_scalerl_fp32_weight"):
            module._scalerl_fp32_weight = None
    return len(weights)


# ----------------------------------------------------------------------------- engine


@dataclass(eq=False)
class _Sample:
    serial: int
    request: GenerationRequest
    sample_index: int
    base_seed: int
    stop_ids: frozenset[int]
    budget: int | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)
    support: list[list[int]] | None = None
    start_version: int | None = None
    phase: int = 0  # 0: first request; 1: continuation (after the phrase, or after closing think)
    interrupted_at: int | None = None


class VLLMEngine(SteppingEngine):
    """vLLM V1 engine behind the `Engine` protocol (see module docstring). One GPU (TP = 1).

    Args:
        model: Hugging Face model id or path, as for `vllm.LLM`.
        fp32_lm_head: float32 LM-head projection (must match the trainer's setting).
        seed: base seed for requests without `SamplingParams.seed`.
        max_batch_size: vLLM's `max_num_seqs`.
        max_logprobs: upper bound on `top_k` when `return_support` is requested.
        eos_token_ids: stop ids added to every request (default: the model's eos ids).
        enable_prefix_caching: reuse prompt KV blocks across requests (stale after updates).
        engine_kwargs: further `vllm.EngineArgs` fields (e.g. `max_model_len`, `dtype`).
    """

    def __init__(
        self,
        model: str,
        *,
        fp32_lm_head: bool = True,
        seed: int = 0,
        max_batch_size: int = 256,
        gpu_memory_utilization: float = 0.5,
        max_logprobs: int = 20,
        eos_token_ids: Sequence[int] | None = None,
        initial_version: int = 0,
        enable_prefix_caching: bool = False,
        engine_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(initial_version)
        import_vllm()
        # In-process engine core and worker: exact per-step version tagging, tensors passed by reference.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        wanted: dict[str, Any] = {
            "model": model,
            "seed": seed,
            "max_num_seqs": max_batch_size,
            "gpu_memory_utilization": gpu_memory_utilization,
            "max_logprobs": max_logprobs,
            "enable_prefix_caching": enable_prefix_caching,
            "logprobs_mode": "processed_logprobs",
            "async_scheduling": False,
            "stream_interval": 1,
            "tensor_parallel_size": 1,
            "disable_log_stats": True,
            **dict(engine_kwargs or {}),
        }
        known = {f.name for f in dataclasses.fields(EngineArgs)}
        if "logprobs_mode" not in known:
            raise RuntimeError(f"VLLMEngine needs vLLM >= {_MIN_VLLM} (EngineArgs.logprobs_mode)")
        optional = {"async_scheduling", "stream_interval"}  # absent in older releases: their default is ours
        unknown = set(wanted) - known - optional
        if unknown:
            raise TypeError(f"unknown vllm.EngineArgs fields: {sorted(unknown)}")
        args = EngineArgs(**{k: v for k, v in wanted.items() if k in known})
        self._init_state(LLMEngine.from_engine_args(args), seed=seed, max_logprobs=max_logprobs)
        self.fp32_lm_head = fp32_lm_head
        if fp32_lm_head:
            self._rpc(check_unquantized_head)
            if min(self._rpc(install_fp32_lm_head)) < 1:
                raise RuntimeError("no LogitsProcessor found in the vLLM model: cannot install the fp32 head")
        self.vocab_size = int(self._engine.model_config.get_vocab_size())
        self.eos_token_ids = tuple(eos_token_ids) if eos_token_ids is not None else self._model_eos_ids(model)

    def _init_state(self, core: Any, *, seed: int, max_logprobs: int) -> None:
        """Engine state around a built vLLM `LLMEngine` (`core`)."""
        self._engine = core
        self.max_logprobs = max_logprobs
        self.fp32_lm_head = False
        self.vocab_size = 0
        self.eos_token_ids: tuple[int, ...] = ()
        self._rng = np.random.default_rng(seed)
        self._samples: dict[str, _Sample] = {}  # vLLM request id -> sample
        self._unfinished = 0

    # ----------------------------------------------------------------------------- helpers
    def _rpc(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        return self._engine.collective_rpc(fn, args=args)

    def _model_eos_ids(self, model: str) -> tuple[int, ...]:
        ids: set[int] = set()
        eos = getattr(self._engine.model_config.hf_config, "eos_token_id", None)
        try:
            from transformers import GenerationConfig

            gen_eos = GenerationConfig.from_pretrained(model).eos_token_id
        except (OSError, ValueError):
            gen_eos = None
        for value in (eos, gen_eos):
            if value is not None:
                ids.update(value if isinstance(value, (list, tuple)) else [value])
        return tuple(sorted(int(i) for i in ids))

    def _vllm_params(self, params: SamplingParams, seed: int, max_tokens: int, want_support: bool) -> Any:
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        return VSamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            max_tokens=max_tokens,
            seed=seed,
            stop_token_ids=sorted(set(params.stop_token_ids) | set(self.eos_token_ids)),
            logprobs=params.top_k if want_support else 0,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )

    def _add(self, sample: _Sample, prompt: list[int], max_tokens: int) -> None:
        params = sample.request.params
        want_support = sample.support is not None
        seed = phase_seed(sample.base_seed, sample.sample_index, sample.phase)
        rid = f"{sample.serial}-{sample.sample_index}-{sample.phase}"
        returned = self._engine.add_request(
            rid, {"prompt_token_ids": prompt}, self._vllm_params(params, seed, max_tokens, want_support)
        )
        # Recent vLLM may rename the request; outputs carry the returned id.
        self._samples[returned if isinstance(returned, str) else rid] = sample

    # ----------------------------------------------------------------------------- hooks
    def _num_unfinished_locked(self) -> int:
        return self._unfinished

    def _submit_locked(self, requests: Sequence[GenerationRequest], serials: list[int]) -> None:
        for request in requests:
            params = request.params
            if not request.prompt_ids:
                raise ValueError(f"request {request.request_id!r}: empty prompt")
            spec_ids = [*params.interruption.phrase_ids] if params.interruption is not None else []
            bad = [t for t in [*request.prompt_ids, *spec_ids] if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(
                    f"request {request.request_id!r}: token ids {bad[:5]} outside the vocabulary"
                )
            sampled = params.temperature > 0
            if params.return_support and sampled and params.top_p < 1.0 and params.top_k == 0:
                raise ValueError("VLLMEngine records the sampling support only when top_k > 0")
            if params.return_support and params.top_k > self.max_logprobs:
                raise ValueError(f"top_k {params.top_k} > max_logprobs {self.max_logprobs}")
        for serial, request in zip(serials, requests, strict=True):
            params = request.params
            base = params.seed if params.seed is not None else int(self._rng.integers(2**31))
            want_support = params.return_support and params.truncates_support and params.temperature > 0
            for i in range(params.n):
                budget = None
                if params.interruption is not None:
                    rng = np.random.default_rng(
                        np.random.SeedSequence(entropy=base % 2**64, spawn_key=(i, 2))
                    )
                    budget = draw_think_budget(params.interruption, rng)
                sample = _Sample(
                    serial=serial,
                    request=request,
                    sample_index=i,
                    base_seed=base,
                    stop_ids=frozenset(params.stop_token_ids) | frozenset(self.eos_token_ids),
                    budget=budget,
                    support=[] if want_support else None,
                )
                first = params.max_new_tokens if budget is None else min(budget, params.max_new_tokens)
                self._add(sample, list(request.prompt_ids), first)
                self._unfinished += 1

    def _step_locked(self) -> list[Finished]:
        if not self._engine.has_unfinished_requests():
            return []
        version = self._version
        finished: list[Finished] = []
        for output in self._engine.step():
            sample = self._samples.get(output.request_id)
            if sample is None:
                continue
            out = output.outputs[0]
            self._append(sample, out, version)
            if not output.finished:
                continue
            del self._samples[output.request_id]
            reason = self._after_phase(sample, out.finish_reason)
            if reason is not None:
                self._unfinished -= 1
                finished.append((sample.serial, sample.sample_index, self._completion(sample, reason)))
        return finished

    def _load_weights_locked(self, state: Mapping[str, torch.Tensor]) -> None:
        self._rpc(load_weights_in_worker, list(state.items()))

    # ----------------------------------------------------------------------------- bookkeeping
    def _append(self, sample: _Sample, out: Any, version: int) -> None:
        new_ids = list(out.token_ids)
        if not new_ids:
            return
        if sample.start_version is None:
            sample.start_version = version
        if out.logprobs is None or len(out.logprobs) < len(new_ids):
            raise RuntimeError("vLLM returned fewer log-prob entries than tokens")
        entries = list(out.logprobs)[-len(new_ids) :]
        for tok, entry in zip(new_ids, entries, strict=True):
            sample.token_ids.append(int(tok))
            sample.logprobs.append(float(entry[tok].logprob))
            sample.versions.append(version)
            sample.loss_mask.append(True)
            if sample.support is not None:
                sample.support.append(sorted(int(t) for t, lp in entry.items() if math.isfinite(lp.logprob)))

    def _after_phase(self, sample: _Sample, vllm_reason: str | None) -> FinishReason | None:
        """Finish reason when a vLLM request ends, or None after queueing its continuation."""
        params = sample.request.params
        spec = params.interruption
        interrupted = sample.interrupted_at is not None
        n = len(sample.token_ids)
        if vllm_reason == "stop" or (n and sample.token_ids[-1] in sample.stop_ids):
            return "interrupted" if interrupted else "stop"
        if vllm_reason != "length":
            raise RuntimeError(f"vLLM request ended with {vllm_reason!r}")
        if n >= params.max_new_tokens:
            return "length"
        if interrupted:
            return "interrupted"  # answer budget spent
        if spec is None or sample.phase != 0:
            return "length"
        # The think phase reached its budget.
        prompt = list(sample.request.prompt_ids)
        sample.phase = 1
        if contains_subsequence(sample.token_ids, spec.think_end_ids):
            self._add(sample, prompt + sample.token_ids, params.max_new_tokens - n)
            return None
        phrase = list(spec.phrase_ids)
        if n + len(phrase) >= params.max_new_tokens:
            return "length"
        sample.interrupted_at = n
        sample.token_ids.extend(phrase)
        sample.logprobs.extend([0.0] * len(phrase))
        sample.versions.extend([self._version] * len(phrase))
        sample.loss_mask.extend([False] * len(phrase))
        if sample.support is not None:
            sample.support.extend([t] for t in phrase)
        left = params.max_new_tokens - len(sample.token_ids)
        self._add(sample, prompt + sample.token_ids, min(spec.answer_budget, left))
        return None

    def _completion(self, sample: _Sample, reason: FinishReason) -> Completion:
        request = sample.request
        metadata = dict(request.metadata)
        if sample.budget is not None:
            metadata["interruption"] = {"think_budget": sample.budget, "phrase_start": sample.interrupted_at}
        return Completion(
            request_id=request.request_id,
            sample_index=sample.sample_index,
            prompt_ids=list(request.prompt_ids),
            token_ids=sample.token_ids,
            logprobs=sample.logprobs,
            versions=sample.versions,
            loss_mask=sample.loss_mask,
            finish_reason=reason,
            start_version=sample.start_version if sample.start_version is not None else self._version,
            support=sample.support,
            metadata=metadata,
        )
