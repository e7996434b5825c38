"""Durable atomic writes: fsync before the rename, the directory after it, old or new on a crash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import scalerl.atomic as atomic


def test_the_file_is_synced_before_the_rename_and_the_directory_after(tmp_path, monkeypatch) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync file")
        real_fsync(fd)

    def replace(src, dst) -> None:
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(atomic.os, "replace", replace)
    atomic.write_atomic(tmp_path / "state.json", "{}")
    assert events == ["fsync file", "rename", "fsync dir"]


def test_a_failure_before_the_rename_keeps_the_old_file(tmp_path, monkeypatch) -> None:
    target = tmp_path / "manifest.json"
    target.write_text("old")

    def crash(src, dst) -> None:
        raise OSError("injected crash before the rename")

    monkeypatch.setattr(atomic.os, "replace", crash)
    with pytest.raises(OSError, match="injected"):
        atomic.write_atomic(target, "new")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]  # no temporary left


@pytest.mark.parametrize("when", ["before_rename", "after_rename"])
def test_a_killed_writer_leaves_the_old_or_the_new_file(tmp_path, when) -> None:
    """SIGKILL between the write and the rename (or right after it): never half a file."""
    target = tmp_path / "counters.json"
    target.write_text("old")
    script = textwrap.dedent(f"""
        import os, signal
        import scalerl.atomic as atomic
        real = os.replace
        def replace(src, dst):
            if {when == "after_rename"!r}:
                real(src, dst)
            os.kill(os.getpid(), signal.SIGKILL)
        atomic.os.replace = replace
        atomic.write_atomic({str(target)!r}, "new" * 100000)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    want = "old" if when == "before_rename" else "new" * 100000
    assert target.read_text() == want


def test_fsync_dir_tolerates_a_filesystem_that_refuses(tmp_path, monkeypatch) -> None:
    def refuse(fd: int) -> None:
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(atomic.os, "fsync", refuse)
    atomic.fsync_dir(tmp_path)  # no exception: the rename already stands
    assert Path(tmp_path).is_dir()
