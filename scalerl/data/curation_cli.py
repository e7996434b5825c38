"""``scalerl data difficulty`` and ``scalerl data curate``: model-based pass rates, then a curated set.

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
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scalerl.data import curate as curation
from scalerl.data.loaders import FORMATS
from scalerl.data.tokenize import TEMPLATES


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
    out = Path(path)
    if out.is_dir():
        raise ValueError(f"{what} {out}: is a directory")
    if out.exists() and not overwrite:
        raise ValueError(f"{what} {out}: exists; pass --overwrite to replace it")
    return out


def _write_records(records: Sequence[Any], path: Path) -> None:
    from scalerl.atomic import atomic_path
    from scalerl.data.loaders import write_jsonl

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, suffix=".jsonl") as tmp:
        write_jsonl(records, tmp)


# ---------------------------------------------------------------------------------------------
# difficulty


def run_difficulty(args: argparse.Namespace) -> int:
    from scalerl.data.difficulty import (
        DifficultySettings,
        PartialFile,
        annotate,
        estimate_pass_rates,
        histogram,
        partial_path,
        score_chunk,
    )
    from scalerl.data.loaders import load_prompts
    from scalerl.data.tokenize import check_template, encode_prompts, resolve_system_prompt
    from scalerl.evaluation.cli import resolve_source
    from scalerl.model_identity import model_identity

    out = _check_out(args.out, args.overwrite)
    source = resolve_source(args.model)
    cfg = source.config.model_copy(deep=True)
    cfg.model.name_or_path = source.model
    cfg.model.tokenizer = None  # a checkpoint holds its own tokenizer files
    if args.engine is not None:
        cfg.generation.engine = args.engine
    if args.max_new_tokens is not None:
        cfg.generation.max_new_tokens = args.max_new_tokens
    d = cfg.data
    template = args.template or d.template
    if args.system_prompt is not None or args.think:
        system = resolve_system_prompt(args.think, args.system_prompt)
    else:
        system = resolve_system_prompt(d.think_system_prompt, d.system_prompt)
    check_template(template, system)
    max_prompt_tokens = args.max_prompt_tokens or d.max_prompt_tokens
    on_error = "skip" if args.skip else d.on_bad_row

    from scalerl.rollout.factory import check_engine_available

    check_engine_available(cfg.generation.engine)
    loaded = load_prompts(args.prompts, field_map=dict(args.field_map), default_task=args.default_task or
                          d.default_task, split=args.split, format=args.format, on_error=on_error)
    from scalerl.training.policy import load_tokenizer

    tokenizer = load_tokenizer(cfg.model)
    enc = encode_prompts(loaded.records, tokenizer, max_prompt_tokens=max_prompt_tokens, system_prompt=system,
                         on_error=on_error, template=template)
    records = enc.records
    for rejects in (loaded.rejects, enc.rejects):
        if rejects:
            print(f"difficulty: skipped {rejects.summary()}", file=sys.stderr)

    settings = DifficultySettings(
        model=model_identity(source.model), engine=cfg.generation.engine, k=args.k,
        temperature=args.temperature, seed=args.seed, max_new_tokens=cfg.generation.max_new_tokens,
        template=template, system_prompt=system, length_control=cfg.generation.length_control.kind,
        top_p=cfg.generation.top_p, top_k=cfg.generation.top_k,
    )
    work = partial_path(out)
    if args.restart:
        work.unlink(missing_ok=True)
    partial = PartialFile.open(work, settings)
    resumed = len(partial.done)
    if resumed:
        torn = " (a line cut by the interruption: dropped, redone)" if partial.torn_lines else ""
        print(f"difficulty: resuming {work}: {resumed} of {len(records)} prompts done{torn}", file=sys.stderr)

    started = time.perf_counter()
    with _Progress(len(records), args.no_progress) as progress:
        if len(partial.done) < len(records):
            with _open_engine(cfg, source.model, tokenizer, args.device) as (generate, scorer, params):
                def run_chunk(chunk: Sequence[Any]) -> list[Any]:
                    return score_chunk(chunk, lambda r: enc.token_ids[r.id], generate, scorer, params,
                                       settings)

                results = estimate_pass_rates(records, partial, run_chunk, chunk_size=args.chunk,
                                              on_chunk=progress.update)
        else:
            results = estimate_pass_rates(records, partial, lambda chunk: [], on_chunk=progress.update)
    _write_records(annotate(records, results, settings, source.model), out)
    partial.remove()
    hist = histogram(results.values(), args.k)
    mean = sum(r.pass_rate for r in results.values()) / len(results)
    failures = sum(r.verifier_failures for r in results.values())
    truncated = sum(r.truncated for r in results.values())
    print(f"difficulty: {len(results)} prompts x {args.k} samples (temperature {args.temperature:g}, "
          f"{cfg.generation.engine} engine) -> {out}")
    print(f"  mean pass rate {mean:.3f}; solved c of {args.k} times: "
          + ", ".join(f"{c}: {n}" for c, n in enumerate(hist)))
    print(f"  {resumed} prompts from an earlier session, {len(results) - resumed} rated now in "
          f"{time.perf_counter() - started:.0f} s; truncated samples {truncated}, "
          f"verifier failures {failures}")
    return 0


class _Progress:
    """A prompt counter on stderr (tqdm), resumed runs starting at what was done before."""

    def __init__(self, total: int, disabled: bool) -> None:
        self.total = total
        self.disabled = disabled
        self._bar: Any = None

    def __enter__(self) -> _Progress:
        return self

    def update(self, done: int, total: int) -> None:
        if self.disabled:
            return
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=done, desc="difficulty", unit="prompt", file=sys.stderr,
                             dynamic_ncols=True)
        else:
            self._bar.update(done - self._bar.n)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()


class _open_engine:  # noqa: N801 (a context manager used like a function)
    """The model in the engine `generation.engine` names, a verifier-backed scorer, the sampling
    parameters (length control included), exactly as `scalerl eval` builds them."""

    def __init__(self, cfg: Any, model: str, tokenizer: Any, device: str | None) -> None:
        self.cfg, self.model, self.tokenizer, self.device = cfg, model, tokenizer, device
        self._closers: list[Any] = []

    def __enter__(self) -> tuple[Any, Any, Any]:
        from scalerl.assembly.build import sampling_params
        from scalerl.pipeline.driver import success_threshold
        from scalerl.rewards import RewardRouter
        from scalerl.rewards.groups import GroupScorer
        from scalerl.rollout.factory import build_engine, close_engine, spec_from_config

        cfg, tok = self.cfg, self.tokenizer
        try:
            router = RewardRouter(cfg.rewards)
            self._closers.append(router.close)
            scorer = GroupScorer(router, lambda ids: str(tok.decode(ids, skip_special_tokens=True)),
                                 max_workers=cfg.rewards.max_workers,
                                 success_threshold=success_threshold(cfg))
            self._closers.append(scorer.close)
            pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
            spec = spec_from_config(cfg, model_path=self.model, eos_token_ids=(int(tok.eos_token_id),),
                                    pad_token_id=int(pad))
            model = None
            if spec.kind == "embedded":
                from scalerl.training.policy import load_policy

                try:
                    model = load_policy(cfg.model, self.device).model
                except OSError as err:
                    raise FileNotFoundError(f"{self.model}: cannot load a model from it ({err})") from None
            engine = build_engine(spec, model=model)
            self._closers.append(lambda: close_engine(engine))
            params = sampling_params(cfg, tok)
            check = getattr(engine, "check_params", None)
            if callable(check):
                check(params)
            return engine.generate, scorer, params
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        while self._closers:
            self._closers.pop()()


# ---------------------------------------------------------------------------------------------
# curate


def run_curate(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from scalerl.data.loaders import load_prompts

    outs = {"--out": args.out, "--easy": args.easy, "--hard": args.hard, "--dropped": args.dropped}
    paths = {flag: _check_out(p, args.overwrite, flag) for flag, p in outs.items() if p is not None}
    if not paths:
        raise ValueError("name at least one output: --out, --easy, --hard or --dropped")
    resolved = [p.resolve() for p in paths.values()]
    if len(set(resolved)) != len(resolved) or Path(args.prompts).resolve() in resolved:
        raise ValueError("outputs must be distinct files, none of them the input")
    loaded = load_prompts(args.prompts, on_error="skip" if args.skip else "error")
    if loaded.rejects:
        print(f"curate: skipped {loaded.rejects.summary()}", file=sys.stderr)
    lo, hi = args.pass_rate
    result = curation.curate(loaded.records, min_pass_rate=lo, max_pass_rate=hi, split_at=args.split_at,
                             max_answer_share=args.max_answer_share, drop_guessable=not args.keep_guessable)
    dropped = []
    for record, reason in result.dropped:
        meta = dict(record.metadata)
        meta["curate_dropped"] = reason
        dropped.append(replace(record, metadata=meta))
    sets = {"--out": result.kept, "--easy": result.easy, "--hard": result.hard, "--dropped": dropped}
    # Everything is decided before anything is written; each file is written whole, by a rename.
    for flag, path in paths.items():
        _write_records(sets[flag], path)
    n = len(loaded.records)
    print(f"curate: {n} prompts from {args.prompts}: kept {len(result.kept)}, dropped {len(result.dropped)}")
    for reason, count in sorted(result.counts().items()):
        print(f"  dropped, {reason}: {count}")
    print(f"  pass-rate range [{lo:g}, {hi:g}]; split at {args.split_at:g}: easy {len(result.easy)}, "
          f"hard {len(result.hard)}")
    for flag, path in paths.items():
        print(f"  {flag[2:]}: {len(sets[flag])} prompts -> {path}")
    return 0


def _field_pair(text: str) -> tuple[str, str]:
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
    dif.add_argument("--field-map", type=_field_pair, action="append", default=[], metavar="FIELD=COL",
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
    cur.add_argument("--keep-guessable", action="store_true", help="do not drop easy-to-guess prompts")
    cur.add_argument("--skip", action="store_true", help="skip and count bad rows instead of failing")
    cur.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    cur.set_defaults(func=run_curate)


__all__ = ["register_curation", "run_curate", "run_difficulty"]
