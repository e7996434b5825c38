"""Finding a Ray actor's worker processes from outside Ray, to kill them as a crash would."""

from __future__ import annotations

from pathlib import Path


def ray_worker_pids(actor_class: str) -> list[int]:
    """PIDs of the live processes whose command line is `ray::<actor_class>...` (Ray renames its
    worker processes after the actor they host)."""
    prefix = f"ray::{actor_class}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue  # exited while we looked
            if cmd.startswith(prefix):
                pids.append(int(entry.name))
    return pids
