"""The hostile corpus (`tests/rewards/hostile.py`): nothing escapes the full sandbox, and the same
checks do catch a weak one (so a 0 means something). Each program bounds itself; two run at a
time; the whole corpus takes about 11 s of wall time here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scalerl.rewards import cgroup as cg
from scalerl.rewards.sandbox import Sandbox, SandboxConfig, SandboxUnavailableError
from tests.rewards.hostile import (
    CORPUS,
    Report,
    calibration_problems,
    format_table,
    program_identity,
    run_corpus,
)
from tests.rewards.isolation import no_isolation

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"
# uids of this process only: RLIMIT_NPROC and the "no process of a sandbox uid remains" check
# count every process of a uid, including those of other test runs on the same machine.
UID_BASE = 1_500_000_000 + (os.getpid() % 50_000) * 16
CONFIG = {"max_parallel": 2, "memory_mb": 256, "tree_memory_mb": 384, "nproc": 16,
          "max_output_bytes": 1 << 20, "uid_base": UID_BASE}


def test_the_corpus_covers_the_required_kinds() -> None:
    names = {p.name for p in CORPUS}
    assert len(CORPUS) >= 30 and len(names) == len(CORPUS)
    required = {"cpu_spin", "sleep_forever", "fork_bomb", "setsid_daemon", "memory_bomb", "huge_output",
                "write_outside", "disk_fill", "network", "env_secret", "proc_probe", "signal_canary",
                "setuid_attempts", "tree_memory", "sys_probe", "ptrace_canary", "symlink_escape",
                "long_argv_env", "binary_output", "unclosed_pipes", "zombie_horde", "thread_spin",
                "outside_allow_list", "unix_sockets", "userns_remount"}
    assert required <= names, required - names


@pytest.fixture(scope="module")
def report() -> Report:
    return run_corpus(Sandbox(SandboxConfig(**CONFIG)), REPO)  # type: ignore[arg-type]


def test_no_hostile_program_escapes(report: Report) -> None:
    table = format_table(report)
    assert report.escapes == 0, table
    assert not report.global_evidence, table
    assert report.sandbox_stats["errors"] == 0 and report.sandbox_stats["cgroup_leaks"] == 0, table


def test_programs_run_unprivileged_inside_namespaces(report: Report) -> None:
    """We are root here: the hostile programs must not be, and must not share the host's namespaces."""
    ident = report.identity
    assert ident is not None and ident.host_uid != 0 and ident.host_gid != 0 and ident.capabilities == 0
    if os.geteuid() == 0:
        assert ident.host_uid in range(UID_BASE, UID_BASE + CONFIG["max_parallel"]), ident
        assert {"pid", "net", "mnt", "ipc", "uts"} <= set(ident.new_namespaces), ident


def test_the_corpus_refuses_to_run_as_host_root() -> None:
    """A forced `userns` sandbox as root maps the program to host root: no hostile program runs."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    sandbox = Sandbox(SandboxConfig(**CONFIG, isolation="userns", cgroup="off"))  # type: ignore[arg-type]
    try:
        ident = program_identity(sandbox)
    except SandboxUnavailableError as exc:
        no_isolation(f"no user namespaces here: {exc}")
    assert ident.host_uid == 0
    with pytest.raises(RuntimeError, match="as root on the host"):
        run_corpus(sandbox, REPO, only={"fork_bomb"})
    assert sandbox.stats()["runs"] == 2  # the two identity probes, no hostile program


def test_limits_the_corpus_cannot_test_are_refused() -> None:
    loose = Sandbox(SandboxConfig(**{**CONFIG, "memory_mb": 2048, "nproc": 256}))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"sandbox\.memory_mb=2048.*sandbox\.nproc=256"):
        run_corpus(loose, REPO)
    assert calibration_problems(SandboxConfig(**CONFIG)) == []  # type: ignore[arg-type]


def test_the_host_side_cost_is_small(report: Report) -> None:
    """The host thread's own CPU per program (setup, pumping output, cleanup), whatever the
    program does: a busy loop on the host side, or an output flood it has to copy, would show."""
    costs = {r.name: r.host_cpu_s for r in report.tried}
    assert all(0 < c < 0.5 for c in costs.values()), costs


def test_every_program_is_tried_where_the_machine_allows(report: Report) -> None:
    support, _ = cg.locate()
    if os.geteuid() != 0 or support is None or set(support.limited) != {"memory", "pids"}:
        pytest.skip("not root with memory+pids cgroups: some programs' bounds are missing here")
    # this machine and CI: every protection the corpus relies on is there
    assert len(report.tried) == len(CORPUS) >= 30, format_table(report)


def test_bounds_were_actually_hit(report: Report) -> None:
    """Contained because the limits fired, not because the programs failed to start."""
    rows = {r.name: r for r in report.tried}
    assert rows["cpu_spin"].reason == "timeout" and rows["fork_bomb"].reason == "timeout"
    assert rows["huge_output"].reason == "output_limit"
    if "tree_memory" in rows:
        assert rows["tree_memory"].reason == "memory_limit"
        assert rows["memfd_memory"].reason == "memory_limit"
        assert rows["tree_memory"].peak_memory_mb is not None and rows["tree_memory"].peak_memory_mb <= 384
    assert rows["binary_output"].reason == "ok" and rows["env_secret"].reason == "ok"


def _row(table: str, name: str) -> str:
    """The `contained` cell of program `name`'s row."""
    match = re.search(rf"^\| {name} \|(?:[^|]*\|){{3}} ((?:[^|]|\\\|)*) \|", table, flags=re.MULTILINE)
    assert match, f"no row for {name}:\n{table}"
    return match[1]


def test_a_weak_sandbox_fails_the_checks_not_the_host() -> None:
    """Every program against no namespaces, no cgroup and loose rlimits (only the programs' own
    bounds hold), as the slot's unprivileged uid; the experiment enclosed in namespaces of its own
    and a 3 GB / 1000-task safety cgroup: the checks report the escapes (so a 0 means something),
    and the cost is bounded."""
    support, _ = cg.locate()
    if os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON) or support is None \
            or set(support.limited) != {"memory", "pids"}:
        pytest.skip("needs root (the slot's uid), an interpreter outside /root, memory+pids cgroups")
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "hostile_corpus.py"), "--weak"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    foot = re.search(r"peak memory (\d+) MB of a 3072 MB safety bound; peak tasks (\d+) of 1000; "
                     r"safety bound reached: no", out)
    assert foot, out
    assert int(foot[1]) < 2048 and int(foot[2]) < 700, out  # a few hundred processes, under 2 GB
    # the whole weak experiment is enclosed in namespaces of its own
    assert "enclosure: the weak run has its own pid, net, mnt, ipc, uts namespaces" in out, out
    # weak, but still not root
    assert re.search(r"^identity: programs run as host uid (?!0 )\d+ .*no capabilities, in NO new namespaces",
                     out, flags=re.MULTILINE), out
    # what a program reports, or its own check finds, is in its row
    assert "connected to 127.0.0.1" in _row(out, "network"), out
    assert "held reached 480 MB" in _row(out, "tree_memory"), out
    assert "sees host canary" in _row(out, "proc_probe"), out
    assert "host network interface" in _row(out, "sys_probe"), out
    # damage found on the host may land in the row of the program run beside it (two at a time)
    assert "host file created: /tmp/sbx-" in out and "SysV shm with the program's key" in out, out
    # what the weak mode still has: a clean environment and the seccomp filter (Unix sockets, and on
    # x86_64 everything outside the allow-list, the user namespace userns_remount needs included)
    assert "secret environment variable was read" not in out, out
    assert "connected to '" not in out and not re.search(r"listener (?:'|b')", out), out
    if os.uname().machine == "x86_64":
        assert _row(out, "outside_allow_list") == "yes" and _row(out, "userns_remount") == "yes", out
    escapes = re.search(rf"^programs tried: {len(CORPUS)}; escapes: (\d+);", out, flags=re.MULTILINE)
    assert escapes and int(escapes[1]) >= 8, out


def test_unknown_program_names_are_refused() -> None:
    with pytest.raises(ValueError, match="nope"):
        run_corpus(Sandbox(SandboxConfig(**CONFIG)), REPO, only={"nope"})  # type: ignore[arg-type]


def test_a_failed_canary_setup_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Setup failing half-way (here: at the first canary process) undoes what it made."""
    from tests.rewards import hostile

    def refuse(self: hostile.Canaries, uid: int | None) -> None:
        raise OSError("no canary")

    monkeypatch.setattr(hostile.Canaries, "_canary_process", refuse)
    monkeypatch.setenv(hostile.SECRET_VAR, "before")
    with pytest.raises(OSError, match="no canary"):
        hostile.Canaries(Sandbox(SandboxConfig(**CONFIG)), tmp_path)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
    assert os.environ[hostile.SECRET_VAR] == "before"
