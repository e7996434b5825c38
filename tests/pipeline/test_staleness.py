"""The admission rule: the lag bound under adversarial completion orders, tightness, liveness."""

from __future__ import annotations

import random

import pytest

from scalerl.pipeline.staleness import StalenessController, StalenessError


def test_capacity_at_start_is_k_plus_one_batches() -> None:
    assert StalenessController(0, 4).capacity(0) == 4
    assert StalenessController(8, 4).capacity(0) == 36
    c = StalenessController(2, 3)
    c.admit(0, 5)
    assert c.capacity(0) == 4
    assert c.outstanding == 5


def test_engine_lagging_the_trainer_reduces_capacity() -> None:
    c = StalenessController(2, 4, train_version=5)
    assert c.capacity(5) == 12
    assert c.capacity(4) == 8  # new groups would start one version older
    assert c.capacity(2) == 0


def test_old_outstanding_group_throttles_admission() -> None:
    k, b = 1, 2
    c = StalenessController(k, b)
    c.admit(0, 4)  # u=0: 4 = (k+1) * B groups at version 0
    assert c.capacity(0) == 0
    # Three of them finish and two are trained; the fourth (the slow one) is still generating.
    c.consume([0, 0], 0)
    c.settle(1)
    # Weights of version 1 are loaded; the slow group still holds v_min = 0, so only one more
    # group may start: with 2 more the trainer could take [0, 1'] then [1', 1'] and train the
    # slow group at version 2.
    assert c.capacity(1) == 0  # (min(0, 1) + 1 - 1 + 1) * 2 - 2 = 0
    c.consume([0, 0], 1)
    c.settle(2)
    assert c.capacity(2) == 4


def test_admission_beyond_capacity_is_refused() -> None:
    c = StalenessController(1, 2)
    with pytest.raises(StalenessError, match="exceeds the capacity"):
        c.admit(0, 5)


def test_rule_is_tight() -> None:
    """One group more than the capacity and the adversarial order trains a group k+1 late."""
    k, b = 2, 2
    c = StalenessController(k, b)
    cap = c.capacity(0)
    assert cap == (k + 1) * b
    # Bypass the rule by one group and let the oldest finish last.
    c._versions[0] += cap + 1
    c._outstanding += cap + 1
    for u in range(k + 1):
        c.consume([0, 0], u)
        c.settle(u + 1)
    # One version-0 group is left and the trainer needs a second one to step: the rule refuses it
    # (the bypassed state cannot progress without breaking the bound) ...
    assert c.capacity(k + 1) == 0
    # ... and forcing it in trains the version-0 group k + 1 steps late, which consume() rejects.
    c._versions[k + 1] += 1
    c._outstanding += 1
    with pytest.raises(StalenessError, match="lag 3 > max_lag 2"):
        c.consume([0, k + 1], k + 1)


def test_consume_checks_premises() -> None:
    c = StalenessController(1, 2)
    c.admit(0, 2)
    with pytest.raises(StalenessError, match="B=2"):
        c.consume([0], 0)
    with pytest.raises(StalenessError, match="more than one version"):
        c.consume([0, 0], 1)
    with pytest.raises(StalenessError, match="not outstanding"):
        c.drop(3)


def _simulate(k: int, b: int, steps: int, seed: int, order: str, drop_p: float) -> tuple[int, int]:
    """Random admissions up to capacity, random finishes, adversarial or random training order.

    Returns (max lag, admissions). The controller raises on any violation.
    """
    rng = random.Random(seed)
    c = StalenessController(k, b)
    engine_version = 0
    generating: list[int] = []  # admission versions of groups still generating
    finished: list[int] = []  # finished (queued) groups, in completion order
    u = 0
    admitted = 0
    max_lag = 0
    for _ in range(steps):
        room = c.capacity(engine_version)
        if room:
            m = rng.randint(1, room)
            c.admit(engine_version, m)
            generating += [engine_version] * m
            admitted += m
        # Some generating groups finish: the oldest rarely (long tail) in "adversarial" mode.
        rng.shuffle(generating)
        if order == "adversarial":
            generating.sort(reverse=True)  # newest first to finish
        for _ in range(rng.randint(0, len(generating))):
            v = generating.pop(0)
            if rng.random() < drop_p:
                c.drop(v)
            else:
                finished.append(v)
        if len(finished) >= b:
            if order == "adversarial":
                finished.sort(reverse=True)
                batch, finished = finished[:b], finished[b:]
            else:
                batch, finished = finished[:b], finished[b:]
            lags = c.consume(batch, u)
            max_lag = max(max_lag, *lags)
            if rng.random() < 0.9:  # sometimes a step does not update (no signal)
                u += 1
            c.settle(u)
            if rng.random() < 0.8:  # weights usually reach the engine right away
                engine_version = u
        elif rng.random() < 0.5:
            engine_version = u
    return max_lag, admitted


@pytest.mark.parametrize("k,b", [(0, 1), (0, 4), (1, 2), (2, 3), (4, 4), (8, 2), (8, 8)])
@pytest.mark.parametrize("order", ["fifo", "adversarial"])
def test_bound_holds_in_random_histories(k: int, b: int, order: str) -> None:
    for seed in range(5):
        max_lag, admitted = _simulate(k, b, steps=400, seed=seed, order=order, drop_p=0.2)
        assert max_lag <= k
        assert admitted > 100  # never deadlocked


@pytest.mark.parametrize("k,b", [(1, 2), (3, 2), (8, 4)])
def test_adversarial_order_reaches_the_bound(k: int, b: int) -> None:
    """The rule is not needlessly strict: an adversary does reach lag k."""
    worst = max(_simulate(k, b, steps=400, seed=s, order="adversarial", drop_p=0.0)[0] for s in range(5))
    assert worst == k


# ---------------------------------------------------------------------------------- deadline rules
def test_deadline_rule_admits_behind_an_old_group() -> None:
    """The scenario of `test_old_outstanding_group_throttles_admission` under (D): the slow
    version-0 group no longer blocks new admissions, it only has to be in the next batch."""
    k, b = 1, 2
    for admission in ("deadline",):
        c = StalenessController(k, b, admission=admission)
        assert c.capacity(0) == (k + 1) * b  # x = 0: (0 + 1 - 0 + 1) * 2 - 0
        c.admit(0, 4)
        c.consume([0, 0], 0)
        c.settle(1)
        # (D) at x = 1: (1 + 1 - 1 + 1) * 2 - N(1) = 4 - 2 = 2 (the bounded rule: 0).
        assert c.capacity(1) == 2
        # The two version-0 groups left have deadline 0 + k = 1: both are needed now.
        assert c.needed() == [(0, 2)]
        c.admit(1, 2)
        assert c.capacity(1) == 0


def _two_due_two_new(admission: str) -> StalenessController:
    """k=1, B=2: four groups admitted at version 0, two trained at 0, two more admitted at 1."""
    c = StalenessController(1, 2, admission=admission)  # type: ignore[arg-type]
    c.admit(0, 4)
    c.consume([0, 0], 0)
    c.settle(1)
    c.admit(1, 2)
    return c


def test_needed_and_selection_by_hand() -> None:
    k, b = 1, 2
    c = _two_due_two_new("deadline")
    # need(x) = N(x) - (x + k - u) * B with u = 1: x = 0: 2 - 0 = 2; x = 1: 4 - 2 = 2.
    assert c.needed() == [(0, 2), (1, 2)]
    assert c.select_batch([1, 1]) is None  # the two new ones finished first: not a valid batch
    assert c.select_batch([1, 0, 1]) is None  # one version-0 group is still missing
    assert c.select_batch([1, 0, 1, 0]) == [1, 3]
    # The bounded rule takes the first B in queue order and needs nothing.
    bounded = StalenessController(k, b)
    assert bounded.select_batch([1, 1, 0]) == [0, 1]
    assert bounded.needed() == []


def test_deadline_consume_rejects_a_batch_that_leaves_a_group_behind() -> None:
    c = StalenessController(1, 2, admission="deadline")
    c.admit(0, 4)
    c.consume([0, 0], 0)
    c.settle(1)
    c.admit(1, 2)
    with pytest.raises(StalenessError, match="took 0 group"):
        c.consume([1, 1], 1)


def test_deadline_admission_waits_for_an_engine_behind_an_outstanding_group() -> None:
    """(D) with all outstanding groups <= v_e: capacity (v_e + k - u + 1) * B - O; an engine older
    than an outstanding group admits nothing until it catches up."""
    k, b = 2, 2
    c = StalenessController(k, b, train_version=3, admission="deadline")
    c.admit(3, 6)  # x = 3: (3 + 2 - 3 + 1) * 2 = 6
    assert c.capacity(3) == 0
    assert c.capacity(2) == 0  # behind the version-3 groups
    c.consume([3, 3], 3)
    c.settle(4)
    assert c.capacity(2) == 0  # (2 + 2 - 4 + 1) * 2 - 4 = -2 even without the version check
    assert c.capacity(3) == 0  # (3 + 2 - 4 + 1) * 2 - 4 = 0
    assert c.capacity(4) == 2  # x = 4: (4 + 2 - 4 + 1) * 2 - 4 = 2
    # Without the version check an engine at 2 could admit here: (2 + 2 - 3 + 1) * 2 - 2 = 2.
    d = StalenessController(k, b, train_version=3, admission="deadline")
    d.admit(3, 2)
    assert d.capacity(3) == 4
    assert d.capacity(2) == 0


def _simulate_deadline(k: int, b: int, steps: int, seed: int, drop_p: float) -> tuple[int, int]:
    """Random admissions up to capacity, adversarial completions (the newest finish first, the
    oldest last), the trainer taking `select_batch()` or waiting. The test checks the bound with its
    own arithmetic: no group is trained, or still outstanding, more than k versions after its
    admission. Returns (max lag, admissions)."""
    rng = random.Random(seed)
    c = StalenessController(k, b, admission="deadline")
    engine_version = u = admitted = max_lag = 0
    generating: list[int] = []
    finished: list[int] = []
    for _ in range(steps):
        room = c.capacity(engine_version)
        if room:
            m = rng.randint(1, room)
            c.admit(engine_version, m)
            generating += [engine_version] * m
            admitted += m
        generating.sort(reverse=True)  # newest first to finish
        for _ in range(rng.randint(0, max(0, len(generating) - 1))):
            v = generating.pop(0)
            if rng.random() < drop_p:
                c.drop(v)
            else:
                finished.append(v)
        pick = c.select_batch(finished)
        if pick is None and rng.random() < 0.3:
            finished.extend(generating)  # the trainer waited until the old groups finished too
            generating = []
            pick = c.select_batch(finished)
        if pick is not None:
            batch = [finished[i] for i in pick]
            finished = [v for i, v in enumerate(finished) if i not in set(pick)]
            lags = c.consume(batch, u)
            assert lags == [u - v for v in batch]
            max_lag = max(max_lag, *(u - v for v in batch))
            if rng.random() < 0.9:
                u += 1
            c.settle(u)
            if rng.random() < 0.8:
                engine_version = u
        elif rng.random() < 0.5:
            engine_version = u
        # Independent check of the bound for what is still outstanding: trained at >= u.
        assert all(u - v <= k for v in generating + finished)
    return max_lag, admitted


@pytest.mark.parametrize("k,b", [(0, 1), (1, 2), (2, 3), (4, 4), (8, 2), (8, 8)])
def test_deadline_bound_holds_in_random_histories(k: int, b: int) -> None:
    for seed in range(5):
        max_lag, admitted = _simulate_deadline(k, b, steps=300, seed=seed, drop_p=0.2)
        assert max_lag <= k
        assert admitted > 50  # never deadlocked


@pytest.mark.parametrize("k,b", [(2, 2), (8, 4)])
def test_deadline_capacity_dominates_the_bounded_one(k: int, b: int) -> None:
    """(I) implies (D): in every state reached, the deadline rule admits at least what the bounded
    rule would, and strictly more in states that arise under a long tail (generators kept busy)."""
    rng = random.Random(0)
    c = StalenessController(k, b, admission="deadline")
    generating: list[int] = []
    finished: list[int] = []
    u = more = 0
    for _ in range(300):
        bounded = StalenessController(k, b)
        bounded.load_state_dict(c.state_dict())
        for v in (u - 1, u):
            assert c.capacity(v) >= bounded.capacity(v)
            more += c.capacity(v) > bounded.capacity(v)
        room = c.capacity(u)
        c.admit(u, room)
        generating += [u] * room
        generating.sort(reverse=True)
        finished += [generating.pop(0) for _ in range(min(len(generating) - 1, rng.randint(0, 2 * b)))]
        pick = c.select_batch(finished)
        if pick is None:  # the trainer waits: the old groups finish too
            finished, generating = finished + generating, []
            pick = c.select_batch(finished)
        if pick is None:
            continue
        c.consume([finished[i] for i in pick], u)
        finished = [v for i, v in enumerate(finished) if i not in set(pick)]
        u += 1
        c.settle(u)
    assert more > 0


def test_max_outstanding_caps_admission_under_both_rules() -> None:
    for admission in ("bounded", "deadline"):
        c = StalenessController(8, 4, admission=admission, max_outstanding=10)
        assert c.capacity(0) == 10  # the rule alone: (0 + 8 - 0 + 1) * 4 = 36
        c.admit(0, 7)
        assert c.capacity(0) == 3
        with pytest.raises(StalenessError, match="exceeds the capacity 3"):
            c.admit(0, 4)
        c.consume([0, 0, 0, 0], 0)
        c.settle(1)
        assert c.capacity(1) == 7  # 10 - 3 (the rules alone: 33 deadline, 29 bounded)
    with pytest.raises(ValueError, match="max_outstanding"):
        StalenessController(2, 4, max_outstanding=3)  # below B: a step could never fill


@pytest.mark.parametrize("cap", [2, 3, 8])
def test_capped_deadline_rule_keeps_the_bound_and_the_cap(cap: int) -> None:
    k, b = 4, 2
    rng = random.Random(cap)
    c = StalenessController(k, b, admission="deadline", max_outstanding=cap)
    generating: list[int] = []
    finished: list[int] = []
    u = trained = 0
    for _ in range(300):
        room = c.capacity(u)
        c.admit(u, room)
        generating += [u] * room
        assert c.outstanding == len(generating) + len(finished) <= cap
        generating.sort(reverse=True)
        finished += [generating.pop(0) for _ in range(rng.randint(0, max(0, len(generating) - 1)))]
        pick = c.select_batch(finished)
        if pick is None and rng.random() < 0.5:
            finished, generating = finished + generating, []
            pick = c.select_batch(finished)
        if pick is not None:
            batch = [finished[i] for i in pick]
            assert all(u - v <= k for v in batch)
            c.consume(batch, u)
            finished = [v for i, v in enumerate(finished) if i not in set(pick)]
            trained += b
            u += 1
            c.settle(u)
    assert trained > 100  # never deadlocked


# ------------------------------------------------------------------------------ partial rollouts
def test_partial_renewal_by_hand() -> None:
    """k=1, B=2: after the step at version 0, two version-0 groups are due now (need(0) = 2) but
    only the two version-1 groups finished. `shortfall` names the version and the count; renewing
    the two blockers at the engine's version 1 makes the finished pair a valid batch."""
    c = _two_due_two_new("partial")
    assert c.select_batch([1, 1]) is None
    assert c.shortfall([1, 1]) == (0, 2)
    assert c.shortfall([1, 0, 1]) == (0, 1)  # one version-0 group finished: one is missing
    assert c.shortfall([1]) is None  # fewer than B queued: nothing to decide yet
    c.renew([0, 0], 1)
    assert c.renewed == 2 and c.outstanding == 4 and c.oldest_version == 1
    # need(1) = N(1) - (1 + k - u) * B = 4 - 2 = 2: any two of the version-1 groups.
    assert c.needed() == [(1, 2)]
    assert c.shortfall([1, 1]) is None and c.select_batch([1, 1]) == [0, 1]
    assert c.consume([1, 1], 1) == [0, 0]
    assert c.state_dict()["renewed"] == 2


def test_renew_refuses_what_it_cannot_do() -> None:
    deadline = StalenessController(1, 2, admission="deadline")
    deadline.admit(0, 2)
    assert deadline.shortfall([0, 0]) is None
    with pytest.raises(StalenessError, match="only the partial rule"):
        deadline.renew([0], 1)
    c = StalenessController(2, 2, admission="partial")
    c.admit(0, 2)
    c.admit(1, 1)
    with pytest.raises(StalenessError, match="cannot move to 1"):
        c.renew([1], 1)  # not newer
    with pytest.raises(StalenessError, match="3 group"):
        c.renew([0, 0, 0], 2)  # two outstanding
    with pytest.raises(StalenessError, match="of version 5"):
        c.renew([5], 6)
    assert c.renewed == 0 and c.outstanding == 3  # nothing half-done


@pytest.mark.parametrize("k,b", [(1, 2), (2, 3), (4, 4), (8, 2)])
def test_partial_rule_never_waits_and_keeps_its_bound(k: int, b: int) -> None:
    """Random admissions, adversarial completions (the newest finish first), the trainer taking a
    batch whenever B groups are queued: blocking groups are renewed (the most recent first, as the
    generator does) instead of waited for. Checked with the test's own arithmetic on each group's
    current admission version: (D) after every event, every trained group within k of its last
    admission, and the trainer never waits with B groups queued."""
    rng = random.Random(k * 100 + b)
    c = StalenessController(k, b, admission="partial")
    generating: list[int] = []  # current admission versions of groups still generating
    finished: list[int] = []
    u = trained = renewed = 0

    def check_d() -> None:
        everything = sorted(generating + finished)
        for x in set(everything):
            assert sum(v <= x for v in everything) <= (x + k - u + 1) * b

    for _ in range(400):
        room = c.capacity(u)
        c.admit(u, room)
        generating += [u] * room
        check_d()
        generating.sort(reverse=True)
        finished += [generating.pop(0) for _ in range(rng.randint(0, max(0, len(generating) - 1)))]
        if len(finished) >= b:
            while (short := c.shortfall(finished)) is not None:
                x, missing = short
                movers = sorted((v for v in generating if v <= x), reverse=True)[:missing]
                assert len(movers) == missing and u > x  # always possible with the engine at u
                c.renew(movers, u)
                for v in movers:
                    generating.remove(v)
                generating += [u] * missing
                renewed += missing
                check_d()
            pick = c.select_batch(finished)
            assert pick is not None  # the trainer never waits with B groups queued
            batch = [finished[i] for i in pick]
            assert all(u - v <= k for v in batch)
            c.consume(batch, u)
            finished = [v for i, v in enumerate(finished) if i not in set(pick)]
            trained += 1
            u += 1
            c.settle(u)
            check_d()
    assert trained > 100 and renewed > 0 and c.renewed == renewed
