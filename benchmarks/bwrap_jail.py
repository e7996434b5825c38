"""Our code sandbox's jail rebuilt on bubblewrap (Debian `bubblewrap`, Flatpak's sandbox), to compare.

    .venv/bin/python benchmarks/hostile_corpus.py --jail bwrap        # the hostile corpus through it
    .venv/bin/python benchmarks/bwrap_jail.py --runs 30               # interleaved A/B timing vs ours

`BwrapSandbox` is a `scalerl.rewards.sandbox.Sandbox` whose jail is made by `bwrap` instead of
`unshare` plus `sandbox_init.build_jail`; everything around the jail is ours and unchanged, so the
comparison is of the jail alone: the slot's cgroup (tree memory and task bounds, made by
`cgroup.py`, joined before `bwrap` starts, so `bwrap` and everything below it are charged to it),
the unprivileged slot uid (`uid_base + slot`), the rlimits, the clean environment, the wall-clock
kill, the output cap and the status line. `sandbox_init.py` runs inside the jail as its PID 1
with no mount work left (`mount_namespace: false`): it makes `/tmp/work`, drops to the slot uid,
empties the capability bounding set, sets no-new-privileges, loads our seccomp allow-list and
execs the program, as it does in our jail.

bwrap runs as root, without a user namespace, as our jail does (`isolation: namespaces`): run as
the slot uid instead (its unprivileged mode), it cannot reach an interpreter under a private dir
(`/root/.pyenv`: `--ro-bind-fd` of a root-opened fd is refused too), and the init could not drop
to the slot uid. For the same reason the filter is not given to bwrap (`--seccomp FD` would load
it before the init, which needs setresuid/setgroups to drop privileges): the init loads it, the
same program as in our jail.

The flags, the closest equivalent of ours (sandbox_init.build_jail):

    --unshare-pid --unshare-net --unshare-ipc --unshare-uts --unshare-cgroup-try
    --die-with-parent --new-session --as-pid-1
    --ro-bind / /                  the whole filesystem read-only (bwrap remounts every submount ro)
    --proc /proc                   a fresh /proc of the new PID namespace (bwrap has no hidepid option)
    --dev /dev                     a minimal /dev
    --tmpfs /sys                   the host's sysfs hidden (bwrap cannot mount a fresh one)
    --size B --tmpfs /tmp          scratch: a tmpfs of `scratch_mb` (bwrap cannot cap its inodes)
    --tmpfs /var/tmp, /run + --remount-ro; --size 16M --tmpfs /dev/shm
    --tmpfs /root --ro-bind TREE TREE --remount-ro /root   the interpreter's tree only (as ours)
    --ro-bind SPEC/... /tmp/...    the init's spec and the program files

Needs root and `bwrap` (`apt-get install bubblewrap`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from scalerl.rewards import sandbox_init
from scalerl.rewards.cgroup import RunCgroup
from scalerl.rewards.sandbox import (
    _INIT_SCRIPT,
    _SAFE_PATH,
    Protections,
    Sandbox,
    SandboxConfig,
    SandboxResult,
    SandboxUnavailableError,
    _interpreter_trees,
    _MiB,
    _program_env,
    _rlimits,
)

_SHM_BYTES = 16 * _MiB


def bwrap_version(bwrap: str) -> str:
    out = subprocess.run([bwrap, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip() or out.stderr.strip()


@dataclass(frozen=True)
class BwrapProtections(Protections):
    version: str = ""

    def describe(self) -> str:
        ours = super().describe().replace("sandbox mode 'namespaces': ", "")
        return (f"bwrap jail ({self.version}: PID, network, IPC, UTS, mount, cgroup namespaces; no hidepid "
                f"on /proc; scratch tmpfs capped in size, not in inodes): {ours}")


def _hidden_trees(python: str) -> dict[str, list[str]]:
    """As ours does (sandbox_init._plan_trees): each interpreter tree under a dir the slot uid may
    not traverse (a pyenv Python in /root), by that dir. The jail binds each back, read-only, into
    an empty tmpfs over the dir, so the rest of it stays hidden."""
    anchors: dict[str, list[str]] = {}
    for tree in _trees(python):
        anchor = sandbox_init._hidden_ancestor(tree)
        if anchor is not None and anchor != tree:
            anchors.setdefault(anchor, []).append(tree)
    return anchors


def _trees(python: str) -> list[str]:
    return sorted({os.path.realpath(p) for p in _interpreter_trees(python) if os.path.isdir(p)})


def _bind_back(anchor: str, trees: list[str]) -> list[str]:
    """bwrap arguments binding `trees` (dirs or files) read-only back into the tmpfs at `anchor`; the
    dirs on the way made 0755 (bwrap would make them 0700, and the slot uid could not pass)."""
    argv: list[str] = []
    for tree in trees:
        parts = Path(tree).relative_to(anchor).parts
        for depth in range(1, len(parts)):
            argv += ["--perms", "0755", "--dir", str(Path(anchor, *parts[:depth]))]
        argv += ["--ro-bind", tree, tree]
    return argv


class BwrapSandbox(Sandbox):
    """`Sandbox` with the jail made by bubblewrap (see the module doc)."""

    def __init__(self, config: SandboxConfig | None = None, bwrap: str | None = None) -> None:
        super().__init__(config)
        self.bwrap = bwrap or shutil.which("bwrap")

    def _detect(self) -> Protections:
        if self.bwrap is None:
            raise SandboxUnavailableError("bwrap (Debian package bubblewrap) not found")
        if os.geteuid() != 0:
            raise SandboxUnavailableError("the bwrap jail needs root (slot uids, per-run cgroups)")
        if sandbox_init.seccomp_program(platform.machine()) is None:  # refused here too
            raise SandboxUnavailableError(f"no seccomp allow-list for architecture {platform.machine()!r}")
        base = BwrapProtections(mode="namespaces", network_isolated=True, pid_namespace=True,
                                readonly_filesystem=True, private_tmp=True, dedicated_uid=True,
                                version=bwrap_version(self.bwrap))
        return self._detect_cgroup(base)

    def _bwrap_argv(self, spec_dir: str) -> list[str]:
        c = self.config
        argv = [self.bwrap or "bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--as-pid-1",
                "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/sys",
                "--size", str(c.scratch_mb * _MiB), "--perms", "0711", "--tmpfs", "/tmp"]
        for hidden in ("/var/tmp", "/run"):
            if os.path.isdir(hidden) and not os.path.islink(hidden):
                argv += ["--tmpfs", hidden, "--remount-ro", hidden]
        for anchor, bound in _hidden_trees(self.python).items():
            argv += ["--tmpfs", anchor, *_bind_back(anchor, bound), "--remount-ro", anchor]
        # An interpreter under a dir the jail replaced by a tmpfs (a venv in /tmp, as on a CI clone).
        for scratch in ("/tmp", "/var/tmp", "/run"):
            needed = [*_trees(self.python), os.path.realpath(_INIT_SCRIPT)]  # and the init itself
            argv += _bind_back(scratch, [t for t in needed if Path(t).is_relative_to(scratch)])
        argv += ["--size", str(_SHM_BYTES), "--perms", "1777", "--tmpfs", "/dev/shm",
                 "--ro-bind", f"{spec_dir}/spec.json", "/tmp/spec.json",
                 "--ro-bind", f"{spec_dir}/files", "/tmp/files", "--chdir", "/tmp"]
        return argv

    def _run(self, prot: Protections, files: dict[str, bytes], main: str, stdin: bytes,
             wall_s: float) -> SandboxResult:
        slot = self._free_slots.get()
        spec_dir = tempfile.mkdtemp(prefix=f"scalerl-sbx-{os.getpid()}-")
        fds: list[int] = []
        cgroup: RunCgroup | None = None
        uid = self.config.uid_base + slot
        try:
            cgroup, cgroup_warning = self._make_cgroup(prot, slot)
            os.mkdir(os.path.join(spec_dir, "files"), 0o700)
            for name, content in files.items():
                Path(spec_dir, "files", name).write_bytes(content)
            status_r, status_w = os.pipe()
            control_r, control_w = os.pipe()
            fds += [status_r, status_w, control_r, control_w]
            spec = {
                "files": sorted(files), "argv": [self.python, "-I", "-B", main], "env": _program_env(),
                "rlimits": _rlimits(self.config, wall_s), "wall_s": wall_s,
                "uid": uid, "gid": uid, "uid_dedicated": True,
                "mount_namespace": False,  # bwrap built the jail; the init only makes /tmp/work
                "pid_namespace": True, "expose": [],
                "scratch_bytes": self.config.scratch_mb * _MiB, "scratch_inodes": self.config.scratch_inodes,
                "status_fd": status_w, "control_fd": control_r,
                "cgroup": None,  # joined before bwrap starts (the jail shows no cgroup files)
            }
            Path(spec_dir, "spec.json").write_text(json.dumps(spec))
            join = list(cgroup.join_files) if cgroup is not None else []

            def enter() -> None:  # in the child, before exec: bwrap and all below it in the cgroup
                for path in join:
                    with open(path, "w") as fh:
                        fh.write("0")

            init = [self.python, "-I", "-S", "-B", str(_INIT_SCRIPT), "/tmp"]
            cmd = [*self._bwrap_argv(spec_dir), *init]
            try:
                proc = subprocess.Popen(
                    cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    pass_fds=(status_w, control_r), env={"PATH": _SAFE_PATH, "LANG": "C.UTF-8"},
                    cwd="/", start_new_session=True, preexec_fn=enter)
            except OSError as exc:
                raise SandboxUnavailableError(f"cannot start {cmd[0]}: {exc}") from exc
            for fd in (status_w, control_r):
                os.close(fd)
                fds.remove(fd)
            result = self._pump(proc, stdin, status_r, control_w, wall_s)
            if cgroup_warning:
                result = replace(result, setup_warnings=(*result.setup_warnings, cgroup_warning))
            if cgroup is not None:
                result = self._release_cgroup(cgroup, replace(result, cgroup=True))
                cgroup = None
            return result
        finally:
            if cgroup is not None:
                cgroup.remove()
            for fd in fds:
                os.close(fd)
            shutil.rmtree(spec_dir, ignore_errors=True)
            self._free_slots.put(slot)


# -- interleaved A/B timing --------------------------------------------------------------------

PROGRAMS = {
    "print": "print(1)\n",
    "syscalls": "import os\nfor _ in range(100_000):\n    os.stat('.'); os.getppid()\nprint(1)\n",
}


def _median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def compare(config: SandboxConfig, runs: int) -> dict[str, dict[str, dict[str, float]]]:
    """Each program `runs` times through each jail, alternating (ours, bwrap, ours, ...) in one
    process, so that load drifts hit both alike: medians of host wall (what a caller waits) and
    program wall (the init's own clock, fork to exit), in ms."""
    jails = {"ours": Sandbox(config), "bwrap": BwrapSandbox(config)}
    for sb in jails.values():
        sb.require_isolation("the timing comparison")
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, source in PROGRAMS.items():
        samples: dict[str, dict[str, list[float]]] = {j: {"host": [], "program": []} for j in jails}
        for _ in range(runs):
            for jail, sb in jails.items():
                start = time.monotonic()
                result = sb.run_python({"p.py": source}, "p.py", wall_s=20.0)
                host = time.monotonic() - start
                if not result.ok:
                    raise RuntimeError(f"{jail}: {name} failed: {result.reason} {result.error} "
                                       f"{result.stderr[-300:]!r}")
                samples[jail]["host"].append(host)
                samples[jail]["program"].append(result.wall_s)
        out[name] = {j: {k: _median_ms(v) for k, v in s.items()} for j, s in samples.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="runs of each program through each jail")
    args = parser.parse_args(argv)
    if args.runs < 1:
        print(f"error: --runs: must be >= 1, got {args.runs}", file=sys.stderr)
        return 2
    config = SandboxConfig(max_parallel=1, memory_mb=256, tree_memory_mb=384, nproc=16,
                           uid_base=1_500_000_000 + (os.getpid() % 50_000) * 16)
    try:
        table = compare(config, args.runs)
    except SandboxUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    load = os.getloadavg()[0]
    print(f"interleaved A/B, {args.runs} runs each, load average {load:.1f}; medians in ms")
    print("| program | ours host wall | bwrap host wall | ours program wall | bwrap program wall |")
    print("|---|---|---|---|---|")
    for name, row in table.items():
        ours, bwrap = row["ours"], row["bwrap"]
        print(f"| {name} | {ours['host']:.1f} | {bwrap['host']:.1f} | {ours['program']:.1f} "
              f"| {bwrap['program']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
