"""Files the user cannot read and folders they cannot write in: exit 2 naming them, no traceback.

Permissions do not bind root (CI runs as root), so as root each command runs as the unprivileged
user `nobody` (uid 65534, through util-linux's `setpriv`); as anyone else, `chmod` binds. Nothing is
skipped: a root without `setpriv` fails the test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
CURVE = "".join(f'{{"step": {i}, "compute_device_hours": {0.1 * i:.1f}, "val_pass_rate": 0.{i}}}\n'
                for i in range(1, 7))


def _as_user() -> list[str]:
    """The prefix that runs a command as `nobody` when this process is root; [] otherwise."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.fail("running as root without util-linux's setpriv: cannot drop privileges to test "
                    "permissions")
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


@pytest.fixture
def folder() -> Iterator[Path]:
    """A folder every user may enter (pytest's tmp_path is root's own, mode 0700)."""
    d = Path(tempfile.mkdtemp(prefix="scalerl-perm-"))
    d.chmod(0o777)
    (d / "home").mkdir(mode=0o777)
    (d / "p.jsonl").write_text('{"prompt": "1+1?", "answer": "2"}\n')
    (d / "m.jsonl").write_text(CURVE)
    (d / "c.yaml").write_text("optim:\n  lr: 1.0e-5\n")
    for name in ("p.jsonl", "m.jsonl", "c.yaml"):
        (d / name).chmod(0o000)
    (d / "ro").mkdir(mode=0o555)
    (d / "ro").chmod(0o555)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _run(folder: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HOME": str(folder / "home"),
           "SCALERL_CACHE_DIR": str(folder / "home" / "cache")}
    return subprocess.run([*_as_user(), sys.executable, "-m", "scalerl.cli", *argv], cwd=folder, env=env,
                          text=True, capture_output=True, check=False)


@pytest.mark.parametrize("argv, message", [
    (("data", "check", "p.jsonl"), r"scalerl data: error: p\.jsonl: cannot read \(Permission denied\)"),
    (("fit", "m.jsonl"), r"scalerl fit: error: m\.jsonl: cannot read \(Permission denied\)"),
    (("train", "--output-dir", "out", "-c", "c.yaml"),
     r"scalerl train: error: c\.yaml: cannot read the config file \(Permission denied\)"),
    (("data", "synth", "--n", "3", "--out", "ro/x.jsonl"),
     r"scalerl data: error: --out ro/x\.jsonl: cannot write in ro \(permission denied\)"),
], ids=["data-check", "fit", "train-config", "synth-out"])
def test_unreadable_file_or_unwritable_folder_is_bad_input(folder: Path, argv: tuple[str, ...],
                                                           message: str) -> None:
    premise = subprocess.run([*_as_user(), sys.executable, "-c", "open('p.jsonl')"], cwd=folder,
                             capture_output=True, text=True, check=False)
    assert "PermissionError" in premise.stderr, premise.stderr  # the command's user cannot read it
    before = sorted(p.name for p in folder.rglob("*"))
    done = _run(folder, *argv)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and re.search(message, done.stderr), done.stderr
    assert sorted(p.name for p in folder.rglob("*") if "cache" not in p.parts) == before
