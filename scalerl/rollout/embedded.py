"""The embedded engine: any Hugging Face causal LM, with torch, on CPU or one GPU.

Continuous batching: `max_batch_size` slots share one `SlotKVCache`; every `step()` admits waiting
sequences into free slots (their prompt is prefilled in that step) and decodes one token for every
sequence in flight, so a finished sequence's slot is refilled at the next step and the batch stays
full. New prompts and forced-interruption phrases (multi-token chunks) run as one forward, the
one-token decodes as another.

In-flight weight updates (PipelineRL, arXiv 2509.19128): `update_weights(state, version)` may be
called from another thread while `step()` runs in the generator thread. It waits for the step in
progress, copies the weights, and the next step runs under them: sequences keep their (stale) KV
cache and continue; every token sampled afterwards records the new version. Nothing is dropped or
restarted. A waiting update is served before the next step starts, so a busy generator loop cannot
starve the trainer.

Multi-turn continuation (`ContinuableEngine`): a sample of a `hold=True` request that finishes keeps
its slot and KV cache; `extend` appends an environment segment as one multi-token chunk (the same
path as the forced-interruption phrase, loss-masked, not scored) and the sample generates its next
segment from there, so the prefix is never recomputed. A held sample whose slot a waiting sequence
needs is evicted (its cache dropped, counted in `stats.evictions`); extending it then re-prefills
its whole prefix (`stats.recomputed_tokens`).

Log-probs of sampled tokens come from `scalerl.models.lm_head` (the functions the trainer uses),
with the same `fp32_lm_head` option, and the sampling rules of `scalerl.rollout.sampling`.
Each sequence samples from its own `torch.Generator` (seeded from `SamplingParams.seed` and its
sample index, or from the engine's seed), so its draws do not depend on what else is batched.

Mixture-of-experts models (`scalerl.models.moe`): every position fed through the decoder (the
prompt's, then each sampled token's as it is fed back) records the experts each MoE layer's router
selected for it, in the router's order; `Completion.routing` carries them, `[prompt + response
tokens, layers, k]` int16, -1 for the last sampled token (never fed). The trainer replays them
(`algorithm.keep_routing`) or measures its disagreement with them.

`snapshot()` / `restore()` capture everything in flight (sequences, their sampler states, the KV
cache, the engine's seed stream), so a run checkpointed mid-generation resumes to the very tokens
it would have drawn (`scalerl.pipeline.snapshot`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from scalerl.models.lm_head import (
    Fp32HeadWeight,
    cache_kwarg_name,
    check_head_matches_model,
    decoder_of,
    lm_head_logits,
    output_head,
    token_logprobs,
)
from scalerl.models.moe import NO_ROUTE, ROUTING_DTYPE, moe_routers, record_routing
from scalerl.rollout.base import Finished, SteppingEngine
from scalerl.rollout.fingerprint import Fingerprint, state_fingerprints
from scalerl.rollout.interruption import Action, InterruptionState, draw_think_budget, ends_with
from scalerl.rollout.probe import Probe, ProbeLogprobs, model_probe_logprobs
from scalerl.rollout.protocol import (
    Completion,
    FinishReason,
    GenerationRequest,
    InterruptionSpec,
    SamplingParams,
)
from scalerl.rollout.sampling import SUPPORT_FORCED, SampledTokens, sample_next_tokens
from scalerl.rollout.slot_cache import SlotKVCache, attention_masks
from scalerl.rollout.support import SupportIds

_SUPPORTED_ATTENTION = ("sdpa", "eager")
_SUPPORTED_LAYER_TYPES = {"full_attention", "sliding_attention"}


def model_eos_ids(model: nn.Module) -> tuple[int, ...]:
    """The model's end-of-sequence ids (generation config first, then config; int or list)."""
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = getattr(source, "eos_token_id", None)
        if eos is None:
            continue
        return tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))
    return ()


def sample_seed(base: int, sample_index: int) -> tuple[int, int]:
    """(torch seed, budget seed) for one sample, mixed from a base seed and the sample index with
    numpy's `SeedSequence` so that nearby seeds do not give correlated streams."""
    state = np.random.SeedSequence(entropy=base % 2**64, spawn_key=(sample_index,)).generate_state(
        2, np.uint64
    )
    return int(state[0] & 0x7FFF_FFFF_FFFF_FFFF), int(state[1])


@dataclass
class EngineStats:
    """Counters since construction (or `reset_stats`)."""

    steps: int = 0
    slot_steps: int = 0  # sum over steps of the sequences in flight
    generated_tokens: int = 0  # sampled tokens (forced phrase tokens excluded)
    prefill_tokens: int = 0
    max_batch_size: int = 1
    appended_tokens: int = 0  # environment tokens fed by `extend`
    evictions: int = 0  # held samples whose KV cache was dropped to free their slot
    recomputed_tokens: int = 0  # prefix tokens re-prefilled when an evicted sample was extended
    aborted: int = 0  # requests dropped by `abort` (their client went away)

    @property
    def occupancy(self) -> float:
        """Mean fraction of the slots busy per step."""
        return self.slot_steps / (self.steps * self.max_batch_size) if self.steps else 0.0


@dataclass(eq=False)
class _Sequence:
    serial: int
    request: GenerationRequest
    sample_index: int
    generator: torch.Generator | None
    interruption: InterruptionState | None
    stop_ids: frozenset[int]
    temperature: float
    top_k: int
    top_p: float
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)
    support: list[int] | None = None  # `Completion.support` codes
    support_ids: SupportIds | None = None  # `Completion.support_ids`
    slot: int = -1
    cache_len: int = 0
    pending: list[int] = field(default_factory=list)  # tokens the next forward feeds
    forced_pending: int = 0  # trailing tokens of `pending` that were forced (need their log-probs)
    start_version: int = 0
    params: SamplingParams | None = None  # this segment's sampling settings
    budget_seed: int = 0
    hold: bool = False
    held: bool = False  # finished a segment, waiting for `extend` (slot kept unless evicted)
    admitted: bool = False  # has entered a slot at least once (start_version is set)
    segment_start: int = 0  # index in token_ids where this segment's sampled tokens begin
    segments: int = 0
    appended: int = 0  # tokens the last `extend` appended
    # MoE only: the experts chosen at positions 0.. of prompt + tokens, `[n, layers, k]` chunks.
    routing: list[torch.Tensor] = field(default_factory=list)


class EmbeddedEngine(SteppingEngine):
    """Continuous-batching generation engine for a Hugging Face causal LM (see module docstring).

    Args:
        model: a causal LM with `get_decoder()` / `get_output_embeddings()` and SDPA or eager
            attention (full and/or sliding-window layers). The engine puts it in eval mode and owns it.
        max_batch_size: number of slots decoded together.
        fp32_lm_head: compute the LM head in float32 (must match the trainer's setting).
        seed: seeds the per-sample generators of requests without `SamplingParams.seed`.
        eos_token_ids: stop ids added to every request's `stop_token_ids` (default: the model's eos).
        initial_version: policy version of the weights the model holds now.
        pad_token_id: filler for padded chunk columns (never attended); default the config's or 0.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        max_batch_size: int = 8,
        fp32_lm_head: bool = False,
        seed: int = 0,
        eos_token_ids: Sequence[int] | None = None,
        initial_version: int = 0,
        pad_token_id: int | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size: must be >= 1, got {max_batch_size}")
        super().__init__(initial_version)
        self.model = model.eval()
        self.max_batch_size = max_batch_size
        self.fp32_lm_head = fp32_lm_head
        self._decoder = decoder_of(model)
        self._cache_kw = cache_kwarg_name(self._decoder)
        head = output_head(model)
        self.device = head.weight.device
        self.vocab_size = int(head.weight.shape[0])
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        compute_dtype = head.weight.dtype
        self._additive_mask_dtype, self._sliding_window, self._mask_kinds = self._attention_layout(
            config, compute_dtype
        )
        check_head_matches_model(model)
        self.eos_token_ids = tuple(eos_token_ids) if eos_token_ids is not None else model_eos_ids(model)
        pad = pad_token_id if pad_token_id is not None else getattr(config, "pad_token_id", None)
        self._pad_id = int(pad) if pad is not None and 0 <= int(pad) < self.vocab_size else 0

        self._weight_targets: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
        self._weight_targets.update(dict(model.named_buffers(remove_duplicate=False)))
        self._head_cache = Fp32HeadWeight()
        self._moe_layers = len(moe_routers(model))
        self._rng = np.random.default_rng(seed)
        self._cache = SlotKVCache(max_batch_size)
        self._slots: list[_Sequence | None] = [None] * max_batch_size
        self._waiting: deque[_Sequence] = deque()
        self._held: dict[tuple[str, int], _Sequence] = {}
        self.stats = EngineStats(max_batch_size=max_batch_size)

    # ----------------------------------------------------------------------------- model layout
    @staticmethod
    def _attention_layout(
        config: object, compute_dtype: torch.dtype
    ) -> tuple[torch.dtype | None, int | None, frozenset[str]]:
        """(additive-mask dtype or None for bool masks, sliding window, attention kinds present)."""
        impl = getattr(config, "_attn_implementation", None) or "eager"
        if impl not in _SUPPORTED_ATTENTION:
            raise ValueError(
                f"attention implementation {impl!r} is not supported by the embedded engine (it passes "
                f"explicit 4-D masks); load the model with attn_implementation in {_SUPPORTED_ATTENTION}"
            )
        # Eager attention adds the mask to the scores, so it must be additive in the compute dtype.
        additive = compute_dtype if impl == "eager" else None
        layer_types = getattr(config, "layer_types", None)
        window = getattr(config, "sliding_window", None)
        if layer_types:
            kinds = frozenset(layer_types)
            unknown = kinds - _SUPPORTED_LAYER_TYPES
            if unknown:
                raise NotImplementedError(
                    f"layer types {sorted(unknown)} are not supported by the embedded engine"
                )
        elif window is not None and getattr(config, "use_sliding_window", True):
            kinds = frozenset({"sliding_attention"})
        else:
            kinds = frozenset({"full_attention"})
        if "sliding_attention" in kinds and not window:
            raise ValueError("config has sliding-attention layers but no sliding_window")
        return additive, (int(window) if "sliding_attention" in kinds else None), kinds

    def reset_stats(self) -> None:
        self.stats = EngineStats(max_batch_size=self.max_batch_size)

    # ----------------------------------------------------------------------------- internals
    @torch.no_grad()
    def _load_weights_locked(self, state: Mapping[str, torch.Tensor]) -> None:
        unknown = [name for name in state if name not in self._weight_targets]
        if unknown:
            raise KeyError(f"update_weights: unknown parameter names {unknown[:5]} (of {len(unknown)})")
        for name, src in state.items():
            if tuple(src.shape) != tuple(self._weight_targets[name].shape):
                raise ValueError(
                    f"update_weights: {name} has shape {tuple(src.shape)}, "
                    f"expected {tuple(self._weight_targets[name].shape)}"
                )
        # Validated first so a bad state leaves the weights untouched.
        for name, src in state.items():
            self._weight_targets[name].copy_(src)
        self._head_cache.invalidate()

    # ----------------------------------------------------------------------------- sync verification
    @property
    def weight_dtype(self) -> str:
        """The dtype the generation weights are held in (what a sender fingerprints against)."""
        first = next(iter(self._weight_targets.values()))
        return str(first.dtype).removeprefix("torch.")

    def weight_fingerprints(self) -> dict[str, Fingerprint]:
        """Fingerprints of every tensor the engine holds (`scalerl.rollout.fingerprint`), read
        between two decode steps."""
        with self._lock:
            return state_fingerprints(self._weight_targets)

    def probe_logprobs(self, probe: Probe) -> ProbeLogprobs:
        """The weight-sync probe's log-probs under the weights held now (`scalerl.rollout.probe`),
        scored between two decode steps with the model's own forward (no slot cache)."""
        with self._lock:
            return model_probe_logprobs(self.model, probe, fp32_lm_head=self.fp32_lm_head, device=self.device)

    def _validate(self, request: GenerationRequest) -> None:
        ids = request.prompt_ids
        if not ids:
            raise ValueError(f"request {request.request_id!r}: empty prompt")
        params = request.params
        spec = params.interruption
        to_check = [*ids, *params.stop_token_ids]
        if spec is not None:
            to_check += [*spec.phrase_ids, *spec.think_end_ids]
        bad = [t for t in to_check if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise ValueError(
                f"request {request.request_id!r}: token ids {bad[:5]} outside [0, {self.vocab_size})"
            )

    def _num_unfinished_locked(self) -> int:
        return len(self._waiting) + sum(s is not None and not s.held for s in self._slots)

    def _submit_locked(self, requests: Sequence[GenerationRequest], serials: list[int]) -> None:
        for request in requests:
            self._validate(request)
        for serial, request in zip(serials, requests, strict=True):
            params = request.params
            base = params.seed if params.seed is not None else int(self._rng.integers(2**63))
            stop_ids = frozenset(params.stop_token_ids) | frozenset(self.eos_token_ids)
            greedy = params.temperature <= 0
            for i in range(params.n):
                torch_seed, budget_seed = sample_seed(base, i)
                generator = None
                if not greedy:
                    generator = torch.Generator(device=self.device)
                    generator.manual_seed(torch_seed)
                interruption = None
                if params.interruption is not None:
                    budget = draw_think_budget(params.interruption, np.random.default_rng(budget_seed))
                    interruption = InterruptionState(params.interruption, budget)
                want_support = params.return_support and params.truncates_support and not greedy
                self._waiting.append(
                    _Sequence(
                        serial=serial,
                        request=request,
                        sample_index=i,
                        generator=generator,
                        interruption=interruption,
                        stop_ids=stop_ids,
                        temperature=params.temperature,
                        top_k=params.top_k,
                        top_p=params.top_p,
                        support=[] if want_support else None,
                        support_ids=SupportIds() if want_support else None,
                        params=params,
                        budget_seed=budget_seed,
                        hold=request.hold,
                    )
                )

    def _admit(self, version: int) -> None:
        free = [slot for slot, s in enumerate(self._slots) if s is None]
        if len(free) < len(self._waiting):
            # Held samples give up their slot (oldest first) before a waiting sequence starves.
            held = [slot for slot, s in enumerate(self._slots) if s is not None and s.held]
            for slot in held[: len(self._waiting) - len(free)]:
                self._evict(slot)
                free.append(slot)
        for slot in sorted(free):
            if not self._waiting:
                return
            seq = self._waiting.popleft()
            seq.slot, seq.cache_len = slot, 0
            if seq.admitted:
                # An evicted held sample: its whole prefix is fed again, then its new segment.
                seq.pending = [*seq.request.prompt_ids, *seq.token_ids]
                self.stats.recomputed_tokens += len(seq.pending) - seq.appended
            else:
                seq.start_version, seq.admitted = version, True
                seq.pending = list(seq.request.prompt_ids)
            self._slots[slot] = seq
            self.stats.prefill_tokens += len(seq.pending)

    def _evict(self, slot: int) -> None:
        """Drop the KV cache of the held sample in `slot` so a waiting sequence can use the slot."""
        seq = self._slots[slot]
        assert seq is not None and seq.held
        seq.slot, seq.cache_len = -1, 0
        self._slots[slot] = None
        self.stats.evictions += 1

    # ----------------------------------------------------------------------------- continuation
    def _held_sequence(self, request_id: str, sample_index: int) -> _Sequence:
        seq = self._held.get((request_id, sample_index))
        if seq is None:
            raise KeyError(f"no held sample {sample_index} of request {request_id!r}")
        return seq

    def extend(
        self, request_id: str, sample_index: int, append_ids: Sequence[int], params: SamplingParams,
        *, hold: bool = True,
    ) -> None:
        """Append `append_ids` (loss-masked, not scored) to a held sample; it then samples a new
        segment under `params` (see the module docstring). Thread-safe like `submit`."""
        append = [int(t) for t in append_ids]
        if not append:
            raise ValueError(f"extend {request_id!r}/{sample_index}: nothing to append")
        bad = [t for t in [*append, *params.stop_token_ids] if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"extend {request_id!r}: token ids {bad[:5]} outside [0, {self.vocab_size})")
        with self._lock:
            seq = self._held_sequence(request_id, sample_index)
            del self._held[(request_id, sample_index)]
            version = self._version
            k = len(append)
            seq.token_ids.extend(append)
            seq.logprobs.extend([0.0] * k)
            seq.versions.extend([version] * k)
            seq.loss_mask.extend([False] * k)
            if seq.support is not None:
                seq.support.extend([SUPPORT_FORCED] * k)
            if seq.support_ids is not None:
                seq.support_ids.append_empty(k)
            self.stats.appended_tokens += k
            seq.appended = k
            self._start_segment(seq, params, hold)
            if seq.slot >= 0:
                seq.pending = [*seq.pending, *append]  # the last sampled token, then the segment
                self.stats.prefill_tokens += len(seq.pending)
            else:
                self._waiting.appendleft(seq)

    def release(self, request_id: str, sample_index: int) -> None:
        """Free a held sample's slot and cache."""
        with self._lock:
            seq = self._held_sequence(request_id, sample_index)
            del self._held[(request_id, sample_index)]
            if seq.slot >= 0:
                self._slots[seq.slot] = None

    def abort(self, request_ids: Sequence[str]) -> list[str]:
        """Drop every waiting, running or held sample of `request_ids` (their client went away):
        no completion comes for them. Returns the ids that had samples here."""
        ids = set(request_ids)
        found: set[str] = set()
        with self._lock:
            kept = deque(s for s in self._waiting if s.request.request_id not in ids)
            found.update(s.request.request_id for s in self._waiting if s.request.request_id in ids)
            self._waiting = kept
            for slot, seq in enumerate(self._slots):
                if seq is not None and seq.request.request_id in ids:
                    self._slots[slot] = None  # the slot's cache is overwritten by the next admitted one
                    found.add(seq.request.request_id)
            for key in [k for k in self._held if k[0] in ids]:
                del self._held[key]
                found.add(key[0])
            self.stats.aborted += len(found)
        return sorted(found)

    def _start_segment(self, seq: _Sequence, params: SamplingParams, hold: bool) -> None:
        seq.held, seq.hold, seq.params = False, hold, params
        seq.segment_start = len(seq.token_ids)
        seq.segments += 1
        seq.stop_ids = frozenset(params.stop_token_ids) | frozenset(self.eos_token_ids)
        seq.temperature, seq.top_k, seq.top_p = params.temperature, params.top_k, params.top_p
        seq.interruption = None
        if params.interruption is not None:
            rng = np.random.default_rng([seq.budget_seed, seq.segments])
            budget = draw_think_budget(params.interruption, rng)
            seq.interruption = InterruptionState(params.interruption, budget)

    def _step_locked(self) -> list[Finished]:
        version = self._version
        self._admit(version)
        active = [s for s in self._slots if s is not None and not s.held]
        if not active:
            if not self._held:
                self._cache.reset()  # idle: release the KV buffers
            return []
        with torch.no_grad():
            chunks = [s for s in active if len(s.pending) > 1]
            decodes = [s for s in active if len(s.pending) == 1]
            parts = [self._prefill(chunks, version)] if chunks else []
            if decodes:
                parts.append(self._decode(decodes))
            order = chunks + decodes
            logits = torch.cat(parts) if len(parts) > 1 else parts[0]
            device = logits.device
            sampled = sample_next_tokens(
                logits,
                torch.tensor([s.temperature for s in order], device=device),
                torch.tensor([s.top_k for s in order], device=device),
                torch.tensor([s.top_p for s in order], device=device),
                [s.generator for s in order],
                record_ids=torch.tensor(
                    [_id_bound(s) if s.support_ids is not None else 0 for s in order], device=device
                ),
            )
        tokens = sampled.token_ids.tolist()
        logprobs = sampled.logprobs.tolist()
        sizes = sampled.support_size.tolist() if sampled.support_size is not None else None
        per_row = _split_ids(sampled)
        self.stats.steps += 1
        self.stats.slot_steps += len(order)
        self.stats.generated_tokens += len(order)
        finished: list[Finished] = []
        for i, seq in enumerate(order):
            seq.token_ids.append(tokens[i])
            seq.logprobs.append(logprobs[i])
            seq.versions.append(version)
            seq.loss_mask.append(True)
            if seq.support is not None and sampled.support_size is not None:
                seq.support.append(int(sizes[i]))
                if seq.support_ids is not None:
                    seq.support_ids.append(per_row[i] if per_row is not None else ())
            reason = self._advance(seq, tokens[i])
            if reason is not None:
                if seq.hold:
                    # Keep slot and cache; the last sampled token is fed first when extended.
                    seq.held, seq.pending = True, [tokens[i]]
                    self._held[(seq.request.request_id, seq.sample_index)] = seq
                else:
                    self._slots[seq.slot] = None
                finished.append((seq.serial, seq.sample_index, self._completion(seq, reason)))
        return finished

    def _run(
        self, slots: list[int], chunks: list[list[int]], starts: list[int],
        owners: Sequence[_Sequence | None],
    ) -> torch.Tensor:
        """Feed `chunks[i]` to slot `slots[i]` from column `starts[i]`; return the decoder's final
        hidden states `[G, q, hidden]` (right-padded chunks; padded positions are junk). An MoE
        model's routing of each chunk is recorded into its owner (`owners[i]`, None for filler)."""
        q = max(len(c) for c in chunks)
        kv_len = self._cache.plan(slots, starts, q, self.device)
        input_ids = torch.tensor([c + [self._pad_id] * (q - len(c)) for c in chunks], device=self.device)
        start_t = torch.tensor(starts, device=self.device)
        position_ids = start_t.unsqueeze(1) + torch.arange(q, device=self.device).unsqueeze(0)
        full, sliding = attention_masks(
            start_t, q, kv_len, sliding_window=self._sliding_window, additive_dtype=self._additive_mask_dtype
        )
        if self._mask_kinds == {"full_attention"}:
            mask: torch.Tensor | dict[str, torch.Tensor] = full
        elif self._mask_kinds == {"sliding_attention"}:
            mask = sliding  # type: ignore[assignment]
        else:
            mask = {"full_attention": full, "sliding_attention": sliding}  # type: ignore[dict-item]
        kwargs = {"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids,
                  "use_cache": True, self._cache_kw: self._cache}
        if not self._moe_layers:
            return self._decoder(**kwargs).last_hidden_state
        with record_routing(self.model) as calls:
            out = self._decoder(**kwargs)
        # [G * q, layers, k] in the decoder's row-major token order -> [G, q, layers, k]
        chosen = torch.stack(calls[0], dim=1).view(len(chunks), q, self._moe_layers, -1)
        for i, seq in enumerate(owners):
            if seq is not None:
                _put_routing(seq, starts[i], chosen[i, : len(chunks[i])])
        return out.last_hidden_state

    def _prefill(self, group: list[_Sequence], version: int) -> torch.Tensor:
        """Multi-token chunks (new prompts, forced phrases) of `group`: return the logits at each
        chunk's last position `[G, V]`, score forced tokens, and advance the slots' lengths."""
        hidden = self._run([s.slot for s in group], [s.pending for s in group], [s.cache_len for s in group],
                           group)
        last = torch.tensor([len(s.pending) - 1 for s in group], device=self.device)
        rows = torch.arange(len(group), device=self.device)
        logits = lm_head_logits(self.model, hidden[rows, last], self.fp32_lm_head, self._head_cache)
        for g, seq in enumerate(group):
            if seq.forced_pending:
                self._score_forced(seq, hidden[g], version)
            seq.cache_len += len(seq.pending)
            seq.pending = []
        return logits

    def _decode(self, group: list[_Sequence]) -> torch.Tensor:
        """One token for each sequence of `group` (ordered by slot); return their logits `[G, V]`.

        When most slots decode, the forward runs over every slot: slots with nothing to decode (free,
        or prefilled this step) take a pad token at their current length, which writes junk exactly
        where their next real token will go. That wastes those rows' compute but avoids gathering a
        subset of the KV cache, a copy as large as what the attention reads. When fewer than half
        the slots decode (draining tail, small jobs), gathering the subset is the cheaper one.
        """
        if 2 * len(group) <= self.max_batch_size:
            slots = [s.slot for s in group]
            hidden = self._run(slots, [s.pending for s in group], [s.cache_len for s in group], group)
            rows = torch.arange(len(group), device=self.device)
        else:
            decoding = {s.slot: s.pending for s in group}
            tokens = [decoding.get(slot, [self._pad_id]) for slot in range(self.max_batch_size)]
            starts = [seq.cache_len if seq is not None else 0 for seq in self._slots]
            by_slot = {s.slot: s for s in group}
            owners = [by_slot.get(slot) for slot in range(self.max_batch_size)]
            hidden = self._run(list(range(self.max_batch_size)), tokens, starts, owners)
            rows = torch.tensor([s.slot for s in group], device=self.device)
        logits = lm_head_logits(self.model, hidden[rows, 0], self.fp32_lm_head, self._head_cache)
        for seq in group:
            seq.cache_len += 1
            seq.pending = []
        return logits

    def _score_forced(self, seq: _Sequence, hidden: torch.Tensor, version: int) -> None:
        """Log-probs (current policy, untruncated, the sequence's temperature) of the forced tokens
        at the end of `seq.pending`; they are loss-masked, recorded for diagnostics only."""
        f, n = seq.forced_pending, len(seq.pending)
        positions = hidden[n - f - 1 : n - 1]
        logits = lm_head_logits(self.model, positions, self.fp32_lm_head, self._head_cache)
        targets = torch.tensor(seq.pending[n - f :], device=self.device)
        values = token_logprobs(logits, targets, seq.temperature).tolist()
        seq.logprobs[-f:] = values
        seq.versions[-f:] = [version] * f
        seq.forced_pending = 0

    def _advance(self, seq: _Sequence, token: int) -> FinishReason | None:
        """Apply stop / length / interruption rules after `token`; set what the next step feeds.

        Budgets, stop sequences and the interruption count this segment's tokens only."""
        params = seq.params or seq.request.params
        state = seq.interruption
        segment = seq.token_ids[seq.segment_start :] if seq.segment_start else seq.token_ids
        if token in seq.stop_ids or any(ends_with(segment, stop) for stop in params.stop_sequences):
            return "interrupted" if state is not None and state.interrupted else "stop"
        if len(segment) >= params.max_new_tokens:
            return "length"
        seq.pending = [token]
        if state is None:
            return None
        action = state.after_token(segment, params.max_new_tokens)
        if action is Action.FINISH_INTERRUPTED:
            return "interrupted"
        if action is Action.FINISH_LENGTH:
            return "length"
        if action is Action.INJECT:
            phrase = list(state.spec.phrase_ids)
            k = len(phrase)
            seq.token_ids.extend(phrase)
            seq.logprobs.extend([0.0] * k)  # replaced by `_score_forced` at the next forward
            seq.versions.extend([seq.versions[-1]] * k)
            seq.loss_mask.extend([False] * k)
            if seq.support is not None:
                seq.support.extend([SUPPORT_FORCED] * k)  # forced: the only token "drawable"
            if seq.support_ids is not None:
                seq.support_ids.append_empty(k)
            seq.pending = [token, *phrase]
            seq.forced_pending = k
        return None

    def _completion(self, seq: _Sequence, reason: FinishReason) -> Completion:
        request = seq.request
        metadata = dict(request.metadata)
        if seq.interruption is not None:
            metadata["interruption"] = {
                "think_budget": seq.interruption.budget,
                "phrase_start": None if seq.interruption.interrupted_at is None
                else seq.segment_start + seq.interruption.interrupted_at,
            }
        # Copies: a held sample's lists keep growing when it is extended.
        return Completion(
            request_id=request.request_id,
            sample_index=seq.sample_index,
            prompt_ids=list(request.prompt_ids),
            token_ids=list(seq.token_ids),
            logprobs=list(seq.logprobs),
            versions=list(seq.versions),
            loss_mask=list(seq.loss_mask),
            finish_reason=reason,
            start_version=seq.start_version,
            support=None if seq.support is None else list(seq.support),
            support_cut=None if seq.support is None else (seq.top_k, seq.top_p),
            support_ids=None if seq.support_ids is None else seq.support_ids.copy(),
            metadata=metadata,
            routing=self._routing_of(seq) if self._moe_layers else None,
        )

    def _routing_of(self, seq: _Sequence) -> torch.Tensor:
        """`[prompt + tokens, layers, k]` routing of `seq`, -1 at positions never fed (the last
        sampled token)."""
        total = len(seq.request.prompt_ids) + len(seq.token_ids)
        have = torch.cat(seq.routing) if seq.routing else None
        k = int(have.shape[-1]) if have is not None else 1
        out = torch.full((total, self._moe_layers, k), NO_ROUTE, dtype=ROUTING_DTYPE)
        if have is not None:
            n = min(total, int(have.shape[0]))
            out[:n] = have[:n]
        return out

    # ----------------------------------------------------------------------------- exact resume
    def snapshot(self, include_weights: bool = False) -> dict[str, Any]:
        """Everything in flight (see the module docstring) as tensors and plain values;
        `include_weights` adds the generation weights (needed when they are not the trainer's:
        mid-round in `ppo_offpolicy`, or before a delayed in-flight update)."""
        return _snapshot(self, include_weights)

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from `snapshot()`: the same sequences in the same slots, sampler states, KV cache."""
        _restore(self, state)


def _put_routing(seq: _Sequence, start: int, block: torch.Tensor) -> None:
    """Record `block [n, layers, k]` as the routing of positions `start..start+n-1` of `seq`
    (a re-fed prefix, after an eviction, overwrites what was recorded there)."""
    have = sum(int(c.shape[0]) for c in seq.routing)
    if start < have:
        seq.routing = [torch.cat(seq.routing)[:start]]
    elif start > have:
        raise RuntimeError(f"routing: position {start} fed before positions {have}..{start - 1}")
    seq.routing.append(block.clone())


# --------------------------------------------------------------------------------- exact resume
SNAPSHOT_FORMAT = 1


def _params_to_plain(params: SamplingParams) -> dict[str, Any]:
    return asdict(params)


def _params_from_plain(d: Mapping[str, Any]) -> SamplingParams:
    d = dict(d)
    spec = d.pop("interruption")
    d["stop_token_ids"] = tuple(d["stop_token_ids"])
    d["stop_sequences"] = tuple(tuple(seq) for seq in d.get("stop_sequences", ()))
    interruption = None
    if spec is not None:
        interruption = InterruptionSpec(**{**spec, "phrase_ids": tuple(spec["phrase_ids"]),
                                           "think_end_ids": tuple(spec["think_end_ids"])})
    return SamplingParams(**d, interruption=interruption)


def _id_bound(seq: _Sequence) -> int:
    """How many ids of its sampling set a sequence records per token (`support_max_ids`)."""
    return (seq.params or seq.request.params).support_max_ids


def _split_ids(sampled: SampledTokens) -> list[list[int]] | None:
    """Each row's recorded ids (`SampledTokens.support_counts` / `support_ids`) as a list."""
    if sampled.support_counts is None or sampled.support_ids is None:
        return None
    flat = sampled.support_ids.tolist()
    out, start = [], 0
    for c in sampled.support_counts.tolist():
        out.append(flat[start : start + c])
        start += c
    return out


def _sequence_to_plain(seq: _Sequence) -> dict[str, Any]:
    r = seq.request
    state = seq.interruption
    return {
        "serial": seq.serial,
        "request": {"request_id": r.request_id, "prompt_ids": list(r.prompt_ids),
                    "params": _params_to_plain(r.params), "metadata": dict(r.metadata)},
        "sample_index": seq.sample_index,
        "generator": None if seq.generator is None else seq.generator.get_state(),
        "interruption": None if state is None else {"budget": state.budget, "closed": state.closed,
                                                    "interrupted_at": state.interrupted_at},
        "stop_ids": sorted(seq.stop_ids),
        "temperature": seq.temperature, "top_k": seq.top_k, "top_p": seq.top_p,
        "token_ids": list(seq.token_ids), "logprobs": list(seq.logprobs), "versions": list(seq.versions),
        "loss_mask": list(seq.loss_mask),
        "support": None if seq.support is None else list(seq.support),
        "support_ids": None if seq.support_ids is None else seq.support_ids.to_plain(),
        "slot": seq.slot, "cache_len": seq.cache_len, "pending": list(seq.pending),
        "forced_pending": seq.forced_pending, "start_version": seq.start_version,
        "params": None if seq.params is None else _params_to_plain(seq.params),
        "budget_seed": seq.budget_seed, "hold": seq.hold, "admitted": seq.admitted,
        "segment_start": seq.segment_start, "segments": seq.segments, "appended": seq.appended,
        "routing": torch.cat(seq.routing) if seq.routing else None,
    }


def _sequence_from_plain(d: Mapping[str, Any], device: torch.device) -> _Sequence:
    r = d["request"]
    params = _params_from_plain(r["params"])
    request = GenerationRequest(r["request_id"], list(r["prompt_ids"]), params, dict(r["metadata"]))
    generator = None
    if d["generator"] is not None:
        generator = torch.Generator(device=device)
        generator.set_state(d["generator"])
    interruption = None
    if d["interruption"] is not None:
        if params.interruption is None:
            raise ValueError("engine snapshot: a sequence has interruption state but no interruption spec")
        i = d["interruption"]
        interruption = InterruptionState(params.interruption, int(i["budget"]), bool(i["closed"]),
                                         i["interrupted_at"])
    return _Sequence(
        serial=int(d["serial"]), request=request, sample_index=int(d["sample_index"]), generator=generator,
        interruption=interruption, stop_ids=frozenset(d["stop_ids"]), temperature=float(d["temperature"]),
        top_k=int(d["top_k"]), top_p=float(d["top_p"]), token_ids=list(d["token_ids"]),
        logprobs=list(d["logprobs"]), versions=list(d["versions"]), loss_mask=list(d["loss_mask"]),
        support=None if d["support"] is None else [int(s) for s in d["support"]],
        support_ids=None if d.get("support_ids") is None else SupportIds.from_plain(d["support_ids"]),
        slot=int(d["slot"]),
        cache_len=int(d["cache_len"]), pending=list(d["pending"]), forced_pending=int(d["forced_pending"]),
        start_version=int(d["start_version"]),
        params=None if d.get("params") is None else _params_from_plain(d["params"]),
        budget_seed=int(d.get("budget_seed", 0)), hold=bool(d.get("hold", False)),
        admitted=bool(d.get("admitted", False)), segment_start=int(d.get("segment_start", 0)),
        segments=int(d.get("segments", 0)), appended=int(d.get("appended", 0)),
        routing=[d["routing"]] if d.get("routing") is not None else [],
    )


def _snapshot(engine: EmbeddedEngine, include_weights: bool) -> dict[str, Any]:
    with engine._lock:
        if engine._undelivered or engine._claimed or engine._claimed_results:
            raise RuntimeError("snapshot: a generate() call is in progress or completions are undelivered")
        if engine._held:
            # A held sequence belongs to a trajectory whose environment state is not in the snapshot.
            raise RuntimeError("snapshot: sequences are held for multi-turn continuation")
        active = [s for s in engine._slots if s is not None]
        columns = max((s.cache_len for s in active), default=0)
        out: dict[str, Any] = {
            "format": SNAPSHOT_FORMAT,
            "version": engine._version,
            "serial": engine._serial,
            "max_batch_size": engine.max_batch_size,
            "rng": engine._rng.bit_generator.state,
            "slots": [None if s is None else _sequence_to_plain(s) for s in engine._slots],
            "waiting": [_sequence_to_plain(s) for s in engine._waiting],
            "cache": engine._cache.state(columns) if active else None,
            "stats": asdict(engine.stats),
            "weights": None,
        }
        if include_weights:
            out["weights"] = {k: t.detach().cpu().clone() for k, t in engine._weight_targets.items()}
        return out


def _restore(engine: EmbeddedEngine, state: Mapping[str, Any]) -> None:
    if state.get("format") != SNAPSHOT_FORMAT:
        raise ValueError(f"engine snapshot: format {state.get('format')!r}, expected {SNAPSHOT_FORMAT}")
    if int(state["max_batch_size"]) != engine.max_batch_size:
        raise ValueError(f"engine snapshot: {state['max_batch_size']} slots, this engine has "
                         f"{engine.max_batch_size} (generation.max_batch_size changed)")
    with engine._lock:
        if engine._num_unfinished_locked():
            raise RuntimeError("restore: the engine already has sequences")
        slots = [None if d is None else _sequence_from_plain(d, engine.device) for d in state["slots"]]
        waiting = deque(_sequence_from_plain(d, engine.device) for d in state["waiting"])
        if state["weights"] is not None:
            engine._load_weights_locked({k: t.to(engine.device) for k, t in state["weights"].items()})
        engine._head_cache.invalidate()
        engine._version = int(state["version"])
        engine._serial = int(state["serial"])
        engine._rng.bit_generator.state = state["rng"]
        engine._slots, engine._waiting = slots, waiting
        engine._cache = SlotKVCache(engine.max_batch_size)
        if state["cache"] is not None:
            engine._cache.load_state(state["cache"], engine.device)
        engine.stats = EngineStats(**state["stats"])

