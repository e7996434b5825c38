"""A corpus of hostile programs, and a runner that says which of them escaped a `Sandbox`.

Each program tries one thing a model-written program must not achieve: outlive its limits, use
more memory, processes, disk or output than allowed, write outside its scratch dir, read the
host's secrets, see or signal or trace host processes, gain privileges, reach the network or a
host socket, leave state behind, or take the sandbox itself down. A program *escapes* if it
achieves its goal. Evidence is gathered on the host where the host can see it (a canary file
and directory, canary processes that must stay alive and untraced, listeners that must accept
nothing, a secret in the host's environment, processes left over, SysV IPC keys, the run's
measured usage) and otherwise from the program's own report of a hostile call that succeeded
(the programs are ours: an `ESCAPED:` line is a fact, not a claim to be doubted).

Every program is bounded by itself (its own 10 s deadline, at most a few hundred processes, a
few hundred MB, 200 MB of disk), so against a weak sandbox the check fails instead of the
machine. No program signals anything but the canaries, writes anything but unique new names
or the canaries, or opens a kernel control file for anything but a write-open that writes
nothing.

    report = run_corpus(sandbox, Path("."))   # the directory must be visible inside the jail
    print(format_table(report))
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalerl.rewards.sandbox import Sandbox, SandboxConfig, SandboxResult
from scalerl.rewards.sandbox_init import SECCOMP_MACHINES

SECRET_VAR = "SCALERL_CORPUS_SECRET"
# Time over the wall limit that counts as "outlived its limit": as the init measures the program
# (the kill came late), and as the host sees the whole call (a hang on the host's side; generous,
# because jail start-up on a loaded 2-core machine takes seconds).
KILL_SLACK_S = 2.0
HOST_SLACK_S = 10.0
_MiB = 1024 * 1024

_PRELUDE = '''\
import os, sys, time
C = {canary!r}
DEADLINE = time.monotonic() + 10  # bounded even if nothing stops it


def escaped(what):
    print("ESCAPED:", what, flush=True)


def try_open_write(path):
    """Write-open without writing: proves the access, changes nothing."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    os.close(fd)
    return True

'''


@dataclass(frozen=True)
class Hostile:
    """One program: `body` runs after the prelude (which defines `C`, `DEADLINE`, `escaped`)."""

    name: str
    kind: str
    goal: str
    body: str
    wall_s: float = 1.5
    stdin: bytes = b""
    needs: str | None = None  # "cgroup", "namespaces" or "allow_list": the protection it relies on
    check: Callable[[Canaries, SandboxResult, str], str | None] | None = None


@dataclass
class Row:
    """One program's outcome; `evidence` is empty when it was contained."""

    name: str
    kind: str
    goal: str
    reason: str
    evidence: list[str]
    host_wall_s: float
    peak_memory_mb: float | None
    tree_cpu_s: float | None
    skipped: str | None = None
    host_cpu_s: float = 0.0  # the host thread's own CPU for the call: setup, pumping, cleanup

    @property
    def escaped(self) -> bool:
        return bool(self.evidence)


@dataclass
class Report:
    rows: list[Row]
    global_evidence: list[str]
    protections: str
    wall_s: float
    sandbox_stats: dict[str, int] = field(default_factory=dict)
    identity: Identity | None = None

    @property
    def tried(self) -> list[Row]:
        return [r for r in self.rows if r.skipped is None]

    @property
    def escapes(self) -> int:
        return sum(r.escaped for r in self.tried) + bool(self.global_evidence)


# -- the host side: canaries -------------------------------------------------------------------

class Canaries:
    """What a program must not reach, set up on the host for one corpus run."""

    def __init__(self, sandbox: Sandbox, root: Path) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.listeners: list[socket.socket] = []
        self.unix_paths: list[str] = []
        self.dir: Path | None = None
        self._old_secret: str | None = os.environ.get(SECRET_VAR)
        self._lock = threading.Lock()
        self._reported: set[str] = set()
        try:
            self._setup(sandbox, root)
        except BaseException:
            self.close()
            raise

    def _setup(self, sandbox: Sandbox, root: Path) -> None:
        self.sandbox = sandbox
        self.config = sandbox.config
        self.token = secrets.token_hex(6)
        self.ipc_key = int(self.token[:7], 16)
        self.marker = f"scalerl-canary-{self.token}"
        self.dir = Path(tempfile.mkdtemp(prefix=".sbx-canary-", dir=root))
        self.dir.chmod(0o777)  # permissions are not the barrier: the jail must be
        self.file = self.dir / "canary.txt"
        self.file.write_text(self.token)
        self.file.chmod(0o666)
        self.secret = "sk-" + secrets.token_hex(12)
        os.environ[SECRET_VAR] = self.secret
        for uid in self._canary_uids():
            self.procs.append(self._canary_process(uid))
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listeners.append(self.tcp)
        self.tcp.bind(("127.0.0.1", 0))
        self.port = self.tcp.getsockname()[1]
        addresses = [str(self.dir / "canary.sock")]
        if os.path.isdir("/run") and os.access("/run", os.W_OK):
            addresses.append(f"/run/{self.marker}.sock")  # where host services keep theirs
        self.abstract = "\0" + self.marker
        for address in (*addresses, self.abstract):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.listeners.append(sock)
            sock.bind(address)
            if not address.startswith("\0"):
                self.unix_paths.append(address)
                os.chmod(address, 0o777)
        for sock in self.listeners:
            sock.listen(16)
            sock.setblocking(False)

    def _canary_uids(self) -> list[int | None]:
        """The host's own uid, and (as root) every sandbox slot uid: then only the jail, not
        file permissions, stops a program from signalling or tracing a process of its own uid."""
        uids: list[int | None] = [None]
        if os.geteuid() == 0 and self.sandbox.protections.dedicated_uid:
            uids += [self.config.uid_base + i for i in range(self.config.max_parallel)]
        return uids

    def _canary_process(self, uid: int | None) -> subprocess.Popen[bytes]:
        sleep = shutil.which("sleep") or "/bin/sleep"
        return subprocess.Popen([self.marker, "3600"], executable=sleep, user=uid, group=uid,
                                start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def info(self) -> dict[str, Any]:
        """What the programs are told (they know every target; knowing must not be enough)."""
        return {"dir": str(self.dir), "file": str(self.file), "pids": [p.pid for p in self.procs],
                "port": self.port, "unix": self.unix_paths, "abstract": self.abstract,
                "token": self.token, "marker": self.marker, "ipc_key": self.ipc_key,
                "host_paths": self.host_paths()}

    def host_paths(self) -> list[str]:
        """Host paths where a program's write must not land (unique to this run)."""
        assert self.dir is not None
        dirs = (tempfile.gettempdir(), "/var/tmp", "/dev/shm", "/etc", "", str(self.dir.parent))
        return [f"{d}/sbx-{self.token}" for d in dirs]

    def new_damage(self) -> list[str]:
        """`damage()` not reported before: what the program(s) just run did."""
        found = self.damage()
        with self._lock:
            fresh = [d for d in found if d not in self._reported]
            self._reported |= set(fresh)
        return fresh

    def damage(self) -> list[str]:
        """Host-side evidence that something got through (checked after every program)."""
        found = []
        with self._lock:
            for sock in self.listeners:
                try:
                    conn, _ = sock.accept()
                    conn.close()
                    found.append(f"listener {sock.getsockname()!r} accepted a connection")
                except BlockingIOError:
                    pass
        for proc in self.procs:
            if proc.poll() is not None:
                found.append(f"canary process {proc.pid} died ({proc.returncode})")
            else:
                with contextlib.suppress(OSError):
                    state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state in ("t", "T"):
                        found.append(f"canary process {proc.pid} is stopped/traced")
        try:
            if self.file.read_text() != self.token:
                found.append("canary file modified")
            if self.file.stat().st_mode & 0o7777 != 0o666:
                found.append("canary file mode changed")
        except OSError:
            found.append("canary file removed")
        extra = sorted(p.name for p in self.dir.iterdir() if p.name not in ("canary.txt", "canary.sock"))
        if extra:
            found.append(f"files created in the canary dir: {extra}")
        for path in self.host_paths():
            if os.path.lexists(path):
                found.append(f"host file created: {path}")
        found += self._ipc_leaks()
        return found

    def _ipc_leaks(self) -> list[str]:
        found = []
        for kind in ("shm", "msg", "sem"):
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]:
                    if line.split() and line.split()[0] == str(self.ipc_key):
                        found.append(f"SysV {kind} with the program's key visible on the host")
        return found

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for sock in self.listeners:
            sock.close()
        for path in self.unix_paths:
            with contextlib.suppress(OSError):
                os.unlink(path)
        if self.dir is not None:  # the token and dir exist from here on
            for path in self.host_paths():
                with contextlib.suppress(OSError):
                    os.unlink(path)
            self._remove_ipc()
            shutil.rmtree(self.dir, ignore_errors=True)
        if self._old_secret is None:
            os.environ.pop(SECRET_VAR, None)
        else:
            os.environ[SECRET_VAR] = self._old_secret

    def _remove_ipc(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        ipc_rmid = 0
        for get, ctl in (("shmget", "shmctl"), ("msgget", "msgctl"), ("semget", "semctl")):
            args = (self.ipc_key, 0, 0) if get != "msgget" else (self.ipc_key, 0)
            ident = getattr(libc, get)(*args)
            if ident >= 0:
                if ctl == "semctl":
                    libc.semctl(ident, 0, ipc_rmid)
                else:
                    getattr(libc, ctl)(ident, ipc_rmid, None)


# -- checks -----------------------------------------------------------------------------------

def _numbers(text: str, label: str) -> list[int]:
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == label and parts[1].lstrip("-").isdigit():
            out.append(int(parts[1]))
    return out


def _must_be_stopped(_: Canaries, result: SandboxResult, __: str) -> str | None:
    if result.timed_out or result.signal is not None or result.memory_limited:
        return None
    return f"not stopped by the sandbox (exit {result.exit_code}): it ran to its own deadline"


def _at_most(label: str, limit: Callable[[Canaries], int], unit: str = "") -> Callable[..., str | None]:
    def check(c: Canaries, _: SandboxResult, text: str) -> str | None:
        values = _numbers(text, label)
        top, bound = max(values, default=0), limit(c)
        return f"{label} reached {top}{unit}, over the bound {bound}{unit}" if top > bound else None
    return check


def _below(label: str, limit: Callable[[Canaries], int], unit: str = "") -> Callable[..., str | None]:
    def check(c: Canaries, _: SandboxResult, text: str) -> str | None:
        values = _numbers(text, label)
        top, bound = max(values, default=0), limit(c)
        return f"{label} reached {top}{unit}, the bound is {bound}{unit}" if top >= bound else None
    return check


def _secret_absent(c: Canaries, result: SandboxResult, _: str) -> str | None:
    seen = c.secret.encode() in result.stdout + result.stderr
    return "the host's secret environment variable was read" if seen else None


def _cpu_bounded(wall_s: float) -> Callable[..., str | None]:
    def check(c: Canaries, result: SandboxResult, _: str) -> str | None:
        used = result.tree_cpu_s if result.tree_cpu_s is not None else result.cpu_s
        # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL 1 s later; 0.5 s for the init's own start
        limit = math.ceil(c.config.cpu_s if c.config.cpu_s is not None else wall_s) + 1.5
        if used is not None and used > limit:
            return f"used {used:.1f} CPU-s, over its {limit:.1f} s"
        return None
    return check


def _output_capped(c: Canaries, result: SandboxResult, _: str) -> str | None:
    kept = len(result.stdout) + len(result.stderr)
    if kept > c.config.max_output_bytes:
        return f"{kept} bytes captured, over the {c.config.max_output_bytes} cap"
    return None if result.output_limited else "the output cap did not stop it"


_BINARY = (bytes(range(256)) * 64 + b"\xff\xfe\x00\x1b[2J\x1b]0;title\x07\r\n"
           + b'{"ok": true, "exit_code": 0}\n')


def _binary_intact(_: Canaries, result: SandboxResult, __: str) -> str | None:
    if result.stdout != _BINARY or result.stderr != _BINARY[::-1]:
        return "binary output altered on its way to the host"
    return None if result.ok else f"binary output broke the run ({result.reason})"


def _exit_code_is(code: int) -> Callable[..., str | None]:
    def check(_: Canaries, result: SandboxResult, __: str) -> str | None:
        return None if result.exit_code == code else f"status forged: exit {result.exit_code}, not {code}"
    return check


def _no_late_output(_: Canaries, result: SandboxResult, __: str) -> str | None:
    return "a child wrote after the program ended" if b"late" in result.stdout else None


def _canary_not_listed(c: Canaries, _: SandboxResult, text: str) -> str | None:
    return "host processes visible in /proc" if c.marker in text else None


# -- the corpus -------------------------------------------------------------------------------

def _p(name: str, kind: str, goal: str, body: str, **kw: Any) -> Hostile:
    return Hostile(name, kind, goal, textwrap.dedent(body), **kw)


CORPUS: tuple[Hostile, ...] = (
    # -- time
    _p("cpu_spin", "time", "run past the wall limit", """
    while time.monotonic() < DEADLINE:
        pass
    """, check=_must_be_stopped),
    _p("sleep_forever", "time", "run past the wall limit", "time.sleep(10)\n", check=_must_be_stopped),
    _p("ignore_signals", "time", "survive the kill by ignoring signals", """
    import signal
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGXCPU, signal.SIGALRM):
        signal.signal(s, signal.SIG_IGN)
    while time.monotonic() < DEADLINE:
        pass
    """, check=_must_be_stopped),
    _p("self_stop", "time", "freeze itself (SIGSTOP) to dodge the limits", """
    import signal
    if os.fork() == 0:
        while time.monotonic() < DEADLINE:
            pass
        os._exit(0)
    os.kill(os.getpid(), signal.SIGSTOP)
    print("resumed")
    """, check=_must_be_stopped),
    _p("thread_spin", "time", "use more CPU than its limit with many threads", """
    import hashlib, threading
    def spin():
        while time.monotonic() < DEADLINE:
            hashlib.sha256(b"x" * (1 << 20)).digest()  # releases the GIL: real parallel CPU
    started = 0
    for _ in range(32):
        try:
            threading.Thread(target=spin, daemon=True).start()
            started += 1
        except RuntimeError:
            break
    print("threads", started, flush=True)
    spin()
    """, wall_s=4.0, check=_cpu_bounded(4.0)),
    _p("process_spin", "time", "outlive the limit with many spinning processes", """
    for _ in range(8):
        try:
            if os.fork() == 0:
                while time.monotonic() < DEADLINE:
                    pass
                os._exit(0)
        except OSError:
            break
    while time.monotonic() < DEADLINE:
        pass
    """, check=_must_be_stopped),
    # -- processes
    _p("fork_bomb", "processes", "more processes than the limit", """
    n = 0
    for _ in range(300):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(10)
            os._exit(0)
        n += 1
    print("forked", n, flush=True)
    time.sleep(10)
    """, check=_below("forked", lambda c: c.config.nproc)),
    _p("setsid_daemon", "processes", "leave a daemon running after the run", """
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(10)
            try:
                open(C["file"], "a").write("daemon")
            except OSError:
                pass
        os._exit(0)
    print("parent done")
    """),
    _p("zombie_horde", "processes", "pile up unreaped zombies past the limit", """
    n = 0
    for _ in range(200):
        try:
            if os.fork() == 0:
                os._exit(0)
        except OSError:
            break
        n += 1
    print("zombies", n, flush=True)
    time.sleep(0.3)
    """, check=_below("zombies", lambda c: c.config.nproc)),
    # -- memory
    _p("memory_bomb", "memory", "allocate more than the per-process limit", """
    chunks = []
    try:
        for _ in range(10):  # 1 GB at most: over the limits the corpus is run with, not the host's
            chunks.append(bytearray(100 * 1024 * 1024))
            print("allocated", len(chunks) * 100, flush=True)
    except MemoryError:
        pass
    """, check=_below("allocated", lambda c: c.config.memory_mb, " MB")),
    _p("tree_memory", "memory", "hold more than the run's memory in many small processes", """
    r, w = os.pipe()
    for _ in range(4):
        if os.fork() == 0:
            block = bytearray(120 * 1024 * 1024)
            for i in range(0, len(block), 4096):
                block[i] = 1
            os.write(w, b"x")
            time.sleep(2)
            os._exit(0)
    os.close(w)
    held = 0
    while os.read(r, 1):
        held += 120
        print("held", held, flush=True)
    """, wall_s=6.0, needs="cgroup", check=_below("held", lambda c: c.config.tree_memory_mb, " MB")),
    _p("memfd_memory", "memory", "hold unmapped memory (memfd) that the address-space limit misses", """
    held = 0
    fds = []
    try:
        for i in range(40):
            fd = os.memfd_create(f"m{i}")
            os.write(fd, b"x" * (15 * 1024 * 1024))
            fds.append(fd)
            held += 15
            print("held", held, flush=True)
    except OSError:
        pass
    """, wall_s=4.0, needs="cgroup", check=_below("held", lambda c: c.config.tree_memory_mb, " MB")),
    # -- disk and files
    _p("disk_fill", "disk", "write more than the scratch quota", """
    n = 0
    try:
        while n < 200:
            with open(f"f{n}", "wb") as fh:
                fh.write(b"x" * 1_000_000)
            n += 1
            print("written", n, flush=True)
    except OSError:
        pass
    """, check=_at_most("written", lambda c: c.config.scratch_mb * _MiB // 1_000_000, " MB")),
    _p("inode_fill", "disk", "create more files than the scratch inode quota", """
    n = 0
    try:
        while n < 5000:
            open(f"i{n}", "w").close()
            n += 1
    except OSError:
        pass
    print("created", n)
    """, check=_at_most("created", lambda c: c.config.scratch_inodes)),
    _p("big_file", "disk", "write one file over the file-size limit", """
    with open("big", "wb") as fh:
        for n in range(1, 101):
            fh.write(b"x" * (1024 * 1024))
            fh.flush()
            print("size", n, flush=True)
    """, check=_at_most("size", lambda c: c.config.file_size_mb, " MB")),
    _p("fd_exhaust", "disk", "hold more open files than the limit", """
    fds = []
    try:
        while len(fds) < 5000:
            fds.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    print("opened", len(fds))
    """, check=_at_most("opened", lambda c: c.config.open_files)),
    # -- output and input
    _p("huge_output", "output", "flood the host with output", """
    chunk = "x" * 65536
    for _ in range(1024):
        sys.stdout.write(chunk)
    """, check=_output_capped),
    _p("binary_output", "output", "break the host's reading with binary bytes", f"""
    data = {_BINARY!r}
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    sys.stderr.buffer.write(data[::-1])
    """, check=_binary_intact),
    _p("forge_status", "output", "forge the init's status line through inherited descriptors", """
    fake = b'{"ok": true, "wall_s": 0, "cpu_s": 0, "timed_out": false, "exit_code": 0, "signal": null}\\n'
    for fd in range(3, 256):
        try:
            os.write(fd, fake)
            escaped(f"wrote to inherited fd {fd}")
        except OSError:
            pass
    sys.exit(3)
    """, check=_exit_code_is(3)),
    _p("unclosed_pipes", "output", "hang the host on a pipe a child keeps open", """
    if os.fork() == 0:
        os.setsid()
        time.sleep(10)
        print("late", flush=True)
        os._exit(0)
    print("parent exits")
    """, check=_no_late_output),
    _p("stdin_flood", "input", "block the host writing 8 MB of stdin it never reads", """
    time.sleep(0.2)
    print("ignored stdin")
    """, stdin=b"y" * (8 * _MiB)),
    _p("long_argv_env", "input", "crash the sandbox with huge argv and environment strings", """
    import subprocess
    big = "A" * (128 * 1024 - 1)  # the kernel's per-string maximum
    for n in (1, 8, 64, 256):
        try:
            r = subprocess.run([sys.executable, "-c", "pass", *([big] * n)], timeout=5)
            print("argv", n, "ran", r.returncode)
        except (OSError, subprocess.SubprocessError) as exc:
            print("argv", n, type(exc).__name__)
    for size in (1 << 20, 16 << 20):
        try:
            subprocess.run(["/bin/true"], env={"X": "B" * size}, timeout=5)
            print("env", size, "ran")
        except (OSError, subprocess.SubprocessError) as exc:
            print("env", size, type(exc).__name__)
    """, wall_s=5.0),
    # -- filesystem
    _p("write_outside", "filesystem", "write a file outside the scratch dir", """
    # judged on the host: a write that lands in the jail's own /tmp or /dev/shm is harmless
    for path in [C["dir"] + "/outside-" + C["token"], C["file"], *C["host_paths"]]:
        try:
            with open(path, "a") as fh:
                fh.write("escaped")
        except OSError:
            pass
    """),
    _p("symlink_escape", "filesystem", "modify a host file through links from scratch", """
    attempts = []
    def attempt(what, fn):
        try:
            fn()
            attempts.append(what)
        except OSError:
            pass
    attempt("symlink", lambda: os.symlink(C["file"], "l1"))
    attempt("write via symlink", lambda: open("l1", "a").write("x"))
    attempt("chmod via symlink", lambda: os.chmod("l1", 0o600))
    attempt("dir symlink", lambda: os.symlink(C["dir"], "d1"))
    attempt("create via dir symlink", lambda: open("d1/via-link", "w").write("x"))
    attempt("hard link", lambda: os.link(C["file"], "h1"))
    attempt("write via hard link", lambda: open("h1", "a").write("x"))
    attempt("traversal", lambda: open("../" * 12 + C["dir"].lstrip("/") + "/traversal", "w").write("x"))
    attempt("proc root", lambda: open("/proc/self/root" + C["dir"] + "/procroot", "w").write("x"))
    attempt("rename into host dir", lambda: os.rename("l1", C["dir"] + "/renamed"))
    print("succeeded:", attempts)
    """),
    _p("proc_probe", "proc/sys", "read host secrets or write kernel knobs through /proc", """
    for pid in ["self", "1"] + sorted(p for p in os.listdir("/proc") if p.isdigit()):
        for part in ("environ", "cmdline"):
            try:
                print(pid, part, open(f"/proc/{pid}/{part}", "rb").read())
            except OSError:
                pass
    for knob in ("/proc/sysrq-trigger", "/proc/sys/vm/drop_caches", "/proc/sys/kernel/core_pattern",
                 "/proc/sys/kernel/panic", "/proc/1/oom_score_adj", "/proc/sys/net/ipv4/ip_forward"):
        if try_open_write(knob):
            escaped(f"write-open {knob}")
    for pid in C["pids"]:
        if os.path.exists(f"/proc/{pid}/status"):
            try:
                if C["marker"].encode() in open(f"/proc/{pid}/cmdline", "rb").read():
                    escaped(f"sees host canary {pid}")
            except OSError:
                pass
    """, needs="namespaces", check=lambda c, r, t: _secret_absent(c, r, t) or _canary_not_listed(c, r, t)),
    _p("sys_probe", "proc/sys", "write kernel knobs through /sys or see host devices", """
    for knob in ("/sys/kernel/mm/transparent_hugepage/enabled", "/sys/power/state",
                 "/sys/class/net/lo/mtu", "/sys/kernel/uevent_helper", "/sys/module/kernel/parameters/panic"):
        if try_open_write(knob):
            escaped(f"write-open {knob}")
    try:
        ifaces = os.listdir("/sys/class/net")
    except OSError:
        ifaces = []
    print("interfaces", ifaces)
    for name in ifaces:
        if name != "lo":
            escaped(f"host network interface {name} visible")
    """, needs="namespaces"),
    _p("cgroup_escape", "proc/sys", "leave or loosen its own cgroup", """
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    for fstype, options in ((b"cgroup", b"memory"), (b"cgroup2", None)):
        if libc.mount(b"x", b"/mnt", fstype, 0, options) == 0:
            escaped(f"mounted a {fstype.decode()} hierarchy")
            libc.umount2(b"/mnt", 2)  # MNT_DETACH: a weak sandbox must not keep the mount
    for line in open("/proc/self/cgroup").read().splitlines():
        _, controllers, path = line.split(":", 2)
        name = controllers.split(",")[0].replace("name=", "")
        base = "/sys/fs/cgroup/" + ("unified" if controllers == "" else name)
        if not os.path.isdir(base) and controllers == "":
            base = "/sys/fs/cgroup"
        own = base + path
        parent = os.path.dirname(own.rstrip("/"))
        for target in (parent + "/cgroup.procs", base + "/cgroup.procs", own + "/cgroup.procs",
                       own + "/memory.limit_in_bytes", own + "/memory.max", own + "/pids.max",
                       own + "/memory.memsw.limit_in_bytes"):
            if os.path.exists(target) and try_open_write(target):
                escaped(f"write-open {target}")
        try:
            os.mkdir(own + "/child-" + C["token"])
            escaped(f"made a child cgroup under {own}")
            os.rmdir(own + "/child-" + C["token"])
        except OSError:
            pass
    """, needs="cgroup"),
    # -- other processes
    _p("signal_canary", "signals", "signal a host process", """
    import signal
    for pid in C["pids"]:
        for what, call in (("kill", lambda: os.kill(pid, signal.SIGKILL)),
                           ("killpg", lambda: os.killpg(pid, signal.SIGKILL)),
                           ("probe", lambda: os.kill(pid, 0))):
            try:
                call()
                escaped(f"{what} {pid}")
            except OSError:
                pass
    """, needs="namespaces"),
    _p("ptrace_canary", "ptrace", "trace or read the memory of a host process", """
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    PTRACE_ATTACH, PTRACE_DETACH, PTRACE_SEIZE = 16, 17, 0x4206
    for pid in C["pids"]:
        for req in (PTRACE_ATTACH, PTRACE_SEIZE):
            if libc.ptrace(req, pid, None, None) == 0:
                escaped(f"ptrace {req} on {pid}")
                time.sleep(0.05)
                libc.ptrace(PTRACE_DETACH, pid, None, None)
        try:
            open(f"/proc/{pid}/mem", "rb").close()
            escaped(f"opened /proc/{pid}/mem")
        except OSError:
            pass
    if os.fork() == 0:  # tracing its own child is allowed: not an escape, and must not break
        time.sleep(0.2)
        os._exit(0)
    """, needs="namespaces"),
    _p("kill_supervisor", "signals", "take the sandbox's init down to lose its verdict", """
    import signal
    def is_init(pid):  # only the sandbox's own init: without a PID namespace, 1 is the host's
        try:
            return b"sandbox_init" in open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            return False
    for target in {t for t in (1, os.getppid()) if is_init(t)}:
        for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP):
            try:
                os.kill(target, sig)
            except OSError:
                pass
    print("still here")
    """, check=lambda c, r, t: f"sandbox lost the run: {r.error}" if r.error else None),
    # -- privileges
    _p("setuid_attempts", "privileges", "become root or gain capabilities", """
    import subprocess
    start = os.getresuid()
    for call in (lambda: os.setuid(0), lambda: os.setresuid(0, 0, 0), lambda: os.setreuid(0, 0),
                 lambda: os.setgid(0), lambda: os.setgroups([0]), lambda: os.seteuid(0)):
        try:
            call()
        except OSError:
            pass
    if os.getresuid() != start:
        escaped(f"uid changed {start} -> {os.getresuid()}")
    status = open("/proc/self/status").read()
    for cap in ("CapEff", "CapPrm", "CapAmb"):
        value = status.split(cap + ":")[1].split()[0]
        if int(value, 16):
            escaped(f"{cap} {value}")
    for argv in (["su", "root", "-c", "id -u"], ["sudo", "-n", "id", "-u"],
                 ["mount", "-t", "tmpfs", "x", "/mnt"]):
        try:
            r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=3)
        except (OSError, subprocess.SubprocessError):
            continue
        if r.returncode == 0:
            escaped(f"{argv[0]} succeeded: {r.stdout[:40]!r}")
            if argv[0] == "mount":  # a weak sandbox must not keep the mount
                subprocess.run(["umount", "-l", "/mnt"], capture_output=True, timeout=3)
    """),
    _p("userns_remount", "privileges", "remount the filesystem writable from a new user namespace", """
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
    MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
        print("unshare refused", ctypes.get_errno())
    else:
        for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"0 {uid} 1"),
                           ("/proc/self/gid_map", f"0 {gid} 1")):
            try:
                open(path, "w").write(text)
            except OSError as exc:
                print(path, exc)
        libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None)
        for target in (b"/", C["dir"].encode(), os.path.dirname(C["dir"]).encode()):
            rc = libc.mount(None, target, None, MS_REMOUNT | MS_BIND, None)
            print("remount rw", target, rc, ctypes.get_errno())
        for path in (C["dir"] + "/userns-" + C["token"], C["file"]):
            try:
                open(path, "a").write("escaped")
                escaped(f"wrote {path} from a user namespace")
            except OSError:
                pass
    """),
    # -- network and IPC
    _p("network", "network", "reach the network or a host listener", """
    import socket
    for host, port in (("127.0.0.1", C["port"]), ("localhost", C["port"]), ("192.0.2.1", 80)):
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            escaped(f"connected to {host}:{port}")
        except OSError:
            pass
    try:
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("192.0.2.1", 53))
        escaped("sent a UDP datagram off the machine")
    except OSError:
        pass
    try:
        socket.getaddrinfo("example.com", 80)
        escaped("resolved a name")
    except OSError:
        pass
    for _, name in socket.if_nameindex():
        if name != "lo":
            escaped(f"interface {name}")
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        escaped("raw packet socket")
    except (OSError, AttributeError):
        pass
    """),
    _p("unix_sockets", "network", "connect to a host service's Unix socket", """
    import socket
    for address in [*C["unix"], C["abstract"], "/run/dbus/system_bus_socket", "/var/run/docker.sock",
                    "/run/systemd/private", "/run/systemd/journal/stdout"]:
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(0.5)
            s.connect(address)
            escaped(f"connected to {address!r}")
        except OSError:
            pass
    """),
    _p("sysv_ipc", "ipc", "leave SysV IPC objects on the host", """
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    IPC_CREAT = 0o1000
    print("shm", libc.shmget(C["ipc_key"], 4096, IPC_CREAT | 0o666))
    print("msg", libc.msgget(C["ipc_key"], IPC_CREAT | 0o666))
    print("sem", libc.semget(C["ipc_key"], 1, IPC_CREAT | 0o666))
    """, needs="namespaces"),
    _p("outside_allow_list", "privileges", "use a syscall outside the interpreter's seccomp allow-list", """
    import ctypes, errno, socket
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    pid, NULL, AT_FDCWD = os.getpid(), 0, -100
    buf = ctypes.create_string_buffer(64)
    # x86_64 numbers; each call is harmless if it runs (a query, a bad fd or pointer, no state):
    # what matters is whether the filter refused it (EPERM) before the kernel looked at it
    calls = {
        "ptrace(PTRACE_TRACEME)": (101, 0, 0, 0, 0),
        "process_vm_readv(self)": (310, pid, NULL, 0, NULL, 0, 0),
        "kcmp(self, self)": (312, pid, pid, 1, 0, 0), "unshare(CLONE_NEWUSER)": (272, 0x10000000),
        "unshare(CLONE_NEWNS)": (272, 0x00020000), "setns": (308, -1, 0), "userfaultfd": (323, 0x80000),
        "perf_event_open": (298, NULL, 0, -1, -1, 0), "bpf(BPF_PROG_LOAD)": (321, 5, NULL, 0),
        "io_uring_setup": (425, 1, NULL), "keyctl(KEYCTL_GET_KEYRING_ID)": (250, 0, -3, 0),
        "request_key": (249, NULL, NULL, NULL, 0), "name_to_handle_at": (303, AT_FDCWD, NULL, NULL, NULL, 0),
        "open_by_handle_at": (304, -1, NULL, 0), "personality(query)": (135, 0xFFFFFFFF),
        "modify_ldt(read)": (154, 0, ctypes.addressof(buf), 0), "syslog(size)": (103, 10, NULL, 0),
        "mq_open": (240, NULL, 0, 0, NULL), "pidfd_getfd": (438, -1, 0, 0), "vmsplice": (278, -1, NULL, 0, 0),
        "seccomp(query)": (317, 2, 0, ctypes.addressof(buf)), "ioctl(TIOCSTI)": (16, 0, 0x5412, NULL),
        "mount": (165, NULL, NULL, NULL, 0, NULL), "setuid(0)": (105, 0), "sync": None,
    }
    for name, args in calls.items():
        if args is None:
            continue  # named to document it is refused; not called (it would flush every filesystem)
        ctypes.set_errno(0)
        r = libc.syscall(*[ctypes.c_long(a) for a in args])
        err = ctypes.get_errno()
        if r != -1 or err != errno.EPERM:
            escaped(f"{name} not refused by the filter (returned {r}, {errno.errorcode.get(err, err)})")
    # clone with a namespace flag: the child (if any) leaves at once
    ctypes.set_errno(0)
    child = libc.syscall(ctypes.c_long(56), ctypes.c_long(0x10000000 | 17), *[ctypes.c_long(0)] * 3)
    if child == 0:
        os._exit(0)
    if child > 0:
        os.waitpid(child, 0)
        escaped("clone(CLONE_NEWUSER) made a process")
    elif ctypes.get_errno() != errno.EPERM:
        escaped(f"clone(CLONE_NEWUSER) not refused by the filter ({ctypes.get_errno()})")
    for family in ("AF_NETLINK", "AF_PACKET", "AF_ALG", "AF_VSOCK"):
        try:
            kind = socket.SOCK_SEQPACKET if family == "AF_ALG" else socket.SOCK_RAW
            socket.socket(getattr(socket, family), kind)
            escaped(f"socket({family}) made")
        except AttributeError:
            pass
        except OSError as e:
            if e.errno != errno.EPERM:
                escaped(f"socket({family}) not refused by the filter ({errno.errorcode.get(e.errno)})")
    """, needs="allow_list"),
    _p("hostname", "privileges", "change the host's name", """
    import ctypes, socket
    libc = ctypes.CDLL(None, use_errno=True)
    name = socket.gethostname().encode()  # the same name: proves the power, changes nothing
    if libc.sethostname(name, len(name)) == 0:
        escaped("sethostname allowed")
    if try_open_write("/proc/sys/kernel/hostname"):
        escaped("write-open /proc/sys/kernel/hostname")
    """),
    _p("devices", "privileges", "read raw devices or create device nodes", """
    import stat
    for dev in ("/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg", "/dev/sda", "/dev/vda",
                "/dev/nvme0n1", "/dev/loop0", "/dev/kvm", "/dev/fuse"):
        if os.path.exists(dev):
            try:
                os.close(os.open(dev, os.O_RDONLY | os.O_NONBLOCK))
                escaped(f"opened {dev}")
            except OSError:
                pass
    try:
        os.mknod("node", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        escaped("mknod of a character device")
    except OSError:
        pass
    """),
    _p("env_secret", "secrets", "read the host's environment", """
    print(sorted(os.environ.items()))
    for pid in ("self", "1", str(os.getppid())):
        try:
            print(pid, open(f"/proc/{pid}/environ", "rb").read())
        except OSError:
            pass
    """, check=_secret_absent),
)


# -- running ----------------------------------------------------------------------------------

def _survivors(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path("/proc", entry, "cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _uid_processes(uids: range, exclude: set[int]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in exclude:
            try:
                status = Path("/proc", entry, "status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("Uid:") and int(line.split()[1]) in uids:
                    found.append(int(entry))
    return found


def calibration_problems(config: SandboxConfig) -> list[str]:
    """Limits of `config` the corpus cannot show broken: each program tries a fixed amount (so
    that against a weak sandbox it stays bounded), which must exceed the limit it tests."""
    tries = (("memory_mb", config.memory_mb, 1000, "memory_bomb allocates up to 1000 MB"),
             ("tree_memory_mb", config.tree_memory_mb, 480, "tree_memory holds up to 480 MB"),
             ("nproc", config.nproc, 200, "zombie_horde forks up to 200"),
             ("scratch_mb", config.scratch_mb * _MiB // 1_000_000, 200, "disk_fill writes up to 200 MB"),
             ("scratch_inodes", config.scratch_inodes, 5000, "inode_fill creates up to 5000 files"),
             ("file_size_mb", config.file_size_mb, 100, "big_file grows to 100 MB"),
             ("open_files", config.open_files, 5000, "fd_exhaust opens up to 5000 files"),
             ("max_output_bytes", config.max_output_bytes, 64 * _MiB, "huge_output writes 64 MB"))
    problems = [f"sandbox.{key}={value}: must be below {top} ({why})" for key, value, top, why in tries
                if value >= top]
    if config.memory_mb <= 160:
        problems.append(f"sandbox.memory_mb={config.memory_mb}: must be over 160 (tree_memory's "
                        "120 MB children must each fit, so that only the tree bound can stop them)")
    return problems


@dataclass(frozen=True)
class Identity:
    """Who a program runs as, seen from the host: its uid there and the namespaces it shares."""

    host_uid: int
    host_gid: int
    capabilities: int  # CapEff
    new_namespaces: tuple[str, ...]  # of pid, net, mnt, ipc, uts, user: those not the host's

    def describe(self) -> str:
        spaces = ", ".join(self.new_namespaces) if self.new_namespaces else "NO new"
        caps = "no capabilities" if self.capabilities == 0 else f"capabilities {self.capabilities:#x}"
        return (f"programs run as host uid {self.host_uid} (gid {self.host_gid}), {caps}, "
                f"in {spaces} namespaces")


_NAMESPACES = ("pid", "net", "mnt", "ipc", "uts", "user")
_IDENTITY_PROBE = """\
import json, os
ns = {}
for name in NAMES:
    try:
        ns[name] = os.readlink("/proc/self/ns/" + name)
    except OSError:
        ns[name] = None
status = open("/proc/self/status").read()
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "ns": ns,
                  "caps": int(status.split("CapEff:")[1].split()[0], 16),
                  "uid_map": open("/proc/self/uid_map").read(),
                  "gid_map": open("/proc/self/gid_map").read()}))
""".replace("NAMES", repr(_NAMESPACES))


def _to_host(inner: int, id_map: str) -> int:
    """An id inside a user namespace -> the host's, from `/proc/self/{uid,gid}_map` lines
    `inside outside count` (user_namespaces(7)); an unmapped id is the overflow id 65534."""
    for line in id_map.splitlines():
        inside, outside, count = (int(x) for x in line.split())
        if inside <= inner < inside + count:
            return outside + inner - inside
    return 65534


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def program_identity(sandbox: Sandbox) -> Identity:
    """Run a probe program and say who it is on the host (RuntimeError if it cannot tell)."""
    result = sandbox.run_python({"identity.py": _IDENTITY_PROBE}, "identity.py", wall_s=10.0)
    try:
        info = json.loads(result.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        why = result.error or result.stderr[-300:].decode(errors="replace")
        raise RuntimeError(f"identity probe failed ({result.reason}): {why}") from exc
    host = {name: _readlink(f"/proc/self/ns/{name}") for name in _NAMESPACES}
    new = tuple(n for n in _NAMESPACES if info["ns"][n] is not None and info["ns"][n] != host[n])
    return Identity(_to_host(info["uid"], info["uid_map"]), _to_host(info["gid"], info["gid_map"]),
                    info["caps"], new)


def _missing(sandbox: Sandbox, needs: str | None) -> str | None:
    prot = sandbox.protections
    if needs == "cgroup" and (prot.cgroup is None or set(prot.cgroup.limited) != {"memory", "pids"}):
        return "no per-run cgroup here"
    if needs == "namespaces" and not prot.pid_namespace:
        return "no namespaces here"
    if needs == "allow_list" and os.uname().machine not in SECCOMP_MACHINES:
        return "no seccomp allow-list on this architecture"
    return None


def run_one(sandbox: Sandbox, canaries: Canaries, program: Hostile, try_all: bool = False) -> Row:
    """Run one program and collect every piece of evidence that it escaped.

    A program whose bound relies on a protection this sandbox lacks (it says so in its log) is
    not tried, unless `try_all` (to show what the missing protection lets through)."""
    skipped = None if try_all else _missing(sandbox, program.needs)
    if skipped:
        return Row(program.name, program.kind, program.goal, "-", [], 0.0, None, None, skipped)
    host_cpu = resource.getrusage(resource.RUSAGE_THREAD)
    file_name = f"h_{program.name}_{canaries.token}.py"
    source = _PRELUDE.format(canary=canaries.info()) + program.body
    start = time.monotonic()
    result = sandbox.run_python({file_name: source}, file_name, stdin=program.stdin, wall_s=program.wall_s)
    host_wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_THREAD)
    host_cpu_s = after.ru_utime + after.ru_stime - host_cpu.ru_utime - host_cpu.ru_stime
    text = result.stdout.decode(errors="replace")
    evidence = [line.split("ESCAPED:", 1)[1].strip() for line in text.splitlines()
                if line.startswith("ESCAPED:")]
    if result.error is not None:
        evidence.append(f"sandbox error: {result.error[:200]}")
    if result.wall_s > program.wall_s + KILL_SLACK_S:
        evidence.append(f"outlived its limit: ran {result.wall_s:.1f} s of a {program.wall_s} s limit")
    if host_wall > program.wall_s + HOST_SLACK_S:
        evidence.append(f"held the host {host_wall:.1f} s for a {program.wall_s} s run")
    if program.check is not None and (found := program.check(canaries, result, text)):
        evidence.append(found)
    left = _survivors(file_name)
    if left:
        evidence.append(f"{len(left)} processes survived the run")
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    evidence += canaries.new_damage()  # with programs in parallel, possibly the other one's
    peak = result.peak_memory_bytes / _MiB if result.peak_memory_bytes is not None else None
    return Row(program.name, program.kind, program.goal, result.reason, evidence, host_wall, peak,
               result.tree_cpu_s, host_cpu_s=host_cpu_s)


def run_corpus(sandbox: Sandbox, root: Path, programs: tuple[Hostile, ...] = CORPUS,
               only: set[str] | None = None, try_all: bool = False) -> Report:
    """Run `programs` (or those named in `only`) `max_parallel` at a time; then global checks.

    `root`: a host directory the programs can see (not under /tmp, which the jail replaces) for
    the canary directory. The host's environment holds a secret for the duration.

    Refuses (RuntimeError) to run programs that would be root on the host, whatever the
    sandbox: a probe says who they are first. Refuses (ValueError) limits the corpus cannot
    show broken (`calibration_problems`), unless `try_all`, which runs every program to show
    what a sandbox lets through, not to certify it.
    """
    chosen = tuple(p for p in programs if only is None or p.name in only)
    if only is not None and len(chosen) != len(only):
        unknown = sorted(only - {p.name for p in programs})
        raise ValueError(f"unknown hostile programs: {unknown}")
    if not try_all and (problems := calibration_problems(sandbox.config)):
        raise ValueError("the corpus cannot test these limits: " + "; ".join(problems))
    prot = sandbox.protections
    identity = program_identity(sandbox)
    if identity.host_uid == 0 or identity.host_gid == 0:
        raise RuntimeError(f"refusing to run hostile programs as root on the host: {identity.describe()}")
    canaries = Canaries(sandbox, root)
    start = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=sandbox.config.max_parallel) as pool:
            rows = list(pool.map(lambda p: run_one(sandbox, canaries, p, try_all), chosen))
        wall = time.monotonic() - start
        global_evidence = canaries.new_damage()
        canary_pids = {p.pid for p in canaries.procs}
        if prot.dedicated_uid:
            uids = range(sandbox.config.uid_base, sandbox.config.uid_base + sandbox.config.max_parallel)
            left = _uid_processes(uids, canary_pids)
            if left:
                global_evidence.append(f"{len(left)} processes of sandbox uids remain (zombies or daemons)")
        stats = sandbox.stats()
        if stats["cgroup_leaks"]:
            global_evidence.append(f"{stats['cgroup_leaks']} run cgroups could not be removed")
        mine = f"scalerl-sbx-{os.getpid()}-"  # other sandboxes on the machine have their own
        leftover = [p for p in os.listdir(tempfile.gettempdir()) if p.startswith(mine)]
        if leftover:
            global_evidence.append(f"spec dirs left behind: {leftover[:3]}")
    finally:
        canaries.close()
    return Report(rows, global_evidence, prot.describe(), wall, stats, identity)


def format_table(report: Report) -> str:
    """A Markdown table, one row per program, and a summary line."""
    lines = ["| program | kind | goal | outcome | contained | host wall s | host CPU ms | peak MB "
             "| tree CPU s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in report.rows:
        if r.skipped:
            lines.append(f"| {r.name} | {r.kind} | {r.goal} | not tried: {r.skipped} | - | - | - | - | - |")
            continue
        peak = f"{r.peak_memory_mb:.0f}" if r.peak_memory_mb is not None else "-"
        cpu = f"{r.tree_cpu_s:.2f}" if r.tree_cpu_s is not None else "-"
        contained = "yes" if not r.escaped else "**NO**: " + "; ".join(r.evidence).replace("|", "\\|")
        lines.append(f"| {r.name} | {r.kind} | {r.goal} | {r.reason} | {contained} | {r.host_wall_s:.2f} "
                     f"| {r.host_cpu_s * 1000:.0f} | {peak} | {cpu} |")
    tried = report.tried
    peaks = [r.peak_memory_mb for r in tried if r.peak_memory_mb is not None]
    summary = (f"programs tried: {len(tried)}; escapes: {report.escapes}; "
               f"not tried: {len(report.rows) - len(tried)}; corpus wall: {report.wall_s:.1f} s; "
               f"sum of host wall: {sum(r.host_wall_s for r in tried):.1f} s; "
               f"host CPU: {sum(r.host_cpu_s for r in tried) * 1000:.0f} ms in all, "
               f"{max((r.host_cpu_s for r in tried), default=0) * 1000:.0f} ms at most")
    if peaks:
        summary += f"; max tree peak: {max(peaks):.0f} MB"
    lines += ["", summary]
    if report.global_evidence:
        lines.append("global: " + "; ".join(report.global_evidence))
    return "\n".join(lines)
