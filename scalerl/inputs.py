"""Checks of a run's inputs before any work: data files, model folders or Hub ids, output folders.

Each check takes the value and the config key (or flag) it came from; every error is an
`InputError` (a `ValueError`: the command line prints it and exits 2) whose message starts with
that key and names the path. A whole run's inputs are checked by
`scalerl.assembly.inputs.check_run_inputs(cfg)`, built on these; this module reads no config.

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
from pathlib import Path

HUB_TIMEOUT_S = 10.0
# Hugging Face repo ids: `name` or `namespace/name`, letters, digits, `-`, `_`, `.` (not leading).
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")
_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
CACHE_DIR_VAR = "SCALERL_CACHE_DIR"


class InputError(ValueError):
    """A missing or unreadable input; the message names the config key and the path."""


class MissingInputError(InputError, FileNotFoundError):
    """An input file or folder that does not exist (also a `FileNotFoundError`)."""


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


__all__ = [
    "CACHE_DIR_VAR",
    "InputError",
    "MissingInputError",
    "check_cache_dir",
    "check_device",
    "check_model_source",
    "check_output_dir",
    "check_path",
    "could_be_hub_id",
]
