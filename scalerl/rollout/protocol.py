"""The engine protocol: the one contract between every pipeline mode and every generation engine.

A pipeline submits `GenerationRequest`s (prompt token ids + `SamplingParams`, `n` samples each) and
collects `Completion`s as they finish. Each completion carries what the trainer needs to compute the
importance ratio pi_train / pi_gen (ScaleRL eq. 2) and to enforce staleness bounds: behaviour
log-probs of the sampled tokens, the policy version of every token, the version at which generation
started, the sampling support when top-k / top-p truncated it (keep-sampling-mask, DeepSeek-V3.2),
a loss mask (forced-interruption tokens are not the policy's actions), and why it finished.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import torch

from scalerl.rollout.support import SupportIds

FinishReason = Literal["stop", "length", "interrupted"]

DEFAULT_INTERRUPTION_PHRASE = (
    "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"
)


@dataclass(frozen=True)
class InterruptionSpec:
    """ScaleRL forced interruption (length control): stop over-long thinking.

    When a sample has produced `budget ~ U[think_budget_lo, think_budget_hi]` tokens without emitting
    `think_end_ids`, the engine appends `phrase_ids` (masked out of the loss) and lets the sample
    answer within `answer_budget` more tokens. Source: ScaleRL Sec. 3 / A.10 (Qwen3-style).
    """

    think_budget_lo: int
    think_budget_hi: int
    answer_budget: int
    phrase_ids: tuple[int, ...]
    think_end_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if not 0 < self.think_budget_lo <= self.think_budget_hi:
            raise ValueError(
                f"think_budget: need 0 < lo <= hi, got [{self.think_budget_lo}, {self.think_budget_hi}]"
            )
        if self.answer_budget <= 0:
            raise ValueError(f"answer_budget: must be positive, got {self.answer_budget}")
        if not self.phrase_ids or not self.think_end_ids:
            raise ValueError("phrase_ids/think_end_ids: must be non-empty token id sequences")


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings for one request. `top_k=0` and `top_p=1.0` mean no truncation."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    # Record, per generated token, the top-k/top-p set it was drawn from: its size
    # (`Completion.support`) and up to `support_max_ids` of its token ids (`Completion.support_ids`).
    return_support: bool = False
    support_max_ids: int = 64
    interruption: InterruptionSpec | None = None
    seed: int | None = None
    # Multi-token stop sequences (e.g. `</tool_call>` in a char-level vocabulary): a sample that
    # ends with one finishes with reason "stop", the sequence included in its tokens.
    stop_sequences: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n: must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature: must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k: must be >= 0, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: must be >= 1, got {self.max_new_tokens}")
        if self.support_max_ids < 1:
            raise ValueError(f"support_max_ids: must be >= 1, got {self.support_max_ids}")
        if any(not seq for seq in self.stop_sequences):
            raise ValueError("stop_sequences: every stop sequence must be non-empty")

    @property
    def truncates_support(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0


@dataclass
class GenerationRequest:
    """`n` samples of one prompt. `request_id` is echoed back on every completion.

    `hold=True` (engines with `ContinuableEngine`): a finished sample keeps its state (the KV cache)
    so that `extend` can append environment tokens and continue it; `release` frees it.

    `cache_key`: requests that share one continue each other (the turns of a multi-turn episode
    resubmitted with their whole context), so an engine with prefix caching may serve their common
    prefix from KV computed for an earlier one, as an in-flight update keeps a running sequence's
    KV. None: only the request's own samples share cached KV, so a request admitted after a weight
    update never reads KV of older weights. A pool of engines keeps a key on one engine.
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    metadata: dict = field(default_factory=dict)
    hold: bool = False
    cache_key: str | None = None


# Completion metadata: the index of the engine of a pool that generated it (the Ray engine pool
# stamps it; an agentic episode records it per turn). Absent for a single engine.
ENGINE_METADATA_KEY = "pool_engine"


@dataclass
class Completion:
    """One finished sample.

    Per-token lists all have length `len(token_ids)`:
    `logprobs[t]` is log pi_gen(token_t | prefix) under the weights that sampled it, after temperature
    scaling and, when the support was truncated, renormalised over that support;
    `versions[t]` is the policy version that produced token t; `loss_mask[t]` is False for tokens
    the policy did not choose (the forced-interruption phrase).
    `support[t]` (only when requested and truncated) is the size of the set S_old the sampler could
    draw token t from: `k > 0`, exactly k tokens (the k highest-scoring of its scaled logits, ties:
    lower id first, which is what top-k/top-p keep); `< 0`, at least `-k` (an engine that showed only
    its top log-probs, see `rollout.vllm_engine`); `SUPPORT_FORCED` (0), a forced token.
    `support_ids` holds the members of each S_old as token ids (`rollout.support.SupportIds`, at
    most `SamplingParams.support_max_ids` per token, the highest-scoring when the set is larger; none
    for a forced token). `support_cut` is the request's `(top_k, top_p)`, with which a trainer
    completes a set whose ids were not all recorded (`rollout.sampling.support_from_record`).
    `routing` (MoE models, engines that record it) holds the experts every MoE layer selected at
    every position of `prompt_ids + token_ids`: `[positions, layers, k]` int16, -1 where none was
    recorded (`scalerl.models.moe`; replayed by `algorithm.keep_routing`).
    """

    request_id: str
    sample_index: int
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    loss_mask: list[bool]
    finish_reason: FinishReason
    start_version: int
    support: list[int] | None = None
    support_cut: tuple[int, float] | None = None
    support_ids: SupportIds | None = None
    metadata: dict = field(default_factory=dict)
    # Not compared by `==` (a tensor has no single truth value); compare it with `torch.equal`.
    routing: torch.Tensor | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if self.routing is not None and (
            self.routing.dim() != 3 or int(self.routing.shape[0]) != len(self.prompt_ids) + n
        ):
            raise ValueError(f"routing: shape {tuple(self.routing.shape)}, expected "
                             f"[{len(self.prompt_ids) + n} (prompt + tokens), layers, k]")
        for name in ("logprobs", "versions", "loss_mask"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name}: length {len(getattr(self, name))} != len(token_ids) {n}")
        if self.support is not None:
            if len(self.support) != n:
                raise ValueError(f"support: length {len(self.support)} != len(token_ids) {n}")
            if self.support_cut is None:
                raise ValueError("support_cut: needed with support (the request's top_k, top_p)")
        if self.support_ids is not None:
            if self.support is None:
                raise ValueError("support_ids: needs support (the size of each recorded set)")
            if len(self.support_ids) != n:
                raise ValueError(f"support_ids: {len(self.support_ids)} tokens != len(token_ids) {n}")

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def end_version(self) -> int:
        return self.versions[-1] if self.versions else self.start_version


@runtime_checkable
class Engine(Protocol):
    """What every generation engine provides.

    Thread-safety contract: `update_weights` may be called from another thread while `step` runs in
    the generator thread; the engine applies it between decode steps, sequences in flight keep their
    KV cache and continue under the new weights (PipelineRL in-flight update).
    """

    @property
    def version(self) -> int:
        """Policy version of the weights currently used for sampling."""
        ...

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        """Queue requests; each expands into `params.n` sequences."""
        ...

    def step(self) -> list[Completion]:
        """Advance generation by one decode step (admitting waiting sequences into free slots);
        return the completions that finished during it."""
        ...

    def num_unfinished(self) -> int:
        """Sequences queued or in flight."""
        ...

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Submit and run to completion; completions are ordered by (request order, sample_index)."""
        ...

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Load new policy weights (in flight) and tag every later token with `version`."""
        ...


@runtime_checkable
class ContinuableEngine(Engine, Protocol):
    """An engine that continues a finished sample after appended tokens, keeping its prefix state.

    Multi-turn rollouts (scalerl.agentic): a sample of a `hold=True` request finishes one model
    segment; the caller appends an environment segment (a tool result) with `extend`, and the
    engine continues the same sequence without recomputing the prefix. The appended tokens are not
    the policy's actions: `loss_mask` False, log-prob 0. The completion the continued sample
    finishes with holds every token since the original prompt (earlier segments included), and
    each segment samples under `params` afresh (`max_new_tokens` counts that segment's tokens).
    """

    def extend(
        self, request_id: str, sample_index: int, append_ids: Sequence[int], params: SamplingParams,
        *, hold: bool = True,
    ) -> None:
        """Append `append_ids` to the held sample and queue it to generate its next segment."""
        ...

    def release(self, request_id: str, sample_index: int) -> None:
        """Free a held sample (its slot and cache); unknown ids are an error."""
        ...
