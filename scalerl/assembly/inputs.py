"""Every input of a `RunConfig`, checked before any work.

A training command (and `scalerl demo`) calls `check_run_inputs(cfg)` before the warm start, before
the run directory is created: a missing file or a bad row then costs a second, not a warm start,
and leaves nothing behind. The checks themselves are `scalerl.inputs`'s; every error is an
`InputError` whose message starts with the config key and names the path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scalerl.config import RunConfig
from scalerl.data.loaders import load_prompts
from scalerl.inputs import InputError, check_cache_dir, check_model_source, check_output_dir, check_path


def check_prompt_file(path: str, key: str, **load_kwargs: Any) -> int:
    """The file or folder loads as prompts (every row checked); returns the number of records."""
    check_path(path, key)
    try:
        return len(load_prompts(path, **load_kwargs).records)
    except (ValueError, OSError) as err:
        raise InputError(f"{key}: {err}") from None


def check_run_inputs(cfg: RunConfig) -> None:
    """Every input of a `RunConfig`: run directory, model and tokenizer (or the warm start's cache),
    training prompts, extra evaluation sets."""
    check_output_dir(cfg.output_dir)
    if cfg.model.name_or_path is None:
        check_cache_dir()
    check_model_source(cfg.model.name_or_path, "model.name_or_path")
    check_model_source(cfg.model.tokenizer, "model.tokenizer", need_config=False)
    d = cfg.data
    if d.train_path is not None:
        check_prompt_file(d.train_path, "data.train_path", field_map=d.field_map, default_task=d.default_task,
                          format=d.format, on_error=d.on_bad_row)
    extra: Mapping[str, str] = cfg.eval.extra_sets
    for name, path in extra.items():
        check_prompt_file(path, f"eval.extra_sets.{name}", default_task=d.default_task, on_error=d.on_bad_row)


__all__ = ["check_run_inputs"]
