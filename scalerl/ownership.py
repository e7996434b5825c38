"""Output folders and files a command may write: new, empty, or its own. Never someone else's.

Every command that writes a folder (`scalerl train`, `sft`, `demo`, `ablate`) checks it with
`check_output_dir_owned` before any work and claims it with `claim_output_dir` when it starts
writing: the folder must not exist yet, be empty, or hold the marker file `OWNER_FILE` left by an
earlier command of the same kind (`{"kind": "train", ...}`). Anything else (a home folder, a
project, another command's output) is an `OwnershipError` (an `InputError`: exit status 2) naming
the folder and the flag that chooses another.

A folder written by a scalerl from before the markers is recognised by its kind's own files
(`EARLIER_OUTPUTS`): an ablate study (`study.json` holding a study plan) or a demo (`demo.json`) is
adopted by the same command (marked, then continued or replaced as one of its own); any other
earlier output (a training run, an SFT model) is refused with a message that says what it looks
like and which flag to use, since adopting it would let a new run replace what it holds.

A command deletes only inside a folder it claimed. Commands that write single files
(`data synth`, `data difficulty`, `data curate`, `fit --plot`) refuse an existing file unless their
`--overwrite` says to replace it (`check_output_file`). No torch, no config: a bottom utility.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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


def _is_study_plan(folder: Path) -> bool:
    """`study.json` is a study plan as `scalerl ablate` writes it (kind, variants, runs)."""
    try:
        plan = json.loads((folder / "study.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(plan, dict) and isinstance(plan.get("kind"), str)
            and isinstance(plan.get("variants"), list) and isinstance(plan.get("runs"), list))


@dataclass(frozen=True)
class EarlierOutput:
    """How a folder of `kind` written by a scalerl from before the ownership markers is recognised:
    it holds every name in `needs`, at least one of `any_of` (when given), and `check` holds.
    `adopt`: the same command takes it over (marks it, continues); else `hint` says what to do."""

    kind: str
    needs: tuple[str, ...]
    any_of: tuple[str, ...] = ()
    check: Callable[[Path], bool] | None = None
    adopt: bool = False
    hint: str = ""

    def matches(self, folder: Path) -> bool:
        return (all((folder / n).exists() for n in self.needs)
                and (not self.any_of or any((folder / n).exists() for n in self.any_of))
                and (self.check is None or self.check(folder)))

    def describe(self) -> str:
        return ", ".join([*self.needs, *([" or ".join(self.any_of)] if self.any_of else [])])


#: Earlier outputs by kind, most specific first (an ablate study holds runs, a run does not hold a study).
EARLIER_OUTPUTS: tuple[EarlierOutput, ...] = (
    EarlierOutput("ablate", ("study.json",), check=_is_study_plan, adopt=True),
    EarlierOutput("demo", ("demo.json",), adopt=True),  # scalerl.studies.demo.MARKER_FILE
    EarlierOutput("train", ("config.yaml",), any_of=("metrics.jsonl", "sessions.jsonl", "checkpoints"),
                  hint="to continue that run, pass it with --resume"),
    EarlierOutput("sft", ("sft_info.json", "config.json"),
                  hint="to replace that model, remove the folder yourself"),
)


def earlier_output(path: str | os.PathLike[str]) -> EarlierOutput | None:
    """The rule an unmarked folder matches (an earlier scalerl's output of that kind), or None."""
    folder = Path(path)
    if owner_of(folder) is not None:
        return None
    return next((rule for rule in EARLIER_OUTPUTS if rule.matches(folder)), None)


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
    earlier = earlier_output(p) if owner is None else None
    if earlier is not None and earlier.kind == kind and earlier.adopt:
        return p  # an earlier scalerl's own output of this kind: `claim_output_dir` marks it
    if earlier is not None:
        what = (f"looks like the output of an earlier scalerl {earlier.kind} (it holds {earlier.describe()}, "
                f"and no {OWNER_FILE})")
        todo = (f"{earlier.hint}, or choose another {flag}" if earlier.kind == kind and earlier.hint
                else f"scalerl {kind} writes only into a new or empty folder or one of its own: choose "
                     f"another {flag}")
        raise OwnershipError(f"{flag}: {path} is not empty and {what}; {todo}")
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
    """`path` may be written: it does not exist, or `--overwrite` says to replace it; never a folder,
    never in a folder that cannot be written in."""
    with writing_output(path, flag):  # a path that cannot even be looked at (EACCES on a parent)
        return _check_output_file(Path(path).expanduser(), path, flag, overwrite)


def _check_output_file(p: Path, path: str | os.PathLike[str], flag: str, overwrite: bool) -> Path:
    if p.is_dir():
        raise OwnershipError(f"{flag} {path}: is a directory; choose another {flag}")
    if p.exists() and not overwrite:
        raise OwnershipError(f"{flag} {path}: exists; pass --overwrite to replace it, or choose another "
                             f"{flag}")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OwnershipError(f"{flag} {path}: is under {parent}, which is a file")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise OwnershipError(f"{flag} {path}: cannot write in {parent} (permission denied); choose "
                                     f"another {flag}")
            break
    return p


#: Errors of creating a file that come from where the user asked it written, not from us.
_USER_PATH_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR,
                               errno.EISDIR, errno.ENAMETOOLONG})


@contextmanager
def writing_output(path: str | os.PathLike[str], flag: str) -> Iterator[None]:
    """Around a command's write of `path`: a folder that cannot be written in (permissions, a
    read-only or pseudo file system, a parent that cannot be made) is an `OwnershipError` naming the
    flag and the path (exit 2); other failures (a full disk) stay what they are."""
    try:
        yield
    except OSError as err:
        if err.errno not in _USER_PATH_ERRNOS:
            raise
        where = err.filename if isinstance(err.filename, str) else path
        raise OwnershipError(f"{flag} {path}: cannot write ({where}: {err.strerror}); choose another "
                             f"{flag}") from None


__all__ = ["EARLIER_OUTPUTS", "OWNER_FILE", "EarlierOutput", "OwnershipError", "check_output_dir_owned",
           "check_output_file", "claim_output_dir", "earlier_output", "mark_output_dir", "owner_of",
           "writing_output"]
