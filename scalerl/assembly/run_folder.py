"""What a run folder says about itself: its id and lineage, and what a resume may change.

`run.json` holds the run's id (a random hex string made when the run starts) and, for a run
started from another run's checkpoint (`scalerl train --resume-from-other`), that parent: its run
id, checkpoint and step. A checkpoint belongs to the run in folder R when it sits in
`R/checkpoints/`; it is this run's own when R is the output folder itself or a copy of it (the
same run id). `checkpoint_origin` answers that; `scalerl train --resume` refuses a checkpoint of
another run unless `--resume-from-other` starts a new run from it.

On resume the saved `config.yaml` is the base and the user's config files and overrides layer on
top: `config_changes` lists every key whose value differs (dotted path, old and new value), and
`frozen_changes` picks out those a run cannot change mid-way (`FROZEN_KEYS`: the model, the prompt
data and its held-out split, the seed, the recipe's loss). `absolute_paths` stores the run's local
paths as absolute ones, so a resume from another directory finds the same model and data.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scalerl.atomic import write_atomic
from scalerl.config import RunConfig

RUN_FILE = "run.json"
CHECKPOINTS = "checkpoints"  # scalerl.training.checkpoint.CHECKPOINT_DIR (no torch here)

#: Keys a resumed run cannot change (dotted prefixes): the weights in the checkpoint are this
#: model's, the pool and the held-out split were drawn from these prompts with these seeds, and the
#: optimizer state and the curve so far belong to this loss.
FROZEN_KEYS: tuple[str, ...] = (
    "model.name_or_path", "model.tokenizer", "model.tiny", "model.lora", "model.init_seed", "model.dtype",
    "data.train_path", "data.source", "data.reasoning_gym", "data.format", "data.field_map",
    "data.default_task", "data.synthetic", "data.heldout_size", "data.heldout_seed",
    "seed", "algorithm.loss_type",
)
#: Keys that differ without changing the run: where it is written.
IGNORED_KEYS: tuple[str, ...] = ("output_dir",)
#: Keys that hold a local path (a model folder, a prompt file), stored absolute when they exist.
PATH_KEYS: tuple[tuple[str, ...], ...] = (
    ("model", "name_or_path"), ("model", "tokenizer"), ("data", "train_path"), ("agentic", "corpus_path"),
)


def read_run_file(run_dir: Path) -> dict[str, Any]:
    """`run.json` of `run_dir`, or {} when absent or unreadable (a run from before run ids)."""
    try:
        data = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def run_id(run_dir: Path) -> str | None:
    """The run id recorded in `run_dir/run.json`, or None."""
    value = read_run_file(run_dir).get("run_id")
    return value if isinstance(value, str) and value else None


def ensure_run_id(run_dir: Path, parent: Mapping[str, Any] | None = None) -> str:
    """The run's id, made and written to `run.json` when it has none (with `parent`, the run it
    was started from); a run that has one keeps it."""
    existing = run_id(run_dir)
    if existing is not None and parent is None:
        return existing
    new = secrets.token_hex(8)
    record: dict[str, Any] = {"run_id": new}
    if parent is not None:
        record["parent"] = dict(parent)
    write_atomic(run_dir / RUN_FILE, json.dumps(record, indent=2) + "\n")
    return new


def checkpoint_run(checkpoint: Path) -> Path | None:
    """The run folder a checkpoint belongs to (`R` of `R/checkpoints/step_N`), None outside one."""
    if checkpoint.parent.name != CHECKPOINTS:
        return None
    return checkpoint.parent.parent


def checkpoint_origin(checkpoint: Path, run_dir: Path) -> str | None:
    """None when `checkpoint` is `run_dir`'s own; else why it is another run's (for the message)."""
    owner = checkpoint_run(checkpoint)
    if owner is None:
        return f"{checkpoint} is not in a run's {CHECKPOINTS}/ folder, so it is no checkpoint of {run_dir}"
    if owner.resolve() == run_dir.resolve():
        return None
    theirs, ours = run_id(owner), run_id(run_dir)
    if theirs is not None and theirs == ours:
        return None  # a copy of the same run (moved or copied folder)
    what = f"run {theirs}" if theirs else f"the run in {owner}"
    return f"{checkpoint} belongs to {what}, not to the run in {run_dir}" + (f" (run {ours})" if ours else "")


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`; lists and scalars are leaves."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def config_changes(before: RunConfig, after: RunConfig) -> list[dict[str, Any]]:
    """Every key whose value differs, as `{"key", "from", "to"}` (JSON values), sorted by key."""
    old = flatten(before.model_dump(mode="json"))
    new = flatten(after.model_dump(mode="json"))
    missing = object()
    changes = []
    for key in sorted(set(old) | set(new)):
        if any(key == k or key.startswith(k + ".") for k in IGNORED_KEYS):
            continue
        a, b = old.get(key, missing), new.get(key, missing)
        if a != b:
            changes.append({"key": key, "from": None if a is missing else a,
                            "to": None if b is missing else b})
    return changes


def is_frozen(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in FROZEN_KEYS)


def frozen_changes(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The changes a resumed run cannot take (`FROZEN_KEYS`)."""
    return [c for c in changes if is_frozen(c["key"])]


def describe_change(change: Mapping[str, Any]) -> str:
    return f"{change['key']}: {json.dumps(change['from'])} -> {json.dumps(change['to'])}"


def absolute_paths(cfg: RunConfig, base: Path | None = None) -> RunConfig:
    """`cfg` with every local path of `PATH_KEYS` (and `eval.extra_sets`) that exists made absolute
    (a Hub id, which is no local path, stays as it is)."""
    here = base or Path.cwd()
    out = cfg.model_copy(deep=True)

    def fix(value: Any) -> Any:
        if not isinstance(value, str) or not value or Path(value).is_absolute():
            return value
        local = here / Path(value).expanduser()
        return os.path.abspath(local) if local.exists() else value  # a symlink stays one

    for section, key in PATH_KEYS:
        part = getattr(out, section)
        setattr(part, key, fix(getattr(part, key)))
    out.eval.extra_sets = {name: fix(v) if isinstance(v, str) else v.model_copy(update={"path": fix(v.path)})
                           for name, v in out.eval.extra_sets.items()}
    return out


__all__ = ["FROZEN_KEYS", "IGNORED_KEYS", "PATH_KEYS", "RUN_FILE", "absolute_paths", "checkpoint_origin",
           "checkpoint_run", "config_changes", "describe_change", "ensure_run_id", "flatten",
           "frozen_changes", "is_frozen", "read_run_file", "run_id"]
