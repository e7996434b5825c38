"""Per-run cgroups: one bound on the memory and process count of a program's whole process tree.

Rlimits bind each process (address space) or each uid (processes), so a program that forks can
use up to `nproc * memory_mb`, and memory that is not mapped (tmpfs files, memfd, pipe buffers)
escapes RLIMIT_AS entirely. A cgroup charges every page and every task of the tree to one
budget. `locate` finds, per controller, where this process may create child cgroups (its own
cgroup in each hierarchy, so the host's own limits still apply above the run's); `RunCgroup`
makes one child per run, sets the limits, reads what the run used, kills whatever is left in it
and removes it.

Controllers and their files (kernel docs: admin-guide/cgroup-v1/{memory,pids}.rst and
admin-guide/cgroup-v2.rst):

* ``memory``: v2 `memory.max`, `memory.swap.max` = 0, `memory.oom.group` = 1 (an OOM kills the
  whole tree), `memory.events` (`oom_kill`), `memory.peak`; v1 `memory.limit_in_bytes`,
  `memory.memsw.limit_in_bytes` (no swap either, when swap accounting is on),
  `memory.oom_control` (`oom_kill`, watched through `cgroup.event_control` with an eventfd),
  `memory.max_usage_in_bytes`.
* ``pids``: `pids.max`, `pids.events` (`max`: forks refused), `pids.peak` (both versions).
* ``cpu`` (accounting only, no limit): v2 `cpu.stat` `usage_usec` (every v2 cgroup has it),
  v1 `cpuacct.usage` (ns).

A v2 hierarchy is used for a controller only when the controller is enabled for children of
this process's cgroup (`cgroup.subtree_control`); enabling it is left to whoever owns that
cgroup (e.g. systemd `Delegate=yes`), because a cgroup that holds processes cannot enable it.
Stdlib only: `sandbox.py` imports it, and that module must load without the rest of scalerl.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Prefer = Literal["auto", "v1", "v2"]
LIMITED = ("memory", "pids")  # the controllers that bound the tree
_V1_NAMES = {"memory": "memory", "pids": "pids", "cpu": "cpuacct"}
RUN_PREFIX = "scalerl-sbx-"


class CgroupError(OSError):
    """A run's cgroup could not be created, configured, read or removed."""


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy as seen by this process."""

    version: int  # 1 or 2
    controllers: frozenset[str]  # v1: from the mount options; v2: empty (read from cgroup.controllers)
    mount_point: str
    own_dir: str | None  # this process's cgroup in it, as a directory; None if outside the mount


@dataclass(frozen=True)
class Placement:
    """Where run cgroups for one controller are made: children of `parent`."""

    controller: str  # "memory", "pids" or "cpu"
    version: int
    parent: str


@dataclass(frozen=True)
class CgroupSupport:
    """The controllers a run cgroup gets, each with the hierarchy it lives in."""

    placements: tuple[Placement, ...]

    def placement(self, controller: str) -> Placement | None:
        return next((p for p in self.placements if p.controller == controller), None)

    @property
    def limited(self) -> tuple[str, ...]:
        return tuple(c for c in LIMITED if self.placement(c) is not None)

    def describe(self) -> str:
        return ", ".join(f"{p.controller} v{p.version} under {p.parent}" for p in self.placements)


@dataclass(frozen=True)
class CgroupUsage:
    """What one run's tree used, read before its cgroup is removed (None: not measured)."""

    peak_memory_bytes: int | None
    oom_kills: int
    pids_refused: int  # forks refused at pids.max
    peak_pids: int | None
    cpu_s: float | None


# -- parsing (pure) -------------------------------------------------------------------------

def parse_proc_cgroup(text: str) -> dict[str, str]:
    """`/proc/<pid>/cgroup` lines `id:controllers:path` -> {controllers: path}; v2 has key ""."""
    own = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            own[parts[1]] = parts[2]
    return own


def _unescape(field: str) -> str:
    return field.encode().decode("unicode_escape")  # mountinfo octal-escapes spaces and tabs


def parse_hierarchies(proc_cgroup: str, mountinfo: str) -> list[Hierarchy]:
    """Every cgroup mount in `mountinfo` (proc(5) format), with this process's directory in it."""
    own = parse_proc_cgroup(proc_cgroup)
    found = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        root, point = _unescape(fields[3]), _unescape(fields[4])
        if tail[0] == "cgroup2":
            version, controllers, path = 2, frozenset(), own.get("")
        else:
            version = 1
            controllers = frozenset(o for o in tail[2].split(",") if o in _V1_NAMES.values())
            path = next((p for key, p in own.items() if key and frozenset(key.split(",")) & controllers
                         and frozenset(key.split(",")) <= frozenset(tail[2].split(","))), None)
        own_dir = None
        if path is not None and (root == "/" or path == root or path.startswith(root.rstrip("/") + "/")):
            rel = path[len(root):] if root != "/" else path
            own_dir = os.path.normpath(point + "/" + rel.lstrip("/"))
        found.append(Hierarchy(version, controllers, point, own_dir))
    return found


def _read(path: str) -> str:
    with open(path, encoding="ascii") as fh:
        return fh.read()


def _keyed(text: str) -> dict[str, int]:
    """`key value` lines (memory.events, pids.events, memory.oom_control, cpu.stat) -> dict."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


# -- detection ------------------------------------------------------------------------------

def locate(prefer: Prefer = "auto", proc_cgroup: str | None = None,
           mountinfo: str | None = None) -> tuple[CgroupSupport | None, list[str]]:
    """Where this process can make run cgroups, per controller; and why each missing one is not.

    `prefer`: "auto" takes v2 for a controller where it is enabled for children, else v1;
    "v1"/"v2" use that version only. Nothing is created here (the first run proves it works).
    """
    if proc_cgroup is None:
        proc_cgroup = _read("/proc/self/cgroup")
    if mountinfo is None:
        with open("/proc/self/mountinfo", encoding="utf-8") as fh:
            mountinfo = fh.read()
    hierarchies = parse_hierarchies(proc_cgroup, mountinfo)
    v2 = next((h for h in hierarchies if h.version == 2 and h.own_dir), None)
    v2_enabled: set[str] = set()
    if v2 is not None and v2.own_dir is not None:
        with contextlib.suppress(OSError):
            v2_enabled = set(_read(os.path.join(v2.own_dir, "cgroup.subtree_control")).split())
    placements, reasons = [], []
    for controller in (*LIMITED, "cpu"):
        why = []
        if prefer in ("auto", "v2"):
            if v2 is None or v2.own_dir is None:
                why.append("v2: no cgroup2 hierarchy holding this process")
            elif controller != "cpu" and controller not in v2_enabled:
                why.append(f"v2: {controller!r} not in {v2.own_dir}/cgroup.subtree_control")
            elif not os.access(v2.own_dir, os.W_OK):
                why.append(f"v2: {v2.own_dir} not writable")
            else:
                placements.append(Placement(controller, 2, v2.own_dir))
                continue
        if prefer in ("auto", "v1"):
            name = _V1_NAMES[controller]
            h1 = next((h for h in hierarchies if h.version == 1 and name in h.controllers), None)
            if h1 is None:
                why.append(f"v1: no {name!r} hierarchy mounted")
            elif h1.own_dir is None or not os.path.isdir(h1.own_dir):
                why.append(f"v1: this process's {name!r} cgroup is outside {h1.mount_point}")
            elif not os.access(h1.own_dir, os.W_OK):
                why.append(f"v1: {h1.own_dir} not writable")
            else:
                placements.append(Placement(controller, 1, h1.own_dir))
                continue
        if controller != "cpu":
            reasons.append(f"{controller}: " + "; ".join(why))
    if not any(p.controller in LIMITED for p in placements):
        return None, reasons
    return CgroupSupport(tuple(placements)), reasons


# -- one run --------------------------------------------------------------------------------

class RunCgroup:
    """The cgroup(s) of one run: created with limits set, then read, emptied and removed.

    One directory per hierarchy in use (v2 controllers share one). The run's init joins every
    directory (`join_files`) before it builds the jail or starts the program, so the whole tree
    is inside; nothing else ever is, which is what makes killing every member safe.
    """

    def __init__(self, support: CgroupSupport, name: str, dirs: dict[str, str]) -> None:
        self.support = support
        self.name = name
        self.dirs = dirs  # controller -> this run's directory

    @classmethod
    def create(cls, support: CgroupSupport, name: str, memory_bytes: int, pids_max: int) -> RunCgroup:
        """Make the run's directories and set its limits; CgroupError (nothing left) on failure."""
        if not name.startswith(RUN_PREFIX) or "/" in name:
            raise ValueError(f"run cgroup name must start with {RUN_PREFIX!r}: {name!r}")
        run = cls(support, name, {})
        made: dict[tuple[int, str], str] = {}
        try:
            for p in support.placements:
                key = (p.version, p.parent)
                if key not in made:
                    path = os.path.join(p.parent, name)
                    os.mkdir(path, 0o755)
                    made[key] = path
                run.dirs[p.controller] = made[key]
            run._set_limits(memory_bytes, pids_max)
        except OSError as exc:
            with contextlib.suppress(OSError):
                run.remove(timeout_s=1.0)
            raise CgroupError(exc.errno, f"creating run cgroup {name}: {exc}") from exc
        return run

    def _version(self, controller: str) -> int | None:
        p = self.support.placement(controller)
        return p.version if p else None

    def _write(self, controller: str, file: str, value: str) -> None:
        with open(os.path.join(self.dirs[controller], file), "w", encoding="ascii") as fh:
            fh.write(value)

    def _set_limits(self, memory_bytes: int, pids_max: int) -> None:
        memory = self._version("memory")
        if memory == 2:
            self._write("memory", "memory.max", str(memory_bytes))
            if os.path.exists(os.path.join(self.dirs["memory"], "memory.swap.max")):
                self._write("memory", "memory.swap.max", "0")
            self._write("memory", "memory.oom.group", "1")
        elif memory == 1:
            self._write("memory", "memory.limit_in_bytes", str(memory_bytes))
            if os.path.exists(os.path.join(self.dirs["memory"], "memory.memsw.limit_in_bytes")):
                self._write("memory", "memory.memsw.limit_in_bytes", str(memory_bytes))
        if self._version("pids") is not None:
            self._write("pids", "pids.max", str(pids_max))

    @property
    def directories(self) -> list[str]:
        return sorted(set(self.dirs.values()))

    @property
    def join_files(self) -> list[str]:
        """The `cgroup.procs` files the init writes "0" to (0 = the writing process)."""
        return [os.path.join(d, "cgroup.procs") for d in self.directories]

    def oom_watch(self) -> dict[str, str | int] | None:
        """What the init watches to stop the whole tree at its first OOM kill."""
        memory = self._version("memory")
        if memory == 1:
            return {"version": 1, "event_control": os.path.join(self.dirs["memory"], "cgroup.event_control"),
                    "oom_control": os.path.join(self.dirs["memory"], "memory.oom_control")}
        if memory == 2:
            return {"version": 2, "events": os.path.join(self.dirs["memory"], "memory.events")}
        return None

    def usage(self) -> CgroupUsage:
        """Read the run's counters (call before `remove`). Unreadable counters are None / 0."""
        peak = peak_pids = cpu = None
        oom = refused = 0
        memory, pids, cpu_version = self._version("memory"), self._version("pids"), self._version("cpu")
        with contextlib.suppress(OSError, ValueError):
            if memory == 2:
                oom = _keyed(_read(os.path.join(self.dirs["memory"], "memory.events"))).get("oom_kill", 0)
                peak = int(_read(os.path.join(self.dirs["memory"], "memory.peak")))
            elif memory == 1:
                control = _read(os.path.join(self.dirs["memory"], "memory.oom_control"))
                oom = _keyed(control).get("oom_kill", 0)
                peak = int(_read(os.path.join(self.dirs["memory"], "memory.max_usage_in_bytes")))
        with contextlib.suppress(OSError, ValueError):
            if pids is not None:
                refused = _keyed(_read(os.path.join(self.dirs["pids"], "pids.events"))).get("max", 0)
                peak_pids = int(_read(os.path.join(self.dirs["pids"], "pids.peak")))
        with contextlib.suppress(OSError, ValueError, KeyError):
            if cpu_version == 2:
                cpu = _keyed(_read(os.path.join(self.dirs["cpu"], "cpu.stat")))["usage_usec"] / 1e6
            elif cpu_version == 1:
                cpu = int(_read(os.path.join(self.dirs["cpu"], "cpuacct.usage"))) / 1e9
        return CgroupUsage(peak, oom, refused, peak_pids, cpu)

    def members(self) -> set[int]:
        """PIDs (host view) of every process in any of the run's directories."""
        pids: set[int] = set()
        for d in self.directories:
            with contextlib.suppress(FileNotFoundError):
                pids |= {int(x) for x in _read(os.path.join(d, "cgroup.procs")).split()}
        return pids

    def kill_members(self) -> int:
        """SIGKILL every member; returns how many were signalled.

        A PID read from `cgroup.procs` is pinned with a pidfd and signalled only if it is still
        listed afterwards, so a PID reused by an unrelated process is never hit.
        """
        for d in self.directories:
            kill_file = os.path.join(d, "cgroup.kill")  # v2, Linux 5.14+: atomic, fork-proof
            if os.path.exists(kill_file):
                with contextlib.suppress(OSError), open(kill_file, "w", encoding="ascii") as fh:
                    fh.write("1")
        listed = self.members()
        pinned = {}
        for pid in listed:
            with contextlib.suppress(OSError):
                pinned[pid] = os.pidfd_open(pid)
        still = self.members()
        killed = 0
        for pid, fd in pinned.items():
            try:
                if pid in still:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    killed += 1
            except ProcessLookupError:
                pass
            finally:
                os.close(fd)
        return killed

    def remove(self, timeout_s: float = 5.0) -> None:
        """Kill what is left, then rmdir every directory; CgroupError if that fails in time."""
        deadline = time.monotonic() + timeout_s
        pause = 0.002
        while True:
            if self.members():
                self.kill_members()
            else:
                left = []
                for d in self.directories:
                    try:
                        os.rmdir(d)
                    except FileNotFoundError:
                        pass
                    except OSError as exc:
                        left.append(f"{d}: {exc.strerror}")
                if not left:
                    return
                if time.monotonic() > deadline:
                    raise CgroupError(16, "cannot remove run cgroup: " + "; ".join(left))
            if time.monotonic() > deadline:
                survivors = len(self.members())
                raise CgroupError(16, f"run cgroup {self.name}: {survivors} processes survive SIGKILL")
            time.sleep(pause)
            pause = min(pause * 2, 0.05)


def leftovers(support: CgroupSupport, prefix: str = RUN_PREFIX) -> list[str]:
    """Run cgroup directories under the parents in `support` (for tests and the sweep)."""
    found = set()
    for p in support.placements:
        with contextlib.suppress(OSError):
            found |= {os.path.join(p.parent, n) for n in os.listdir(p.parent) if n.startswith(prefix)}
    return sorted(found)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(support: CgroupSupport, owners_alive: Iterable[int] | None = None) -> list[str]:
    """Remove run cgroups left by host processes that died mid-run (SIGKILL of a trainer).

    A run directory is named `scalerl-sbx-<host pid>-...`; it is stale when that PID is gone.
    Returns what could not be removed.
    """
    problems = []
    keep = set(owners_alive or ())
    for path in leftovers(support):
        owner = os.path.basename(path)[len(RUN_PREFIX):].split("-", 1)[0]
        if not owner.isdigit() or int(owner) in keep or _alive(int(owner)):
            continue
        try:
            RunCgroup(support, os.path.basename(path), {"stale": path}).remove(timeout_s=2.0)
        except CgroupError as exc:
            problems.append(str(exc))
    return problems
