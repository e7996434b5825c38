"""`spawn_ranks`: results in rank order; a rank that raises, dies or hangs becomes an error that
names it, well within the timeouts (not the 30-minute default of a process group)."""

from __future__ import annotations

import time

import pytest
from rank_faults import failing_job, sum_job

from scalerl.distributed import RankFailedError, spawn_ranks

pytestmark = pytest.mark.distributed


def test_results_come_back_in_rank_order():
    # all_reduce of (rank + 5) over 2 ranks = 11
    assert spawn_ranks(sum_job, 2, args=(5,), timeout_s=30) == [1100, 1101]


@pytest.mark.parametrize("mode", ["raise", "exit"])
def test_a_failing_rank_is_named(mode):
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        spawn_ranks(failing_job, 2, args=(mode,), timeout_s=60)
    elapsed = time.monotonic() - start
    assert info.value.rank == 1
    if mode == "raise":
        assert "rank 1 of 2 raised" in str(info.value) and "ValueError: boom on purpose" in str(info.value)
    else:
        assert "rank 1 of 2 exited with code 3" in str(info.value)
    assert elapsed < 45, f"took {elapsed:.0f}s: the failure was not noticed before the collective timeout"


def test_a_hanging_peer_times_out_after_timeout_s():
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        spawn_ranks(failing_job, 2, args=("hang",), timeout_s=3)
    elapsed = time.monotonic() - start
    # Rank 0's barrier gives up after timeout_s ("Timed out waiting 3000ms for recv ...").
    assert info.value.rank == 0
    assert "rank 0 of 2 raised" in str(info.value) and "Timed out" in str(info.value)
    assert elapsed < 60, f"took {elapsed:.0f}s"
