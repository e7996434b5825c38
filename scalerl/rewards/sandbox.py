"""A sandbox for model-written programs: namespaces, an unprivileged uid, rlimits, bounded output.

Model-written code is hostile. `Sandbox.run_python` runs one program per call, with at most
`max_parallel` running at once (callers in other threads wait for a slot), and returns its
captured, size-capped output. The jail itself is built by `sandbox_init.py`, started through
`unshare`; this module detects, once, whether the configured isolation works here, and logs it:

* ``namespaces`` (running as root): new network (no interfaces up: no network), PID (fresh
  `/proc`, the program sees only its own processes), mount (whole filesystem read-only, `/tmp`
  a private size-limited tmpfs that is the only writable place), IPC and UTS namespaces; the
  program runs as a dedicated unprivileged uid/gid per parallel slot (`uid_base + slot`), so
  RLIMIT_NPROC holds and one program's fork bomb cannot starve another's;
* ``userns`` (not root, unprivileged user namespaces allowed): the same namespaces inside a new
  user namespace; the program is namespace-root mapped to the invoking user, with every
  capability dropped, so the host sees it as that user;
* ``none`` (no namespaces), only when `isolation: none` names it: scratch dir on the host,
  rlimits, clean environment, process group kill and, as root, the dedicated uid (whose processes
  are all killed afterwards). No network or filesystem isolation beyond file permissions: logged
  as a warning.

`isolation: auto` means the namespace mode for this user ("namespaces" as root, else "userns")
and fails closed: where it does not work, nothing runs (`SandboxUnavailableError`;
`require_isolation()` turns it into a `ConfigError` naming `rewards.sandbox.isolation` and what
is missing, which runs that need the sandbox call before any work).

Always: clean environment (PATH, LANG, HOME=TMPDIR=scratch, single-thread BLAS), rlimits for CPU
time, address space, processes, file size, open files and core dumps, a wall-clock limit that
kills every process of the run, no-new-privileges, a cap on captured output (the run is killed
past it), and a fresh scratch dir removed afterwards.

Where this process may create cgroups (v2 with the controllers delegated, else v1; `cgroup.py`),
each run also gets its own cgroup, which bounds the whole tree: `tree_memory_mb` of memory of
every kind (anonymous, tmpfs, memfd, kernel), no swap, `tree_nproc` tasks. The first OOM kill
in it stops the whole run (reason "memory_limit"). The host kills anything left in it and
removes it after every run. Where none can be made, the run falls back to the rlimits alone (the
tree may then use up to `nproc * memory_mb`) and the log says so. Not bounded: CPU share.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import queue
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from scalerl.config import ConfigError, SandboxConfig
from scalerl.rewards.cgroup import CgroupError, CgroupSupport, CgroupUsage, RunCgroup, locate, sweep_stale
from scalerl.rewards.sandbox_init import SECCOMP_MACHINES

logger = logging.getLogger(__name__)

Mode = Literal["namespaces", "userns", "none"]
_MODES: tuple[Mode, ...] = ("namespaces", "userns", "none")
_INIT_SCRIPT = Path(__file__).with_name("sandbox_init.py")
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
_MiB = 1024 * 1024


@dataclass(frozen=True)
class Protections:
    """What isolation is active, as detected by running a probe program in each mode."""

    mode: Mode
    network_isolated: bool
    pid_namespace: bool
    readonly_filesystem: bool
    private_tmp: bool
    dedicated_uid: bool
    rejected: tuple[str, ...] = ()  # why each stronger mode was not used
    setup_warnings: tuple[str, ...] = ()  # jail parts the probe run could not build
    cgroup: CgroupSupport | None = None  # per-run cgroups, when they work here
    tree_limits: str = ""  # what the cgroup bounds, e.g. "memory 1024 MB, 18 tasks"
    cgroup_rejected: tuple[str, ...] = ()  # why a controller (or cgroups at all) is not used

    def missing(self) -> list[str]:
        """The protections absent here, worded for the user ("NO network isolation", ...)."""
        missing: list[str] = []
        if self.cgroup is None or "memory" not in self.cgroup.limited:
            missing.append("NO tree-wide memory bound (up to nproc x memory_mb)")
        if self.cgroup is None or "pids" not in self.cgroup.limited:
            missing.append("NO tree-wide task bound (per-uid RLIMIT_NPROC only)")
        if not self.network_isolated:
            missing.append("NO network isolation")
        if not self.readonly_filesystem:
            missing.append("NO filesystem isolation (host file permissions only)")
        if not self.pid_namespace:
            missing.append("NO PID isolation (can see and signal host processes of its uid)")
        return missing

    def describe(self) -> str:
        active = ["rlimits (cpu, memory, processes, file size, open files)", "clean environment",
                  "wall-clock kill of all processes", "output cap", "no-new-privileges"]
        if self.network_isolated:
            active.append("no network (empty network namespace)")
        if self.pid_namespace:
            active.append("PID namespace with private /proc")
        if self.readonly_filesystem:
            active.append("read-only filesystem")
        if self.private_tmp:
            active.append("private size-limited /tmp (and /dev/shm) as the only writable dirs; "
                          "host /run and network interfaces hidden")
        active.append(f"seccomp: an allow-list of the syscalls a Python interpreter needs on "
                      f"{platform.machine()} (sockets AF_INET/AF_INET6 only, no namespaces, ptrace, "
                      f"mount, bpf, io_uring, keyrings)")
        if self.dedicated_uid:
            active.append("dedicated unprivileged uid per slot")
        if self.cgroup is not None:
            active.append(f"per-run cgroup bounding the whole tree ({self.tree_limits}; "
                          f"{self.cgroup.describe()})")
        missing = self.missing()
        text = f"sandbox mode {self.mode!r}: " + "; ".join(active)
        if missing:
            text += ". MISSING: " + "; ".join(missing)
        if self.rejected:
            text += ". Stronger modes unavailable: " + " | ".join(self.rejected)
        if self.cgroup_rejected:
            text += ". Cgroups: " + " | ".join(self.cgroup_rejected)
        if self.setup_warnings:
            text += ". Setup warnings: " + " | ".join(self.setup_warnings)
        return text


@dataclass(frozen=True)
class SandboxResult:
    """One run. `error` is set when the sandbox itself failed (not the program's fault)."""

    stdout: bytes
    stderr: bytes
    exit_code: int | None
    signal: int | None
    timed_out: bool
    output_limited: bool
    wall_s: float
    cpu_s: float | None
    error: str | None = None
    setup_warnings: tuple[str, ...] = ()  # parts of the jail that could not be built (e.g. a mount)
    cgroup: bool = False  # the run's tree was inside its own cgroup
    memory_limited: bool = False  # the tree hit `tree_memory_mb` (an OOM kill): the run was stopped
    tasks_refused: int = 0  # forks refused at `tree_nproc`
    peak_memory_bytes: int | None = None  # the tree's peak (cgroup), None without one
    tree_cpu_s: float | None = None  # CPU time of the whole tree (cgroup), None without one

    @property
    def ok(self) -> bool:
        """The program ran to a clean exit 0 within every limit."""
        return (self.error is None and self.exit_code == 0 and not self.timed_out
                and not self.output_limited and not self.memory_limited)

    @property
    def reason(self) -> str:
        """A one-word account: ok, sandbox_error, memory_limit (the tree's), timeout (wall or CPU),
        output_limit, signal, exit_code."""
        if self.error is not None:
            return "sandbox_error"
        if self.memory_limited:
            return "memory_limit"
        if self.timed_out:
            return "timeout"
        if self.output_limited:
            return "output_limit"
        if self.signal is not None:
            return "timeout" if self.signal == signal.SIGXCPU else "signal"
        return "ok" if self.exit_code == 0 else "exit_code"


class SandboxUnavailableError(RuntimeError):
    """The configured isolation cannot be had here: no namespace mode works (`isolation: auto`),
    the named mode does not, or a required cgroup version does not. `key` names the setting."""

    def __init__(self, message: str, key: str = "isolation", hint: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.hint = hint  # what the user can do, when the default advice for `key` does not apply


def _rlimits(config: SandboxConfig, wall_s: float) -> dict[str, tuple[int, int]]:
    cpu = math.ceil(config.cpu_s if config.cpu_s is not None else wall_s)
    memory = config.memory_mb * _MiB
    fsize = config.file_size_mb * _MiB
    return {
        "RLIMIT_CPU": (cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL one second later
        "RLIMIT_AS": (memory, memory),
        "RLIMIT_NPROC": (config.nproc, config.nproc),
        "RLIMIT_FSIZE": (fsize, fsize),
        "RLIMIT_NOFILE": (config.open_files, config.open_files),
        "RLIMIT_CORE": (0, 0),
        "RLIMIT_MEMLOCK": (0, 0),
        "RLIMIT_MSGQUEUE": (0, 0),
    }


def _program_env() -> dict[str, str]:
    """Everything the program's environment holds; nothing is inherited from the host."""
    return {
        "PATH": _SAFE_PATH,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",  # thread pools would spend the process limit
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _interpreter_trees(python: str) -> list[str]:
    """Directories the program's interpreter reads: its venv and its base install."""
    trees = {str(Path(python).absolute().parent.parent), str(Path(python).resolve().parent.parent)}
    if Path(python).absolute() == Path(sys.executable).absolute():
        trees |= {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return sorted(trees)


def _launch_prefix(mode: Mode, unshare: str | None) -> list[str]:
    if mode == "none":
        return []
    if unshare is None:
        raise SandboxUnavailableError("`unshare` (util-linux) not found")
    prefix = [unshare, "--net", "--pid", "--fork", "--mount", "--ipc", "--uts",
              "--propagation", "private", "--kill-child=SIGKILL"]
    if mode == "userns":
        prefix[1:1] = ["--user", "--map-root-user"]
    return prefix


class Sandbox:
    """Runs Python programs under the strongest isolation available (see module doc)."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config: SandboxConfig = config or SandboxConfig()
        # Resolved here, not in the config, so a saved config names no machine's paths.
        self.python = self.config.python or sys.executable
        self.unshare = self.config.unshare or shutil.which("unshare")
        self._free_slots: queue.Queue[int] = queue.Queue()
        for slot in range(self.config.max_parallel):
            self._free_slots.put(slot)
        self._protections: Protections | None = None
        self._detect_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self.runs = 0
        self.sandbox_errors = 0  # runs where the sandbox itself failed
        self.memory_limited = 0  # runs stopped at the tree's memory bound
        self.tasks_limited = 0  # runs that had a fork refused at the tree's task bound
        self.cgroup_runs = 0  # runs inside their own cgroup
        self.cgroup_fallbacks = 0  # runs that should have had one but fell back to rlimits only
        self.cgroup_leaks = 0  # run cgroups that could not be removed (logged)
        self._fallback_logged = False

    def stats(self) -> dict[str, int]:
        """Counters for metrics: runs, sandbox errors, tree limits hit, cgroup use and failures."""
        with self._stats_lock:
            return {"runs": self.runs, "errors": self.sandbox_errors,
                    "memory_limited": self.memory_limited, "tasks_limited": self.tasks_limited,
                    "cgroup_runs": self.cgroup_runs, "cgroup_fallbacks": self.cgroup_fallbacks,
                    "cgroup_leaks": self.cgroup_leaks}

    # -- detection -------------------------------------------------------------------------
    @property
    def protections(self) -> Protections:
        """The active isolation, detected on first use and logged once."""
        with self._detect_lock:
            if self._protections is None:
                self._protections = self._detect()
                # A missing protection is a warning (Python's last-resort handler prints it on
                # stderr when the application configured no logging), not an INFO line nobody sees.
                degraded = self._protections.mode != "namespaces" or bool(self._protections.missing())
                logger.log(logging.WARNING if degraded else logging.INFO, "%s", self._protections.describe())
            return self._protections

    def require_isolation(self, need: str = "this run") -> Protections:
        """The active protections; a `ConfigError` (bad input: exit 2) naming the setting and what
        is missing when the configured isolation cannot be had. `need`: why the caller needs it.

        Fail closed: a run that would execute model-written code calls this before any work, and
        no mode weaker than the configured one is ever chosen in its place."""
        try:
            return self.protections
        except SandboxUnavailableError as exc:
            key = f"rewards.sandbox.{exc.key}"
            value = getattr(self.config, exc.key)
            default = ("set rewards.sandbox.isolation=none to run model-written code without network, "
                       "filesystem or PID isolation" if exc.key == "isolation"
                       else "set rewards.sandbox.cgroup=auto (rlimits where no cgroup can be made) or off")
            hint = exc.hint or default
            raise ConfigError(f"{key}: {value!r} cannot be had here ({exc}); the sandbox is needed for "
                              f"{need}; fix what is missing, or {hint}") from None

    def _candidate_modes(self) -> list[Mode]:
        """The mode to try. `auto` is the strongest namespace mode for this user (as root, a user
        namespace would add nothing over `namespaces`); `none` is never a fallback, only a choice."""
        if self.config.isolation != "auto":
            return [self.config.isolation]
        return ["namespaces"] if os.geteuid() == 0 else ["userns"]

    def _detect(self) -> Protections:
        machine = platform.machine()
        if machine not in SECCOMP_MACHINES:  # every mode loads the allow-list: none exists here
            raise SandboxUnavailableError(
                f"no seccomp allow-list for architecture {machine!r} (tables exist for "
                f"{', '.join(SECCOMP_MACHINES)})",
                hint="run the code verifier on an x86_64 or aarch64 machine (no isolation setting runs "
                     "model-written code without the allow-list)")
        rejected: list[str] = []
        for mode in self._candidate_modes():
            dedicated = os.geteuid() == 0 and mode != "userns"
            probe = Protections(
                mode=mode, network_isolated=mode != "none", pid_namespace=mode != "none",
                readonly_filesystem=mode != "none", private_tmp=mode != "none", dedicated_uid=dedicated,
                rejected=tuple(rejected))
            try:
                result = self._run(probe, {"probe.py": b"import os\nprint(6 * 7, os.getuid())\n"},
                                   "probe.py", b"", wall_s=30.0)
            except SandboxUnavailableError as exc:
                rejected.append(f"{mode}: {exc}")
                continue
            words = result.stdout.decode(errors="replace").split()
            uids = range(self.config.uid_base, self.config.uid_base + self.config.max_parallel)
            uid_ok = not dedicated or (len(words) > 1 and words[1].isdigit() and int(words[1]) in uids)
            if result.ok and words[:1] == ["42"] and uid_ok:
                return self._detect_cgroup(replace(probe, setup_warnings=result.setup_warnings))
            why = result.error or result.stderr.decode(errors="replace").strip()[-300:] or result.reason
            rejected.append(f"{mode}: probe failed ({why})")
        what = "no namespace mode works here" if self.config.isolation == "auto" else "it does not work here"
        raise SandboxUnavailableError(f"{what}: " + " | ".join(rejected))

    def _detect_cgroup(self, prot: Protections) -> Protections:
        """Add per-run cgroups to `prot` if a probe run inside one works; else say why not."""
        wanted = self.config.cgroup
        if wanted == "off":
            return replace(prot, cgroup_rejected=("off (sandbox.cgroup)",))
        try:
            support, reasons = locate("auto" if wanted == "auto" else wanted)
        except OSError as exc:
            support, reasons = None, [f"cannot read this process's cgroups: {exc}"]
        if support is not None:
            for problem in sweep_stale(support):
                logger.warning("sandbox: stale run cgroup left in place: %s", problem)
            limits = f"memory {self.config.tree_memory_mb} MB, {self.config.tree_tasks} tasks"
            trial = replace(prot, cgroup=support, tree_limits=limits)
            result = self._run(trial, {"probe.py": b"print(6 * 7)\n"}, "probe.py", b"", wall_s=30.0)
            if result.ok and result.stdout.split()[:1] == [b"42"] and result.cgroup:
                return replace(trial, cgroup_rejected=tuple(reasons))
            why = result.error or "; ".join(result.setup_warnings) or result.reason
            reasons.append(f"a probe run inside a cgroup failed ({why})")
            support = None
        if wanted != "auto":
            raise SandboxUnavailableError(f"sandbox.cgroup={wanted!r} does not work here: "
                                          + " | ".join(reasons), key="cgroup")
        return replace(prot, cgroup_rejected=tuple(reasons or ["no cgroup hierarchy found"]))

    # -- running ---------------------------------------------------------------------------
    def run_python(
        self,
        files: dict[str, str | bytes],
        main: str,
        stdin: str | bytes = b"",
        wall_s: float | None = None,
    ) -> SandboxResult:
        """Run `python -I -B main` in a fresh scratch dir holding `files` (name -> content).

        Blocks while `max_parallel` runs are in flight. Never raises for anything the program
        does; raises SandboxUnavailableError when no isolation mode works, ValueError on bad arguments.
        """
        if main not in files:
            raise ValueError(f"main: {main!r} is not one of the files {sorted(files)}")
        for name in files:
            if not name or "/" in name or name.startswith("."):
                raise ValueError(f"files: bad file name {name!r} (plain names only)")
        if wall_s is not None and wall_s <= 0:
            raise ValueError(f"wall_s: must be > 0, got {wall_s}")
        raw = {name: (c.encode() if isinstance(c, str) else c) for name, c in files.items()}
        data = stdin.encode() if isinstance(stdin, str) else stdin
        prot = self.protections
        result = self._run(prot, raw, main, data, wall_s or self.config.wall_s)
        with self._stats_lock:
            self.runs += 1
            self.sandbox_errors += result.error is not None
            self.memory_limited += result.memory_limited
            self.tasks_limited += result.tasks_refused > 0
            self.cgroup_runs += result.cgroup
            self.cgroup_fallbacks += prot.cgroup is not None and not result.cgroup and result.error is None
        return result

    def _make_cgroup(self, prot: Protections, slot: int) -> tuple[RunCgroup | None, str | None]:
        if prot.cgroup is None:
            return None, None
        name = f"scalerl-sbx-{os.getpid()}-{slot}-{os.urandom(4).hex()}"
        try:
            return RunCgroup.create(prot.cgroup, name, self.config.tree_memory_mb * _MiB,
                                    self.config.tree_tasks), None
        except (CgroupError, ValueError) as exc:
            with self._stats_lock:
                first, self._fallback_logged = not self._fallback_logged, True
            if first:  # once: a machine where this fails tends to fail on every run
                logger.warning("sandbox: no per-run cgroup, rlimits only: %s", exc)
            return None, f"no per-run cgroup (rlimits only): {exc}"

    def _release_cgroup(self, cgroup: RunCgroup, result: SandboxResult) -> SandboxResult:
        """Read what the tree used, kill what is left in the cgroup, remove it."""
        usage: CgroupUsage = cgroup.usage()
        try:
            cgroup.remove()
        except CgroupError as exc:
            with self._stats_lock:
                self.cgroup_leaks += 1
            logger.error("sandbox: %s", exc)
        oom = result.cgroup and usage.oom_kills > 0  # a victim the init did not see in time
        return replace(result, memory_limited=result.memory_limited or oom,
                       tasks_refused=usage.pids_refused, peak_memory_bytes=usage.peak_memory_bytes,
                       tree_cpu_s=usage.cpu_s)

    def _run(self, prot: Protections, files: dict[str, bytes], main: str, stdin: bytes,
             wall_s: float) -> SandboxResult:
        prefix = _launch_prefix(prot.mode, self.unshare)
        slot = self._free_slots.get()
        spec_dir = tempfile.mkdtemp(prefix=f"scalerl-sbx-{os.getpid()}-")  # pid: whose leftovers
        fds: list[int] = []
        cgroup: RunCgroup | None = None
        try:
            cgroup, cgroup_warning = self._make_cgroup(prot, slot)
            os.chmod(spec_dir, 0o711)  # the program's uid may pass through to `work/`, not list it
            os.mkdir(os.path.join(spec_dir, "files"), 0o700)
            for name, content in files.items():
                Path(spec_dir, "files", name).write_bytes(content)
            status_r, status_w = os.pipe()
            control_r, control_w = os.pipe()
            fds += [status_r, status_w, control_r, control_w]
            uid = self.config.uid_base + slot if prot.dedicated_uid else None
            spec = {
                "files": sorted(files),
                "argv": [self.python, "-I", "-B", main],
                "env": _program_env(),
                "rlimits": _rlimits(self.config, wall_s),
                "wall_s": wall_s,
                "uid": uid,
                "gid": uid,
                "uid_dedicated": prot.dedicated_uid,
                "mount_namespace": prot.mode != "none",
                "pid_namespace": prot.pid_namespace,
                "expose": _interpreter_trees(self.python),
                "scratch_bytes": self.config.scratch_mb * _MiB,
                "scratch_inodes": self.config.scratch_inodes,
                "status_fd": status_w,
                "control_fd": control_r,
                "cgroup": {"join": cgroup.join_files, "oom": cgroup.oom_watch()} if cgroup else None,
            }
            Path(spec_dir, "spec.json").write_text(json.dumps(spec))
            cmd = [*prefix, self.python, "-I", "-S", "-B", str(_INIT_SCRIPT), spec_dir]
            try:
                proc = subprocess.Popen(
                    cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    pass_fds=(status_w, control_r), env={"PATH": _SAFE_PATH, "LANG": "C.UTF-8"},
                    cwd="/", start_new_session=True)
            except OSError as exc:
                raise SandboxUnavailableError(f"cannot start {cmd[0]}: {exc}") from exc
            for fd in (status_w, control_r):
                os.close(fd)
                fds.remove(fd)
            result = self._pump(proc, stdin, status_r, control_w, wall_s)
            if cgroup_warning:
                result = replace(result, setup_warnings=(*result.setup_warnings, cgroup_warning))
            if cgroup is not None:
                result = self._release_cgroup(cgroup, result)
                cgroup = None
            return result
        finally:
            if cgroup is not None:  # an exception on the way: still nothing may be left behind
                with contextlib.suppress(CgroupError):
                    cgroup.remove()
            for fd in fds:
                os.close(fd)
            shutil.rmtree(spec_dir, ignore_errors=True)
            self._free_slots.put(slot)

    def _pump(self, proc: subprocess.Popen[bytes], stdin: bytes, status_fd: int, control_fd: int,
              wall_s: float) -> SandboxResult:
        """Feed stdin, collect capped output and the init's status; kill on overflow or hang."""
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        start = time.monotonic()
        deadline = start + wall_s + self.config.startup_grace_s
        cap = self.config.max_output_bytes
        out = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
        status = bytearray()
        output_limited = backstop = False
        sel = selectors.DefaultSelector()
        for fd in (*out, status_fd):
            sel.register(fd, selectors.EVENT_READ)
        stdin_fd = proc.stdin.fileno()
        view = memoryview(stdin)
        if view:
            os.set_blocking(stdin_fd, False)
            sel.register(stdin_fd, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        try:
            readers = (*out, status_fd)
            while any(fd in sel.get_map() for fd in readers):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    backstop = True
                    break
                for key, _ in sel.select(remaining):
                    fd = key.fd
                    if fd == stdin_fd:
                        try:
                            view = view[os.write(fd, view[:65536]):]
                        except BlockingIOError:
                            continue
                        except BrokenPipeError:
                            view = view[len(view):]  # the program stopped reading: drop the rest
                        if not view:
                            sel.unregister(fd)
                            proc.stdin.close()
                        continue
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        sel.unregister(fd)
                        continue
                    if fd == status_fd:
                        status += chunk[: 65536 - len(status)]
                        continue
                    if output_limited:
                        continue  # keep draining so the program never blocks before it is killed
                    total = sum(len(b) for b in out.values())
                    out[fd] += chunk[: max(0, cap - total)]
                    if total + len(chunk) > cap:
                        output_limited = True
                        with contextlib.suppress(BrokenPipeError):  # the init may be gone already
                            os.write(control_fd, b"k")  # the init kills every process of the run
        finally:
            sel.close()
            if not proc.stdin.closed:
                proc.stdin.close()
        if backstop:
            _kill_group(proc.pid)  # the init's group; --kill-child empties the namespace
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait()
        stdout, stderr = bytes(out[proc.stdout.fileno()]), bytes(out[proc.stderr.fileno()])
        proc.stdout.close()
        proc.stderr.close()
        elapsed = time.monotonic() - start
        try:
            info = json.loads(bytes(status).decode().splitlines()[0])
        except (ValueError, IndexError):
            why = "hung past the wall limit" if backstop else f"exited with code {proc.returncode}"
            return SandboxResult(stdout, stderr, None, None, backstop, output_limited, elapsed, None,
                                 error=f"sandbox init {why}: {stderr[-500:].decode(errors='replace')}")
        if not info.get("ok"):
            return SandboxResult(stdout, stderr, None, None, False, output_limited, elapsed, None,
                                 error=str(info.get("error", "sandbox init failed")))
        return SandboxResult(
            stdout=stdout, stderr=stderr, exit_code=info["exit_code"], signal=info["signal"],
            timed_out=bool(info["timed_out"]), output_limited=output_limited,
            wall_s=float(info["wall_s"]), cpu_s=info["cpu_s"],
            setup_warnings=tuple(info.get("setup_warnings", ())),
            cgroup=bool(info.get("cgroup")), memory_limited=bool(info.get("memory_limited")))


_default: Sandbox | None = None
_default_lock = threading.Lock()


def default_sandbox() -> Sandbox:
    """The process-wide sandbox used by `code_reward` (created on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Sandbox()
        return _default


def configure_sandbox(config: SandboxConfig | None = None, **overrides: Any) -> Sandbox:
    """Replace the process-wide sandbox: a full `SandboxConfig` and/or field overrides."""
    global _default
    base = config or SandboxConfig()
    new = Sandbox(SandboxConfig.model_validate({**base.model_dump(), **overrides}))
    with _default_lock:
        _default = new
    return new
