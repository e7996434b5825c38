"""A generation-device emulator for benchmarks and tests: not a generation backend.

`EmulatedEngine` is a real `Engine` (the `SteppingEngine` plumbing: the lock, in-flight
`update_weights`, per-token version tags are the production ones) whose "model" is a timing and
length model instead of a network. It exists so that pipeline and scale-out code can be measured
and tested as if every engine had its own accelerator, on a machine that has two shared CPU cores:

* Device time. Each decode step costs modelled seconds,
  `step_seconds = slowdown * (step_s + token_s * decoded + prefill_token_s * prefilled)`
  (`decoded`: sequences in flight, one token each; `prefilled`: prompt and forced-phrase tokens fed
  in the step), spent in `time.sleep`. Sleeping releases the GIL and uses no CPU, so several such
  engines in threads or processes overlap like separate devices instead of competing for cores.
  `update_weights` costs `slowdown * update_s` (a modelled transfer + load). `stats.device_s` is the
  modelled time spent, exactly (the sleeps themselves overshoot by scheduler jitter; the engine pays
  an overshoot back on its next step so its mean rate follows the model).
* Continuous batching with `max_batch_size` slots: waiting sequences enter free slots at the start
  of a step (`start_version` is the version then), every sequence in flight gets one token per step.
* Lengths: a seeded long-tailed (lognormal) length per sample, `LengthModel`: a prompt factor shared
  by the `n` samples of a request (hard prompts make long groups) times a per-sample factor, drawn
  from (request seed, sample index) exactly like the embedded engine's sampling streams, so a rerun
  with the same seeds gives the same lengths and tokens whatever else is batched. A sample whose
  drawn length fits in `max_new_tokens` ends with a stop token (`stop`), else it is truncated
  (`length`). Greedy requests (temperature 0) give `n` identical samples, as a real engine does.
* Tokens: valid ids in `[0, vocab_size)` other than the stop ids, with finite log-probs <= 0, drawn
  from the same per-sample stream; the policy never closes its thinking, so forced interruption
  (ScaleRL length control) cuts every sample longer than its thinking budget, with the
  `scalerl.rollout.interruption` rules the embedded engine uses (phrase tokens loss-masked).
* `update_weights` accepts any state (its content is ignored); it only changes the version later
  tokens carry.

It is never selected by `generation.engine`; `scalerl.rollout.factory.build_engine` builds it only
from an explicit `EngineSpec(kind="emulated", options={...})`, whose options are this class's
keyword arguments (plain values: picklable, so another process can build the same engine).
Sampling support (`return_support` with top-k/top-p truncation) is not emulated: such a request is
rejected.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scalerl.rollout.base import Finished, SteppingEngine
from scalerl.rollout.interruption import Action, InterruptionState, draw_think_budget
from scalerl.rollout.protocol import Completion, FinishReason, GenerationRequest

_PROMPT_STREAM = 0
_SAMPLE_STREAM = 1
_BUDGET_STREAM = 2


def stream(base_seed: int, *key: int) -> np.random.Generator:
    """An independent numpy stream for (`base_seed`, `key`), mixed by `SeedSequence`, so nearby
    seeds and sample indices do not give correlated draws."""
    return np.random.default_rng(np.random.SeedSequence(entropy=base_seed % 2**64, spawn_key=key))


def sample_z(base_seed: int, sample_index: int) -> float:
    """The standard-normal draw that sets sample `sample_index`'s length (first draw of its stream)."""
    return float(stream(base_seed, _SAMPLE_STREAM, sample_index).standard_normal())


@dataclass(frozen=True)
class LengthModel:
    """Completion lengths: `round(median * exp(prompt_sigma * z_p + sample_sigma * z_i))`, at least 1.

    `z_p ~ N(0, 1)` is shared by the samples of one request (prompt difficulty), `z_i ~ N(0, 1)` is
    per sample. The log-length is normal with standard deviation `sqrt(prompt_sigma^2 +
    sample_sigma^2)`: a lognormal, long-tailed like reasoning traces. Capping at `max_new_tokens`
    (truncation) is the engine's job, not the model's.
    """

    median: float = 64.0
    prompt_sigma: float = 0.0
    sample_sigma: float = 0.5

    def __post_init__(self) -> None:
        if not self.median > 0:
            raise ValueError(f"length median: must be > 0, got {self.median}")
        if self.prompt_sigma < 0 or self.sample_sigma < 0:
            raise ValueError(f"length sigmas: must be >= 0, got {self.prompt_sigma}, {self.sample_sigma}")

    def prompt_factor(self, base_seed: int) -> float:
        return self.prompt_sigma * float(stream(base_seed, _PROMPT_STREAM).standard_normal())

    def length(self, prompt_factor: float, sample_z: float) -> int:
        # The exponent is clipped so that an absurd sigma cannot overflow a float.
        log_factor = min(60.0, prompt_factor + self.sample_sigma * sample_z)
        return max(1, round(self.median * math.exp(log_factor)))

    def draw(self, base_seed: int, n: int) -> list[int]:
        """The `n` lengths of one request seeded `base_seed` (what `EmulatedEngine` draws)."""
        p = self.prompt_factor(base_seed)
        return [self.length(p, sample_z(base_seed, i)) for i in range(n)]


@dataclass(frozen=True)
class DeviceTimes:
    """Modelled seconds of one generation device (see the module docstring)."""

    step_s: float = 0.002
    token_s: float = 0.0
    prefill_token_s: float = 0.0
    update_s: float = 0.0
    slowdown: float = 1.0

    def __post_init__(self) -> None:
        for name in ("step_s", "token_s", "prefill_token_s", "update_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if not self.slowdown > 0:
            raise ValueError(f"slowdown: must be > 0, got {self.slowdown}")

    def step_seconds(self, decoded: int, prefilled: int = 0) -> float:
        return self.slowdown * (self.step_s + self.token_s * decoded + self.prefill_token_s * prefilled)

    def update_seconds(self) -> float:
        return self.slowdown * self.update_s


@dataclass
class EmulatedStats:
    """Counters since construction (or `reset_stats`); `device_s` / `update_device_s` are modelled."""

    steps: int = 0
    slot_steps: int = 0  # sum over steps of the sequences in flight
    generated_tokens: int = 0  # sampled tokens (forced phrase tokens excluded)
    prefill_tokens: int = 0
    device_s: float = 0.0  # modelled seconds of decode steps
    updates: int = 0
    update_device_s: float = 0.0  # modelled seconds of weight updates
    max_batch_size: int = 1

    @property
    def occupancy(self) -> float:
        """Mean fraction of the slots busy per step."""
        return self.slot_steps / (self.steps * self.max_batch_size) if self.steps else 0.0


@dataclass(eq=False)
class _Sequence:
    serial: int
    request: GenerationRequest
    sample_index: int
    length: int  # natural length: the sampled token at index length - 1 is a stop token
    stream_ids: np.ndarray  # the sampled tokens, in order
    stream_logprobs: np.ndarray
    phrase_logprobs: list[float]  # of the forced phrase, if it is ever injected
    stop_ids: frozenset[int]
    interruption: InterruptionState | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)
    sampled: int = 0  # tokens taken from the stream so far
    start_version: int = 0


class EmulatedEngine(SteppingEngine):
    """An `Engine` that emulates a generation device's time (see the module docstring).

    Args (all plain values):
        max_batch_size: continuous-batching slots.
        step_s, token_s, prefill_token_s: decode-step time model (seconds).
        update_s: modelled seconds of one `update_weights`.
        slowdown: multiplies every modelled time (a slower device).
        length_median, length_prompt_sigma, length_sample_sigma: the `LengthModel`.
        vocab_size: token ids are in `[0, vocab_size)`.
        eos_token_ids: stop ids added to every request's (default: `vocab_size - 1`).
        seed: seeds requests without `SamplingParams.seed`.
        initial_version: version of the weights the engine holds at construction.
        sleep: False skips the sleeps (modelled time is still counted): for tests of the
            bookkeeping only.
    """

    def __init__(
        self,
        *,
        max_batch_size: int = 8,
        step_s: float = 0.002,
        token_s: float = 0.0,
        prefill_token_s: float = 0.0,
        update_s: float = 0.0,
        slowdown: float = 1.0,
        length_median: float = 64.0,
        length_prompt_sigma: float = 0.0,
        length_sample_sigma: float = 0.5,
        vocab_size: int = 32000,
        eos_token_ids: Sequence[int] | None = None,
        seed: int = 0,
        initial_version: int = 0,
        sleep: bool = True,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size: must be >= 1, got {max_batch_size}")
        if vocab_size < 2:
            raise ValueError(f"vocab_size: must be >= 2, got {vocab_size}")
        super().__init__(initial_version)
        self.max_batch_size = int(max_batch_size)
        self.times = DeviceTimes(step_s, token_s, prefill_token_s, update_s, slowdown)
        self.lengths = LengthModel(length_median, length_prompt_sigma, length_sample_sigma)
        self.vocab_size = int(vocab_size)
        eos = tuple(int(t) for t in (eos_token_ids if eos_token_ids is not None else (vocab_size - 1,)))
        if not eos or any(not 0 <= t < vocab_size for t in eos):
            raise ValueError(f"eos_token_ids: need at least one id in [0, {vocab_size}), got {eos}")
        self.eos_token_ids = eos
        self.sleep = bool(sleep)
        self._rng = np.random.default_rng(seed)
        self._slots: list[_Sequence] = []
        self._waiting: deque[_Sequence] = deque()
        self._allowed: dict[frozenset[int], np.ndarray] = {}
        self._overshoot = 0.0
        self.stats = EmulatedStats(max_batch_size=self.max_batch_size)

    def reset_stats(self) -> None:
        self.stats = EmulatedStats(max_batch_size=self.max_batch_size)

    # ----------------------------------------------------------------------------- device time
    def _spend(self, seconds: float) -> None:
        """Sleep `seconds` of modelled device time, paying back the previous sleep's overshoot."""
        if not self.sleep or seconds <= 0:
            return
        target = seconds - self._overshoot
        start = time.perf_counter()
        if target > 0:
            time.sleep(target)
        # Clipped so that one long stall (a loaded machine) is not paid back as a burst of free steps.
        self._overshoot = min(seconds, max(0.0, time.perf_counter() - start - target))

    # ----------------------------------------------------------------------------- hooks
    def _load_weights_locked(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping):
            raise TypeError(f"update_weights: state must be a mapping, got {type(state).__name__}")
        seconds = self.times.update_seconds()
        self._spend(seconds)
        self.stats.updates += 1
        self.stats.update_device_s += seconds

    def _num_unfinished_locked(self) -> int:
        return len(self._waiting) + len(self._slots)

    def _validate(self, request: GenerationRequest) -> None:
        params = request.params
        if not request.prompt_ids:
            raise ValueError(f"request {request.request_id!r}: empty prompt")
        if params.return_support and params.truncates_support:
            raise ValueError(
                f"request {request.request_id!r}: the emulated engine does not emulate sampling support "
                "(return_support with top-k/top-p)"
            )
        to_check = [*request.prompt_ids, *params.stop_token_ids]
        if params.interruption is not None:
            to_check += [*params.interruption.phrase_ids, *params.interruption.think_end_ids]
        bad = [t for t in to_check if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise ValueError(
                f"request {request.request_id!r}: token ids {bad[:5]} outside [0, {self.vocab_size})"
            )

    def _allowed_ids(self, stop_ids: frozenset[int]) -> np.ndarray:
        allowed = self._allowed.get(stop_ids)
        if allowed is None:
            allowed = np.setdiff1d(np.arange(self.vocab_size), np.fromiter(stop_ids, dtype=np.int64))
            if allowed.size == 0:
                raise ValueError(f"every token id in [0, {self.vocab_size}) is a stop id")
            self._allowed[stop_ids] = allowed
        return allowed

    def _submit_locked(self, requests: Sequence[GenerationRequest], serials: list[int]) -> None:
        for request in requests:
            self._validate(request)
        for serial, request in zip(serials, requests, strict=True):
            params = request.params
            base = params.seed if params.seed is not None else int(self._rng.integers(2**63))
            stop_ids = frozenset(int(t) for t in params.stop_token_ids) | frozenset(self.eos_token_ids)
            stop_first = min(stop_ids)
            allowed = self._allowed_ids(stop_ids)
            prompt_factor = self.lengths.prompt_factor(base)
            for i in range(params.n):
                # Greedy decoding gives the same completion n times: every sample reads stream 0.
                k = 0 if params.temperature <= 0 else i
                rng = stream(base, _SAMPLE_STREAM, k)
                # Its first draw is `sample_z(base, k)`, so `LengthModel.draw` predicts the lengths.
                length = self.lengths.length(prompt_factor, float(rng.standard_normal()))
                size = min(length, params.max_new_tokens)
                ids = allowed[rng.integers(0, allowed.size, size=size)]
                if length <= params.max_new_tokens:
                    ids[-1] = stop_first
                # log pi of a sampled token: -Exp(1), i.e. probabilities uniform in (0, 1].
                logprobs = -rng.exponential(1.0, size=size)
                interruption, phrase_logprobs = None, []
                if params.interruption is not None:
                    spec = params.interruption
                    budget = draw_think_budget(spec, stream(base, _BUDGET_STREAM, k))
                    interruption = InterruptionState(spec, budget)
                    phrase_logprobs = (-rng.exponential(1.0, size=len(spec.phrase_ids))).tolist()
                self._waiting.append(
                    _Sequence(
                        serial=serial,
                        request=request,
                        sample_index=i,
                        length=length,
                        stream_ids=ids,
                        stream_logprobs=logprobs,
                        phrase_logprobs=phrase_logprobs,
                        stop_ids=stop_ids,
                        interruption=interruption,
                    )
                )

    def _step_locked(self) -> list[Finished]:
        version = self._version
        prefilled = 0
        while self._waiting and len(self._slots) < self.max_batch_size:
            seq = self._waiting.popleft()
            seq.start_version = version
            prefilled += len(seq.request.prompt_ids)
            self._slots.append(seq)
        if not self._slots:
            return []
        active = list(self._slots)
        finished: list[Finished] = []
        for seq in active:
            token = int(seq.stream_ids[seq.sampled])
            seq.token_ids.append(token)
            seq.logprobs.append(float(seq.stream_logprobs[seq.sampled]))
            seq.versions.append(version)
            seq.loss_mask.append(True)
            seq.sampled += 1
            reason, forced = self._advance(seq, token, version)
            prefilled += forced
            if reason is not None:
                self._slots.remove(seq)
                finished.append((seq.serial, seq.sample_index, self._completion(seq, reason)))
        seconds = self.times.step_seconds(len(active), prefilled)
        self._spend(seconds)
        self.stats.steps += 1
        self.stats.slot_steps += len(active)
        self.stats.generated_tokens += len(active)
        self.stats.prefill_tokens += prefilled
        self.stats.device_s += seconds
        return finished

    def _advance(self, seq: _Sequence, token: int, version: int) -> tuple[FinishReason | None, int]:
        """Stop / length / interruption rules after `token` (those of the embedded engine);
        returns (finish reason or None, forced phrase tokens appended)."""
        params = seq.request.params
        state = seq.interruption
        if token in seq.stop_ids:
            return ("interrupted" if state is not None and state.interrupted else "stop"), 0
        if len(seq.token_ids) >= params.max_new_tokens:
            return "length", 0
        if state is None:
            return None, 0
        action = state.after_token(seq.token_ids, params.max_new_tokens)
        if action is Action.FINISH_INTERRUPTED:
            return "interrupted", 0
        if action is Action.FINISH_LENGTH:
            return "length", 0
        if action is Action.INJECT:
            phrase = list(state.spec.phrase_ids)
            seq.token_ids.extend(phrase)
            # Forced tokens are not the policy's actions (loss-masked); their log-probs are
            # diagnostics, drawn like the others.
            seq.logprobs.extend(seq.phrase_logprobs)
            seq.versions.extend([version] * len(phrase))
            seq.loss_mask.extend([False] * len(phrase))
            return None, len(phrase)
        return None, 0

    def _completion(self, seq: _Sequence, reason: FinishReason) -> Completion:
        request = seq.request
        metadata = dict(request.metadata)
        if seq.interruption is not None:
            metadata["interruption"] = {
                "think_budget": seq.interruption.budget,
                "phrase_start": seq.interruption.interrupted_at,
            }
        return Completion(
            request_id=request.request_id,
            sample_index=seq.sample_index,
            prompt_ids=list(request.prompt_ids),
            token_ids=seq.token_ids,
            logprobs=seq.logprobs,
            versions=seq.versions,
            loss_mask=seq.loss_mask,
            finish_reason=reason,
            start_version=seq.start_version,
            metadata=metadata,
        )
