"""Atomic file writes: a reader (or a crash) never sees half a file. No torch: `scaling` uses it."""

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
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to `path` (creating its directory) through a temporary file and a rename."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return out


def write_json_atomic(path: str | Path, obj: Any) -> Path:
    return write_atomic(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")
