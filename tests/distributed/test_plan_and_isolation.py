"""Fast checks without spawning ranks: the row split and lockstep plan, and that the
single-process code never imports `scalerl.distributed`."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from scalerl.distributed.collectives import lockstep_plan, rank_rows, row_slice
from scalerl.training.collectives import StepCollectives
from scalerl.training.packing import MicroBatching


@pytest.mark.parametrize("n", [0, 1, 2, 7, 15, 16])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_rows_are_split_into_disjoint_balanced_slices(n, world):
    slices = [row_slice(n, r, world) for r in range(world)]
    assert [i for s in slices for i in s] == list(range(n))
    assert max(map(len, slices)) - min(map(len, slices)) <= 1


def _lengths(n: int, seed: int = 0) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(1, 20), rng.randint(0, 200)) for _ in range(n)]


@pytest.mark.parametrize("n,size,world", [(15, 7, 2), (15, 2, 2), (1, 4, 2), (3, 1, 4), (16, 64, 2)])
@pytest.mark.parametrize("tokens", [None, 150, 1])
def test_lockstep_plan_covers_each_row_once_with_equal_pass_counts(n, size, world, tokens):
    lengths = _lengths(n)
    batching = MicroBatching(samples=size, tokens=tokens, packed=tokens is not None)
    plans = [lockstep_plan(lengths, batching, r, world) for r in range(world)]
    assert len({len(p) for p in plans}) == 1, "every rank must run the same number of passes"
    assert sorted(i for p in plans for mb in p for i in mb) == list(range(n))
    if tokens is None:
        assert all(len(mb) <= size for p in plans for mb in p)
    else:
        assert all(batching.cost([lengths[i] for i in mb]) <= tokens or len(mb) == 1
                   for p in plans for mb in p)
    # Padding passes come last and only where a rank ran out of rows.
    for p in plans:
        assert all(mb for mb in p[: sum(1 for mb in p if mb)])


def test_lockstep_plan_example():
    # 15 rows, 7 per micro-batch: rank 0 has rows 0-6 (one pass, then a padding pass), rank 1 rows 7-14.
    lengths = [(1, 1)] * 15
    assert lockstep_plan(lengths, MicroBatching(samples=7), 0, 2) == [list(range(7)), []]
    assert lockstep_plan(lengths, MicroBatching(samples=7), 1, 2) == [list(range(7, 14)), [14]]


def test_token_budgets_balance_ranks_by_tokens_not_samples():
    # One long sample and many short ones: a sample split gives rank 0 the long one plus half the
    # short ones; the token split gives it the long one alone.
    lengths = [(10, 990)] + [(5, 45)] * 19
    batching = MicroBatching(tokens=4000, packed=True)
    loads = [sum(sum(lengths[i]) for i in rank_rows(lengths, batching, r, 2)) for r in range(2)]
    assert loads == [1000, 950]
    by_samples = [sum(sum(lengths[i]) for i in row_slice(20, r, 2)) for r in range(2)]
    assert by_samples == [1450, 500]


def test_single_process_plan_is_plain_micro_batches():
    assert StepCollectives().micro_batch_plan([(1, 1)] * 5, MicroBatching(samples=2)) == [[0, 1], [2, 3], [4]]
    assert not StepCollectives.lockstep


def test_single_process_code_does_not_import_scalerl_distributed():
    code = (
        "import sys, scalerl.cli, scalerl.assembly.build, scalerl.assembly.run, scalerl.cli.train, "
        "scalerl.training, scalerl.training.trainer, scalerl.rollout.factory\n"
        "bad = sorted(m for m in sys.modules if m.startswith('scalerl.distributed'))\n"
        "print(bad)\nsys.exit(1 if bad else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
