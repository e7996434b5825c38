"""`scalerl sft`: supervised fine-tuning, the warm start before RL.

    scalerl sft                                   # tiny default on the synthetic gold traces (cached)
    scalerl sft --model Qwen/Qwen3-0.6B --data sft.jsonl --output runs/sft-qwen
    scalerl sft -c recipe.yaml model.init_seed=3 --steps 500 --output runs/sft-tiny

Config files and `key.sub=value` overrides set the model (`model.*`) and prompt format
(`data.system_prompt`, `data.think_system_prompt`); the flags set the SFT hyper-parameters.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from scalerl.config import ConfigError, RunConfig, load_config
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
    from scalerl.assembly.warm_start import default_sft_records, system_prompt_of, warm_start_default
    from scalerl.inputs import check_model_source, check_path
    from scalerl.training.sft import (
        INFO_FILE,
        examples_from_records,
        progress_printer,
        save_sft_model,
        solution_pairs,
        train_sft,
    )
    from scalerl.training.threads import run_threads

    try:
        cfg = load_config(*args.config, overrides=list(args.overrides))
    except ConfigError as err:
        raise ValueError(str(err)) from None
    if args.model:
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"name_or_path": args.model})})
    sft = _sft_config(args, cfg)
    # Every input is checked before any model is built or trained.
    check_model_source(cfg.model.name_or_path, "--model / model.name_or_path")
    check_model_source(cfg.model.tokenizer, "model.tokenizer")
    if args.data is not None:
        check_path(args.data, "--data")
    report = progress_printer(sft.steps)

    if cfg.model.name_or_path is None and args.data is None and args.device in (None, "cpu"):
        path = warm_start_default(cfg, sft, on_step=report)
        if args.output:
            out = Path(args.output)
            if out.exists():
                shutil.rmtree(out)
            shutil.copytree(path, out)
            path = out
        print(path)
        return 0

    from scalerl.training.policy import load_policy
    from scalerl.training.sft_data import read_sft_pairs

    pairs = read_sft_pairs(args.data, args.field_map) if args.data else None
    with run_threads(cfg.model, args.device):
        policy = load_policy(cfg.model, device=args.device)
        if pairs is None:
            pairs = solution_pairs(default_sft_records(cfg))
        examples = examples_from_records(pairs, policy.tokenizer, system_prompt_of(cfg.data), sft.max_length,
                                         cfg.data.template)
        print(f"sft: {len(examples)} examples, {sft.steps} steps of {sft.batch_size}", file=sys.stderr)
        result = train_sft(policy, examples, sft, on_step=report)
    out = Path(args.output) if args.output else Path(cfg.output_dir) / "sft"
    save_sft_model(policy, out, {"sft": asdict(sft), "data": args.data, "model": cfg.model.name_or_path,
                                 "final_loss": result.final_loss, "seconds": result.seconds})
    print(f"sft: final loss {result.final_loss:.4f} in {result.seconds:.0f}s; saved to {out}/ "
          f"({INFO_FILE} has the details)", file=sys.stderr)
    print(out)
    return 0
