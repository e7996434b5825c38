"""Per-step pipeline metrics: what the consumed batch looked like and what the generator did meanwhile.

`batch_metrics` describes the groups a step trains on: their staleness (`version_lag_*`: trainer
version at train time minus each sample's `start_version`, the quantity `max_lag` bounds except
under `pipeline.admission: partial`, where it is the lag of a continued sample's first token;
`token_lag_*`: the same per generated token, smaller under in-flight updates), truncation and
interruption rates, rewards and lengths, overall and per task (`pass_rate/math`, ...: multi-task
runs get a curve per domain). `IntervalMeter` turns the generator's cumulative counters
and clocks into per-step rates: generated tokens/s, generator idle fraction, prompts drawn,
groups dropped by dynamic sampling.

In the interleaved schedule the generator and the trainer share one thread, so wall-clock idle
time says nothing about the pipeline; `gen_idle_frac` is then counted in its simulated time: the
share of the interval's ticks with nothing for the engine to run (`tick_idle=True`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from scalerl.data.modes import row_mode
from scalerl.pipeline.generator import Generator
from scalerl.pipeline.interfaces import ReadyGroup
from scalerl.rollout.protocol import Completion


def batch_metrics(items: Sequence[ReadyGroup], train_version: int) -> dict[str, float]:
    """Statistics of the groups trained at `train_version` (all samples, before any trainer filter)."""
    samples = [c for it in items for c in it.group.completions]
    if not samples:
        raise ValueError("batch_metrics: no samples")
    rewards = [r for it in items for r in it.group.rewards]
    correct = [ok for it in items for ok in it.group.is_correct]
    lags = [train_version - c.start_version for c in samples]
    token_lags = [train_version - v for c in samples for v in c.versions]
    lengths = [c.num_tokens for c in samples]
    n = len(samples)
    return {
        "version_lag_mean": sum(lags) / n,
        "version_lag_max": float(max(lags)),
        "token_lag_mean": sum(token_lags) / len(token_lags) if token_lags else 0.0,
        "token_lag_max": float(max(token_lags)) if token_lags else 0.0,
        "truncation_rate": sum(c.finish_reason == "length" for c in samples) / n,
        "interruption_rate": sum(c.finish_reason == "interrupted" for c in samples) / n,
        "reward_mean": sum(rewards) / n,
        "pass_rate": sum(correct) / n,
        "response_length_mean": sum(lengths) / n,
        "response_length_max": float(max(lengths)),
        "batch_groups": float(len(items)),
        "batch_samples": float(n),
        **task_metrics(items),
        **_agentic(samples),
    }


def task_metrics(items: Sequence[ReadyGroup]) -> dict[str, float]:
    """Reward, pass rate, length and sample count of each task in the batch, as `<name>/<task>` keys.

    Every task present gets its keys (a single-task run too, so a run's per-task curves never
    depend on how many tasks it mixes); a task absent from this batch has none in this row.
    """
    by_task: dict[str, list[ReadyGroup]] = {}
    for it in items:
        by_task.setdefault(it.group.record.task, []).append(it)
    out: dict[str, float] = {}
    for task in sorted(by_task):
        groups = [it.group for it in by_task[task]]
        rewards = [r for g in groups for r in g.rewards]
        correct = [ok for g in groups for ok in g.is_correct]
        lengths = [c.num_tokens for g in groups for c in g.completions]
        out[f"reward_mean/{task}"] = sum(rewards) / len(rewards)
        out[f"pass_rate/{task}"] = sum(correct) / len(correct)
        out[f"response_length_mean/{task}"] = sum(lengths) / len(lengths)
        out[f"batch_samples/{task}"] = float(len(lengths))
    by_mode: dict[str, list[ReadyGroup]] = {}
    for it in items:  # rows with a `thinking` column (scalerl.data.modes): the same figures per mode
        mode = row_mode(it.group.record)
        if mode is not None:
            by_mode.setdefault(f"mode={mode}", []).append(it)
    for key in sorted(by_mode):
        groups = [it.group for it in by_mode[key]]
        correct = [ok for g in groups for ok in g.is_correct]
        rewards = [r for g in groups for r in g.rewards]
        lengths = [c.num_tokens for g in groups for c in g.completions]
        out[f"reward_mean/{key}"] = sum(rewards) / len(rewards)
        out[f"pass_rate/{key}"] = sum(correct) / len(correct)
        out[f"response_length_mean/{key}"] = sum(lengths) / len(lengths)
        out[f"batch_samples/{key}"] = float(len(lengths))
    return out


def _agentic(samples: Sequence[Completion]) -> dict[str, float]:
    """Trajectory figures (turns, tool calls and errors, context events, env vs generation time)."""
    if not any("agentic" in c.metadata for c in samples):
        return {}
    from scalerl.agentic.metrics import agentic_metrics

    return agentic_metrics(samples)


class IntervalMeter:
    """Rates between consecutive `lap()` calls (one per training step)."""

    def __init__(
        self,
        generator: Generator,
        clock: Callable[[], float] = time.perf_counter,
        *,
        tick_idle: bool = False,
        counters: Mapping[str, int] | None = None,
    ) -> None:
        """`counters`: the generator's counters at the previous lap (a resumed run's last step row),
        when not the current ones."""
        self.generator = generator
        self.clock = clock
        self.tick_idle = tick_idle
        self._last_time = clock()
        self._last_counters = dict(counters) if counters is not None else generator.counters.as_dict()
        self._last_busy, self._last_idle = generator.timing()

    def counters(self) -> dict[str, int]:
        """The generator's counters at the last lap."""
        return dict(self._last_counters)

    def lap(self) -> dict[str, float]:
        now = self.clock()
        counters = self.generator.counters.as_dict()
        busy, idle = self.generator.timing()
        wall = max(now - self._last_time, 1e-9)
        delta = {k: counters[k] - self._last_counters.get(k, 0) for k in counters}
        if self.tick_idle:
            ticks = delta["engine_steps"] + delta["idle_ticks"]
            idle_frac = delta["idle_ticks"] / ticks if ticks else 0.0
        else:
            idle_frac = min(1.0, max(0.0, (idle - self._last_idle) / wall))
        out = {
            "step_wall_s": wall,
            "gen_tokens_per_s": delta["tokens_generated"] / wall,
            "gen_samples_per_s": delta["samples_generated"] / wall,
            "gen_idle_frac": idle_frac,
            "gen_busy_frac": min(1.0, max(0.0, (busy - self._last_busy) / wall)),
            "prompts_drawn": float(delta["prompts_drawn"]),
            "refill_prompts": float(delta["refill_prompts"]),
            "groups_dropped": float(delta["groups_dropped"]),
            "verifier_failures": float(delta["verifier_failures"]),
            "prompts_drawn_total": float(counters["prompts_drawn"]),
            "groups_dropped_total": float(counters["groups_dropped"]),
            "verifier_failures_total": float(counters["verifier_failures"]),
            "gen_tokens": float(delta["tokens_generated"]),
            "gen_samples": float(delta["samples_generated"]),
            "gen_engine_steps": float(delta["engine_steps"]),
            "gen_prompt_tokens": float(delta["prompt_tokens"]),
        }
        self._last_time, self._last_counters = now, counters
        self._last_busy, self._last_idle = busy, idle
        return out


def _reward_fn(parts: Sequence[Mapping[str, float] | None] | None, s: int) -> dict[str, object]:
    """`reward_fn`: each reward function's unweighted score of sample `s` (`rewards.functions`; a
    function that gave None or failed on it is absent); nothing for a run without functions."""
    if parts is None or parts[s] is None:
        return {}
    return {"reward_fn": {name: float(v) for name, v in parts[s].items()}}


def sample_rows(items: Sequence[ReadyGroup], train_version: int, decode: Callable[[list[int]], str],
                limit: int) -> list[dict[str, object]]:
    """Up to `limit` of the step's trained samples as readable rows (`logging.samples_every`).

    Taken round-robin over the groups (the first sample of each group, then the second, ...), so a
    few rows show several prompts. `lag` is the trainer version minus the sample's `start_version`,
    the staleness `pipeline.k` bounds; `versions` the first and last token's policy version.
    """
    order = [(g, s) for s in range(max((len(it.group.completions) for it in items), default=0))
             for g in range(len(items)) if s < len(items[g].group.completions)]
    rows: list[dict[str, object]] = []
    for g, s in order[:limit]:
        group = items[g].group
        record, completion = group.record, group.completions[s]
        versions = [int(completion.versions[0]), int(completion.versions[-1])] if completion.versions else []
        rows.append({
            "prompt_id": record.id, "task": record.task, "sample": s,
            "prompt": record.prompt if record.prompt is not None else record.messages,
            "response": decode(list(completion.token_ids)),
            "reward": float(group.rewards[s]), **_reward_fn(group.reward_parts, s),
            "correct": bool(group.is_correct[s]),
            "finish_reason": completion.finish_reason, "tokens": len(completion.token_ids),
            "start_version": int(completion.start_version),
            "lag": int(train_version - completion.start_version), "versions": versions,
        })
    return rows
