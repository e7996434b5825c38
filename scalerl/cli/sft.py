"""`scalerl sft`: supervised fine-tuning, the warm start before RL.

    scalerl sft                                   # tiny default on the synthetic gold traces (cached)
    scalerl sft --model Qwen/Qwen3-0.6B --data sft.jsonl --output runs/sft-qwen
    scalerl sft -c recipe.yaml model.init_seed=3 --steps 500 --output runs/sft-tiny

Config files and `key.sub=value` overrides set the model (`model.*`) and prompt format
(`data.system_prompt`, `data.think_system_prompt`); the flags set the SFT hyper-parameters.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from scalerl.config import ConfigError, RunConfig, load_config
from scalerl.inputs import InputError
from scalerl.training.sft_config import SFTConfig


def _field_map(text: str) -> dict[str, str]:
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise argparse.ArgumentTypeError(f"expected field=column pairs, got {part!r}")
        key, column = part.split("=", 1)
        out[key.strip()] = column.strip()
    return out


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sft",
        help="supervised fine-tuning (warm start before RL)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides (model.init_seed=1)")
    p.add_argument("-c", "--config", action="append", default=[], metavar="FILE", help="YAML (repeatable)")
    p.add_argument("--model", metavar="NAME_OR_PATH", help="Hugging Face causal LM (default: the tiny model)")
    p.add_argument("--data", metavar="PATH",
                   help="JSONL/JSON/Parquet file or folder of SFT rows (default: synthetic gold traces)")
    p.add_argument("--field-map", type=_field_map, default={}, metavar="F=COL,...",
                   help="column names, e.g. prompt=question,response=answer")
    p.add_argument("--output", metavar="DIR",
                   help="where to save the model (default: the shared cache for the tiny default, "
                        "else <output_dir>/sft)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda if available)")
    defaults = SFTConfig()
    for f in fields(SFTConfig):
        kind = float if f.name in ("lr", "weight_decay", "grad_clip") else int
        p.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=None, metavar=f.name.upper(),
                       help=f"(default {getattr(defaults, f.name)})")
    p.set_defaults(func=run_sft)


def _sft_config(args: argparse.Namespace, cfg: RunConfig) -> SFTConfig:
    values = {f.name: getattr(args, f.name) for f in fields(SFTConfig) if getattr(args, f.name) is not None}
    values.setdefault("seed", cfg.model.init_seed)
    return replace(SFTConfig(), **values)


def run_sft(args: argparse.Namespace) -> int:
    from scalerl.assembly.sft import sft_run
    from scalerl.inputs import check_device, check_model_source, check_path
    from scalerl.ownership import check_output_dir_owned
    from scalerl.training.sft import SFT_KIND, progress_printer

    try:
        cfg = load_config(*args.config, overrides=list(args.overrides))
    except ConfigError as err:
        raise InputError(str(err)) from None
    if args.model:
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"name_or_path": args.model})})
    sft = _sft_config(args, cfg)
    # Every input is checked before any model is built or trained.
    check_model_source(cfg.model.name_or_path, "--model / model.name_or_path")
    check_model_source(cfg.model.tokenizer, "model.tokenizer")
    if args.data is not None:
        check_path(args.data, "--data")
    check_device(args.device)
    default_cache = cfg.model.name_or_path is None and args.data is None and args.device in (None, "cpu")
    if args.output or not default_cache:  # the shared cache of the warm start is not the user's folder
        check_output_dir_owned(args.output or Path(cfg.output_dir) / "sft", SFT_KIND, "--output")
    path = sft_run(cfg, sft, data=args.data, field_map=args.field_map, output=args.output, device=args.device,
                   on_step=progress_printer(sft.steps), say=lambda m: print(m, file=sys.stderr))
    print(path)
    return 0


__all__ = ["register", "run_sft"]
