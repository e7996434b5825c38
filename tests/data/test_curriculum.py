"""Kimi k1.5 sampling in the prompt pool: easy-to-hard frontier, failure-rate priority, resume."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from scalerl.config import CurriculumConfig
from scalerl.data import PoolExhaustedError, PromptPool, PromptRecord
from scalerl.data.curriculum import (
    curriculum_frontier,
    difficulty_ranks,
    draw_weighted,
    failure_rate_weights,
)


def _records(n: int, levels: int = 5) -> list[PromptRecord]:
    return [PromptRecord(id=f"p{i}", task="math", prompt=f"q{i}", answer=str(i),
                         metadata={"difficulty": 1 + i % levels}, source=f"f.jsonl:{i + 1}")
            for i in range(n)]


def test_frontier_grows_linearly_from_the_start_share_to_everything() -> None:
    assert curriculum_frontier(0, 100, 0.2) == pytest.approx(0.2)
    assert curriculum_frontier(50, 100, 0.2) == pytest.approx(0.6)
    assert curriculum_frontier(100, 100, 0.2) == curriculum_frontier(10_000, 100, 0.2) == 1.0


def test_difficulty_ranks_order_easy_first_either_way_round() -> None:
    records = _records(10)
    ranks = difficulty_ranks(records, "difficulty", "higher", seed=0)
    by_rank = sorted(records, key=lambda r: ranks[r.id])
    assert [r.metadata["difficulty"] for r in by_rank] == sorted(r.metadata["difficulty"] for r in records)
    # A pass-rate column: lower is harder, so the highest pass rate comes first.
    lowered = difficulty_ranks(records, "difficulty", "lower", seed=0)
    assert sorted(records, key=lambda r: lowered[r.id])[0].metadata["difficulty"] == 5


def test_failure_rate_weights_and_the_uniform_fallback() -> None:
    assert failure_rate_weights([0.0, 0.25, 1.0]).tolist() == [1.0, 0.75, 0.0]
    rng = np.random.default_rng(0)
    picked, fell_back = draw_weighted(rng, np.array([0.0, 1.0, 0.0]), 3)
    assert picked == [1, 1, 1] and not fell_back  # one index with weight: drawn with replacement
    picked, fell_back = draw_weighted(rng, np.zeros(4), 4)
    assert fell_back and sorted(picked) == [0, 1, 2, 3]


def test_easy_to_hard_opens_the_easiest_prompts_first_then_all() -> None:
    spec = CurriculumConfig(order="easy_to_hard", ramp_prompts=400, start_fraction=0.2)
    pool = PromptPool(_records(100), seed=0, no_positive_resampling=False, curriculum=spec)
    first = pool.next_prompts(20)
    # 20% of 100 prompts open: the 20 of difficulty 1 (the easiest of five equal levels), each once
    # (no replacement within a draw).
    assert {p.metadata["difficulty"] for p in first} == {1} and len({p.id for p in first}) == 20
    assert pool.frontier == pytest.approx(0.2 + 0.8 * 20 / 400)
    for _ in range(19):
        pool.next_prompts(20)
    assert pool.frontier == 1.0
    late = Counter(p.metadata["difficulty"] for _ in range(20) for p in pool.next_prompts(40))
    assert set(late) == {1, 2, 3, 4, 5}
    assert pool.stats()["curriculum_frontier"] == 1.0


def test_failure_rate_priority_samples_in_proportion_to_one_minus_success() -> None:
    spec = CurriculumConfig(priority="failure_rate")
    pool = PromptPool(_records(3), seed=0, no_positive_resampling=False, curriculum=spec)
    pool.report("p0", [1.0, 1.0, 1.0, 1.0])  # solved: weight 0
    pool.report("p1", [1.0, 0.0, 1.0, 0.0])  # half: weight 0.5
    # p2 never drawn: weight 1.
    counts = Counter(p.id for _ in range(3000) for p in pool.next_prompts(1))
    assert counts["p0"] == 0
    assert counts["p2"] / counts["p1"] == pytest.approx(2.0, rel=0.12)


def test_retired_prompts_are_never_drawn_and_exhaustion_is_an_error() -> None:
    spec = CurriculumConfig(priority="failure_rate")
    pool = PromptPool(_records(2), seed=0, retire_threshold=0.9, curriculum=spec)
    pool.report("p0", [1.0, 1.0])
    assert {p.id for p in pool.next_prompts(10)} == {"p1"}
    pool.report("p1", [1.0, 1.0])
    with pytest.raises(PoolExhaustedError):
        pool.next_prompts(1)


def test_a_restored_pool_draws_what_the_original_would_have() -> None:
    spec = CurriculumConfig(order="easy_to_hard", priority="failure_rate", ramp_prompts=60,
                            start_fraction=0.3)
    a = PromptPool(_records(50), seed=3, no_positive_resampling=False, curriculum=spec)
    for _ in range(4):
        for p in a.next_prompts(8):
            a.report(p.id, [1.0, 0.0] if int(p.id[1:]) % 2 else [0.0, 0.0])
    state = json.loads(json.dumps(a.state_dict()))
    b = PromptPool(_records(50), seed=3, no_positive_resampling=False, curriculum=spec)
    b.load_state_dict(state)
    assert [p.id for p in a.next_prompts(16)] == [p.id for p in b.next_prompts(16)]
    assert a.curriculum_draws == b.curriculum_draws == 48
    # A state saved before the curriculum existed still loads (no draws yet).
    legacy = dict(state)
    legacy.pop("curriculum")
    c = PromptPool(_records(50), seed=3, no_positive_resampling=False, curriculum=spec)
    c.load_state_dict(legacy)
    assert c.curriculum_draws == 0


def test_a_record_without_a_difficulty_is_named() -> None:
    records = _records(3)
    records[1].metadata.pop("difficulty")
    with pytest.raises(ValueError, match=r"difficulty_key: prompt 'p1' \(f\.jsonl:2\) has no numeric"):
        PromptPool(records, seed=0, curriculum=CurriculumConfig(order="easy_to_hard"))


def test_a_dotted_key_reads_the_pass_rate_scalerl_data_difficulty_writes() -> None:
    """`metadata["model_difficulty"]["pass_rate"]` ranks with `harder="lower"`: highest pass rate first."""
    records = [PromptRecord(id=f"p{i}", task="math", prompt="q", answer="1",
                            metadata={"model_difficulty": {"pass_rate": rate, "k": 10}})
               for i, rate in enumerate([0.3, 0.9, 0.0, 0.6])]
    ranks = difficulty_ranks(records, "model_difficulty.pass_rate", "lower", seed=0)
    assert sorted(ranks, key=ranks.get) == ["p1", "p3", "p0", "p2"]
    records[2].metadata["model_difficulty"].pop("pass_rate")
    missing = r"prompt 'p2' has no numeric metadata\['model_difficulty.pass_rate'\]"
    with pytest.raises(ValueError, match=missing):
        difficulty_ranks(records, "model_difficulty.pass_rate", "lower", seed=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"order": "random"}, r"(?s)order.*'shuffle' or 'easy_to_hard'"),
     ({"priority": "x"}, r"(?s)priority.*'uniform' or 'failure_rate'"),
     ({"ramp_prompts": 0}, r"(?s)ramp_prompts.*greater than 0"), ({"start_fraction": 0.0}, "start_fraction")],
)
def test_bad_specs_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CurriculumConfig(**kwargs)


def test_the_default_spec_keeps_the_epoch_shuffles() -> None:
    plain = PromptPool(_records(10), seed=0)
    with_default = PromptPool(_records(10), seed=0, curriculum=CurriculumConfig())
    assert [p.id for p in plain.next_prompts(15)] == [p.id for p in with_default.next_prompts(15)]
    assert "curriculum_frontier" not in plain.stats()
