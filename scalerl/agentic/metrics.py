"""Per-step and per-evaluation figures of trajectories (from each completion's `metadata["agentic"]`).

Keys (`agentic_*`): turns and tool calls per trajectory (mean), tool errors per trajectory in total
and by kind (`agentic_tool_errors_<kind>`), context-management events by kind
(`agentic_context_<event>`, totals over the batch), how episodes ended (`agentic_end_<end>`,
fractions), environment tokens and untrained tokens (means), and time in the environment vs in
generation (`agentic_env_time_s`, `agentic_gen_time_s`: sums over the batch's trajectories, and
`agentic_env_time_frac` = env / (env + gen)), and on an engine pool the turns that ran on another
engine than their episode's previous turn (`agentic_engine_switches`, total over the batch; see
`engine_switches`). Empty for batches without trajectories.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from itertools import pairwise
from typing import Any

from scalerl.agentic.rollout import ENDS
from scalerl.rollout.protocol import Completion


def engine_switches(turn_engines: Iterable[int | None]) -> int:
    """Turns that ran on another engine of a pool than the episode's previous turn (a turn whose
    engine is unknown, None, is neither). On a pool each later turn goes to the engine holding the
    episode's context in its prefix cache, so a switch means that engine died (or its key was
    evicted from the placement table) and the context was prefilled again elsewhere."""
    known = [e for e in turn_engines if e is not None]
    return sum(a != b for a, b in pairwise(known))


def agentic_metrics(completions: Iterable[Completion], prefix: str = "agentic_") -> dict[str, float]:
    infos: list[dict[str, Any]] = [c.metadata["agentic"] for c in completions if "agentic" in c.metadata]
    if not infos:
        return {}
    n = len(infos)
    errors: Counter[str] = Counter()
    events: Counter[str] = Counter()
    ends: Counter[str] = Counter()
    for info in infos:
        errors.update(info["tool_errors"])
        events.update(info["context_events"])
        ends[info["end"]] += 1
    env_s = sum(float(i["env_time_s"]) for i in infos)
    gen_s = sum(float(i["gen_time_s"]) for i in infos)
    out = {
        "turns_mean": sum(i["turns"] for i in infos) / n,
        "turns_max": float(max(i["turns"] for i in infos)),
        "tool_calls_mean": sum(i["tool_calls"] for i in infos) / n,
        "tool_errors_mean": sum(errors.values()) / n,
        "env_tokens_mean": sum(i["env_tokens"] for i in infos) / n,
        "untrained_tokens_mean": sum(i["untrained_tokens"] for i in infos) / n,
        "windows_mean": sum(i["windows"] for i in infos) / n,
        "engine_switches": float(sum(engine_switches(i.get("turn_engines", [])) for i in infos)),
        "env_time_s": env_s,
        "gen_time_s": gen_s,
        "env_time_frac": env_s / (env_s + gen_s) if env_s + gen_s > 0 else 0.0,
    }
    for kind, count in errors.items():
        out[f"tool_errors_{kind}"] = float(count)
    for event, count in events.items():
        out[f"context_{event}"] = float(count)
    for end in ENDS:
        out[f"end_{end}"] = ends.get(end, 0) / n
    return {prefix + k: v for k, v in out.items()}
