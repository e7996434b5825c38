"""``scalerl data synth | check | decontaminate | difficulty | generate | curate``: write a synthetic
prompt set, vet a real one, drop prompts (or prompt/response rows) that overlap evaluation sets, rate
it with a model, sample SFT rows from a model, curate it.

`check` runs exactly the loading and prompt-length checks a training run does (the same functions,
`scalerl.assembly.inputs.load_prompt_data` and `check_prompt_lengths`, from train's defaults or the
run's config given with `-c`: a file `check` accepts, `train` accepts), so a bad row is found (with
its file:line) before any compute is spent. Rows of a task that needs no gold (scored by
`rewards.reward_models.<task>` or a verifier marked `@gold_free`) need no `answer`, as in training.
`difficulty`, `generate` and `curate` live in `scalerl.cli.curation`. Registered by ``scalerl.cli`` through
``register(subparsers)``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from scalerl.cli.curation import field_pair, load_tokenizer, register_curation
from scalerl.config import DataConfig, RunConfig
from scalerl.data.loaders import FORMATS
from scalerl.data.synthetic import SYNTHETIC_TASKS, write_synthetic_jsonl
from scalerl.data.tokenize import TEMPLATES

DEFAULTS = DataConfig()  # train's: `data check` starts from the same settings
DEFAULT_MAX_PROMPT_TOKENS = DEFAULTS.max_prompt_tokens


_load_tokenizer = load_tokenizer


def _synth(args: argparse.Namespace) -> int:
    from scalerl.ownership import check_output_file, writing_output

    check_output_file(args.out, "--out", overwrite=args.overwrite)
    difficulty = None if args.difficulty is None else tuple(args.difficulty)
    with writing_output(args.out, "--out"):  # whole or not at all: an old file stays until then
        path = write_synthetic_jsonl(args.out, args.task, args.n, args.seed, difficulty, args.weights)
    print(f"wrote {args.n} {args.task} prompts (seed {args.seed}) to {path}")
    return 0


def check_settings(args: argparse.Namespace) -> tuple[DataConfig, RunConfig]:
    """`data check`'s data settings and the run config they come from: the `-c` files' (or train's
    defaults, `RunConfig()`), each flag given replacing its key. The run config's `rewards` decide
    which tasks need no gold (`assembly.inputs.gold_free`) and which tasks are scored."""
    from scalerl.config import load_config

    cfg = load_config(*args.config) if args.config else RunConfig()
    given: dict[str, Any] = {}
    if args.field_map:
        given["field_map"] = dict(args.field_map)
    for key in ("default_task", "format", "max_prompt_tokens", "template", "system_prompt", "subset"):
        if getattr(args, key) is not None:
            given[key] = getattr(args, key)
    if args.think:
        given["think_system_prompt"] = True
    if args.skip:
        given["on_bad_row"] = "skip"
    return cfg.data.model_copy(update=given), cfg


def _check(args: argparse.Namespace) -> int:
    # Exactly what a training run does with the same data settings (`scalerl.assembly.inputs`:
    # one function for both), from train's defaults or the run's config (`-c`) and the flags given;
    # rows of gold-free tasks (a reward model, an `@gold_free` verifier) need no answer, as in training.
    from scalerl.assembly.inputs import check_prompt_lengths, check_prompt_tasks, gold_free, load_prompt_data

    data, cfg = check_settings(args)
    loaded = load_prompt_data(args.path, data, split=args.split, gold_free_tasks=gold_free(cfg))
    records = loaded.records
    print(f"{args.path}: {loaded.rows_read} rows read, {len(records)} records loaded")
    if loaded.rejects:
        print(loaded.rejects.summary())
    tasks = Counter(r.task for r in records)
    print("tasks: " + ", ".join(f"{task} {n}" for task, n in sorted(tasks.items())))
    check_prompt_tasks({task: [args.path] for task in tasks}, cfg.rewards)  # as the run's rewards do
    # Lengths are always checked, as a training run checks them (data.max_prompt_tokens).
    enc = check_prompt_lengths(records, data, _load_tokenizer(args.tokenizer))
    lengths = sorted(len(ids) for ids in enc.token_ids.values())
    if lengths:
        print(
            f"prompt tokens ({args.tokenizer}): min {lengths[0]}, median {lengths[len(lengths) // 2]}, "
            f"max {lengths[-1]}; {len(enc)} fit max_prompt_tokens={data.max_prompt_tokens}"
        )
    else:
        print(f"prompt tokens ({args.tokenizer}): no prompt fits max_prompt_tokens={data.max_prompt_tokens}")
    if enc.rejects:
        print(enc.rejects.summary())
    return 0


def against_spec(text: str) -> tuple[str, str]:
    """`--against [FORMAT:]PATH`: (format, path); FORMAT a file type or benchmark layout."""
    head, sep, rest = text.partition(":")
    if sep and head in FORMATS and rest:
        return head, rest
    return "auto", text


def _output(path: str, flag: str) -> Path:
    from scalerl.ownership import OwnershipError, check_output_file

    out = check_output_file(path, flag, overwrite=True)  # a folder, or under a file: refused
    if out.exists():
        raise OwnershipError(f"{flag} {path}: exists; decontaminate never replaces a file, choose another "
                             f"{flag}")
    return out


def _decontaminate(args: argparse.Namespace) -> int:
    from scalerl.assembly.inputs import load_prompt_data
    from scalerl.atomic import atomic_path
    from scalerl.data.decontaminate import decontaminate
    from scalerl.data.loaders import load_prompts, write_jsonl_atomic
    from scalerl.inputs import InputError

    if args.n < 1:
        raise InputError(f"--n: must be >= 1, got {args.n}")
    if args.threshold is not None and not 0.0 < args.threshold <= 1.0:
        raise InputError(f"--threshold: must be in (0, 1], got {args.threshold}")
    out = _output(args.out, "--out")
    report = None if args.report is None else _output(args.report, "--report")
    if report is not None and report.resolve() == out.resolve():
        raise InputError("--report: the same file as --out")
    from scalerl.training.sft_data import is_sft_file, read_sft_rows

    pair_rows: dict[int, Any] | None = None
    if is_sft_file(args.prompts):
        # Prompt/response rows: their prompts are checked (no gold answer needed), the rows kept are
        # written back as they were read.
        rows = read_sft_rows(args.prompts, dict(args.field_map))
        prompts = [record for _, record, _ in rows]
        pair_rows = {id(record): row for row, record, _ in rows}
    else:
        data = DEFAULTS.model_copy(update={
            "field_map": dict(args.field_map), "default_task": args.default_task, "format": args.format})
        prompts = load_prompt_data(args.prompts, data).records
    sets: dict[str, list[Any]] = {}
    for fmt, path in args.against:
        name = Path(path).stem or path
        while name in sets:
            name += "_"
        sets[name] = load_prompts(path, default_task=args.default_task, format=fmt).records
    result = decontaminate(prompts, sets, n=args.n, threshold=args.threshold)
    rule = (f"{args.n}-grams, any shared" if args.threshold is None
            else f"{args.n}-grams, >= {args.threshold:g} of an item's")
    print(f"{args.prompts}: {len(prompts)} prompts against {sum(map(len, sets.values()))} items of "
          f"{len(sets)} set(s) ({rule})")
    print(f"  kept {len(result.kept)}, dropped {len(result.dropped)} "
          f"({len(result.matches)} matching pairs)")
    for name, records in sets.items():
        print(f"  {name}: {len(records)} items, {result.dropped_by_set().get(name, 0)} prompts dropped")
    if result.matches:
        print("  matches (first 10):")
        for m in result.matches[:10]:
            print(f"    {m.prompt_source} ({m.prompt_id}) ~ {m.item_source} ({m.set_name} {m.item_id}): "
                  f"{m.shared}/{m.item_ngrams} n-grams, e.g. {m.example[:60]!r}")
    from scalerl.ownership import writing_output

    if report is not None:
        with writing_output(report, "--report"):
            report.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(report, suffix=".jsonl") as tmp, tmp.open("w", encoding="utf-8") as f:
                for m in result.matches:
                    f.write(json.dumps(m.to_dict(), ensure_ascii=False) + "\n")
        print(f"wrote {len(result.matches)} matches to {report}")
    with writing_output(out, "--out"):
        if pair_rows is None:
            write_jsonl_atomic(result.kept, out)
        else:
            from scalerl.assembly.curation import write_rows_atomic

            write_rows_atomic([pair_rows[id(r)] for r in result.kept], out)
    what = "prompts" if pair_rows is None else "prompt/response rows"
    print(f"wrote {len(result.kept)} {what} to {out}")
    return 0


def register(subparsers: Any) -> None:
    data = subparsers.add_parser("data",
                                 help="write a synthetic prompt set, check, rate or curate a prompt file")
    sub = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND", required=True)

    synth = sub.add_parser("synth", help="write a built-in synthetic task as JSONL")
    synth.add_argument("--task", choices=SYNTHETIC_TASKS, default="math")
    synth.add_argument("--n", type=int, default=1000, help="number of prompts (default 1000)")
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--difficulty", type=int, nargs=2, metavar=("LO", "HI"),
                       help="inclusive range of difficulty levels (default: all)")
    synth.add_argument("--weights", type=float, nargs="+", metavar="W",
                       help="relative share of each level of the range (default: equal), e.g. "
                            "--difficulty 4 8 --weights 3 0 0 0 1")
    synth.add_argument("--out", required=True, metavar="FILE.jsonl")
    synth.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    synth.set_defaults(func=_synth)

    check = sub.add_parser("check", help="load a prompt file or folder and report bad rows and lengths")
    check.add_argument("path", metavar="PATH", help="JSONL/JSON/Parquet/CSV/TSV file, or a folder")
    check.add_argument("--field-map", type=field_pair, action="append", default=[], metavar="FIELD=COL",
                       help="read record FIELD from column COL (repeatable), e.g. prompt=question")
    check.add_argument("-c", "--config", action="append", default=[], metavar="FILE",
                       help="the run's config YAML (repeatable): its data.* settings are the defaults of "
                            "the flags below, and its rewards.* decide which tasks need no gold answer "
                            "(rewards.reward_models, @gold_free verifiers) and which tasks are scored")
    check.add_argument("--default-task", default=None,
                       help="task for rows without a task column (config key data.default_task; default "
                            f"the config's, else {DEFAULTS.default_task}, as in training)")
    check.add_argument("--split", help="the split of a dataset or folder holding several (config key "
                       "data.split; default the config's)")
    check.add_argument("--subset", help="the config (subset) of a dataset or folder holding several "
                       "(config key data.subset; default the config's)")
    check.add_argument("--format", choices=FORMATS, default=None,
                       help=f"config key data.format (default the config's, else {DEFAULTS.format})")
    check.add_argument("--skip", action="store_true", help="skip and count bad rows instead of failing "
                                                           "(data.on_bad_row=skip)")
    check.add_argument("--max-prompt-tokens", type=int, default=None, metavar="N",
                       help="longest prompt, chat template included, in tokens of --tokenizer "
                            "(default the config's data.max_prompt_tokens, else "
                            f"{DEFAULT_MAX_PROMPT_TOKENS})")
    check.add_argument("--tokenizer", default="tiny",
                       help="'tiny' (embedded default) or a local Hugging Face tokenizer folder")
    check.add_argument("--think", action="store_true", help="include the <think> system prompt")
    check.add_argument("--system-prompt", help="a custom system prompt (overrides --think)")
    check.add_argument("--template", choices=TEMPLATES, default=None,
                       help="prompt template (config key data.template): the tokenizer's chat template, "
                            "or a text template for base models (r1, qwen_math, raw); default the "
                            f"config's, else {DEFAULTS.template}")
    check.set_defaults(func=_check)

    dec = sub.add_parser(
        "decontaminate",
        help="drop prompts that share word n-grams with evaluation sets (GPT-3's 13-gram rule)",
        description="Drop the prompts of PROMPTS that share a word n-gram with an item of an --against "
                    "set (lower-cased, punctuation removed; GPT-3 appendix C: 13-grams, any overlap, a "
                    "short item found whole; --n 8 --threshold 0.7 is PaLM's rule); write the rest to "
                    "--out and every match to --report. Never replaces an existing file. docs/data.md, "
                    "'Decontamination'.")
    dec.add_argument("prompts", metavar="PROMPTS",
                     help="prompt file or folder to clean, or a prompt/response (SFT) file: rows with a "
                          "response or completion column, written back whole")
    dec.add_argument("--against", type=against_spec, nargs="+", required=True, metavar="[FORMAT:]PATH",
                     help="evaluation sets, e.g. gsm8k:gsm8k/test.jsonl math:math500.jsonl heldout.jsonl")
    dec.add_argument("--out", required=True, metavar="CLEAN.jsonl", help="the prompts kept (must not exist)")
    dec.add_argument("--report", metavar="MATCHES.jsonl", help="one line per matching pair (must not exist)")
    dec.add_argument("--n", type=int, default=13, help="n-gram length in words (default 13, GPT-3)")
    dec.add_argument("--threshold", type=float, metavar="F",
                     help="match only when the prompt holds >= F of an item's n-grams (default: any one)")
    dec.add_argument("--format", choices=FORMATS, default=DEFAULTS.format, help="how PROMPTS is read")
    dec.add_argument("--field-map", type=field_pair, action="append", default=[], metavar="FIELD=COL",
                     help="read record FIELD of PROMPTS from column COL (repeatable)")
    dec.add_argument("--default-task", default=DEFAULTS.default_task,
                     help=f"task for rows without a task column (default {DEFAULTS.default_task})")
    dec.set_defaults(func=_decontaminate)

    register_curation(sub)
