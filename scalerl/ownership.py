"""Output folders and files a command may write: new, empty, or its own. Never someone else's.

Every command that writes a folder (`scalerl train`, `sft`, `demo`, `ablate`) checks it with
`check_output_dir_owned` before any work and claims it with `claim_output_dir` when it starts
writing: the folder must not exist yet, be empty, or hold the marker file `OWNER_FILE` left by an
earlier command of the same kind (`{"kind": "train", ...}`). Anything else (a home folder, a
project, another command's output, a folder of an older scalerl without the marker) is an
`OwnershipError` (an `InputError`: exit status 2) naming the folder and the flag that chooses
another. A command deletes only inside a folder it claimed. Commands that write single files
(`data synth`, `data difficulty`, `data curate`, `fit --plot`) refuse an existing file unless their
`--overwrite` says to replace it (`check_output_file`). No torch, no config: a bottom utility.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from scalerl.atomic import write_atomic
from scalerl.inputs import InputError

OWNER_FILE = ".scalerl-owner.json"


class OwnershipError(InputError):
    """An output folder or file that the command did not create; the message names it and the flag."""


def owner_of(path: str | os.PathLike[str]) -> str | None:
    """The kind of command that claimed folder `path` (its marker's `kind`), or None."""
    marker = Path(path) / OWNER_FILE
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    kind = data.get("kind") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else None


def check_output_dir_owned(path: str | os.PathLike[str], kind: str, flag: str) -> Path:
    """`path` may receive `scalerl {kind}`'s output: absent, an empty folder, or one it claimed before.

    Checks only (nothing is created): call it before any work."""
    p = Path(path).expanduser()
    if not p.exists():
        for parent in p.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise OwnershipError(f"{flag}: {path} is under {parent}, which is a file; choose "
                                         f"another {flag}")
                break
        return p
    if not p.is_dir():
        raise OwnershipError(f"{flag}: {path} is a file; choose another {flag}")
    if not any(p.iterdir()):
        return p
    owner = owner_of(p)
    if owner == kind:
        return p
    what = f"holds the output of `scalerl {owner}`" if owner else f"was not made by scalerl (no {OWNER_FILE})"
    raise OwnershipError(f"{flag}: {path} is not empty and {what}; scalerl {kind} writes only into a new or "
                         f"empty folder or one of its own: choose another {flag}")


def claim_output_dir(path: str | os.PathLike[str], kind: str, flag: str) -> Path:
    """Check `path` (as `check_output_dir_owned`), create it and write its marker; returns it."""
    p = check_output_dir_owned(path, kind, flag)
    p.mkdir(parents=True, exist_ok=True)
    if owner_of(p) != kind:
        mark_output_dir(p, kind)
    return p


def mark_output_dir(path: str | os.PathLike[str], kind: str) -> Path:
    """Write `kind`'s marker into folder `path`, which the caller has just made (a temporary folder
    renamed into place afterwards)."""
    marker = {"kind": kind, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "pid": os.getpid()}
    return write_atomic(Path(path) / OWNER_FILE, json.dumps(marker, indent=2) + "\n")


def check_output_file(path: str | os.PathLike[str], flag: str, *, overwrite: bool = False) -> Path:
    """`path` may be written: it does not exist, or `--overwrite` says to replace it; never a folder."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise OwnershipError(f"{flag} {path}: is a directory; choose another {flag}")
    if p.exists() and not overwrite:
        raise OwnershipError(f"{flag} {path}: exists; pass --overwrite to replace it, or choose another "
                             f"{flag}")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OwnershipError(f"{flag} {path}: is under {parent}, which is a file")
            break
    return p


__all__ = ["OWNER_FILE", "OwnershipError", "check_output_dir_owned", "check_output_file", "claim_output_dir",
           "mark_output_dir", "owner_of"]
