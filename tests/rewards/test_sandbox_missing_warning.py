"""A sandbox missing a protection says so on stderr, where a user of `scalerl train` sees it.

The detected protections are logged once; with one missing (no tree-wide cgroup bound here) the
line is a WARNING, which Python's last-resort handler prints on stderr when the application has
configured no logging, as the command line does not. Run in a fresh interpreter for that reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
from scalerl.rewards import sandbox as sb
full = dict(network_isolated=True, pid_namespace=True, readonly_filesystem=True, private_tmp=True,
            dedicated_uid=True)
box = sb.Sandbox()
box._detect = lambda: sb.Protections(mode="namespaces", cgroup=None, **full)
box.protections
"""


def test_a_missing_protection_reaches_stderr() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "sandbox mode 'namespaces'" in done.stderr
    assert "MISSING: NO tree-wide memory bound" in done.stderr and "NO tree-wide task bound" in done.stderr
