"""The verifier of reasoning-gym records (tasks `rg_<name>`, `scalerl.data.rgym`): the generator's
own `score_answer`.

The answer is what our other tasks read (`answer.extract_final_answer`: after the thinking, the
last `\\boxed{}`, else the last `<answer>...</answer>`, reasoning-gym's own tag); none is
"no_answer". It is scored by `score_answer(answer, entry)` of the dataset built with the record's
own options (some scorers read them), so the reward is reasoning-gym's score, partial credit
included (the router maps a score below 1 to `incorrect_reward` unless `rewards.partial_credit`).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from scalerl.data.records import PromptRecord
from scalerl.rewards.answer import extract_final_answer
from scalerl.rewards.registry import VerifierResult

_LOCK = threading.Lock()
_SCORERS: dict[str, Any] = {}


def _scorer(meta: dict[str, Any]) -> Any:
    from scalerl.data.rgym import create_dataset

    key = json.dumps([meta["dataset"], meta.get("options", {}), meta.get("seed", 0), meta.get("size", 1)],
                     sort_keys=True, default=str)
    with _LOCK:
        if key not in _SCORERS:
            ds = create_dataset(meta["dataset"], int(meta.get("size", 1)), int(meta.get("seed", 0)),
                                meta.get("options", {}), "reasoning_gym")
            _SCORERS[key] = ds.score_answer
        return _SCORERS[key]


def verify_reasoning_gym(completion: str, record: PromptRecord) -> VerifierResult:
    """reasoning-gym's score of the completion's final answer for `record`."""
    meta = record.metadata.get("reasoning_gym")
    if not isinstance(meta, dict) or "entry" not in meta:
        return VerifierResult(0.0, "error", f"prompt {record.id!r} ({record.source}): not a reasoning-gym "
                              "record (no metadata.reasoning_gym entry)")
    answer = extract_final_answer(completion)
    if answer is None:
        return VerifierResult(0.0, "no_answer", "no \\boxed{} or <answer> after the thinking")
    score = float(_scorer(meta)(answer, meta["entry"]))
    return VerifierResult(min(max(score, 0.0), 1.0), "ok", f"reasoning_gym {meta['dataset']}: {score:g}")


__all__ = ["verify_reasoning_gym"]
