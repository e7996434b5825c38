"""``scalerl data difficulty``, ``generate`` and ``curate``: model-based pass rates, rejection-sampled
SFT rows (`scalerl.data.generate`), then a curated set (prompt files, or prompt/response files:
`scalerl.data.sft_curate`).

    scalerl data difficulty prompts.jsonl --model runs/base --k 10 --out rated.jsonl
    scalerl data curate rated.jsonl --out curated.jsonl --easy easy.jsonl --hard hard.jsonl

`difficulty` samples every prompt `--k` times (Kimi k1.5: 10, at a high temperature) with the model
(a run directory, a checkpoint, a saved model or a hub name) on the engine `--engine` names
(embedded by default, `vllm` where installed), verifies the samples with the rewards router and
writes each prompt's pass rate into its record. It prints progress, and can be killed and rerun:
the rerun continues where the work file `OUT.partial` stops, without repeating or duplicating a
prompt, and writes the same output an uninterrupted run writes (`scalerl.data.difficulty`).
`curate` drops easy-to-guess prompts and those outside a pass-rate range, and splits the rest into
easy and hard sets (`scalerl.data.curate`). Outputs are written atomically; bad input is an error
naming its file:line (exit status 2). Torch is imported only when `difficulty` runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from scalerl.data import curate as curation
from scalerl.data.generate import RULES
from scalerl.data.loaders import FORMATS
from scalerl.data.tokenize import TEMPLATES
from scalerl.inputs import InputError


def _unit(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a rate in [0, 1], got {text}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


def _check_out(path: str, overwrite: bool, what: str = "--out") -> Path:
    from scalerl.ownership import check_output_file

    return check_output_file(path, what, overwrite=overwrite)


def _sampling_job(args: argparse.Namespace) -> Any:
    """The flags `data difficulty` and `data generate` share, as the composition root takes them."""
    from scalerl.assembly.curation import SamplingJob

    return SamplingJob(
        args.prompts, model=args.model, k=args.k, temperature=args.temperature, seed=args.seed,
        engine=args.engine, max_new_tokens=args.max_new_tokens, template=args.template, think=args.think,
        system_prompt=args.system_prompt, max_prompt_tokens=args.max_prompt_tokens,
        field_map=dict(args.field_map), default_task=args.default_task, split=args.split,
        format=args.format, skip=args.skip, chunk=args.chunk, device=args.device, restart=args.restart)


# ---------------------------------------------------------------------------------------------
# difficulty


def run_difficulty(args: argparse.Namespace) -> int:
    # The run itself (model, engine, work file, output) is built by the composition root.
    from scalerl.assembly.curation import rate_difficulty
    from scalerl.data.difficulty import histogram
    from scalerl.inputs import check_device

    out = _check_out(args.out, args.overwrite)
    check_device(args.device)
    with _Progress(args.no_progress) as progress:
        outcome = rate_difficulty(_sampling_job(args), out=out, on_chunk=progress.update,
                                  say=lambda m: print(m, file=sys.stderr),
                                  warn=lambda m: print(f"eval: warning: {m}", file=sys.stderr))
    results = outcome.results
    hist = histogram(results.values(), args.k)
    mean = sum(r.pass_rate for r in results.values()) / len(results)
    failures = sum(r.verifier_failures for r in results.values())
    truncated = sum(r.truncated for r in results.values())
    print(f"difficulty: {len(results)} prompts x {args.k} samples (temperature {args.temperature:g}, "
          f"{outcome.engine} engine) -> {out}")
    print(f"  mean pass rate {mean:.3f}; solved c of {args.k} times: "
          + ", ".join(f"{c}: {n}" for c, n in enumerate(hist)))
    resumed = outcome.resumed
    print(f"  {resumed} prompts from an earlier session, {len(results) - resumed} rated now in "
          f"{outcome.seconds:.0f} s; truncated samples {truncated}, "
          f"verifier failures {failures}")
    return 0


def run_generate(args: argparse.Namespace) -> int:
    from scalerl.assembly.curation import generate_sft
    from scalerl.data.generate import STATS_SUFFIX
    from scalerl.inputs import check_device

    out = _check_out(args.out, args.overwrite)
    stats = _check_out(args.stats or str(out) + STATS_SUFFIX, args.overwrite, "--stats")
    if stats.resolve() == out.resolve() or Path(args.prompts).resolve() in (out.resolve(), stats.resolve()):
        raise InputError("--out, --stats and PROMPTS must be distinct files")
    check_device(args.device)
    with _Progress(args.no_progress, "generate") as progress:
        outcome = generate_sft(_sampling_job(args), out=out, stats=stats, rule=args.select,
                               on_chunk=progress.update, say=lambda m: print(m, file=sys.stderr),
                               warn=lambda m: print(f"eval: warning: {m}", file=sys.stderr))
    c = outcome.counts
    print(f"generate: {c.prompts} prompts x {args.k} samples (temperature {args.temperature:g}, "
          f"{outcome.engine} engine): {c.correct} of {c.samples} samples correct")
    print(f"  kept {c.kept} rows ({args.select}) from {c.prompts_kept} prompts -> {out}; "
          f"{c.prompts_without_kept} prompts without a kept sample, {c.correct_truncated} correct samples "
          f"cut at the length budget, {c.verifier_failures} verifier failures")
    print(f"  counts and per-prompt pass rates -> {outcome.stats}; {outcome.resumed} prompts from an "
          f"earlier session")
    return 0


class _Progress:
    """A prompt counter on stderr (tqdm), resumed runs starting at what was done before."""

    def __init__(self, disabled: bool, desc: str = "difficulty") -> None:
        self.disabled = disabled
        self.desc = desc
        self._bar: Any = None

    def __enter__(self) -> _Progress:
        return self

    def update(self, done: int, total: int) -> None:
        if self.disabled:
            return
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=done, desc=self.desc, unit="prompt", file=sys.stderr,
                             dynamic_ncols=True)
        else:
            self._bar.update(done - self._bar.n)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()


# ---------------------------------------------------------------------------------------------
# curate


def load_tokenizer(name: str) -> Any:
    """'tiny' (the embedded default's) or a local Hugging Face tokenizer folder."""
    if name == "tiny":
        from scalerl.models.tiny import build_tiny_tokenizer

        return build_tiny_tokenizer()
    from scalerl.models.loading import load_pretrained_tokenizer

    return load_pretrained_tokenizer(name)


def run_curate(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from scalerl.data.loaders import load_prompts, write_jsonl_atomic
    from scalerl.training.sft_data import is_sft_file

    lo, hi = args.pass_rate
    if lo > hi:  # an empty range would keep nothing, silently
        raise InputError(f"--pass-rate {lo:g} {hi:g}: LO is above HI; give the range as LO HI (e.g. "
                         f"--pass-rate {hi:g} {lo:g})")
    outs = {"--out": args.out, "--easy": args.easy, "--hard": args.hard, "--dropped": args.dropped}
    paths = {flag: _check_out(p, args.overwrite, flag) for flag, p in outs.items() if p is not None}
    if not paths:
        raise InputError("name at least one output: --out, --easy, --hard or --dropped")
    resolved = [p.resolve() for p in paths.values()]
    if len(set(resolved)) != len(resolved) or Path(args.prompts).resolve() in resolved:
        raise InputError("outputs must be distinct files, none of them the input")
    if is_sft_file(args.prompts):
        return run_curate_pairs(args, paths)
    for flag, value in (("--max-trace-tokens", args.max_trace_tokens), ("--trivial-from", args.trivial_from)):
        if value is not None:
            raise InputError(f"{flag}: applies to prompt/response files; {args.prompts} is a prompt file "
                             "(its rows have no response or completion column)")
    loaded = load_prompts(args.prompts, on_error="skip" if args.skip else "error")
    if loaded.rejects:
        print(f"curate: skipped {loaded.rejects.summary()}", file=sys.stderr)
    result = curation.curate(loaded.records, min_pass_rate=lo, max_pass_rate=hi, split_at=args.split_at,
                             max_answer_share=args.max_answer_share, drop_guessable=not args.keep_guessable,
                             drop_proofs=not args.keep_proofs)
    dropped = []
    for record, reason in result.dropped:
        meta = dict(record.metadata)
        meta["curate_dropped"] = reason
        dropped.append(replace(record, metadata=meta))
    sets = {"--out": result.kept, "--easy": result.easy, "--hard": result.hard, "--dropped": dropped}
    # Everything is decided before anything is written; each file is written whole, by a rename.
    from scalerl.ownership import writing_output

    for flag, path in paths.items():
        with writing_output(path, flag):
            write_jsonl_atomic(sets[flag], path)
    n = len(loaded.records)
    print(f"curate: {n} prompts from {args.prompts}: kept {len(result.kept)}, dropped {len(result.dropped)}")
    for reason, count in sorted(result.counts().items()):
        print(f"  dropped, {reason}: {count}")
    print(f"  pass-rate range [{lo:g}, {hi:g}]; split at {args.split_at:g}: easy {len(result.easy)}, "
          f"hard {len(result.hard)}")
    for flag, path in paths.items():
        print(f"  {flag[2:]}: {len(sets[flag])} prompts -> {path}")
    return 0


def base_pass_rates(path: str) -> dict[str, float]:
    """Prompt text -> the base model's pass rate, from a `scalerl data difficulty` output."""
    from scalerl.data.curate import _prompt_text, pass_rate_of
    from scalerl.data.loaders import load_prompts

    return {_prompt_text(r): pass_rate_of(r) for r in load_prompts(path).records}


def run_curate_pairs(args: argparse.Namespace, paths: dict[str, Path]) -> int:
    """`data curate` on a prompt/response file: the rules of `scalerl.data.sft_curate`, rows written
    back as they were read (a dropped row with its reason in `curate_dropped`)."""
    from collections import Counter

    from scalerl.assembly.curation import write_rows_atomic
    from scalerl.data.curate import _prompt_text
    from scalerl.data.rejects import DataError
    from scalerl.data.sft_curate import sft_drop_reason
    from scalerl.training.sft_data import read_sft_rows

    for flag in ("--easy", "--hard"):
        if flag in paths:
            raise InputError(f"{flag}: the easy/hard split applies to prompt files; {args.prompts} holds "
                             "prompt/response rows (use --out and --dropped)")
    if args.max_trace_tokens is not None and args.max_trace_tokens < 1:
        raise InputError(f"--max-trace-tokens: must be >= 1, got {args.max_trace_tokens}")
    rows = read_sft_rows(args.prompts)
    rates = base_pass_rates(args.trivial_from) if args.trivial_from else None
    tok = load_tokenizer(args.tokenizer) if args.max_trace_tokens is not None else None
    kept: list[Any] = []
    dropped: list[Any] = []
    counts: Counter[str] = Counter()
    for row, record, response in rows:
        prompt = _prompt_text(record)
        rate = None
        if rates is not None:
            if prompt not in rates:
                raise DataError(f"{record.source}: prompt not in --trivial-from {args.trivial_from} "
                                "(rate the same prompts with `scalerl data difficulty`)")
            rate = rates[prompt]
        tokens = len(tok.encode(response, add_special_tokens=False)) if tok is not None else None
        answer = row.get("answer") if isinstance(row.get("answer"), str) else None
        reason = sft_drop_reason(prompt, response, answer=answer, base_pass_rate=rate,
                                 trivial_at=args.trivial_at, trace_tokens=tokens,
                                 max_trace_tokens=args.max_trace_tokens, drop_proofs=not args.keep_proofs,
                                 drop_multiple_choice=not args.keep_guessable)
        if reason is None:
            kept.append(row)
        else:
            counts[reason] += 1
            dropped.append({**row, "curate_dropped": reason})
    sets = {"--out": kept, "--dropped": dropped}
    from scalerl.ownership import writing_output

    for flag, path in paths.items():
        with writing_output(path, flag):  # an unwritable folder: exit 2 naming the flag
            write_rows_atomic(sets[flag], path)
    print(f"curate: {len(rows)} prompt/response rows from {args.prompts}: kept {len(kept)}, "
          f"dropped {len(dropped)}")
    for reason, count in sorted(counts.items()):
        print(f"  dropped, {reason}: {count}")
    for flag, path in paths.items():
        print(f"  {flag[2:]}: {len(sets[flag])} rows -> {path}")
    return 0


def field_pair(text: str) -> tuple[str, str]:
    """`--field-map FIELD=COLUMN` (here and in `scalerl data check`): the (field, column) pair."""
    key, sep, column = text.partition("=")
    if not sep or not key or not column:
        raise argparse.ArgumentTypeError(f"expected FIELD=COLUMN (e.g. prompt=question), got {text!r}")
    return key, column


def register_curation(sub: Any) -> None:
    """Add `difficulty` and `curate` under `scalerl data`."""
    dif = sub.add_parser(
        "difficulty", help="rate each prompt by the model's pass rate over k samples (Kimi k1.5)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    dif.add_argument("prompts", metavar="PROMPTS", help="prompt file or folder (JSONL/JSON/Parquet/CSV/TSV)")
    dif.add_argument("--model", required=True, metavar="M",
                     help="run directory, checkpoint, saved model directory or hub name")
    dif.add_argument("--out", required=True, metavar="FILE.jsonl",
                     help="the records with metadata.model_difficulty (work file: FILE.jsonl.partial)")
    dif.add_argument("--k", type=_positive, default=10, help="samples per prompt (default 10, as Kimi k1.5)")
    dif.add_argument("--temperature", type=float, default=1.0,
                     help="sampling temperature (default 1.0; Kimi k1.5 says 'relatively high')")
    dif.add_argument("--seed", type=int, default=0, help="sampling seed (per prompt: hashed with its id)")
    dif.add_argument("--max-new-tokens", type=_positive, metavar="N",
                     help="response budget (default: the model's run config, generation.max_new_tokens)")
    dif.add_argument("--engine", choices=("embedded", "vllm"),
                     help="generation engine (config key generation.engine; default: the run's, or embedded)")
    dif.add_argument("--template", choices=TEMPLATES,
                     help="prompt template (default: the run's data.template, or chat)")
    dif.add_argument("--think", action="store_true", help="include the <think> system prompt")
    dif.add_argument("--system-prompt", help="a custom system prompt (overrides --think)")
    dif.add_argument("--max-prompt-tokens", type=_positive, metavar="N",
                     help="longest prompt in tokens (default: the run's data.max_prompt_tokens)")
    dif.add_argument("--field-map", type=field_pair, action="append", default=[], metavar="FIELD=COL",
                     help="read record FIELD from column COL (repeatable)")
    dif.add_argument("--default-task", help="task for rows without a task column (default: the run's)")
    dif.add_argument("--split", help="split of a DatasetDict folder, or file-name prefix in a folder")
    dif.add_argument("--format", choices=FORMATS, default="auto")
    dif.add_argument("--skip", action="store_true", help="skip and count bad rows and overlong prompts")
    dif.add_argument("--chunk", type=_positive, default=64, metavar="N",
                     help="prompts per engine call and per durable save (default 64)")
    dif.add_argument("--device", help="cpu, cuda, cuda:1 (embedded engine; default: cuda if available)")
    dif.add_argument("--restart", action="store_true", help="discard an earlier session's work file")
    dif.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    dif.add_argument("--no-progress", action="store_true", help="no progress bar")
    dif.set_defaults(func=run_difficulty)

    gen = sub.add_parser(
        "generate", help="sample a model k times per prompt, verify, write SFT rows (rejection sampling)",
        description="Sample every prompt of PROMPTS --k times with MODEL, verify each sample with the "
                    "verifiers, and write the samples --select keeps as SFT rows (`scalerl sft --data` "
                    "reads them); counts and per-prompt pass rates go to --stats. Resumable: a rerun "
                    "continues from OUT.partial. docs/data.md, 'Generating SFT data'.")
    gen.add_argument("model", metavar="MODEL",
                     help="run directory, checkpoint, saved model directory or hub name")
    gen.add_argument("--prompts", required=True, metavar="FILE", help="prompt file or folder")
    gen.add_argument("--out", required=True, metavar="SFT.jsonl",
                     help="the SFT rows (work file SFT.jsonl.partial)")
    gen.add_argument("--stats", metavar="FILE.json",
                     help="counts and pass rates (default SFT.jsonl.stats.json)")
    gen.add_argument("--select", choices=RULES, default="all_correct",
                     help="which correct samples become rows (default all_correct; shortest_correct is "
                          "Kimi's long2short)")
    for action in dif._actions:  # the sampling, prompt and resume flags are difficulty's
        if action.dest in ("help", "prompts", "model", "out", "overwrite"):
            continue
        gen._add_action(action)
    gen.add_argument("--overwrite", action="store_true", help="replace an existing --out and --stats")
    gen.set_defaults(func=run_generate)

    cur = sub.add_parser(
        "curate", help="drop easy-to-guess prompts and a pass-rate range; split easy/hard (IsoCompute)",
        description=curation.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cur.add_argument("prompts", metavar="RATED",
                     help="prompt file with pass rates (written by `scalerl data difficulty`)")
    cur.add_argument("--out", metavar="FILE.jsonl", help="the kept prompts")
    cur.add_argument("--easy", metavar="FILE.jsonl", help="kept prompts with pass rate >= --split-at")
    cur.add_argument("--hard", metavar="FILE.jsonl", help="kept prompts with pass rate < --split-at")
    cur.add_argument("--dropped", metavar="FILE.jsonl",
                     help="dropped prompts, the reason in metadata.curate_dropped")
    cur.add_argument("--pass-rate", type=_unit, nargs=2, metavar=("LO", "HI"),
                     default=(curation.DEFAULT_MIN_PASS_RATE, curation.DEFAULT_MAX_PASS_RATE),
                     help="keep LO <= pass rate <= HI (default 0.05 0.95: drop never/always solved at k=10)")
    cur.add_argument("--split-at", type=_unit, default=curation.DEFAULT_SPLIT_AT, metavar="P",
                     help="easy: pass rate >= P, hard: below (default 0.5)")
    cur.add_argument("--max-answer-share", type=_unit, default=curation.DEFAULT_MAX_ANSWER_SHARE, metavar="S",
                     help="an answer shared by this share of the prompts is easy to guess (default 0.05)")
    cur.add_argument("--keep-guessable", action="store_true",
                     help="do not drop easy-to-guess prompts (multiple choice included)")
    cur.add_argument("--keep-proofs", action="store_true",
                     help="do not drop prompts asking for a proof ('prove', 'proof', 'show that')")
    cur.add_argument("--max-trace-tokens", type=int, metavar="N",
                     help="prompt/response files: drop responses over N tokens of --tokenizer (ScaleRL A.3: "
                          "12000)")
    cur.add_argument("--tokenizer", default="tiny",
                     help="for --max-trace-tokens: 'tiny' or a local Hugging Face tokenizer folder")
    cur.add_argument("--trivial-from", metavar="RATED.jsonl",
                     help="prompt/response files: the base model's pass rates (`scalerl data difficulty` "
                          "output); rows whose prompt it solves at >= --trivial-at are dropped")
    cur.add_argument("--trivial-at", type=_unit, default=1.0, metavar="P",
                     help="trivial: base pass rate >= P (default 1.0: every sample correct)")
    cur.add_argument("--skip", action="store_true", help="skip and count bad rows instead of failing")
    cur.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    cur.set_defaults(func=run_curate)


__all__ = ["register_curation", "run_curate", "run_difficulty", "run_generate"]
