"""Check a run's inputs before any work: data files, model folders or Hub ids, evaluation sets.

A training command calls `check_run_inputs(cfg)` before the warm start, before the run directory
is created: a missing file or a bad row then costs a second, not a warm start, and leaves nothing
behind. Every error is an `InputError` (a `ValueError`: the command line prints it and exits 2)
whose message starts with the config key and names the path. A run with code prompts or the
agentic python tool also has the code sandbox's isolation checked then (`check_code_sandbox`: it
fails closed, a `ConfigError` naming `rewards.sandbox.isolation`).

Model names: a name is a local folder when it exists, or when it cannot be a Hugging Face Hub id
(an absolute or `./` path, more than one `/`, a trailing `/`, characters a repo id cannot hold),
or when its first component is an existing local folder (`runs/sft` with a `runs/` here). A local
folder that does not exist is an error at once: it is never looked up on the Hub (which would
wait ~30 s for the network and end in a traceback about repo ids). A name that can only be a Hub
id is accepted when it is in the local Hugging Face cache; otherwise the Hub is asked once (10 s
timeout), and an unknown repo, offline mode or an unreachable Hub is an error.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HUB_TIMEOUT_S = 10.0
# Hugging Face repo ids: `name` or `namespace/name`, letters, digits, `-`, `_`, `.` (not leading).
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")
_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
CACHE_DIR_VAR = "SCALERL_CACHE_DIR"


class InputError(ValueError):
    """A missing or unreadable input; the message names the config key and the path."""


def check_path(path: str | os.PathLike[str], key: str) -> Path:
    """`path` must exist (a file or a folder)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(f"{key}: {path}: no such file or directory")
    return p


def could_be_hub_id(name: str) -> bool:
    """True when `name` is a syntactically valid Hub repo id that is not obviously a local path."""
    if not _HUB_ID.match(name) or ".." in name or name.endswith(".git"):
        return False
    head = name.split("/", 1)[0]
    return not ("/" in name and Path(head).is_dir())


def _offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in _OFFLINE_VARS)


def _check_hub_model(name: str, key: str) -> None:
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return
    if _offline():
        raise InputError(f"{key}: {name!r} is not a local folder and not in the Hugging Face cache "
                         "(offline mode is on)")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(name, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return  # it exists; loading says what access it needs
    except RepositoryNotFoundError:
        raise InputError(f"{key}: {name!r} is neither a local folder nor a model on the Hugging Face Hub "
                         "(or it is private and you are not logged in)") from None
    except Exception as err:  # network errors come from several libraries (httpx, requests, OSError)
        reason = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
        raise InputError(f"{key}: {name!r} is not a local folder, and the Hugging Face Hub could not be "
                         f"reached to look it up ({reason})") from None


def _check_model_config(path: Path, name: str, key: str) -> None:
    """A saved model's config.json must be a JSON object (transformers' own error is a traceback)."""
    if not path.is_file():
        raise InputError(f"{key}: {name}: folder has no config.json (not a saved Hugging Face model)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{key}: {path}: not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{key}: {path}:{err.lineno}:{err.colno}: not valid JSON ({err.msg})") from None
    if not isinstance(config, dict):
        raise InputError(f"{key}: {path}: expected a JSON object, got {type(config).__name__}")


def check_model_source(name: str | None, key: str, *, need_config: bool = True) -> None:
    """A model (or tokenizer, `need_config=False`) folder that exists, or a Hub id that resolves."""
    if name is None:
        return
    p = Path(name).expanduser()
    if p.is_dir():
        if need_config:
            _check_model_config(p / "config.json", name, key)
        return
    if p.exists():
        raise InputError(f"{key}: {name} is a file; expected a model folder or a Hugging Face Hub id")
    if not could_be_hub_id(name):
        raise InputError(f"{key}: {name}: no such directory")
    _check_hub_model(name, key)


def _load_prompt_file(path: str, key: str, **load_kwargs: Any) -> list[Any]:
    from scalerl.data.loaders import load_prompts

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


def check_code_sandbox(cfg: Any, code_prompts_in: list[str]) -> None:
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


def check_output_dir(
    path: str | os.PathLike[str], key: str = "output_dir", what: str = "a run directory"
) -> None:
    """A folder, or a path one can be created at: not a file, nor under one."""
    p = Path(path).expanduser()
    for parent in (p, *p.parents):
        if parent.exists():
            if not parent.is_dir():
                where = "is a file" if parent == p else f"is under {parent}, which is a file"
                raise InputError(f"{key}: {path} {where}; expected {what} (or where to create one)")
            return


def check_cache_dir() -> None:
    """`SCALERL_CACHE_DIR` (where the default warm start is cached), if set, must be a folder or absent."""
    base = os.environ.get(CACHE_DIR_VAR)
    if base:
        check_output_dir(base, key=f"environment variable {CACHE_DIR_VAR}", what="a cache folder")


def check_device(device: str | None, key: str = "--device") -> None:
    """A torch device string this machine has (`cuda:7` on a CPU-only build is a traceback later)."""
    if device is None:
        return
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as err:
        raise InputError(f"{key}: {device!r} is not a torch device ({str(err).splitlines()[0]})") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "torch was built without CUDA" if torch.version.cuda is None else "no GPU is visible"
            raise InputError(f"{key}: {device}: CUDA is not available here ({why}); use --device cpu")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise InputError(f"{key}: {device}: this machine has {count} CUDA device(s) (0..{count - 1})")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"{key}: {device}: MPS is not available here; use --device cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise InputError(f"{key}: {device}: unsupported device type {dev.type!r} (cpu, cuda, mps)")


def check_run_inputs(cfg: Any) -> None:
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


__all__ = ["CACHE_DIR_VAR", "InputError", "check_cache_dir", "check_code_sandbox", "check_device",
           "check_model_source", "check_output_dir", "check_path", "check_prompt_file", "check_run_inputs",
           "could_be_hub_id"]
