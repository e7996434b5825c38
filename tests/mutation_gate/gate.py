r"""The mutation gate: every curated break of the package must make a test fail.

    python tests/mutation_gate/gate.py [--budget-s 600] [--only ID ...] [--list] [FILE.yaml ...]
    make test-mutations

Reads every `tests/mutation_gate/mutations_*.yaml` (or the files named), copies the package
(`scalerl/`, `tests/`, `pyproject.toml`) to a temporary directory once, and for each mutation in
turn writes the mutated file into the copy, runs the mutation's tests there (pytest `-x` with the
copy first on the import path and PYTHONPATH, no bytecode cache), and restores the file. The
working tree is never written to. Each pytest run is a fork of this process after it has imported
torch and transformers (never scalerl), so a run costs seconds, not an interpreter start;
`--fresh` runs `python -m pytest` in a new interpreter instead.

A mutation is CAUGHT when pytest exits 1 (a test failed) and its output names the failing test.
Anything else fails the gate: the tests pass (SURVIVED), pytest exits with a usage or collection
error or collects nothing (ERROR: a node id that no longer exists reads as this), the run passes
the time left (TIMEOUT), or the budget ran out before it started (NOT RUN). Before any mutation the
union of the listed tests runs once on the unmutated copy and must pass: a test that fails anyway
would "catch" everything.

File format (a YAML list; one file per area, e.g. mutations_objectives.yaml, mutations_presets.yaml):

    - id: cispo-trained-as-grpo          # unique across all files
      file: scalerl/training/trainer.py  # path from the repository root
      old: 'loss_type=self.algo.loss_type,'   # exact text; must occur exactly once in `file`
      new: 'loss_type="grpo" if self.algo.loss_type == "cispo" else self.algo.loss_type,'
      tests:                             # pytest node ids or files, relative to the repository
        - tests/training/test_reference_objectives.py::test_one_trainer_step_is_the_papers_update[cispo]
      why: the ScaleRL recipe's CISPO would silently train GRPO's clipped surrogate

Write `old` and `new` as single-quoted one-line strings (quote a `'` as `''`): a `|` block strips
its first line's indentation, so a multi-line snippet would not match the file. For several lines
use a double-quoted string with `\n` and explicit spaces.

Put the test most likely to fail first in `tests` (`-x` stops there, so the gate stays fast).
A snippet found zero or several times, a missing key or a duplicate id fails the gate before any
test runs (`load_mutations`; tests/mutation_gate/test_gate.py checks every file in `make test`).
Exit status: 0 when every mutation is caught, 1 otherwise, 2 for a malformed file.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
GATE_DIR = Path(__file__).resolve().parent
KEYS = ("id", "file", "old", "new", "tests", "why")
COPIED = ("scalerl", "tests", "pyproject.toml")
DEFAULT_BUDGET_S = 600.0
# Imported once by the parent before the runs are forked (`preload`); scalerl itself never is.
PRELOAD = ("numpy", "torch", "yaml", "pydantic", "pytest", "transformers",
           "transformers.models.qwen2.modeling_qwen2", "safetensors", "peft")


class GateFileError(ValueError):
    """A malformed mutation file (exit 2)."""


class GateRunError(RuntimeError):
    """The gate cannot judge the mutations: its tests fail or time out unmutated (exit 1)."""


@dataclass(frozen=True)
class Mutation:
    id: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    why: str
    source: str  # "path:index" of its entry, for error messages


@dataclass
class Result:
    mutation: Mutation
    status: str  # CAUGHT, SURVIVED, ERROR, TIMEOUT, NOT RUN
    caught_by: str
    seconds: float
    detail: str = ""


def load_mutations(files: list[Path], root: Path = ROOT) -> list[Mutation]:
    """Parse and validate mutation files against the tree at `root`; raises `GateFileError`."""
    out: list[Mutation] = []
    seen: dict[str, str] = {}
    for path in files:
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as err:
            raise GateFileError(f"{path}: cannot read the mutations: {err}") from None
        if not isinstance(data, list) or not data:
            raise GateFileError(f"{path}: expected a non-empty YAML list of mutations")
        for i, entry in enumerate(data):
            where = f"{path}:entry {i}"
            if not isinstance(entry, dict):
                raise GateFileError(f"{where}: expected a mapping with keys {', '.join(KEYS)}")
            missing = [k for k in KEYS if k not in entry]
            extra = sorted(set(entry) - set(KEYS))
            if missing or extra:
                raise GateFileError(f"{where} ({entry.get('id', '?')}): missing keys {missing}, "
                                    f"unknown keys {extra}")
            tests = entry["tests"]
            if isinstance(tests, str):
                tests = [tests]
            if not tests or not all(isinstance(t, str) and t for t in tests):
                raise GateFileError(f"{where} ({entry['id']}): tests must be a non-empty list of node ids")
            m = Mutation(str(entry["id"]), str(entry["file"]), str(entry["old"]), str(entry["new"]),
                         tuple(tests), str(entry["why"]), where)
            if m.id in seen:
                raise GateFileError(f"{where}: id {m.id!r} already used at {seen[m.id]}")
            seen[m.id] = where
            target = root / m.file
            if not target.is_file():
                raise GateFileError(f"{where} ({m.id}): file {m.file} does not exist")
            count = target.read_text().count(m.old)
            if count != 1:
                raise GateFileError(f"{where} ({m.id}): `old` occurs {count} times in {m.file}, expected "
                                    "exactly once (a stale or ambiguous snippet)")
            if m.old == m.new:
                raise GateFileError(f"{where} ({m.id}): `new` equals `old`")
            for t in m.tests:
                path_part, _, node = t.partition("::")
                test_file = root / path_part
                if not test_file.exists():
                    raise GateFileError(f"{where} ({m.id}): test file {path_part} does not exist")
                name = node.split("::")[-1].split("[")[0]
                if name and f"def {name}(" not in test_file.read_text():
                    raise GateFileError(f"{where} ({m.id}): no test {name} in {path_part}")
            out.append(m)
    return out


def copy_tree(root: Path, dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in COPIED:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, dest / name)


def _env(copy: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(copy) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a mutated file of the same size and mtime must not reuse a .pyc
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _pytest_subprocess(copy: Path, args: list[str], timeout: float) -> tuple[int | None, str]:
    cmd = [sys.executable, "-m", "pytest", *args]
    try:
        proc = subprocess.run(cmd, cwd=copy, env=_env(copy), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        return None, out
    return proc.returncode, proc.stdout + proc.stderr


def preload() -> None:
    """Import the heavy dependencies (never scalerl) once, so that each forked pytest run starts in
    a second instead of re-importing torch and transformers (tens of seconds on a loaded machine)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for name in PRELOAD:
        # a missing optional dependency only costs time
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    leaked = [m for m in sys.modules if m == "scalerl" or m.startswith(("scalerl.", "tests."))]
    if leaked:
        raise RuntimeError(f"the gate's parent process imported {leaked[:3]}: the forked runs would not "
                           "see the mutated copy")


def _pytest_fork(copy: Path, args: list[str], timeout: float) -> tuple[int | None, str]:
    """pytest in a forked child whose imports of scalerl and tests resolve to `copy` only."""
    with tempfile.NamedTemporaryFile(prefix="gate-", suffix=".log", delete=False) as log:
        log_path = Path(log.name)
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 3
        try:
            os.setpgid(0, 0)  # its own process group, so a timeout ends whatever the tests started
            fd = os.open(log_path, os.O_WRONLY | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            # fresh streams on the log: the parent's may be a capture object (the gate run under pytest)
            sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)  # noqa: SIM115
            sys.stderr = sys.__stderr__ = open(2, "w", closefd=False)  # noqa: SIM115
            os.chdir(copy)
            os.environ.update(_env(copy))
            sys.dont_write_bytecode = True
            root = str(ROOT)
            sys.path[:] = [str(copy)] + [p for p in sys.path if p and Path(p).resolve() != Path(root)
                                         and Path(p).resolve() != GATE_DIR]
            for name in [m for m in sys.modules if m.split(".")[0] in ("scalerl", "tests")]:
                del sys.modules[name]  # the gate itself may run inside a test process
            import scalerl

            if not Path(scalerl.__file__).resolve().is_relative_to(copy.resolve()):
                raise RuntimeError(f"scalerl imported from {scalerl.__file__}, not the copy {copy}")
            import pytest

            code = int(pytest.main(args))
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    deadline = time.monotonic() + timeout
    status = None
    while status is None:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(raw)
        elif time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:  # killed before it made its own group
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        else:
            time.sleep(0.05)
    output = log_path.read_text(errors="replace")
    log_path.unlink()
    return status, output


def _pytest(copy: Path, tests: list[str], timeout: float, *, stop_first: bool, fresh: bool = False
            ) -> tuple[int | None, str]:
    """Exit status (None: timed out) and output of pytest on `tests` in the copy."""
    args = ["-q", "-p", "no:cacheprovider", "-rfE", *(["-x"] if stop_first else []), *tests]
    if fresh or not hasattr(os, "fork"):
        return _pytest_subprocess(copy, args, timeout)
    return _pytest_fork(copy, args, timeout)


_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def run_mutation(copy: Path, m: Mutation, timeout: float, fresh: bool = False) -> Result:
    target = copy / m.file
    original = target.read_text()
    start = time.perf_counter()
    try:
        target.write_text(original.replace(m.old, m.new, 1))
        code, output = _pytest(copy, list(m.tests), timeout, stop_first=True, fresh=fresh)
    finally:
        target.write_text(original)
    seconds = time.perf_counter() - start
    if code is None:
        return Result(m, "TIMEOUT", "", seconds, f"no result within {timeout:.0f}s")
    failed = _FAILED.findall(output)
    if code == 1 and failed:
        return Result(m, "CAUGHT", failed[0], seconds)
    if code == 0:
        return Result(m, "SURVIVED", "", seconds, "every listed test passed with the mutation in place")
    tail = "\n".join(output.strip().splitlines()[-15:])
    return Result(m, "ERROR", "", seconds, f"pytest exit {code} (not a test failure):\n{tail}")


def check_import_path(copy: Path) -> None:
    """The copy, not an installed package, must be what the tests import."""
    out = subprocess.run([sys.executable, "-c", "import scalerl; print(scalerl.__file__)"], cwd=copy,
                         env=_env(copy), capture_output=True, text=True, check=True).stdout.strip()
    if not Path(out).resolve().is_relative_to(copy.resolve()):
        raise RuntimeError(f"the tests would import scalerl from {out}, not from the copy {copy}")


def gate(mutations: list[Mutation], budget_s: float, root: Path = ROOT, log=print, fresh: bool = False
         ) -> list[Result]:
    """Run every mutation on one copy of `root`; `fresh`: a new interpreter per pytest run instead
    of a fork of this one (slower; for platforms without fork)."""
    start = time.perf_counter()
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="scalerl-mutation-gate-") as tmp:
        copy = Path(tmp)
        copy_tree(root, copy)
        check_import_path(copy)
        union = list(dict.fromkeys(t for m in mutations for t in m.tests))
        code, output = _pytest(copy, union, budget_s, stop_first=False, fresh=fresh)
        if code is None:
            raise GateRunError(f"the unmutated baseline run did not finish within --budget-s {budget_s:.0f}")
        if code != 0:
            tail = "\n".join(output.strip().splitlines()[-20:])
            raise GateRunError(f"the gate's tests do not pass on the unmutated tree (exit {code}):\n{tail}")
        log(f"baseline: {len(union)} test ids pass unmutated ({time.perf_counter() - start:.0f}s)")
        for m in mutations:
            left = budget_s - (time.perf_counter() - start)
            if left <= 0:
                results.append(Result(m, "NOT RUN", "", 0.0, f"--budget-s {budget_s:.0f} spent"))
                continue
            r = run_mutation(copy, m, left, fresh=fresh)
            results.append(r)
            log(f"{r.status:8s} {r.seconds:6.1f}s  {m.id}  {r.caught_by}")
    return results


def table(results: list[Result]) -> str:
    width = max(len(r.mutation.id) for r in results)
    lines = [f"{'mutation':{width}s}  {'status':8s}  {'time':>6s}  caught by", "-" * (width + 60)]
    for r in results:
        how = r.caught_by or r.detail.splitlines()[0]
        lines.append(f"{r.mutation.id:{width}s}  {r.status:8s}  {r.seconds:5.1f}s  {how}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("files", nargs="*", type=Path,
                    help="mutation files (default: every mutations_*.yaml here)")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                    help="wall-clock budget for the whole gate; mutations not started in time fail it")
    ap.add_argument("--only", action="append", default=[], help="run only this mutation id (repeatable)")
    ap.add_argument("--list", action="store_true", help="print the mutations and their tests, run nothing")
    ap.add_argument("--fresh", action="store_true",
                    help="a new interpreter per pytest run instead of a fork of a preloaded one (slower)")
    args = ap.parse_args(argv)
    files = args.files or sorted(GATE_DIR.glob("mutations_*.yaml"))
    try:
        if not files:
            raise GateFileError(f"no mutations_*.yaml in {GATE_DIR}")
        mutations = load_mutations(files)
    except GateFileError as err:
        print(f"mutation gate: {err}", file=sys.stderr)
        return 2
    if args.only:
        unknown = sorted(set(args.only) - {m.id for m in mutations})
        if unknown:
            print(f"mutation gate: --only: unknown ids {unknown}", file=sys.stderr)
            return 2
        mutations = [m for m in mutations if m.id in args.only]
    if args.list:
        for m in mutations:
            print(f"{m.id}: {m.file} -- {m.why}\n    " + "\n    ".join(m.tests))
        return 0
    start = time.perf_counter()
    if not args.fresh:
        preload()
    try:
        results = gate(mutations, args.budget_s, fresh=args.fresh)
    except GateRunError as err:
        print(f"mutation gate: {err}", file=sys.stderr)
        return 1
    print()
    print(table(results))
    bad = [r for r in results if r.status != "CAUGHT"]
    for r in bad:
        print(f"\n{r.status}: {r.mutation.id} ({r.mutation.source}): {r.mutation.why}\n{r.detail}")
    elapsed = time.perf_counter() - start
    caught = len(results) - len(bad)
    print(f"\n{caught}/{len(results)} mutations caught in {elapsed:.0f}s (budget {args.budget_s:.0f}s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
