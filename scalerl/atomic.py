"""Atomic, durable file writes: a reader (or a crash) never sees half a file. No torch: `scaling` uses it.

Atomic: the bytes go to a temporary file beside the target, which is renamed onto it. Durable: the
temporary file is fsynced before the rename and the directory after it, so a power loss or a
kernel crash leaves the old file or the new one, never an empty or truncated one (ext4 and XFS may
otherwise commit the rename before the data: the zero-length-file failure of rename-without-fsync).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_path(path: str | Path, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success rename it onto `path`, on error remove it.

    The temporary name keeps `suffix` so writers that infer a format from it (matplotlib) work.
    """
    out = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=suffix, dir=out.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        # mkstemp creates the file 0600; give it the mode a plain open() would have.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        fsync_file(tmp)
        os.replace(tmp, out)
        fsync_dir(out.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fsync_file(path: str | Path) -> None:
    """Flush a file's data to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | Path) -> None:
    """Flush a directory's entries (a rename into it) to stable storage, where the OS allows it."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # a platform without directory handles: nothing more can be done
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a directory (EINVAL): the rename stands
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to `path` (creating its directory) through a temporary file and a rename."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return out


def write_json_atomic(path: str | Path, obj: Any) -> Path:
    return write_atomic(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")
