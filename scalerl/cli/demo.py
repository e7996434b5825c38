"""`scalerl demo`: train the embedded default, fit its curve on the first half, check the prediction.

    scalerl demo                        # the README's first command (its time is measured there)
    scalerl demo --quick                # a smoke test: a few steps, just enough points to fit
    scalerl demo --seed 1 --output-dir runs/demo-s1
    scalerl demo max_steps=300 --max-time 900

The demo warm-starts the tiny model (cached after the first time), trains it with the `scalerl`
recipe while evaluating on held-out prompts, fits R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) on the
first half of the compute, and prints the predicted against the observed final pass rate with the
fitted A, B and C_mid and their intervals. The output directory is the run directory (so
`scalerl fit runs/demo --x flops` refits it) plus `fit.png`, `report.md` and `summary.json`.

Its settings (steps, evaluation cadence and size, fit window, compute axis) are in
`scalerl/studies/demo.yaml`; `--settings FILE` reads another copy, and `KEY=VALUE` overrides go on
top. A rerun replaces the previous demo in the same directory (and refuses a directory holding
anything else).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from scalerl.studies.demo import SETTINGS_FILE, run_demo, run_seeds


def _positive(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="train the tiny default, fit the first half, check the predicted final pass rate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides (max_steps=300)")
    p.add_argument("--output-dir", default="runs/demo", metavar="DIR", help="default runs/demo")
    p.add_argument("--seed", type=int, help="seed of the run (default: the settings file's, 0)")
    p.add_argument("--seeds", type=int, metavar="N",
                   help="run the demo on N seeds from --seed on (OUTPUT_DIR/seed-S each) and report the "
                   "spread of the prediction error and of A and B")
    p.add_argument("--quick", action="store_true",
                   help="a smoke test: a few steps, just enough points to fit")
    p.add_argument("--max-time", "--max-time-s", dest="max_time", type=_positive, metavar="S",
                   help="also stop training after S seconds (default: no limit; max_steps still applies)")
    p.add_argument("--settings", metavar="FILE", help=f"demo settings (default {SETTINGS_FILE})")
    p.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda if available)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from scalerl.assembly.run import stderr_say
    from scalerl.inputs import check_device

    check_device(args.device)
    if args.seeds is not None:
        return run_seeds(n_seeds=args.seeds, settings_path=args.settings, output_dir=args.output_dir,
                         quick=args.quick, seed=args.seed, max_time_s=args.max_time,
                         overrides=args.overrides, device=args.device, say=stderr_say)
    return run_demo(settings_path=args.settings, output_dir=args.output_dir, quick=args.quick, seed=args.seed,
                    max_time_s=args.max_time, overrides=args.overrides, device=args.device, say=stderr_say)


__all__ = ["register"]
