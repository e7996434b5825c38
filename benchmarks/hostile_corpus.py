"""Run the hostile-program corpus against this machine's code sandbox and print what escaped.

    .venv/bin/python benchmarks/hostile_corpus.py                 # all programs, 2 at a time
    .venv/bin/python benchmarks/hostile_corpus.py --only fork_bomb,tree_memory
    .venv/bin/python benchmarks/hostile_corpus.py --weak          # what a weak sandbox costs the host
    .venv/bin/python benchmarks/hostile_corpus.py --jail bwrap    # the same corpus in a bubblewrap jail

Prints the active protections (as detected and logged by the sandbox) and who the programs run
as on the host, then one Markdown row per program (outcome, contained or the evidence of escape,
host-side wall time, the tree's peak memory and CPU time from its cgroup) and a summary line.
Exits 1 if anything escaped. The limits are the ones the tests use (256 MB per process, 384 MB per
tree, 16 processes, 1 MB of output); the canary directory is made in the repository root, which
the jail shows read-only.

`--weak` runs every program against a sandbox with no namespaces, no cgroup and loose rlimits
(4 GB per process, 1024 processes: only the programs' own bounds hold), as the slot's unprivileged
uid. The whole experiment (canaries, sandbox, programs) runs in namespaces of its own (pid, net
with `lo` up, mount with fresh tmpfs on /tmp, /var/tmp, /dev/shm and /run, ipc, uts) and inside
a safety cgroup of 3 GB and 1000 tasks, so what the weak sandbox lets through reaches only that
enclosure, which the checks treat as "the host". It prints what got through and the footprint
(peak memory and tasks of everything the run started), and exits 1 if the safety bound was
reached: then a program is not bounded by itself.

`--jail bwrap` runs the same corpus, limits and checks with the jail made by bubblewrap instead of
ours (`benchmarks/bwrap_jail.py`: everything but the jail is ours, cgroup and slot uids included);
`--jail ours` (the default) is the sandbox `scalerl` uses.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import logging
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from scalerl.rewards import cgroup as cg
from scalerl.rewards.sandbox import Sandbox, SandboxConfig, SandboxUnavailableError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the corpus is test support (tests/rewards/hostile.py), not in the package
from tests.rewards.hostile import CORPUS, format_table, run_corpus  # noqa: E402

SAFETY_MB, SAFETY_TASKS = 3072, 1000
WEAK_PYTHON = "/usr/bin/python3"  # the slot's uid cannot read a venv under /root
_NAMESPACES = ("pid", "net", "mnt", "ipc", "uts")
_HOST_NS_VAR = "SCALERL_WEAK_HOST_NS"
_OWNER_VAR = "SCALERL_WEAK_OWNER_PID"


def _sandbox(jail: str, config: SandboxConfig) -> Sandbox:
    if jail == "bwrap":
        from bwrap_jail import BwrapSandbox  # benchmarks/ is this script's directory (sys.path[0])

        return BwrapSandbox(config)
    return Sandbox(config)


def _config(args: argparse.Namespace) -> SandboxConfig:
    # uids of this process only, so other sandboxes on the machine neither share its process limit
    # nor show up in the "no process of a sandbox uid remains" check
    owner = int(os.environ.get(_OWNER_VAR, os.getpid()))  # --weak: the pid outside the enclosure
    uid_base = 1_500_000_000 + (owner % 50_000) * 16
    base = {"max_parallel": args.parallel, "memory_mb": 256, "tree_memory_mb": 384, "nproc": 16,
            "max_output_bytes": 1 << 20, "uid_base": uid_base}
    if args.weak_inside:
        base |= {"isolation": "none", "cgroup": "off", "python": WEAK_PYTHON, "memory_mb": 4096,
                 "nproc": 1024, "open_files": 8192, "file_size_mb": 1024, "scratch_mb": 1024,
                 "scratch_inodes": 8192, "max_output_bytes": 128 << 20}
    return SandboxConfig(**base)  # type: ignore[arg-type]


def _weak(argv: list[str]) -> int:
    """Run this script with `--weak-inside` in a safety cgroup; report its footprint."""
    support, reasons = cg.locate()
    if os.geteuid() != 0 or support is None or set(support.limited) != {"memory", "pids"}:
        print(f"error: --weak: needs root and memory+pids cgroups ({'; '.join(reasons) or 'not root'})",
              file=sys.stderr)
        return 2
    if not os.path.exists(WEAK_PYTHON):
        print(f"error: --weak: needs {WEAK_PYTHON} (an interpreter the slot's uid can read)", file=sys.stderr)
        return 2
    unshare = shutil.which("unshare")
    if unshare is None:
        print("error: --weak: needs `unshare` (util-linux) for the enclosure", file=sys.stderr)
        return 2
    enclosure = [unshare, "--pid", "--fork", "--mount-proc", "--net", "--ipc", "--uts",
                 "--propagation", "private", "--kill-child=SIGKILL"]
    env = {**os.environ, _HOST_NS_VAR: " ".join(os.readlink(f"/proc/self/ns/{n}") for n in _NAMESPACES),
           _OWNER_VAR: str(os.getpid())}
    safety = cg.RunCgroup.create(support, f"{cg.RUN_PREFIX}{os.getpid()}-weak-{os.urandom(3).hex()}",
                                 SAFETY_MB << 20, SAFETY_TASKS)

    def join() -> None:  # in the child, before exec: everything it starts is inside
        for path in safety.join_files:
            with open(path, "w") as fh:
                fh.write("0")

    start = time.monotonic()
    try:
        child = subprocess.run([*enclosure, sys.executable, __file__, "--weak-inside", *argv],
                               preexec_fn=join, env=env, timeout=600, check=False)
        usage = safety.usage()
        failcnt = _read_int(safety.dirs["memory"], "memory.failcnt")
    finally:
        safety.remove()
    peak_mb = usage.peak_memory_bytes / (1 << 20) if usage.peak_memory_bytes is not None else float("nan")
    hit = usage.oom_kills > 0 or usage.pids_refused > 0 or bool(failcnt)
    print(f"weak-sandbox footprint: peak memory {peak_mb:.0f} MB of a {SAFETY_MB} MB safety bound; "
          f"peak tasks {usage.peak_pids} of {SAFETY_TASKS}; safety bound reached: {'YES' if hit else 'no'} "
          f"(oom kills {usage.oom_kills}, forks refused {usage.pids_refused}, memory failcnt {failcnt}); "
          f"wall {time.monotonic() - start:.1f} s; exit {child.returncode}")
    return 1 if hit or child.returncode not in (0, 1) else 0


def _enter_enclosure() -> str:
    """Inside `--weak`'s namespaces: `lo` up (the canary listener is on 127.0.0.1), fresh tmpfs
    where a program's writes would land. Returns which namespaces differ from the host's."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    ms_bind, ms_rec = 0x1000, 0x4000
    # The checkout and the interpreter may live under /tmp (a CI clone): the fresh tmpfs would hide
    # the sandbox's init script and the modules still to import, so they are bound back in.
    needed = {ROOT, Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    for target, size in (("/tmp", "1g"), ("/var/tmp", "64m"), ("/dev/shm", "64m"), ("/run", "16m")):
        if not os.path.isdir(target):
            continue
        kept = {str(p): os.open(p, os.O_PATH) for p in needed if p.is_relative_to(target)}
        if libc.mount(b"weak", target.encode(), b"tmpfs", 0, f"size={size},mode=1777".encode()) != 0:
            raise OSError(ctypes.get_errno(), f"enclosure: mount tmpfs on {target}")
        for path, fd in kept.items():
            os.makedirs(path, exist_ok=True)
            if libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None, ms_bind | ms_rec, None) != 0:
                raise OSError(ctypes.get_errno(), f"enclosure: bind {path} back over the tmpfs")
            os.close(fd)
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, siocgifflags, req))[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sH14x", b"lo", flags | iff_up))
    host = os.environ.get(_HOST_NS_VAR, "").split()
    own = [os.readlink(f"/proc/self/ns/{n}") for n in _NAMESPACES]
    return ", ".join(n for n, h, o in zip(_NAMESPACES, host, own, strict=False) if h != o) or "NONE"


def _become_init() -> None:
    """This process is pid 1 of the enclosure, where every orphan lands: fork the run and reap
    everything until it ends (else the weak sandbox's orphans stay zombies, counted as tasks)."""
    run = os.fork()
    if run == 0:
        return
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        if pid == run:
            os._exit(os.waitstatus_to_exitcode(status))


def _read_int(directory: str, name: str) -> int | None:
    try:
        return int(Path(directory, name).read_text())
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated program names (default: all)")
    parser.add_argument("--parallel", type=int, default=2, help="programs run at once (sandbox.max_parallel)")
    parser.add_argument("--list", action="store_true", help="list the programs and their goals, run nothing")
    parser.add_argument("--weak", action="store_true",
                        help="every program against a weak sandbox, inside a safety cgroup: the host's cost")
    parser.add_argument("--jail", choices=("ours", "bwrap"), default="ours",
                        help="who builds the jail: ours (scalerl's sandbox) or bwrap (bubblewrap; "
                             "benchmarks/bwrap_jail.py)")
    parser.add_argument("--weak-inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.list:
        for program in CORPUS:
            print(f"{program.name:16s} {program.kind:11s} {program.goal}")
        return 0
    if not 1 <= args.parallel <= 16:
        print(f"error: --parallel: must be in 1..16, got {args.parallel}", file=sys.stderr)
        return 2
    if args.weak and args.jail != "ours":
        print("error: --weak: runs the weak sandbox, not a jail; drop --jail", file=sys.stderr)
        return 2
    if args.weak:
        rest = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--weak"]
        return _weak(rest)
    logging.basicConfig(level=logging.ERROR if args.weak_inside else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.weak_inside:
        print("enclosure: the weak run has its own", _enter_enclosure(), "namespaces", flush=True)
        _become_init()
    sandbox = _sandbox(args.jail, _config(args))
    only = {name.strip() for name in args.only.split(",") if name.strip()} or None
    try:
        report = run_corpus(sandbox, ROOT, only=only, try_all=args.weak_inside)
    except (ValueError, SandboxUnavailableError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("protections:", report.protections)
    assert report.identity is not None
    print("identity:", report.identity.describe())
    print()
    print(format_table(report))
    print("sandbox counters:", " ".join(f"{k}={v}" for k, v in report.sandbox_stats.items()))
    return 1 if report.escapes else 0


if __name__ == "__main__":
    sys.exit(main())
