"""The hostile corpus (`scalerl.rewards.hostile`): nothing escapes the full sandbox, and the same
checks do catch a weak one (so a 0 means something). Each program bounds itself; two run at a
time; the whole corpus takes about 11 s of wall time here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scalerl.rewards import cgroup as cg
from scalerl.rewards.hostile import CORPUS, Report, format_table, run_corpus
from scalerl.rewards.sandbox import Sandbox, SandboxConfig

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
                "long_argv_env", "binary_output", "unclosed_pipes", "zombie_horde", "thread_spin"}
    assert required <= names, required - names


@pytest.fixture(scope="module")
def report() -> Report:
    return run_corpus(Sandbox(SandboxConfig(**CONFIG)), REPO)  # type: ignore[arg-type]


def test_no_hostile_program_escapes(report: Report) -> None:
    table = format_table(report)
    assert report.escapes == 0, table
    assert not report.global_evidence, table
    assert report.sandbox_stats["errors"] == 0 and report.sandbox_stats["cgroup_leaks"] == 0, table


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


def test_the_checks_catch_a_weak_sandbox() -> None:
    """No namespaces, no cgroup: the same programs and checks must report escapes."""
    if os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON):
        pytest.skip("the weak mode's dedicated uid needs root and an interpreter outside /root")
    weak = Sandbox(SandboxConfig(**CONFIG, isolation="none", cgroup="off",  # type: ignore[arg-type]
                                 python=SYSTEM_PYTHON))
    chosen = {"write_outside", "network", "tree_memory", "proc_probe", "unix_sockets", "env_secret"}
    report = run_corpus(weak, REPO, only=chosen, try_all=True)
    rows = {r.name: r for r in report.rows}
    table = format_table(report)
    assert any("host file created" in e or "canary dir" in e for e in rows["write_outside"].evidence), table
    assert any("connected to 127.0.0.1" in e for e in rows["network"].evidence), table
    assert any("held reached 480 MB" in e for e in rows["tree_memory"].evidence), table
    assert any("sees host canary" in e for e in rows["proc_probe"].evidence), table
    # what the weak mode still has: a clean environment and the seccomp filter on Unix sockets
    assert not any("secret" in e for e in rows["env_secret"].evidence), table
    assert not any("connected to" in e for e in rows["unix_sockets"].evidence), table
    assert report.escapes >= 4


def test_unknown_program_names_are_refused() -> None:
    with pytest.raises(ValueError, match="nope"):
        run_corpus(Sandbox(SandboxConfig(**CONFIG)), REPO, only={"nope"})  # type: ignore[arg-type]


def test_a_failed_canary_setup_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Setup failing half-way (here: at the first canary process) undoes what it made."""
    from scalerl.rewards import hostile

    def refuse(self: hostile.Canaries, uid: int | None) -> None:
        raise OSError("no canary")

    monkeypatch.setattr(hostile.Canaries, "_canary_process", refuse)
    monkeypatch.setenv(hostile.SECRET_VAR, "before")
    with pytest.raises(OSError, match="no canary"):
        hostile.Canaries(Sandbox(SandboxConfig(**CONFIG)), tmp_path)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
    assert os.environ[hostile.SECRET_VAR] == "before"
