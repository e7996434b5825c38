"""`PromptPool`: the training curriculum over a prompt set.

It walks epochs over the training prompts, each in a fresh seeded shuffle; keeps every prompt's
pass-rate history; retires prompts whose pass rate reached the threshold so later epochs skip them
(ScaleRL §3.2 no-positive-resampling); counts zero-variance groups (all rewards equal: no
advantage signal) and the extra prompts drawn to refill a batch under DAPO dynamic sampling; and
saves all of that with a checkpoint so a resumed run draws exactly the prompts the original would
have drawn.

With an `algorithm.curriculum` section (`CurriculumConfig`) that asks for it
(`scalerl.data.curriculum`), draws instead follow Kimi k1.5's strategies: an easy-to-hard frontier
over the prompts' difficulty and/or prioritized resampling by failure rate, seeded by the draw
count so that a restored pool draws the same.

The trainer's loop is: `prompts = pool.next_prompts(k)`, generate a group per prompt,
`pool.report(prompt.id, rewards)` per group; under dynamic sampling, when `report` says a group is
not informative, it asks `pool.next_prompts(m, refill=True)` for replacements.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from torch import Tensor

from scalerl.algorithms.filters import PassRateHistory, is_informative_group
from scalerl.config import CurriculumConfig
from scalerl.data.curriculum import (
    curriculum_frontier,
    difficulty_ranks,
    draw_weighted,
    failure_rate_weights,
    weighted,
)
from scalerl.data.records import PromptRecord
from scalerl.data.rejects import DataError

STATE_VERSION = 1
COUNTER_KEYS: tuple[str, ...] = (
    "prompts_drawn",  # every prompt handed out, refills included
    "refill_prompts",  # drawn with refill=True: extra prompts for dynamic sampling
    "retired_skips",  # retired after their epoch was shuffled, so skipped at draw time
    "groups_reported",
    "informative_groups",  # rewards not all equal: a learning signal (DAPO's keep predicate)
    "zero_variance_groups",  # all rewards equal: zero advantage, filtered by ScaleRL/DAPO
    "all_correct_groups",  # zero-variance groups where every sample succeeded
    "all_wrong_groups",  # zero-variance groups where every sample failed
)


class PoolExhaustedError(RuntimeError):
    """Every training prompt is retired: no epoch can start. Nothing was drawn by the failing call."""


def _fingerprint(ids: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for pid in sorted(ids):
        digest.update(pid.encode("utf-8") + b"\n")
    return digest.hexdigest()


class PromptPool:
    """Epoch-shuffled prompt stream with pass-rate history, retirement and checkpointable state.

    `seed` drives only the epoch shuffles (epoch `e` uses the generator seeded by `[seed, e]`), so
    it is independent of the held-out split's seed. A prompt whose latest pass rate (fraction of its
    group's rewards `> success_threshold`) is `>= retire_threshold` is retired when
    `no_positive_resampling` is on: later epochs leave it out. `heldout_ids` guards the split: a
    training record with a held-out id is an error.
    """

    def __init__(
        self,
        records: Sequence[PromptRecord],
        seed: int,
        *,
        retire_threshold: float = 0.9,
        no_positive_resampling: bool = True,
        retire_basis: str = "last",
        heldout_ids: Iterable[str] = (),
        curriculum: CurriculumConfig | None = None,
    ) -> None:
        if not records:
            raise DataError("records: the prompt pool needs at least one training prompt")
        if not 0.0 < retire_threshold <= 1.0:
            raise ValueError(f"retire_threshold: must be in (0, 1], got {retire_threshold}")
        self._records: dict[str, PromptRecord] = {}
        for r in records:
            if r.id in self._records:
                raise DataError(f"records: duplicate prompt id {r.id!r} ({r.source or 'no source'})")
            self._records[r.id] = r
        leaked = sorted(set(heldout_ids) & self._records.keys())
        if leaked:
            raise DataError(
                f"records: {len(leaked)} held-out prompt(s) among the training prompts, e.g. {leaked[:3]}"
            )
        self._ids: list[str] = [r.id for r in records]
        self.seed = int(seed)
        self.retire_threshold = float(retire_threshold)
        self.no_positive_resampling = bool(no_positive_resampling)
        self.retire_basis = retire_basis
        self.history = PassRateHistory()
        self.retired: set[str] = set()
        self.counters: dict[str, int] = dict.fromkeys(COUNTER_KEYS, 0)
        # epoch 0 means "no epoch started"; the first draw starts epoch 1.
        self.epoch = 0
        self._order: list[str] = []
        self._position = 0
        self._init_curriculum(curriculum or CurriculumConfig(), records)

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, prompt_id: object) -> bool:
        return prompt_id in self._records

    def record(self, prompt_id: str) -> PromptRecord:
        try:
            return self._records[prompt_id]
        except KeyError:
            raise KeyError(f"prompt id {prompt_id!r} is not in this pool") from None

    @property
    def active_ids(self) -> list[str]:
        """Prompts that future epochs will include (all but the retired), in input order."""
        return [pid for pid in self._ids if pid not in self.retired]

    def _start_epoch(self) -> None:
        active = self.active_ids
        if not active:
            raise PoolExhaustedError(
                f"all {len(self._ids)} training prompts are retired (pass rate >= {self.retire_threshold}); "
                "no epoch can start"
            )
        self.epoch += 1
        perm = np.random.default_rng([self.seed, self.epoch]).permutation(len(active))
        self._order = [active[i] for i in perm]
        self._position = 0

    # -- Kimi k1.5 sampling (scalerl.data.curriculum) -------------------------------------------

    def _init_curriculum(self, spec: CurriculumConfig, records: Sequence[PromptRecord]) -> None:
        self.curriculum = spec
        self.curriculum_draws = 0
        self.curriculum_fallbacks = 0  # draws where every open prompt had weight 0 (uniform instead)
        self._ranks: dict[str, int] | None = None
        if spec.order == "easy_to_hard":
            self._ranks = difficulty_ranks(records, spec.difficulty_key, spec.harder, self.seed)

    @property
    def frontier(self) -> float:
        """Share of the active prompts (easiest first) open to the next draw; 1 without a curriculum."""
        spec = self.curriculum
        if spec.order != "easy_to_hard":
            return 1.0
        return curriculum_frontier(self.curriculum_draws, spec.ramp_prompts, spec.start_fraction)

    def _next_weighted(self, k: int) -> list[PromptRecord]:
        """`k` prompts drawn by the curriculum's weights (no epochs)."""
        active = self.active_ids
        if not active:
            raise PoolExhaustedError(
                f"all {len(self._ids)} training prompts are retired (pass rate >= {self.retire_threshold})"
            )
        if self._ranks is not None:
            ranks = self._ranks
            open_count = max(1, math.ceil(self.frontier * len(active)))
            active = sorted(active, key=lambda pid: ranks[pid])[:open_count]
        if self.curriculum.priority == "failure_rate":
            weights = failure_rate_weights([self.history.pass_rate(pid, "cumulative") for pid in active])
        else:
            weights = np.ones(len(active))
        rng = np.random.default_rng([self.seed, 0x4B31, self.curriculum_draws])
        picked, fell_back = draw_weighted(rng, weights, k)
        self.curriculum_draws += k
        self.curriculum_fallbacks += int(fell_back)
        return [self._records[active[i]] for i in picked]

    def next_prompts(self, k: int, *, refill: bool = False) -> list[PromptRecord]:
        """The next `k` prompts, crossing into new epochs as needed (or drawn by the curriculum).

        `refill=True` marks them as replacements for groups that dynamic sampling dropped (counted in
        `refill_prompts`). Raises `PoolExhaustedError`, drawing nothing, when the prompts run out.
        """
        if k < 0:
            raise ValueError(f"k: must be >= 0, got {k}")
        if weighted(self.curriculum) and k > 0:
            drawn = self._next_weighted(k)
            self.counters["prompts_drawn"] += len(drawn)
            if refill:
                self.counters["refill_prompts"] += len(drawn)
            return drawn
        saved = (self.epoch, self._order, self._position, self.counters["retired_skips"])
        drawn: list[PromptRecord] = []
        try:
            while len(drawn) < k:
                if self._position >= len(self._order):
                    self._start_epoch()
                pid = self._order[self._position]
                self._position += 1
                if pid in self.retired:
                    # Retired after this epoch was shuffled (its report came late, e.g. async rollouts).
                    self.counters["retired_skips"] += 1
                    continue
                drawn.append(self._records[pid])
        except PoolExhaustedError:
            self.epoch, self._order, self._position, self.counters["retired_skips"] = saved
            raise
        self.counters["prompts_drawn"] += len(drawn)
        if refill:
            self.counters["refill_prompts"] += len(drawn)
        return drawn

    def report(
        self, prompt_id: str, rewards: Sequence[float] | Tensor, success_threshold: float = 0.0
    ) -> bool:
        """Record one prompt's group of rewards; returns whether the group is informative.

        A sample succeeds when its reward is `> success_threshold`. A group is informative (kept
        by dynamic sampling / zero-variance filtering) when its rewards are not all equal.
        """
        if prompt_id not in self._records:
            raise KeyError(f"report: prompt id {prompt_id!r} is not in this pool")
        values = rewards.detach().double().reshape(-1).tolist() if isinstance(rewards, Tensor) else [
            float(r) for r in rewards
        ]
        if not values:
            raise ValueError(f"report: empty reward group for prompt {prompt_id!r}")
        self.history.update([prompt_id] * len(values), values, success_threshold)
        informative = is_informative_group(values)
        self.counters["groups_reported"] += 1
        if informative:
            self.counters["informative_groups"] += 1
        else:
            self.counters["zero_variance_groups"] += 1
            key = "all_correct_groups" if values[0] > success_threshold else "all_wrong_groups"
            self.counters[key] += 1
        if self.no_positive_resampling and self.history.is_retired(
            prompt_id, self.retire_threshold, self.retire_basis
        ):
            self.retired.add(prompt_id)
        return informative

    def pass_rate(self, prompt_id: str) -> float:
        return self.history.pass_rate(prompt_id, self.retire_basis)

    def stats(self) -> dict[str, float]:
        """Numbers for logging: position, retirement, and the counters (plus the zero-variance share)."""
        groups = self.counters["groups_reported"]
        out: dict[str, float] = {
            "epoch": float(self.epoch),
            "epoch_progress": self._position / len(self._order) if self._order else 0.0,
            "n_prompts": float(len(self._ids)),
            "n_retired": float(len(self.retired)),
            "n_active": float(len(self._ids) - len(self.retired)),
            "n_seen": float(len(self.history)),
            "zero_variance_fraction": self.counters["zero_variance_groups"] / groups if groups else 0.0,
        }
        out.update({k: float(v) for k, v in self.counters.items()})
        if weighted(self.curriculum):
            out["curriculum_frontier"] = self.frontier
            out["curriculum_fallbacks"] = float(self.curriculum_fallbacks)
        return out

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: enough to make `next_prompts` after a restore identical to the original."""
        return {
            "version": STATE_VERSION,
            "fingerprint": _fingerprint(self._ids),
            "seed": self.seed,
            "epoch": self.epoch,
            "order": list(self._order),
            "position": self._position,
            "retired": sorted(self.retired),
            "history": self.history.state_dict(),
            "counters": dict(self.counters),
            "curriculum": {"draws": self.curriculum_draws, "fallbacks": self.curriculum_fallbacks},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict()`; the pool must hold the same prompt ids. Validated first."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"pool state: expected a dict with version {STATE_VERSION} from state_dict()")
        missing = [k for k in ("fingerprint", "seed", "epoch", "order", "position", "retired", "history",
                               "counters") if k not in state]
        if missing:
            raise ValueError(f"pool state: missing key(s) {missing}")
        if state["fingerprint"] != _fingerprint(self._ids):
            raise ValueError(
                "pool state: saved for a different set of training prompt ids "
                f"(this pool has {len(self._ids)}); the data or held-out split changed since the checkpoint"
            )
        order, position, epoch = state["order"], state["position"], state["epoch"]
        if not isinstance(order, list) or any(pid not in self._records for pid in order):
            raise ValueError("pool state: 'order' names prompts that are not in this pool")
        if not isinstance(position, int) or not 0 <= position <= len(order):
            raise ValueError(f"pool state: 'position' {position!r} outside the epoch of {len(order)} prompts")
        if not isinstance(epoch, int) or epoch < 0 or (epoch == 0) != (not order):
            raise ValueError(f"pool state: 'epoch' {epoch!r} inconsistent with the saved epoch order")
        retired = state["retired"]
        if not isinstance(retired, list) or any(pid not in self._records for pid in retired):
            raise ValueError("pool state: 'retired' names prompts that are not in this pool")
        counters = state["counters"]
        if not isinstance(counters, dict) or set(counters) != set(COUNTER_KEYS) or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in counters.values()
        ):
            raise ValueError(f"pool state: 'counters' must map exactly {COUNTER_KEYS} to counts")
        if isinstance(state["seed"], bool) or not isinstance(state["seed"], int):
            raise ValueError(f"pool state: 'seed' must be an integer, got {state['seed']!r}")
        history = PassRateHistory()
        history.load_state_dict(state["history"])
        # Absent in states saved before the curriculum existed (epoch draws only).
        curriculum = state.get("curriculum", {"draws": 0, "fallbacks": 0})
        if not isinstance(curriculum, dict) or any(
            isinstance(curriculum.get(key), bool) or not isinstance(curriculum.get(key), int)
            or curriculum[key] < 0 for key in ("draws", "fallbacks")
        ):
            raise ValueError("pool state: 'curriculum' must map draws and fallbacks to counts")
        self.seed = int(state["seed"])
        self.epoch = epoch
        self._order = list(order)
        self._position = position
        self.retired = set(retired)
        self.history = history
        self.counters = dict(counters)
        self.curriculum_draws = curriculum["draws"]
        self.curriculum_fallbacks = curriculum["fallbacks"]
