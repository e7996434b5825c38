"""Reward functions in TRL's and verl's signatures, imported by tests/rewards/test_functions.py by
dotted path (`tests.rewards.reward_fns:NAME`)."""

from __future__ import annotations

import asyncio
from typing import Any

CALLS: list[dict[str, Any]] = []


def contains_answer(prompts: list[Any], completions: list[Any], answer: list[str],
                    **kwargs: Any) -> list[float]:
    """TRL style: 1.0 where the completion holds the gold answer."""
    CALLS.append({"prompts": prompts, "completions": completions, "answer": answer, **kwargs})
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer, strict=True)]


def half_or_none(prompts: list[Any], completions: list[str], **kwargs: Any) -> list[float | None]:
    """TRL style: None (no score) for completions starting with '?', else 0.5 per 'x' in it."""
    return [None if c.startswith("?") else 0.5 * c.count("x") for c in completions]


def short_list(prompts: list[Any], completions: list[str], **kwargs: Any) -> list[float]:
    """TRL style, broken: one score too few."""
    return [1.0] * (len(completions) - 1)


def raises(prompts: list[Any], completions: list[str], **kwargs: Any) -> list[float]:
    raise RuntimeError("reward server down")


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> dict:
    """verl style: a dict with 'score' (verl's default_compute_score may return one)."""
    return {"score": 0.25 if ground_truth in solution_str else 0.0, "acc": ground_truth in solution_str}


async def async_len(prompts: list[Any], completions: list[str], **kwargs: Any) -> list[float]:
    """An async TRL-style function."""
    await asyncio.sleep(0)
    return [float(len(c)) for c in completions]


def ambiguous(text: str) -> float:
    return 0.0
