"""reasoning-gym's procedural generators as a prompt source (`data.source: "reasoning_gym:<name>"`).

reasoning-gym (open-thought/reasoning-gym; `pip install 'scalerl[envs]'`) has 100+ generators, each
a `ProceduralDataset` built by `reasoning_gym.create_dataset(name, size=, seed=, **options)` whose
entries are `{"question", "answer", "metadata"}` and whose `score_answer(answer, entry)` is the
task's own scorer. Each entry becomes a `PromptRecord`:

* `prompt`: the entry's question as written (its own instructions); the answer format (our
  `\\boxed{}` or `<answer>` tags) comes from `data.template` / the system prompt, as for any task;
* `task`: `rg_<name>`, so every generator of a mix has its own per-task metrics
  (`pass_rate/rg_<name>`), and the rewards router scores it with that generator's `score_answer`
  (`scalerl.rewards.rgym`);
* `answer`: the reference answer (text), `metadata["reasoning_gym"]`: the dataset name, its
  options and the entry, which the scorer needs.

A mix (`data.source: "reasoning_gym"`, `data.reasoning_gym.datasets: {name: {weight, config}}`)
splits `size` prompts by weight with the largest-remainder rule (`mix_counts`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from scalerl.data.records import PromptRecord
from scalerl.data.rejects import DataError

SOURCE_PREFIX = "reasoning_gym"
TASK_PREFIX = "rg_"


def source_dataset(source: str) -> str | None:
    """`"reasoning_gym:<name>"` -> name, `"reasoning_gym"` (a mix) -> None; DataError otherwise."""
    head, sep, name = source.partition(":")
    if head != SOURCE_PREFIX or (sep and not name):
        raise DataError(f"data.source: expected 'reasoning_gym:<dataset>' or 'reasoning_gym', got {source!r}")
    return name or None


def mix_counts(weights: Mapping[str, float], size: int) -> dict[str, int]:
    """`size` split in proportion to `weights` by the largest-remainder (Hamilton) method.

    Each name gets floor(size * w / sum w); the prompts left go one each to the largest
    remainders (ties: the order given). The counts sum to `size` exactly."""
    if size < 0 or not weights or any(not (w > 0 and math.isfinite(w)) for w in weights.values()):
        raise ValueError(f"mix_counts: needs size >= 0 and positive weights, got {size}, {dict(weights)}")
    total = sum(weights.values())
    exact = {name: size * w / total for name, w in weights.items()}
    counts = {name: math.floor(x) for name, x in exact.items()}
    order = sorted(exact, key=lambda n: -(exact[n] - counts[n]))  # stable: ties keep their order
    for name in order[: size - sum(counts.values())]:
        counts[name] += 1
    return counts


def _library() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise DataError("data.source reasoning_gym: needs the optional dependency reasoning-gym "
                        "(pip install 'scalerl[envs]')") from None
    return reasoning_gym


def create_dataset(name: str, size: int, seed: int, options: Mapping[str, Any], key: str) -> Any:
    """`reasoning_gym.create_dataset`, its errors as `DataError`s naming the config key."""
    rg = _library()
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        import difflib

        near = difflib.get_close_matches(name, DATASETS, n=3)
        hint = f"; did you mean {', '.join(near)}?" if near else f" ({len(DATASETS)} are registered)"
        raise DataError(f"{key}: no reasoning-gym dataset {name!r}{hint}")
    try:
        return rg.create_dataset(name, size=size, seed=seed, **dict(options))
    except (TypeError, ValueError, AssertionError) as err:  # the library's option checks
        raise DataError(f"{key}: reasoning-gym {name!r} refused the options {dict(options)}: {err}") from None


def make_reasoning_gym(
    datasets: Mapping[str, tuple[float, Mapping[str, Any]]], size: int, seed: int,
    keys: Mapping[str, str] | None = None,
) -> list[PromptRecord]:
    """`size` prompts from the generators `datasets` (name -> (weight, options)), each seeded `seed`;
    `keys[name]` is the config key an error about that generator names (default
    `data.reasoning_gym.datasets.<name>`)."""
    counts = mix_counts({name: w for name, (w, _) in datasets.items()}, size)
    records: list[PromptRecord] = []
    for name, (_, options) in datasets.items():
        if counts[name] == 0:
            continue
        key = (keys or {}).get(name, f"data.reasoning_gym.datasets.{name}")
        dataset = create_dataset(name, counts[name], seed, options, key)
        for i in range(counts[name]):
            entry = dataset[i]
            answer = entry.get("answer")
            records.append(PromptRecord(
                id=f"rg/{name}/{i}", task=f"{TASK_PREFIX}{name}", prompt=str(entry["question"]),
                answer=None if answer is None else str(answer),
                metadata={"reasoning_gym": {"dataset": name, "options": dict(options), "seed": seed,
                                            "size": counts[name], "entry": entry}},
                source=f"reasoning_gym:{name}:{i}",
            ))
    return records


__all__ = ["SOURCE_PREFIX", "TASK_PREFIX", "create_dataset", "make_reasoning_gym", "mix_counts",
           "source_dataset"]
