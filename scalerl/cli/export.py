"""`scalerl export`: write a checkpoint's weights as a Hugging Face model (LoRA adapters merged).

    scalerl export runs/lora                                # the run's latest checkpoint
    scalerl export runs/lora/checkpoints/step_000200 --out merged/

A LoRA run's checkpoints hold the adapter only (`adapter/`, peft's format); export loads it onto
the run's base model and writes the merged weights `W + (alpha / r) B A`, loadable with
`AutoModelForCausalLM.from_pretrained(DIR)` (and by vLLM). An existing non-empty `--out` is refused.
The checkpoint is verified against its `manifest.json` first: a damaged file is named and nothing is
written; a checkpoint without a manifest is refused unless `--trust-unverified`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "export",
        help="write a checkpoint's weights as a Hugging Face model (LoRA adapters merged)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="run directory or checkpoint directory")
    p.add_argument("--out", required=True, metavar="DIR", help="new (or empty) directory to write")
    p.add_argument("--trust-unverified", action="store_true",
                   help="export a checkpoint that has no manifest.json (its files cannot be verified)")
    p.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    from scalerl.assembly.export import check_export_dir, export_checkpoint

    check_export_dir(args.out)  # before loading anything
    out, merged = export_checkpoint(args.checkpoint, args.out,
                                    warn=lambda m: print(f"export: warning: {m}", file=sys.stderr),
                                    trust_unverified=args.trust_unverified)
    what = "LoRA adapter merged into its base" if merged else "full weights"
    print(f"export: {out} ({what}; AutoModelForCausalLM.from_pretrained loads it)")
    return 0


__all__ = ["register", "run_export"]
