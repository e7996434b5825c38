"""Hostile programs stay contained. Every bomb here is bounded, so a weak sandbox fails the test
instead of taking the machine down (an unbounded fork bomb once emptied its process table)."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from scalerl.config import ConfigError
from scalerl.rewards import sandbox as sandbox_module
from scalerl.rewards.sandbox import Sandbox, SandboxConfig, SandboxResult, SandboxUnavailableError
from tests.rewards.isolation import no_isolation

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(SandboxConfig(max_parallel=2, nproc=16, memory_mb=256, wall_s=5.0,
                                 max_output_bytes=64 * 1024))


def run(sb: Sandbox, source: str, stdin: str = "", wall_s: float = 5.0,
        name: str = "prog.py") -> SandboxResult:
    return sb.run_python({name: textwrap.dedent(source)}, name, stdin=stdin, wall_s=wall_s)


def processes_with(marker: str) -> list[int]:
    """Host PIDs whose command line mentions `marker` (the program's unique file name)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path("/proc", entry, "cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry))
    return found


def leftover_spec_dirs() -> set[str]:
    return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith(f"scalerl-sbx-{os.getpid()}-")}


# -- basic behaviour -------------------------------------------------------------------------

def test_runs_a_program_with_stdin(sandbox: Sandbox) -> None:
    result = run(sandbox, "import sys\nprint(sys.stdin.read().upper())", stdin="hello")
    assert result.ok, result
    assert result.stdout == b"HELLO\n"


def test_protections_are_detected_and_described(sandbox: Sandbox) -> None:
    prot = sandbox.protections
    text = prot.describe()
    assert prot.mode in text
    if os.geteuid() == 0:
        # root with util-linux: the full mode must be what this machine (and CI) gets
        assert prot.mode == "namespaces", text
        assert prot.dedicated_uid and prot.network_isolated and prot.readonly_filesystem


# -- hostile programs ------------------------------------------------------------------------

def test_infinite_loop_is_killed_at_the_wall_limit() -> None:
    # the CPU limit defaults to the wall limit, and a busy loop reaches both at about the same
    # moment (CI once saw SIGXCPU first): a CPU budget well above the wall limit isolates the wall
    sb = Sandbox(SandboxConfig(max_parallel=1, nproc=16, memory_mb=256, cpu_s=30.0))
    start = time.monotonic()
    result = run(sb, "while True:\n    pass", wall_s=1.0)
    assert result.timed_out and not result.ok, result
    assert result.reason == "timeout"
    assert time.monotonic() - start < 10


def test_infinite_loop_is_killed_at_the_cpu_limit() -> None:
    sb = Sandbox(SandboxConfig(max_parallel=1, nproc=16, memory_mb=256, cpu_s=1.0))
    result = run(sb, "while True:\n    pass", wall_s=30.0)
    assert not result.ok and not result.timed_out, result
    assert result.signal in (signal.SIGXCPU, signal.SIGKILL), result
    assert result.reason == ("timeout" if result.signal == signal.SIGXCPU else "signal")
    assert result.wall_s < 10, result


def test_sleeping_program_is_killed_at_the_wall_limit(sandbox: Sandbox) -> None:
    result = run(sandbox, "import time\ntime.sleep(60)", wall_s=0.5)
    assert result.timed_out and result.wall_s < 5


def test_fork_bomb_is_capped_by_the_process_limit_and_cleaned_up(sandbox: Sandbox) -> None:
    marker = f"forkbomb_{secrets.token_hex(4)}.py"
    source = """
    import os, time
    n = 0
    for _ in range(300):  # bounded: a weak sandbox fails the test, not the machine
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
    print(n, flush=True)
    time.sleep(60)
    """
    result = run(sandbox, source, wall_s=2.0, name=marker)
    forked = int(result.stdout.split()[0])
    assert forked < sandbox.config.nproc  # RLIMIT_NPROC held (it does not for root: uid was dropped)
    assert result.timed_out
    assert processes_with(marker) == []  # every child died with the run


def test_background_daemon_does_not_outlive_the_run(sandbox: Sandbox) -> None:
    marker = f"daemon_{secrets.token_hex(4)}.py"
    source = """
    import os, time
    if os.fork() == 0:
        os.setsid()  # escapes the process group: only the namespace/uid kill catches it
        if os.fork() == 0:
            time.sleep(60)
        os._exit(0)
    print("parent done")
    """
    result = run(sandbox, source, name=marker)
    assert result.ok and result.stdout == b"parent done\n"
    assert processes_with(marker) == []


def test_memory_bomb_is_capped(sandbox: Sandbox) -> None:
    source = """
    chunks = []
    try:
        for _ in range(30):  # at most 3 GB even if nothing stops it
            chunks.append(bytearray(100 * 1024 * 1024))
    except MemoryError:
        pass
    print(len(chunks) * 100)
    """
    result = run(sandbox, source)
    allocated_mb = int(result.stdout.split()[0])
    assert allocated_mb < sandbox.config.memory_mb


def test_huge_output_is_capped_and_the_program_killed(sandbox: Sandbox) -> None:
    start = time.monotonic()
    result = run(sandbox, "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", wall_s=5.0)
    assert result.output_limited and not result.ok
    assert len(result.stdout) + len(result.stderr) <= sandbox.config.max_output_bytes
    assert time.monotonic() - start < 4  # killed at the cap, not at the wall limit


def test_scratch_is_the_only_writable_place_and_leaves_nothing(sandbox: Sandbox) -> None:
    if not sandbox.protections.readonly_filesystem:
        no_isolation(f"no filesystem isolation here: {sandbox.protections.describe()}")
    before = leftover_spec_dirs()
    token = secrets.token_hex(6)
    # A world-writable host dir outside /tmp: only a read-only mount keeps the program out.
    open_dir = Path(tempfile.mkdtemp(prefix=".sbx-test-", dir=REPO))
    open_dir.chmod(0o777)
    host_tmp_target = Path(tempfile.gettempdir()) / f"sbx-escape-{token}"
    targets = [open_dir / "escaped", host_tmp_target, Path("/var/tmp") / f"sbx-{token}",
               Path("/dev/shm") / f"sbx-{token}", REPO / f"sbx-{token}"]
    try:
        source = f"""
        import os
        ok = []
        for path in {[str(t) for t in targets]!r}:
            try:
                with open(path, "w") as fh:
                    fh.write("escaped")
                ok.append(path)
            except OSError:
                pass
        with open("scratch-file-{token}", "w") as fh:  # the scratch dir itself is writable
            fh.write("fine")
        print("wrote", ok, os.getcwd())
        """
        result = run(sandbox, source)
        assert result.ok, result
        assert b"scratch-file" not in result.stdout
        for target in targets:
            assert not target.exists(), f"program wrote {target}"
        assert list(open_dir.iterdir()) == []
        assert not list(Path(tempfile.gettempdir()).glob(f"**/scratch-file-{token}"))
        assert leftover_spec_dirs() <= before
    finally:
        shutil.rmtree(open_dir, ignore_errors=True)
        for target in targets:
            if target.is_file():
                target.unlink()


def test_disk_fill_stops_at_the_scratch_quota(sandbox: Sandbox) -> None:
    source = """
    i = 0
    try:
        while i < 2000:  # bounded: 2 GB at most
            with open(f"f{i}", "wb") as fh:
                fh.write(b"x" * 1_000_000)
            i += 1
    except OSError as exc:
        print(i, exc.errno)
    """
    result = run(sandbox, source)
    written_bytes = int(result.stdout.split()[0]) * 1_000_000
    assert written_bytes <= sandbox.config.scratch_mb * 1024 * 1024


def test_no_network_connection_reaches_a_host_listener(sandbox: Sandbox) -> None:
    if not sandbox.protections.network_isolated:
        no_isolation(f"no network isolation here: {sandbox.protections.describe()}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        source = f"""
        import socket
        for host in ("127.0.0.1", "localhost"):
            try:
                socket.create_connection((host, {port}), timeout=1).close()
                print("connected")
            except OSError as exc:
                print("refused", exc.errno)
        """
        result = run(sandbox, source)
        assert b"connected" not in result.stdout
        with pytest.raises(BlockingIOError):
            listener.accept()


def test_parent_environment_is_invisible(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-" + secrets.token_hex(12)
    monkeypatch.setenv("SCALERL_TEST_SECRET", secret)
    source = """
    import os
    print(sorted(os.environ.items()))
    for pid in ["self", "1", str(os.getppid())] + [p for p in os.listdir("/proc") if p.isdigit()]:
        try:
            print(pid, open(f"/proc/{pid}/environ", "rb").read())
        except OSError as exc:
            print(pid, "denied", exc.errno)
    """
    result = run(sandbox, source)
    assert result.ok, result
    assert secret.encode() not in result.stdout + result.stderr
    env = eval(result.stdout.decode().splitlines()[0])  # the program's own env, as printed
    assert {k for k, _ in env} <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "OMP_NUM_THREADS",
                                   "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}


def test_host_processes_and_tmp_are_invisible(sandbox: Sandbox) -> None:
    if not sandbox.protections.pid_namespace:
        no_isolation(f"no PID isolation here: {sandbox.protections.describe()}")
    token = secrets.token_hex(8)
    host_file = Path(tempfile.gettempdir()) / f"sbx-visible-{token}"
    host_file.write_text(token)
    host_file.chmod(0o644)
    try:
        source = f"""
        import os
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
        cmdlines = []
        for p in pids:
            try:
                cmdlines.append(open(f"/proc/{{p}}/cmdline", "rb").read())
            except OSError:
                pass
        print(len(pids), cmdlines)
        print(os.listdir("/tmp"))
        try:
            print(open({str(host_file)!r}).read())
        except OSError as exc:
            print("hidden", exc.errno)
        """
        result = run(sandbox, source)
        assert result.ok, result
        assert b"pytest" not in result.stdout
        assert int(result.stdout.split()[0]) <= 3  # itself (and at most its init)
        assert token.encode() not in result.stdout
    finally:
        host_file.unlink()


def test_cannot_signal_host_processes(sandbox: Sandbox) -> None:
    if not sandbox.protections.pid_namespace:
        no_isolation(f"no PID isolation here: {sandbox.protections.describe()}")
    victim = subprocess.Popen(["sleep", "30"])
    try:
        source = f"""
        import os, signal
        for target in ({victim.pid}, -1):  # the victim's host PID, then everything it can reach
            try:
                os.kill(target, signal.SIGKILL)
                print("sent", target)
            except OSError as exc:
                print("denied", target, exc.errno)
        """
        run(sandbox, source)
        time.sleep(0.2)
        assert victim.poll() is None, "a sandboxed program killed a host process"
    finally:
        victim.kill()
        victim.wait()


def test_privilege_escalation_tools_fail(sandbox: Sandbox) -> None:
    source = """
    import os, subprocess
    print(os.getuid())
    print(open("/proc/self/status").read().split("CapEff:")[1].split()[0])
    r = subprocess.run(["mount", "-t", "tmpfs", "x", "/mnt"], capture_output=True)
    print("mount", r.returncode)
    """
    result = run(sandbox, source)
    lines = result.stdout.decode().split()
    assert lines[1] == "0000000000000000"  # no capabilities at all
    assert lines[3] != "0"
    if sandbox.protections.dedicated_uid:
        assert int(lines[0]) >= sandbox.config.uid_base


def test_interpreter_under_a_private_tmp_dir_is_reexposed_read_only(tmp_path: Path) -> None:
    """A checkout (and its venv) under /tmp, as a CI clone may be: the jail's private /tmp would
    hide the interpreter, so its tree alone is bind-mounted back, read-only."""
    if not sandbox_module.Sandbox().protections.readonly_filesystem:
        no_isolation("no mount namespace here")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    secret = tmp_path / "secret.txt"
    secret.write_text("private")
    sb = Sandbox(SandboxConfig(python=str(venv / "bin" / "python"), max_parallel=1))
    source = f"""
    import sys
    print(sys.prefix)
    try:
        print(open({str(secret)!r}).read())
    except OSError as exc:
        print("absent", exc.errno)
    for path in ({str(secret)!r}, {str(venv / "pyvenv.cfg")!r}, {str(venv / "new-file")!r}):
        try:
            open(path, "a").write("x")
            print("wrote", path)
        except OSError as exc:
            print("denied")
    """
    result = run(sb, source)
    assert result.ok, result
    lines = result.stdout.decode().splitlines()
    assert lines[0] == str(venv)
    assert lines[1:] == ["absent 2", "denied", "denied", "denied"]  # the rest of the dir is gone
    assert secret.read_text() == "private"
    assert not (venv / "new-file").exists()


# -- parallelism -----------------------------------------------------------------------------

def test_at_most_max_parallel_programs_overlap(sandbox: Sandbox) -> None:
    source = "import time\nstart = time.time()\ntime.sleep(0.3)\nprint(start, time.time())"
    results: list[SandboxResult] = []
    lock = threading.Lock()

    def one() -> None:
        r = run(sandbox, source)
        with lock:
            results.append(r)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans = [tuple(map(float, r.stdout.split())) for r in results]
    assert len(spans) == 8
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert peak <= sandbox.config.max_parallel
    assert peak == 2  # and the parallelism was used


# -- detection and fallback ------------------------------------------------------------------

def test_auto_fails_closed_where_no_namespace_mode_works(caplog: pytest.LogCaptureFixture) -> None:
    """`isolation: auto` without a working `unshare` runs nothing (no fallback to `none`), and the
    check a run makes before any work names the key and what is missing."""
    sb = Sandbox(SandboxConfig(unshare="/nonexistent/unshare", max_parallel=1))
    with pytest.raises(SandboxUnavailableError, match=r"no namespace mode works here: .*cannot start "
                                                      r"/nonexistent/unshare") as info:
        _ = sb.protections
    assert info.value.key == "isolation"
    with pytest.raises(SandboxUnavailableError):
        sb.run_python({"p.py": "print(1)"}, "p.py")
    assert sb.stats()["runs"] == 0
    with pytest.raises(ConfigError, match=r"^rewards\.sandbox\.isolation: 'auto' cannot be had here \(.*"
                                          r"/nonexistent/unshare.*\); the sandbox is needed for the code "
                                          r"task; .*rewards\.sandbox\.isolation=none"):
        sb.require_isolation("the code task")
    assert "sandbox mode 'none'" not in caplog.text


def test_isolation_none_is_an_explicit_choice_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    if os.geteuid() == 0 and not os.path.exists(SYSTEM_PYTHON):
        pytest.skip("as root the unisolated mode needs an interpreter outside /root")
    python = SYSTEM_PYTHON if os.geteuid() == 0 else sys.executable
    sb = Sandbox(SandboxConfig(isolation="none", python=python, max_parallel=1, nproc=8, memory_mb=256))
    with caplog.at_level(logging.WARNING, logger="scalerl.rewards.sandbox"):
        prot = sb.protections
    assert prot.mode == "none" and sb.require_isolation() == prot
    assert not prot.network_isolated and not prot.readonly_filesystem
    assert "MISSING: NO network isolation" in caplog.text
    assert prot.dedicated_uid == (os.geteuid() == 0)
    # Unisolated, it still enforces the rlimits and kills what the program leaves behind.
    marker = f"unisolated_{secrets.token_hex(4)}.py"
    source = """
    import os, time
    n = 0
    for _ in range(100):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            os.setsid()
            time.sleep(60)
            os._exit(0)
        n += 1
    print(n)
    """
    result = run(sb, source, name=marker)
    assert int(result.stdout.split()[0]) < 8
    assert processes_with(marker) == []
    assert run(sb, "import os\nprint(sorted(os.environ))").stdout.count(b"SCALERL") == 0


@pytest.mark.parametrize("isolation", ["auto", "none"])
def test_an_architecture_without_a_seccomp_table_refuses_to_start(monkeypatch: pytest.MonkeyPatch,
                                                                   isolation: str) -> None:
    """No allow-list for the machine: nothing runs, whatever the isolation setting, and the check
    before any work names the setting and the architecture."""
    monkeypatch.setattr(sandbox_module.platform, "machine", lambda: "riscv64")
    sb = Sandbox(SandboxConfig(isolation=isolation, max_parallel=1))  # type: ignore[arg-type]
    with pytest.raises(SandboxUnavailableError, match="no seccomp allow-list for architecture 'riscv64'"):
        sb.run_python({"p.py": "print(1)"}, "p.py")
    assert sb.stats()["runs"] == 0
    expected = (rf"^rewards\.sandbox\.isolation: '{isolation}' cannot be had here \(no seccomp allow-list "
                r"for architecture 'riscv64'.*x86_64 or aarch64")
    with pytest.raises(ConfigError, match=expected):
        sb.require_isolation("the code task")


def test_forced_mode_that_cannot_work_raises() -> None:
    sb = Sandbox(SandboxConfig(isolation="namespaces", unshare="/nonexistent/unshare"))
    with pytest.raises(SandboxUnavailableError, match="namespaces"):
        _ = sb.protections


def test_bad_config_and_arguments_are_named() -> None:
    with pytest.raises(ValueError, match=r"max_parallel\n.*greater than or equal to 1"):
        SandboxConfig(max_parallel=0)
    with pytest.raises(ValueError, match=r"isolation\n.*'auto', 'namespaces', 'userns' or 'none'"):
        SandboxConfig(isolation="docker")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"uid_base"):
        SandboxConfig(uid_base=2**31 - 2)
    sb = Sandbox()
    with pytest.raises(ValueError, match="main"):
        sb.run_python({"a.py": "print(1)"}, "b.py")
    with pytest.raises(ValueError, match="file name"):
        sb.run_python({"../a.py": "print(1)"}, "../a.py")


def _readable_by_others(path: Path) -> bool:
    if not path.stat().st_mode & stat.S_IROTH:
        return False
    return all(part.stat().st_mode & stat.S_IXOTH for part in path.parents)


def test_unprivileged_user_gets_the_user_namespace_mode() -> None:
    """As a non-root user (via setpriv), detection picks `userns` and the jail still holds."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None or not os.path.exists(SYSTEM_PYTHON):
        pytest.skip("needs root (to switch user), setpriv and a system python")
    if not _readable_by_others(REPO / "scalerl" / "rewards" / "sandbox.py"):
        pytest.skip("the checkout is not readable by an unprivileged user")
    # The sandbox's config is pydantic: the system python borrows this interpreter's site-packages,
    # which its compiled parts (pydantic-core) fit only at the same minor version.
    import pydantic
    import yaml

    system_version = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info[:2])"],
                                    capture_output=True, text=True, check=True).stdout.strip()
    site = sorted({str(Path(m.__file__).resolve().parents[1]) for m in (pydantic, yaml)})
    if system_version != str(sys.version_info[:2]) or not all(_readable_by_others(Path(d)) for d in site):
        pytest.skip("the system python cannot use this interpreter's pydantic (version, permissions)")
    script = textwrap.dedent(f"""
        import importlib.util, sys
        sys.path[:0] = {site!r}
        # config.py (pydantic), cgroup.py, sandbox_init.py and sandbox.py load alone, not the package.
        def load(name, path):
            spec = importlib.util.spec_from_file_location(name, path)
            module = sys.modules[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
        load("scalerl.config", {str(REPO / "scalerl/config.py")!r})
        load("scalerl.rewards.cgroup", {str(REPO / "scalerl/rewards/cgroup.py")!r})
        load("scalerl.rewards.sandbox_init", {str(REPO / "scalerl/rewards/sandbox_init.py")!r})
        sbx = load("sbx", {str(REPO / "scalerl/rewards/sandbox.py")!r})
        Sandbox, SandboxConfig = sbx.Sandbox, sbx.SandboxConfig
        sb = Sandbox(SandboxConfig(python={SYSTEM_PYTHON!r}, max_parallel=1))
        print(sb.protections.mode)
        r = sb.run_python({{"p.py": "import socket, os\\n"
            "try:\\n    socket.create_connection(('127.0.0.1', 9), timeout=1); print('net')\\n"
            "except OSError:\\n    print('nonet')\\n"
            "try:\\n    open('/etc/sbx-test', 'w'); print('wrote')\\n"
            "except OSError:\\n    print('readonly')\\n"}}, "p.py")
        print(r.stdout.decode().strip(), r.error)
    """)
    proc = subprocess.run(
        [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", SYSTEM_PYTHON, "-c", script],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}, cwd="/")
    if "no namespace mode works" in proc.stderr and "userns" in proc.stderr:
        no_isolation(f"unprivileged user namespaces are disabled here: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    assert lines[0] == "userns"
    assert lines[1:3] == ["nonet", "readonly"]
    assert not Path("/etc/sbx-test").exists()


def test_host_side_backstop_kills_a_hung_init(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """If the sandbox's own init hangs, the host kills its whole process group after the grace."""
    marker = f"hung_init_{secrets.token_hex(4)}.py"
    fake_init = tmp_path / marker
    fake_init.write_text("import time\ntime.sleep(3600)\n")
    sb = Sandbox(SandboxConfig(max_parallel=1, startup_grace_s=0.5))
    _ = sb.protections  # detect with the real init
    monkeypatch.setattr(sandbox_module, "_INIT_SCRIPT", fake_init)
    start = time.monotonic()
    result = sb.run_python({"p.py": "print(1)"}, "p.py", wall_s=0.5)
    assert result.timed_out and result.error is not None and "hung" in result.error
    assert time.monotonic() - start < 10
    assert processes_with(marker) == []


def test_missing_isolation_skips_or_fails_as_required(monkeypatch: pytest.MonkeyPatch) -> None:
    """`SCALERL_REQUIRE_ISOLATION=1` (CI) turns the isolation skips into failures."""
    from tests.rewards.isolation import REQUIRE_VAR, is_missing_isolation

    monkeypatch.delenv(REQUIRE_VAR, raising=False)
    with pytest.raises(pytest.skip.Exception, match="no namespaces"):
        no_isolation("no namespaces")
    monkeypatch.setenv(REQUIRE_VAR, "1")
    with pytest.raises(pytest.fail.Exception, match="SCALERL_REQUIRE_ISOLATION is set, and no namespaces"):
        no_isolation("no namespaces")
    assert is_missing_isolation(SandboxUnavailableError("no namespace mode works here"))
    assert not is_missing_isolation(SandboxUnavailableError("sandbox.cgroup='v2' ...", key="cgroup"))
