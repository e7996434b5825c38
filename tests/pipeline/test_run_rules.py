"""Run-level rules act in a built run (`scalerl.assembly.build_training`, a recipe, a few sync steps).

The rewards are fixed per prompt so that each rule's effect can be predicted here: a "solved"
prompt (half of them, by a hash of its id) scores 1 on every sample; any other scores below the
success threshold, differently per sample (a hash of the completion), so its groups carry signal.
What the rules do is read from the pool's draws and from the groups each optimizer step received
(the built objects' own calls, wrapped), and compared with what the rule says.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import pytest

from scalerl.assembly.build import Training, build_training
from scalerl.assembly.run import resolve_run_config
from tests.tiny_runs import warm_tiny_model

from .test_recipes_train import _config


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return warm_tiny_model(tmp_path_factory)


def _hash01(text: str) -> float:
    return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16) / 16**12


def solved(prompt_id: str) -> bool:
    return _hash01(prompt_id) < 0.5


def by_prompt(completion: str, record: Any) -> float:
    """1 for a solved prompt; below 0.5 (the success threshold) and varied otherwise."""
    return 1.0 if solved(record.id) else 0.4 * _hash01(f"{record.id}|{completion}")


def flat_by_prompt(completion: str, record: Any) -> float:
    """1 for a solved prompt, 0 for any other: constant raw rewards in every group."""
    return 1.0 if solved(record.id) else 0.0


def _rewards(fn: str) -> list[str]:
    return [f"rewards.verifiers.math={__name__}:{fn}", "rewards.partial_credit=true",
            "rewards.incorrect_reward=0.0", "rewards.correct_reward=1.0"]


class Recorder:
    """The pool's draws and each optimizer step's groups and metrics, from the built run."""

    def __init__(self, training: Training) -> None:
        self.draws: list[tuple[str, bool]] = []  # (prompt id, refill)
        self.steps: list[tuple[list[Any], dict[str, float]]] = []
        pool, trainer = training.pool, training.trainer
        draw, step = pool.next_prompts, trainer.step

        def next_prompts(k: int, *, refill: bool = False):
            out = draw(k, refill=refill)
            self.draws.extend((r.id, refill) for r in out)
            return out

        def recorded_step(groups):
            snapshot = [(g.record.id, list(g.rewards), [c.num_tokens for c in g.completions],
                         [c.finish_reason for c in g.completions], [list(c.loss_mask) for c in g.completions],
                         g.is_correct) for g in groups]
            metrics = step(groups)
            self.steps.append((snapshot, metrics))
            return metrics

        pool.next_prompts = next_prompts  # type: ignore[method-assign]
        trainer.step = recorded_step  # type: ignore[method-assign]


def _run(tiny_model: Path, tmp_path: Path, recipe: str, steps: int, *overrides: str,
         rewards: str = "by_prompt") -> tuple[Training, Recorder]:
    run_dir = tmp_path / "run"
    cfg = resolve_run_config(recipe, [str(_config(tiny_model, run_dir, steps))],
                             ["pipeline.off_policy=sync", *_rewards(rewards), *overrides])
    training = build_training(cfg, run_dir)
    recorder = Recorder(training)
    with training:
        training.driver.run()
    return training, recorder


@pytest.mark.parametrize("rule", [True, False], ids=["no_positive_resampling", "resampling"])
def test_no_positive_resampling_retires_solved_prompts(tiny_model: Path, tmp_path: Path, rule: bool) -> None:
    """ScaleRL's recipe (retire_threshold 0.9): a prompt whose group all succeeded leaves the pool
    and is never drawn again; with the rule off it comes back in the next epoch. 8 training prompts,
    2 per step, 10 steps: five epochs."""
    training, rec = _run(tiny_model, tmp_path, "scalerl", 10, "data.synthetic.num_prompts=12",
                         f"algorithm.no_positive_resampling={str(rule).lower()}")
    pool = training.pool
    ids = pool.active_ids + sorted(pool.retired)
    assert len(set(ids)) == 8 and any(solved(p) for p in ids) and not all(solved(p) for p in ids)
    drawn = [pid for pid, _ in rec.draws]
    solved_drawn = {p for p in drawn if solved(p)}
    assert solved_drawn
    if rule:
        assert pool.retired == solved_drawn
        assert all(drawn.count(p) == 1 for p in solved_drawn), "a retired prompt was drawn again"
        assert any(drawn.count(p) > 1 for p in drawn if not solved(p))
    else:
        assert pool.retired == set()
        assert any(drawn.count(p) > 1 for p in solved_drawn)


def test_zero_variance_groups_are_dropped_and_counted(tiny_model: Path, tmp_path: Path) -> None:
    """ScaleRL's zero-variance filter: each step drops exactly its groups of equal rewards (the
    solved prompts') and counts them (`zero_variance_frac`, `kept_samples`; an all-flat step is a
    counted no-op)."""
    _, rec = _run(tiny_model, tmp_path, "scalerl", 6, "algorithm.no_positive_resampling=false")
    flat_total = 0
    for groups, metrics in rec.steps:
        flat = [g for g in groups if len(set(g[1])) == 1]
        flat_total += len(flat)
        assert metrics["zero_variance_frac"] == pytest.approx(len(flat) / len(groups))
        if len(flat) == len(groups):
            assert metrics["skipped_no_signal"] == 1.0
        else:
            assert metrics["kept_samples"] == sum(len(g[1]) for g in groups if g not in flat)
    assert flat_total > 0


def test_dynamic_sampling_refills_dropped_groups(tiny_model: Path, tmp_path: Path) -> None:
    """DAPO's dynamic sampling (qwen_dapo + dynamic_sampling): a group of equal rewards is dropped
    before the trainer and its prompt replaced by a refill draw, so every step trains on a full
    batch of informative groups."""
    training, rec = _run(tiny_model, tmp_path, "qwen_dapo", 4, "algorithm.dynamic_sampling=true",
                         "pipeline.prompts_per_step=2")
    refills = [pid for pid, refill in rec.draws if refill]
    dropped = training.driver.generator.counters.groups_dropped
    assert dropped > 0 and len(refills) == dropped == training.pool.counters["refill_prompts"]
    assert sum(solved(pid) for pid, _ in rec.draws) == dropped  # exactly the solved prompts' groups
    for groups, metrics in rec.steps:
        assert len(groups) == 2 and all(len(set(g[1])) > 1 for g in groups)
        assert metrics["zero_variance_frac"] == 0.0


@pytest.mark.parametrize("kind", ["interruption", "none"])
def test_forced_interruption_truncates_thinking(tiny_model: Path, tmp_path: Path, kind: str) -> None:
    """ScaleRL's length control: past a think budget of 4-6 tokens the engine forces the phrase
    (masked out of the loss) and allows `answer_budget` more tokens; without it nothing is cut."""
    lc = "generation.length_control"
    _, rec = _run(tiny_model, tmp_path, "base", 2, f"{lc}.kind={kind}", f"{lc}.think_budget=[4,6]",
                  f"{lc}.answer_budget=4", f"{lc}.phrase=</think>")
    samples = [(n, reason, mask) for groups, _ in rec.steps for g in groups
               for n, reason, mask in zip(g[2], g[3], g[4], strict=True)]
    interrupted = [s for s in samples if s[1] == "interrupted"]
    rates = [m["interruption_rate"] for _, m in rec.steps]
    if kind == "none":
        assert not interrupted and rates == [0.0, 0.0]
        return
    assert interrupted and all(r > 0 for r in rates)
    for n, _, mask in interrupted:
        assert n <= 6 + len("</think>") + 4  # char tokenizer: one token per character
        assert not all(mask), "the forced phrase is trained on"


@pytest.mark.parametrize("kind", ["kimi", "none"])
def test_the_kimi_length_reward_changes_rewards(tiny_model: Path, tmp_path: Path, kind: str) -> None:
    """Kimi k1.5 §2.3.3 (kimi_k15, warm-up 0): r' = r + coef * len_reward with
    lambda = 0.5 - (len - min) / (max - min) over the group (0 when all lengths are equal),
    len_reward = lambda if correct else min(0, lambda). Raw rewards here are 1 or 0 per prompt."""
    lc = "generation.length_control"
    _, rec = _run(tiny_model, tmp_path, "kimi_k15", 2, f"{lc}.kind={kind}", f"{lc}.kimi_warmup_steps=0",
                  f"{lc}.kimi_coef=0.3", "generation.n=4", "generation.max_new_tokens=24",
                  "pipeline.off_policy=sync", rewards="flat_by_prompt")
    changed = 0
    for groups, _ in rec.steps:
        for pid, shaped, lengths, *_ in groups:
            raw = 1.0 if solved(pid) else 0.0
            lo, hi = min(lengths), max(lengths)
            want = []
            for n in lengths:
                lam = 0.5 - (n - lo) / (hi - lo) if hi > lo else 0.0
                bonus = lam if raw > 0.5 else min(0.0, lam)
                want.append(raw + (0.3 * bonus if kind == "kimi" else 0.0))
            assert shaped == pytest.approx(want, abs=1e-9), (pid, lengths)
            changed += any(not math.isclose(s, raw) for s in shaped)
    assert (changed > 0) == (kind == "kimi")


@pytest.mark.parametrize("order", ["easy_to_hard", "shuffle"])
def test_the_curriculum_opens_the_easiest_prompts_first(tiny_model: Path, tmp_path: Path, order: str) -> None:
    """kimi_k15's curriculum: after fewer than `ramp_prompts` draws only the easiest
    `start_fraction` (a quarter) of the prompts can be drawn; shuffled, harder ones come too."""
    training, rec = _run(tiny_model, tmp_path, "kimi_k15", 3, f"algorithm.curriculum.order={order}",
                         "pipeline.prompts_per_step=4")
    pool = training.pool
    levels = sorted(int(pool.record(pid).metadata["difficulty"]) for pid in pool.active_ids)
    cut = levels[math.ceil(0.25 * len(levels)) - 1]  # the hardest level inside the easiest quarter
    drawn = [int(pool.record(pid).metadata["difficulty"]) for pid, _ in rec.draws]
    assert len(drawn) == 12
    if order == "easy_to_hard":
        assert max(drawn) <= cut
    else:
        assert max(drawn) > cut
