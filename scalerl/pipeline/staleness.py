"""Admission control: the generator starts a prompt only if its group is sure to be trained in time.

Setting. Every optimizer step consumes exactly `B` groups (prompts with all `n` samples), in any
order, and raises the trainer version by at most one. A group admitted while the engine runs
weights of version `v` records `start_version >= v` on every sample (the engine stamps the version
at which a sequence enters a slot, and versions only grow). It is trained by the step that starts at
trainer version `u`; its lag is `u - start_version <= u - v`. The bound to guarantee is
`u - v <= k` (`k` = max_lag) for every group, whatever the generation speed of each sequence.

State. `u`: the version the *next* consumed batch will be trained at (after consuming a batch at
version `w`, `u = w + 1`). `O`: outstanding groups, i.e. admitted and neither consumed nor dropped
(in the engine, being scored, or queued for the trainer). `v_min`: the smallest admission version
among them.

Invariant (I):  `u + floor((O - 1) / B) <= v_min + k`  whenever `O > 0`.

(I) states the worst case for the oldest group: if every other outstanding group finishes first,
the trainer can take `floor((O - 1) / B)` full batches without it, and it is trained at version
`u + floor((O - 1) / B)` at the latest; later admissions are again checked against (I).

* (I) implies the bound: when a group with admission version `v >= v_min` is consumed at version
  `w`, then `w <= u` (the trainer advanced at most once per batch) and `O >= 1`, so
  `w - v <= u - v_min <= k`.
* A consumption keeps (I): `u -> u + 1` and `O -> O - B` leave `u + floor((O - 1) / B)` unchanged,
  and `v_min` can only grow when groups leave.
* A drop (dynamic sampling, a failed group) keeps (I): `O` shrinks and `v_min` can only grow.
* An admission of `m` groups at engine version `v_e` keeps (I) iff, with `V = min(v_min, v_e)`,
  `u + floor((O + m - 1) / B) <= V + k`, i.e. `m <= (V + k - u + 1) * B - O`. That is `capacity()`.

The rule is tight: admitting one more group than `capacity()` allows a completion order (the oldest
group finishes last) that trains it `k + 1` steps late. It does not depend on completion order, so it
favours no prompt: a slow (long) group is never discarded; instead, while it is outstanding, it
holds `v_min` down and throttles new admissions. It never deadlocks: admission blocks only when
`O` is a positive multiple of `B` (the trainer can then take a batch once those groups finish) or
when the engine's weights lag the trainer by more than `k` versions.

With `k = 0` and weights loaded before each round the same rule admits exactly one batch per round
(`sync`); with `k - 1` it admits `k` batches per round (`ppo_offpolicy`), so the lag assertion in
`consume()` checks every mode.

Deadline admission (`admission="deadline"`, pipeline mode). Rule (I) assumes the worst completion
order for the oldest group, so one long group holds `v_min` down and throttles every admission
behind it (the generators idle). The deadline rule gives each group its own deadline `d = v + k`
(the last version it may be trained at) and keeps instead the feasibility condition of
earliest-deadline-first scheduling with `B` groups per step:

Invariant (D):  `N(x) <= (x + k - u + 1) * B`  for every version `x`,

where `N(x)` counts the outstanding groups admitted at a version `<= x` (their deadlines are
`<= x + k`; the steps `u .. x + k` take `(x + k - u + 1) * B` groups). (I) implies (D)
(`N(x) <= O`), so (D) admits at least as much. It holds whatever the completion order *provided the
trainer takes the right groups*: the step at `u` must contain at least
`need(x) = N(x) - (x + k - u) * B` groups admitted at `<= x`, for every `x` (`needed()`; (D) keeps
each `<= B`). Then (D) survives the step (at most `(x + k - u) * B` groups `<= x` are left, the
capacity of the steps after it), and the bound holds: a group of version `v` still outstanding at
`u = v + k` has `need(v) = N(v) >= 1`, so this step takes it, with lag exactly `k`.
`select_batch()` returns the B oldest queued groups when they meet every `need(x)` (if any B
queued groups do, the oldest do) and None otherwise: the trainer then waits for the needed groups
to finish. So a long group stalls the trainer at its deadline instead of stalling admissions for
its whole life; no sample is cut or dropped. `consume()` checks every batch against `need(x)` and
raises on one that breaks (D).

Under (D) groups are admitted only at an engine version `v_e` no older than any outstanding
group (otherwise `capacity()` is 0 until the engine catches up), so `N(v_e) = O` and `m` groups
keep (D) iff `m <= (v_e + k - u + 1) * B - O`: the bounded capacity with `v_e` in place of
`min(v_min, v_e)`. Admissions then never raise `need(x)` below the newest version, so a batch the
trainer has picked stays valid while the generator keeps admitting.

Partial rollouts (`admission="partial"`, pipeline mode). Under (D) the trainer still waits at a
deadline for a group that is generating: any rule that trains every group within `k` versions of its
admission can take at most about `k + 1` steps per lifetime of the longest sample. `partial` admits
and selects as `deadline` does, and when the trainer would wait it *re-admits* as many of the groups
that block it as the step lacks instead (`shortfall()`, `renew()`, and `renew_blocking()`, which the
generator and the simulator both call): such a group, still generating, gets the engines' current
version `v'` as its admission version, and so a new deadline `v' + k`. Its sequences are not
restarted or cut: they go on under the newer weights (in-flight updates), their tokens carry the
versions that generated them. Moving one group from `v` to `v' > v` lowers `N(x)` by one for
`v <= x < v'` and leaves it unchanged elsewhere, so (D) and every `need(x)` bound hold (a renewal can only
lower `need(x)`, so a batch the trainer has picked stays valid), and the lag `consume()` checks,
counted from the group's latest admission version, stays `<= k`. What this rule bounds is therefore
the *segment* of each sample generated since its group's last admission (Kimi k1.5's partial
rollouts: a long response is continued across iterations); the tokens of earlier segments are older
than `k` versions when trained. Their lag is reported (the pipeline's `token_lag_*`, `version_lag_*`
from each sample's first token), and the loss corrects them like any off-policy token, with the
behaviour log-probs the engine recorded for each token (`algorithm.tis`, CISPO's truncated ratio).
They are not masked.

`max_outstanding` (0: none) caps `O` on top of either rule. A cap only lowers admissions, so it
keeps (I) and (D); with the deadline rule it bounds the over-subscription (e.g. to the groups the
engines hold at once), which lowers the lag of trained groups at some cost in throughput. A cap of
at least `B` never deadlocks: admission blocks on it only while `O >= B` groups are outstanding,
and the trainer can take a batch once they finish.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar

Admission = Literal["bounded", "deadline", "partial"]
ADMISSIONS: tuple[Admission, ...] = ("bounded", "deadline", "partial")


class StalenessError(RuntimeError):
    """A group was trained more than `max_lag` versions after its admission: a pipeline bug."""


class StalenessController:
    """Thread-safe bookkeeping of outstanding groups and the admission rule (module docstring).

    `on_change` is called (outside the lock) after every consumption or drop, i.e. whenever capacity
    may have grown, so a waiting generator can wake up.
    """

    def __init__(
        self,
        max_lag: int,
        batch_size: int,
        train_version: int = 0,
        on_change: Callable[[], None] | None = None,
        admission: Admission = "bounded",
        max_outstanding: int = 0,
    ) -> None:
        if max_outstanding and max_outstanding < batch_size:
            raise ValueError(
                f"max_outstanding: must be 0 (no cap) or >= batch_size {batch_size}, got {max_outstanding}")
        if admission not in ADMISSIONS:
            raise ValueError(f"admission: expected one of {ADMISSIONS}, got {admission!r}")
        if max_lag < 0:
            raise ValueError(f"max_lag: must be >= 0, got {max_lag}")
        if batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
        self.max_lag = int(max_lag)
        self.batch_size = int(batch_size)
        self.admission: Admission = admission
        # A cap on outstanding groups (0: none) on top of either rule: the over-subscription the
        # deadline rule may reach is then bounded, e.g. by the groups the engines can hold at once.
        self.max_outstanding = int(max_outstanding)
        self._next_train_version = int(train_version)
        self._versions: Counter[int] = Counter()
        self._outstanding = 0
        self._lock = threading.Lock()
        self._on_change = on_change
        self.max_observed_lag = 0
        self.renewed = 0  # groups re-admitted by `renew()` (partial rollouts)

    @property
    def outstanding(self) -> int:
        with self._lock:
            return self._outstanding

    @property
    def next_train_version(self) -> int:
        with self._lock:
            return self._next_train_version

    @property
    def oldest_version(self) -> int | None:
        with self._lock:
            return min(self._versions) if self._versions else None

    def set_on_change(self, callback: Callable[[], None] | None) -> None:
        self._on_change = callback

    @property
    def deadline_rule(self) -> bool:
        """True for the per-group deadline rule (D) (`deadline`, `partial`), False for (I)."""
        return self.admission in ("deadline", "partial")

    @property
    def partial_rollouts(self) -> bool:
        """True when blocking groups are re-admitted instead of waited for (`partial`)."""
        return self.admission == "partial"

    def _cumulative_locked(self) -> list[tuple[int, int]]:
        """(x, N(x)) for every outstanding version x, ascending."""
        out, total = [], 0
        for v in sorted(self._versions):
            total += self._versions[v]
            out.append((v, total))
        return out

    def _deadline_capacity_locked(self, engine_version: int) -> int:
        if self._versions and max(self._versions) > engine_version:
            # An engine behind an outstanding group's version (a pool member that fell back): new
            # groups would be older than queued ones and could invalidate a batch the trainer has
            # already picked, so admission waits until the engine catches up.
            return 0
        # Every outstanding group is then <= engine_version: (D) at x = engine_version is the only
        # condition an admission can break, and N(engine_version) = O.
        slack_batches = engine_version + self.max_lag - self._next_train_version + 1
        return max(0, slack_batches * self.batch_size - self._outstanding)

    def _capacity_locked(self, engine_version: int) -> int:
        if self.deadline_rule:
            room = self._deadline_capacity_locked(engine_version)
        else:
            oldest = min(self._versions) if self._versions else engine_version
            floor_version = min(oldest, engine_version)
            slack_batches = floor_version + self.max_lag - self._next_train_version + 1
            room = max(0, slack_batches * self.batch_size - self._outstanding)
        if self.max_outstanding:
            room = min(room, max(0, self.max_outstanding - self._outstanding))
        return room

    def capacity(self, engine_version: int) -> int:
        """How many groups may be admitted now at `engine_version` without risking the bound."""
        with self._lock:
            return self._capacity_locked(engine_version)

    def _needed_locked(self, train_version: int | None = None) -> list[tuple[int, int]]:
        k, b = self.max_lag, self.batch_size
        u = self._next_train_version if train_version is None else train_version
        return [(x, n_x - (x + k - u) * b) for x, n_x in self._cumulative_locked() if n_x > (x + k - u) * b]

    def needed(self) -> list[tuple[int, int]]:
        """Deadline rule: `(x, need(x))` with `need(x) > 0`: the step at the next train version must
        take at least `need(x)` groups admitted at a version `<= x` (module docstring)."""
        with self._lock:
            return self._needed_locked()

    def select_batch(self, queued_versions: Sequence[int]) -> list[int] | None:
        """Indices (into `queued_versions`, the admission versions of the finished groups in queue
        order) of the B groups the next step takes, or None when no valid batch is queued yet.

        `bounded`: the first B (completion order). `deadline`: the B oldest (by version, then
        queue order), valid only if they meet every `need(x)`; they do whenever any valid choice
        exists, because taking older groups never lowers a count of groups `<= x`.
        """
        b = self.batch_size
        if len(queued_versions) < b:
            return None
        if not self.deadline_rule:
            return list(range(b))
        chosen = sorted(range(len(queued_versions)), key=lambda i: (queued_versions[i], i))[:b]
        picked = sorted(queued_versions[i] for i in chosen)
        for x, need in self.needed():
            if bisect_right(picked, x) < need:
                return None
        return sorted(chosen)

    def shortfall(self, queued_versions: Sequence[int]) -> tuple[int, int] | None:
        """Deadline rules, with at least B groups queued and no valid batch among them: `(x, m)`
        for the smallest version `x` whose `need(x)` the B oldest queued groups miss, by `m`
        groups: the step waits for `m` more groups admitted at `<= x` that are not queued yet (or,
        under `partial`, `renew()` moves `m` of them past `x`). None otherwise."""
        b = self.batch_size
        if not self.deadline_rule or len(queued_versions) < b:
            return None
        picked = sorted(queued_versions)[:b]
        for x, need in self.needed():
            have = bisect_right(picked, x)
            if have < need:
                return x, need - have
        return None

    def renew(self, versions: Sequence[int], engine_version: int) -> None:
        """Partial rollouts: re-admit outstanding groups admitted at `versions` at `engine_version`
        (each strictly newer), giving them the deadline `engine_version + k` (module docstring)."""
        if not self.partial_rollouts:
            raise StalenessError(f"renew: only the partial rule re-admits groups, not {self.admission!r}")
        with self._lock:
            for v, count in Counter(versions).items():
                if v >= engine_version:
                    raise StalenessError(f"renew: a group of version {v} cannot move to {engine_version}")
                if self._versions[v] < count:
                    have = self._versions[v]
                    raise StalenessError(f"renew: {count} group(s) of version {v}, {have} outstanding")
            for v in versions:
                self._release_locked(v)
                self._versions[engine_version] += 1
                self._outstanding += 1
            self.renewed += len(versions)

    def admit(self, engine_version: int, count: int = 1) -> None:
        """Record `count` admissions at `engine_version`; more than `capacity()` is an error."""
        if count < 0:
            raise ValueError(f"count: must be >= 0, got {count}")
        with self._lock:
            room = self._capacity_locked(engine_version)
            if count > room:
                raise StalenessError(
                    f"admitting {count} group(s) at version {engine_version} exceeds the capacity {room} "
                    f"(max_lag={self.max_lag}, B={self.batch_size}, outstanding={self._outstanding}, "
                    f"next train version {self._next_train_version})"
                )
            if count:
                self._versions[engine_version] += count
                self._outstanding += count

    def _release_locked(self, version: int) -> None:
        if self._versions[version] <= 0:
            raise StalenessError(f"released a group of version {version} that is not outstanding")
        self._versions[version] -= 1
        if self._versions[version] == 0:
            del self._versions[version]
        self._outstanding -= 1

    def drop(self, admit_version: int) -> None:
        """An outstanding group leaves without being trained (its capacity is freed)."""
        with self._lock:
            self._release_locked(admit_version)
        if self._on_change is not None:
            self._on_change()

    def consume(self, admit_versions: Sequence[int], train_version: int) -> list[int]:
        """A batch of `B` groups is taken for the step at `train_version`; returns each group's lag.

        Raises `StalenessError` if a lag exceeds `max_lag`, the batch is not `B` groups, or the
        trainer advanced more than one version since the previous batch (the proof's premises).
        """
        if len(admit_versions) != self.batch_size:
            got = len(admit_versions)
            raise StalenessError(f"a step must consume B={self.batch_size} groups, got {got}")
        with self._lock:
            if train_version > self._next_train_version:
                raise StalenessError(
                    f"trainer is at version {train_version} but at most {self._next_train_version} was "
                    "expected: more than one version per consumed batch"
                )
            lags = [train_version - v for v in admit_versions]
            worst = max(lags)
            if worst > self.max_lag:
                raise StalenessError(
                    f"group admitted at version {train_version - worst} trained at version {train_version}: "
                    f"lag {worst} > max_lag {self.max_lag}"
                )
            if self.deadline_rule:
                # The batch must meet every need(x), or (D) cannot hold after the step (module docstring).
                taken = sorted(admit_versions)
                for x, need in self._needed_locked(train_version):
                    if bisect_right(taken, x) < need:
                        got = bisect_right(taken, x)
                        raise StalenessError(
                            f"the step at version {train_version} took {got} group(s) admitted at <= {x}, "
                            f"{need} needed: the rest could not all be trained within max_lag {self.max_lag}"
                        )
            for v in admit_versions:
                self._release_locked(v)
            self._next_train_version = train_version + 1
            self.max_observed_lag = max(self.max_observed_lag, worst)
        if self._on_change is not None:
            self._on_change()
        return lags

    def settle(self, train_version: int) -> None:
        """After a step: the next batch trains at `train_version` (the trainer's version now).

        `consume()` assumed the step would advance the version by one; a step that did not update
        (no learning signal, non-finite loss) leaves it unchanged, and lowering `u` back only
        loosens (I), so admissions are not throttled by steps that never happened.
        """
        with self._lock:
            if train_version > self._next_train_version:
                raise StalenessError(
                    f"trainer reached version {train_version}, more than one past the last consumed batch "
                    f"(expected <= {self._next_train_version})"
                )
            self._next_train_version = int(train_version)
        if self._on_change is not None:
            self._on_change()

    # ------------------------------------------------------------------------------ exact resume
    def state_dict(self) -> dict[str, Any]:
        """The bookkeeping, for a resume that keeps every outstanding group (`Driver.snapshot`)."""
        with self._lock:
            return {"versions": sorted(self._versions.items()), "outstanding": self._outstanding,
                    "next_train_version": self._next_train_version, "max_observed_lag": self.max_observed_lag,
                    "renewed": self.renewed}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        versions = Counter({int(v): int(n) for v, n in state["versions"]})
        if sum(versions.values()) != int(state["outstanding"]):
            raise ValueError("staleness state: outstanding count does not match the per-version counts")
        with self._lock:
            self._versions = versions
            self._outstanding = int(state["outstanding"])
            self._next_train_version = int(state["next_train_version"])
            self.max_observed_lag = int(state["max_observed_lag"])
            self.renewed = int(state.get("renewed", 0))


class Admitted(Protocol):
    """A group still generating, as partial rollouts see it: its latest admission version."""

    admit_version: int


G = TypeVar("G", bound=Admitted)


def renew_blocking(controller: StalenessController, queued_versions: Sequence[int], generating: Iterable[G],
                   engine_version: int, order: Callable[[G], Any]) -> list[G]:
    """Partial rollouts (module docstring): while the next step lacks `m` groups admitted at `<= x`
    (`shortfall`), re-admit `m` of the `generating` groups that old at `engine_version`, the last in
    `order` first (the most recently admitted: the fewest tokens generated before their new
    admission), and set their `admit_version`. Stops when nothing is short, when the engine is not
    newer than `x`, or when too few such groups are still generating (the others are being scored:
    the step waits for them). Returns the groups re-admitted. The generator and the simulator both
    call this, so a run and its simulation renew the same groups."""
    pool = list(generating)
    moved: list[G] = []
    while (short := controller.shortfall(queued_versions)) is not None and engine_version > short[0]:
        x, missing = short
        movers = sorted((g for g in pool if g.admit_version <= x), key=order, reverse=True)[:missing]
        if len(movers) < missing:
            break
        controller.renew([g.admit_version for g in movers], engine_version)
        for g in movers:
            g.admit_version = engine_version
        moved += movers
    return moved

