"""The engine of each turn of an episode (an engine pool stamps `ENGINE_METADATA_KEY` on what it
returns): recorded per model turn in `metadata["agentic"]["turn_engines"]`, switches counted
(`agentic_engine_switches`); and the pool's sum of its engines' vLLM figures."""

from __future__ import annotations

from typing import Any

import pytest

from scalerl.agentic.metrics import agentic_metrics, engine_switches
from scalerl.rollout.protocol import ENGINE_METADATA_KEY
from scalerl.rollout.vllm_engine import VLLMStats, combined_figures
from tests.agentic.test_rollout import make_engine, run, solver


@pytest.mark.parametrize(("engines", "switches"), [
    ([], 0), ([1], 0), ([0, 0, 0], 0), ([0, 1, 1, 0], 2), ([None, 0, None, 1], 1), ([None, None], 0)])
def test_engine_switches_count_changes_between_known_engines(engines: list[Any], switches: int) -> None:
    assert engine_switches(engines) == switches


class Stamping:
    """Wraps an engine, stamping each completion with the engine of a turn: `engine_of(turn)`."""

    def __init__(self, inner: Any, engine_of: Any) -> None:
        self.inner, self.engine_of, self.turn = inner, engine_of, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def step(self) -> list[Any]:
        out = self.inner.step()
        for c in out:
            c.metadata = {**c.metadata, ENGINE_METADATA_KEY: self.engine_of(self.turn)}
            self.turn += 1
        return out


@pytest.mark.parametrize(("engine_of", "expected", "switches"), [
    (lambda turn: 1, [1, 1], 0.0),  # both turns on engine 1: the episode stayed
    (lambda turn: turn, [0, 1], 1.0),  # the second turn ran elsewhere (its engine died)
])
def test_an_episode_records_the_engine_of_every_turn(engine_of: Any, expected: list[int],
                                                     switches: float) -> None:
    engine, inner = make_engine(solver, continuable=False)
    engine.inner = Stamping(inner, engine_of)
    (c,) = run(engine)
    info = c.metadata["agentic"]
    assert info["turns"] == 2 and info["turn_engines"] == expected
    assert agentic_metrics([c])["agentic_engine_switches"] == switches


def test_a_single_engine_records_no_engine() -> None:
    (c,) = run(make_engine(solver, continuable=False)[0])
    assert c.metadata["agentic"]["turn_engines"] == [None, None]
    assert agentic_metrics([c])["agentic_engine_switches"] == 0.0


def test_combined_figures_sum_the_counters_and_recompute_the_hit_rate() -> None:
    a = VLLMStats(requests=3, prompt_tokens=100, cached_prompt_tokens=10).figures()
    b = VLLMStats(requests=1, prompt_tokens=300, cached_prompt_tokens=150).figures()
    out = combined_figures([a, {}, b])  # an engine without vLLM figures adds nothing
    assert out == VLLMStats(requests=4, prompt_tokens=400, cached_prompt_tokens=160).figures()
    assert out["vllm_prefix_hit_rate"] == pytest.approx(160 / 400)  # not the mean of 0.1 and 0.5
    assert combined_figures([{}, {}]) == {} and combined_figures([]) == {}
