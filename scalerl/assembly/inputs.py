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


def _load_prompt_file(path: str, key: str, **load_kwargs: Any) -> list[Any]:
    check_path(path, key)
    try:
        return list(load_prompts(path, **load_kwargs).records)
    except (ValueError, OSError) as err:
        raise InputError(f"{key}: {err}") from None


def check_prompt_file(path: str, key: str, **load_kwargs: Any) -> int:
    """The file or folder loads as prompts (every row checked); returns the number of records."""
    return len(_load_prompt_file(path, key, **load_kwargs))


# Built-in synthetic tasks whose prompts are `task="code"` (scalerl/data/synthetic: "math+code"
# mixes the two, "tool_code" is the code task with an interpreter trace).
_SYNTHETIC_CODE_TASKS = frozenset({"code", "math+code", "tool_code"})


def check_code_sandbox(cfg: RunConfig, code_prompts_in: list[str]) -> None:
    """Fail closed before any work: a run that executes model-written code (code prompts scored by
    the built-in code verifier, or the agentic `python` tool) must get the isolation that
    `rewards.sandbox.isolation` asks for; else a `ConfigError` naming that key and what is missing.
    `code_prompts_in`: the config keys whose prompts include code tasks."""
    from scalerl.rewards.registry import VERIFIERS

    needs = []
    if code_prompts_in and "code" not in cfg.rewards.verifiers and VERIFIERS.get("code") is None:
        needs.append(f"the code task in {' and '.join(code_prompts_in)}")
    a = cfg.agentic
    if a.environment is not None and "python" in a.tools:
        needs.append(f"the python tool (agentic.tools[{list(a.tools).index('python')}])")
    if not needs:
        return
    from scalerl.rewards.sandbox import Sandbox

    Sandbox(cfg.rewards.sandbox).require_isolation(" and ".join(needs))


def check_run_inputs(cfg: RunConfig) -> None:
    """Every input of a `RunConfig`: run directory, model and tokenizer (or the warm start's cache),
    training prompts, extra evaluation sets, and the code sandbox's isolation where the run needs it."""
    check_output_dir(cfg.output_dir)
    if cfg.model.name_or_path is None:
        check_cache_dir()
    check_model_source(cfg.model.name_or_path, "model.name_or_path")
    check_model_source(cfg.model.tokenizer, "model.tokenizer", need_config=False)
    d = cfg.data
    code_in: list[str] = []
    if d.train_path is not None:
        records = _load_prompt_file(d.train_path, "data.train_path", field_map=d.field_map,
                                    default_task=d.default_task, format=d.format, on_error=d.on_bad_row)
        if any(r.task == "code" for r in records):
            code_in.append("data.train_path")
    elif d.synthetic.task in _SYNTHETIC_CODE_TASKS:
        code_in.append(f"data.synthetic.task={d.synthetic.task}")
    extra: Mapping[str, str] = cfg.eval.extra_sets
    for name, path in extra.items():
        records = _load_prompt_file(path, f"eval.extra_sets.{name}", default_task=d.default_task,
                                    on_error=d.on_bad_row)
        if any(r.task == "code" for r in records):
            code_in.append(f"eval.extra_sets.{name}")
    check_code_sandbox(cfg, code_in)


__all__ = ["check_code_sandbox", "check_prompt_file", "check_run_inputs"]
