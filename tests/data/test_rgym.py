"""reasoning-gym as a prompt source and verifier (scalerl/data/rgym.py, scalerl/rewards/rgym.py):
the mix's counts, the records, the config's rules, and our reward against reasoning-gym's own
score on its reference answers (and on wrong ones) for every dataset docs/data.md uses."""

from __future__ import annotations

import pytest

from scalerl.config import ConfigError, load_config
from scalerl.data import DataError
from scalerl.data.rgym import make_reasoning_gym, mix_counts

rg = pytest.importorskip("reasoning_gym")

DOC_DATASETS = ("leg_counting", "chain_sum", "basic_arithmetic", "spell_backward")


def test_mix_counts_largest_remainder() -> None:
    assert mix_counts({"a": 1, "b": 1, "c": 1}, 10) == {"a": 4, "b": 3, "c": 3}
    assert mix_counts({"a": 3, "b": 1}, 10) == {"a": 8, "b": 2}  # 7.5, 2.5: the tie goes to the first
    assert sum(mix_counts({"a": 0.2, "b": 0.7, "c": 0.1}, 7).values()) == 7
    with pytest.raises(ValueError):
        mix_counts({"a": 0.0}, 3)


def test_records_from_a_weighted_mix() -> None:
    recs = make_reasoning_gym({"leg_counting": (3.0, {"min_animals": 2, "max_animals": 3}),
                               "chain_sum": (1.0, {})}, 8, seed=4)
    tasks = [r.task for r in recs]
    assert tasks.count("rg_leg_counting") == 6 and tasks.count("rg_chain_sum") == 2
    ref = rg.create_dataset("leg_counting", size=6, seed=4, min_animals=2, max_animals=3)
    first = recs[0]
    assert (first.id, first.prompt) == ("rg/leg_counting/0", ref[0]["question"])
    assert first.answer == ref[0]["answer"]
    assert first.metadata["reasoning_gym"]["options"] == {"min_animals": 2, "max_animals": 3}
    with pytest.raises(DataError, match="no reasoning-gym dataset 'leg_countin'; did you mean leg_counting"):
        make_reasoning_gym({"leg_countin": (1.0, {})}, 2, 0)
    with pytest.raises(DataError, match=r"datasets\.leg_counting: reasoning-gym 'leg_counting' refused"):
        make_reasoning_gym({"leg_counting": (1.0, {"bogus": 1})}, 2, 0)


def test_config_rules_and_run_records() -> None:
    from scalerl.assembly.sections import load_records

    cfg = load_config(overrides=["data.source=reasoning_gym:chain_sum", "data.reasoning_gym.size=5",
                                 "data.reasoning_gym.config.min_terms=2",
                                 "data.reasoning_gym.config.max_terms=2"])
    recs = load_records(cfg)
    assert len(recs) == 5 and {r.task for r in recs} == {"rg_chain_sum"}
    assert all(r.prompt.count("+") + r.prompt.count(" - ") == 1 for r in recs)  # two terms
    for bad, match in [(["data.source=gym:x"], "expected 'reasoning_gym:<dataset>'"),
                       (["data.source=reasoning_gym"], "is a mix"),
                       (["data.source=reasoning_gym:a", "data.train_path=x.jsonl"], "one prompt source")]:
        with pytest.raises(ConfigError, match=match):
            load_config(overrides=bad)


@pytest.mark.parametrize("name", DOC_DATASETS)
def test_reward_equals_reasoning_gyms_score(name: str) -> None:
    from scalerl.rewards import RewardRouter
    from scalerl.rewards.rgym import verify_reasoning_gym

    recs = make_reasoning_gym({name: (1.0, {})}, 6, seed=1)
    ds = rg.create_dataset(name, size=6, seed=1)
    router = RewardRouter({"partial_credit": True})
    try:
        router.check_tasks({f"rg_{name}"})
        for rec, entry in zip(recs, ds, strict=True):
            ref = entry["answer"]
            boxed = f"\\boxed{{{ref}}}" if "{" not in ref else f"<answer>{ref}</answer>"
            for text, answer in [(f"<think>ok</think><answer>{ref}</answer>", ref), (boxed, ref),
                                 ("<answer>certainly not this</answer>", "certainly not this")]:
                want = float(ds.score_answer(answer, entry))
                assert verify_reasoning_gym(text, rec).score == pytest.approx(want), (name, text)
                outcome = router.score(rec, text)
                assert outcome.reward == pytest.approx(want) and outcome.correct == (want >= 1.0)
            assert float(ds.score_answer(ref, entry)) == 1.0  # the reference earns full reward
        assert verify_reasoning_gym("no tags at all <think>", recs[0]).status == "no_answer"
    finally:
        router.close()
