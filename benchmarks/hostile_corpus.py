"""Run the hostile-program corpus against this machine's code sandbox and print what escaped.

    .venv/bin/python benchmarks/hostile_corpus.py                 # all programs, 2 at a time
    .venv/bin/python benchmarks/hostile_corpus.py --only fork_bomb,tree_memory

Prints the active protections (as detected and logged by the sandbox), then one Markdown row per
program (outcome, contained or the evidence of escape, host-side wall time, the tree's peak memory
and CPU time from its cgroup) and a summary line. Exits 1 if anything escaped. The limits are the
ones the tests use (256 MB per process, 384 MB per tree, 16 processes, 1 MB of output); the canary
directory is made in the repository root, which the jail shows read-only.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from scalerl.rewards.hostile import CORPUS, format_table, run_corpus
from scalerl.rewards.sandbox import Sandbox, SandboxConfig

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated program names (default: all)")
    parser.add_argument("--parallel", type=int, default=2, help="programs run at once (sandbox.max_parallel)")
    parser.add_argument("--list", action="store_true", help="list the programs and their goals, run nothing")
    args = parser.parse_args(argv)
    if args.list:
        for program in CORPUS:
            print(f"{program.name:16s} {program.kind:11s} {program.goal}")
        return 0
    if not 1 <= args.parallel <= 16:
        print(f"error: --parallel: must be in 1..16, got {args.parallel}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # uids of this process only, so other sandboxes on the machine neither share its process limit
    # nor show up in the "no process of a sandbox uid remains" check
    uid_base = 1_500_000_000 + (os.getpid() % 50_000) * 16
    sandbox = Sandbox(SandboxConfig(max_parallel=args.parallel, memory_mb=256, tree_memory_mb=384, nproc=16,
                                    max_output_bytes=1 << 20, uid_base=uid_base))
    only = {name.strip() for name in args.only.split(",") if name.strip()} or None
    try:
        report = run_corpus(sandbox, ROOT, only=only)
    except ValueError as exc:
        print(f"error: --only: {exc}", file=sys.stderr)
        return 2
    print("protections:", report.protections)
    print()
    print(format_table(report))
    print("sandbox counters:", " ".join(f"{k}={v}" for k, v in report.sandbox_stats.items()))
    return 1 if report.escapes else 0


if __name__ == "__main__":
    sys.exit(main())
