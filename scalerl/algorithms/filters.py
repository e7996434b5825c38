"""Group filters and the pass-rate curriculum state.

- Zero-variance filtering (ScaleRL, arXiv 2510.13786): a prompt whose samples all got the same
  reward has zero advantage everywhere and only dilutes the batch; drop it, and count it.
- DAPO dynamic sampling (Yu et al. 2025, arXiv 2503.14476, §3.2): keep sampling until the batch is
  full of groups that are neither all-correct nor all-wrong; `is_informative_group` is its
  predicate.
- No-positive-resampling (ScaleRL, after POLARIS, An et al. 2025): keep a per-prompt pass-rate
  history and permanently retire prompts whose pass rate reached 0.9.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from scalerl.algorithms._checks import (
    check_choice,
    check_finite,
    check_float_tensor,
    check_group_ids,
    check_number,
)
from scalerl.algorithms._groups import group_count, group_index, group_min_max

PromptId = str | int
PASS_RATE_BASES: tuple[str, ...] = ("cumulative", "last")


@dataclass(frozen=True)
class ZeroVarianceCounts:
    """What `zero_variance_filter` dropped."""

    n_groups: int
    n_dropped_groups: int
    n_samples: int
    n_dropped_samples: int


def zero_variance_mask(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Samples to keep: those whose group's rewards are not all equal.

    `keep_i = max_{j in g(i)} r_j > min_{j in g(i)} r_j` (exact equality, as `std == 0`); a prompt
    with a single sample has no variance and is dropped (ScaleRL, arXiv 2510.13786,
    "zero-variance filtering").

    Shapes: `rewards [N]` (float), `group_ids [N]` (int) -> bool `[N]`.
    """
    r = check_float_tensor("rewards", rewards, ndim=1, dims="[N]")
    check_finite("rewards", r)
    g = check_group_ids(group_ids, r.shape[0], "rewards")
    if r.numel() == 0:
        return torch.zeros(0, dtype=torch.bool, device=r.device)
    inverse, n_groups = group_index(g)
    lo, hi = group_min_max(r.detach(), inverse, n_groups)
    return (hi > lo)[inverse]


def zero_variance_filter(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, ZeroVarianceCounts]:
    """`zero_variance_mask` plus counts of the groups and samples it drops.

    Shapes: `rewards [N]`, `group_ids [N]` -> (bool `[N]`, counts).
    """
    keep = zero_variance_mask(rewards, group_ids)
    if keep.numel() == 0:
        return keep, ZeroVarianceCounts(0, 0, 0, 0)
    inverse, n_groups = group_index(group_ids)
    kept_per_group = group_count(inverse[keep], n_groups)
    n_kept_groups = int((kept_per_group > 0).sum())
    n_samples = int(keep.numel())
    return keep, ZeroVarianceCounts(
        n_groups=n_groups,
        n_dropped_groups=n_groups - n_kept_groups,
        n_samples=n_samples,
        n_dropped_samples=n_samples - int(keep.sum()),
    )


def is_informative_group(rewards: Tensor | Sequence[float]) -> bool:
    """DAPO dynamic-sampling predicate: does this prompt's group carry a learning signal?

    True iff the group has at least two samples and not all rewards are equal — for 0/1 rewards,
    `0 < #correct < G` (DAPO, arXiv 2503.14476, §3.2 "Dynamic Sampling").

    Shapes: `rewards [G]` (or a sequence of G numbers) -> bool.
    """
    r = rewards if isinstance(rewards, Tensor) else torch.as_tensor(list(rewards), dtype=torch.float64)
    check_float_tensor("rewards", r, ndim=1, dims="[G]")
    check_finite("rewards", r)
    if r.numel() < 2:
        return False
    return bool(r.max() > r.min())


@dataclass
class PassRateEntry:
    """Sampling history of one prompt: cumulative and most-recent-round attempts and successes."""

    attempts: int = 0
    successes: int = 0
    last_attempts: int = 0
    last_successes: int = 0

    @property
    def pass_rate(self) -> float:
        """Cumulative pass rate `successes / attempts` (0.0 before any attempt)."""
        return self.successes / self.attempts if self.attempts else 0.0

    @property
    def last_pass_rate(self) -> float:
        """Pass rate of the most recent round (`update` call) that sampled this prompt."""
        return self.last_successes / self.last_attempts if self.last_attempts else 0.0


def _check_prompt_id(value: object, where: str) -> PromptId:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{where}: expected str or int prompt ids, got {type(value).__name__}")
    return value


@dataclass
class PassRateHistory:
    """Per-prompt pass-rate history for no-positive-resampling (ScaleRL, arXiv 2510.13786).

    Each `update` call is one *round*: the samples it holds for a prompt (normally that prompt's
    group in one training step) give the prompt's latest pass rate, and add to its cumulative
    counts. A prompt is retired when its pass rate is `>= threshold` (0.9 in ScaleRL). The default
    basis is the latest round ("pass rate" as observed in the epoch it was last sampled); once the
    data layer stops sampling a retired prompt, its latest round never changes, so retirement is
    permanent. `basis="cumulative"` uses all rounds instead.

    `state_dict()` holds only JSON types (ints, strs, lists, dicts) and round-trips through
    `json.dumps` / `json.loads` with prompt ids' types preserved.
    """

    records: dict[PromptId, PassRateEntry] = field(default_factory=dict)

    def update(
        self,
        prompt_ids: Sequence[PromptId] | Tensor,
        rewards: Tensor | Sequence[float],
        success_threshold: float = 0.0,
    ) -> dict[PromptId, float]:
        """Record one round of samples and return each prompt's pass rate in this round.

        Sample `i`, of prompt `prompt_ids[i]`, succeeded iff `rewards[i] > success_threshold`.

        Shapes: `prompt_ids [N]` (str/int sequence or int tensor), `rewards [N]`.
        """
        ids = self._ids(prompt_ids)
        r = rewards if isinstance(rewards, Tensor) else torch.as_tensor(list(rewards), dtype=torch.float64)
        check_float_tensor("rewards", r, ndim=1, dims="[N]")
        if r.shape[0] != len(ids):
            raise ValueError(
                f"rewards: expected shape [N] = ({len(ids)},) matching prompt_ids, got {tuple(r.shape)}"
            )
        check_finite("rewards", r)
        check_number("success_threshold", success_threshold)
        successes = (r.detach() > success_threshold).tolist()
        round_attempts: dict[PromptId, int] = {}
        round_successes: dict[PromptId, int] = {}
        for pid, ok in zip(ids, successes, strict=True):
            round_attempts[pid] = round_attempts.get(pid, 0) + 1
            round_successes[pid] = round_successes.get(pid, 0) + int(ok)
        for pid, n in round_attempts.items():
            rec = self.records.setdefault(pid, PassRateEntry())
            rec.attempts += n
            rec.successes += round_successes[pid]
            rec.last_attempts = n
            rec.last_successes = round_successes[pid]
        return {pid: round_successes[pid] / n for pid, n in round_attempts.items()}

    def pass_rate(self, prompt_id: PromptId, basis: str = "last") -> float:
        """The prompt's pass rate (`"last"` round or `"cumulative"`); 0.0 if never sampled."""
        check_choice("basis", basis, PASS_RATE_BASES)
        rec = self.records.get(prompt_id)
        if rec is None:
            return 0.0
        return rec.last_pass_rate if basis == "last" else rec.pass_rate

    def is_retired(self, prompt_id: PromptId, threshold: float = 0.9, basis: str = "last") -> bool:
        """Whether the prompt has been sampled and its pass rate is `>= threshold`."""
        check_number("threshold", threshold, low=0.0, high=1.0)
        return prompt_id in self.records and self.pass_rate(prompt_id, basis) >= threshold

    def retired(self, threshold: float = 0.9, basis: str = "last") -> set[PromptId]:
        """All prompts whose pass rate is `>= threshold` (ScaleRL: 0.9)."""
        check_number("threshold", threshold, low=0.0, high=1.0)
        check_choice("basis", basis, PASS_RATE_BASES)
        return {pid for pid in self.records if self.pass_rate(pid, basis) >= threshold}

    def __len__(self) -> int:
        return len(self.records)

    def __contains__(self, prompt_id: object) -> bool:
        return prompt_id in self.records

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: `{"version": 1, "records": [{"prompt_id", "attempts", ...}, ...]}`."""
        return {
            "version": 1,
            "records": [
                {
                    "prompt_id": pid,
                    "attempts": rec.attempts,
                    "successes": rec.successes,
                    "last_attempts": rec.last_attempts,
                    "last_successes": rec.last_successes,
                }
                for pid, rec in self.records.items()
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the history with `state` from `state_dict()` (validated before anything changes)."""
        records_in = state.get("records") if isinstance(state, dict) else None
        if not isinstance(state, dict) or state.get("version") != 1 or not isinstance(records_in, list):
            raise ValueError(
                "state: expected {'version': 1, 'records': [...]} from PassRateHistory.state_dict()"
            )
        records: dict[PromptId, PassRateEntry] = {}
        fields = ("attempts", "successes", "last_attempts", "last_successes")
        for i, item in enumerate(records_in):
            if not isinstance(item, dict) or set(item) != {"prompt_id", *fields}:
                raise ValueError(
                    f"state: record {i} must have exactly the keys prompt_id, {', '.join(fields)}"
                )
            pid = _check_prompt_id(item["prompt_id"], f"state: record {i} prompt_id")
            counts = [item[k] for k in fields]
            if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts):
                raise ValueError(f"state: record {i} counts must be non-negative integers")
            rec = PassRateEntry(*counts)
            if rec.successes > rec.attempts or rec.last_successes > rec.last_attempts:
                raise ValueError(f"state: record {i} has more successes than attempts")
            if rec.last_attempts > rec.attempts:
                raise ValueError(f"state: record {i} has more last-round attempts than attempts")
            if pid in records:
                raise ValueError(f"state: duplicate prompt_id {pid!r}")
            records[pid] = rec
        self.records = records

    @staticmethod
    def _ids(prompt_ids: Sequence[PromptId] | Tensor) -> list[PromptId]:
        if isinstance(prompt_ids, Tensor):
            if prompt_ids.dim() != 1 or prompt_ids.is_floating_point() or prompt_ids.dtype == torch.bool:
                raise ValueError(
                    f"prompt_ids: expected a 1-D integer tensor, got {prompt_ids.dtype} of shape "
                    f"{tuple(prompt_ids.shape)}"
                )
            return [int(v) for v in prompt_ids.tolist()]
        if isinstance(prompt_ids, (str, bytes)):
            raise ValueError("prompt_ids: expected a sequence of ids, got a single string")
        return [_check_prompt_id(v, "prompt_ids") for v in prompt_ids]


def no_positive_resampling(
    prompt_ids: Iterable[PromptId],
    history: PassRateHistory,
    threshold: float = 0.9,
    basis: str = "last",
) -> list[PromptId]:
    """The candidate prompts that are not retired, in order (ScaleRL "No-Positive-Resampling").

    A prompt is retired once its pass rate in `history` is `>= threshold`; prompts never sampled
    are kept.
    """
    check_number("threshold", threshold, low=0.0, high=1.0)
    check_choice("basis", basis, PASS_RATE_BASES)
    return [pid for pid in prompt_ids if not history.is_retired(pid, threshold, basis)]
