"""A scripted engine for trajectory tests: each turn's text is a function of the context so far."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from scalerl.rollout.base import Finished, SteppingEngine
from scalerl.rollout.interruption import ends_with
from scalerl.rollout.protocol import Completion, GenerationRequest, SamplingParams
from scalerl.rollout.sampling import SUPPORT_FORCED
from scalerl.rollout.support import SupportIds

Policy = Callable[[str], str]  # decoded context -> the next turn's text


@dataclass
class _Sample:
    serial: int
    request: GenerationRequest
    index: int
    params: SamplingParams
    tokens: list[int]
    logprobs: list[float]
    versions: list[int]
    mask: list[bool]
    start_version: int
    hold: bool
    support: list[int] = field(default_factory=list)
    support_ids: SupportIds = field(default_factory=SupportIds)


class ScriptedEngine(SteppingEngine):
    """One whole segment per step per sample, chosen by `policy(decoded context)`; honours stop
    tokens, stop sequences and `max_new_tokens`; log-prob -0.5 per sampled token; with
    `return_support`, each sampled token t records the set {t, t + 1} (forced ones none). With
    `continuable`, implements `extend`/`release` (and counts prefix tokens it never re-reads)."""

    def __init__(self, tokenizer, policy: Policy, *, continuable: bool = True) -> None:
        super().__init__(0)
        self.tok = tokenizer
        self.policy = policy
        self.eos = int(tokenizer.eos_token_id)
        self._waiting: deque[_Sample] = deque()
        self._held: dict[tuple[str, int], _Sample] = {}
        self.prompts_seen: list[list[int]] = []  # prompts of every submitted request
        self.extends = 0
        self.weights_loaded = 0
        if continuable:
            self.extend = self._extend  # type: ignore[method-assign]
            self.release = self._release  # type: ignore[method-assign]

    def _submit_locked(self, requests: Sequence[GenerationRequest], serials: list[int]) -> None:
        for serial, r in zip(serials, requests, strict=True):
            self.prompts_seen.append(list(r.prompt_ids))
            for i in range(r.params.n):
                self._waiting.append(_Sample(serial, r, i, r.params, [], [], [], [], self._version, r.hold))

    def _segment(self, s: _Sample) -> tuple[list[int], str]:
        context = self.tok.decode([*s.request.prompt_ids, *s.tokens], skip_special_tokens=False)
        text = self.policy(context)
        ids = [*self.tok.encode(text, add_special_tokens=False), self.eos]
        out: list[int] = []
        p = s.params
        for t in ids:
            out.append(t)
            if t in p.stop_token_ids or t == self.eos:
                return out, "stop"
            if any(ends_with(out, seq) for seq in p.stop_sequences):
                return out, "stop"
            if len(out) >= p.max_new_tokens:
                return out, "length"
        return out, "stop"

    def _step_locked(self) -> list[Finished]:
        done: list[Finished] = []
        while self._waiting:
            s = self._waiting.popleft()
            ids, reason = self._segment(s)
            s.tokens += ids
            s.logprobs += [-0.5] * len(ids)
            s.versions += [self._version] * len(ids)
            s.mask += [True] * len(ids)
            s.support += [2] * len(ids)
            for t in ids:
                s.support_ids.append([t, t + 1])
            if s.hold:
                self._held[(s.request.request_id, s.index)] = s
            c = Completion(s.request.request_id, s.index, list(s.request.prompt_ids), list(s.tokens),
                           list(s.logprobs), list(s.versions), list(s.mask), reason,  # type: ignore[arg-type]
                           s.start_version, metadata=dict(s.request.metadata),
                           **self._support_of(s))
            done.append((s.serial, s.index, c))
        return done

    @staticmethod
    def _support_of(s: _Sample) -> dict:
        if not s.request.params.return_support:
            return {}
        return {"support": list(s.support), "support_cut": (s.params.top_k, s.params.top_p),
                "support_ids": s.support_ids.copy()}

    def _extend(self, request_id: str, sample_index: int, append_ids, params: SamplingParams, *,
                hold: bool = True) -> None:
        with self._lock:
            s = self._held.pop((request_id, sample_index))
            k = len(append_ids)
            s.tokens += list(append_ids)
            s.logprobs += [0.0] * k
            s.versions += [self._version] * k
            s.mask += [False] * k
            s.support += [SUPPORT_FORCED] * k
            s.support_ids.append_empty(k)
            s.params, s.hold = params, hold
            self.extends += 1
            self._waiting.append(s)

    def _release(self, request_id: str, sample_index: int) -> None:
        with self._lock:
            del self._held[(request_id, sample_index)]

    def _load_weights_locked(self, state: Mapping[str, torch.Tensor]) -> None:
        self.weights_loaded += 1

    def _num_unfinished_locked(self) -> int:
        return len(self._waiting)

    @property
    def held(self) -> int:
        return len(self._held)
