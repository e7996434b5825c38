"""`scalerl data difficulty`'s run: a model's pass rate on every prompt, resumable.

`rate_difficulty` reads the model's settings (`scalerl.assembly.evaluate.resolve_source`: a run's
own config, or the defaults), loads and encodes the prompts exactly as a training run does, opens
the work file (`scalerl.data.difficulty.PartialFile`: a rerun continues where it stops), builds
the engine `generation.engine` names with a verifier-backed scorer and the run's sampling
parameters (as `scalerl eval` does), rates the prompts not rated yet chunk by chunk
(`scalerl.evaluation.difficulty.score_chunk`) and writes the annotated records atomically. Its
messages go to `say`, its progress to `on_chunk(done, total)`; the command prints the summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalerl.config import RunConfig
from scalerl.data.difficulty import PassRate
from scalerl.data.tokenize import bind_chat_template_kwargs
from scalerl.inputs import MissingInputError

Say = Callable[[str], None]


@dataclass(frozen=True)
class DifficultyOutcome:
    """What a `rate_difficulty` call did: every prompt's result, and how many an earlier session had."""

    results: Mapping[str, PassRate]
    resumed: int
    engine: str
    seconds: float


def difficulty_config(source: Any, *, engine: str | None, max_new_tokens: int | None) -> RunConfig:
    """The source's config with the model it names (its own tokenizer files) and the flags' values."""
    cfg: RunConfig = source.config.model_copy(deep=True)
    cfg.model.name_or_path = source.model
    cfg.model.tokenizer = None  # a checkpoint holds its own tokenizer files
    if engine is not None:
        cfg.generation.engine = engine
    if max_new_tokens is not None:
        cfg.generation.max_new_tokens = max_new_tokens
    return cfg


@dataclass(frozen=True)
class SamplingJob:
    """What `data difficulty` and `data generate` share: the prompts, the model and how to sample
    them (each `None` falls back to the model's own run config), and the work file's handling."""

    prompts: str
    model: str
    k: int
    temperature: float
    seed: int
    engine: str | None = None
    max_new_tokens: int | None = None
    template: str | None = None
    think: bool = False
    system_prompt: str | None = None
    max_prompt_tokens: int | None = None
    field_map: Mapping[str, str] | None = None
    default_task: str | None = None
    split: str | None = None
    format: str = "auto"
    skip: bool = False
    chunk: int = 64
    device: str | None = None
    restart: bool = False


def _prepare(job: SamplingJob, *, say: Say, warn: Say | None,
             what: str) -> tuple[Any, RunConfig, Any, list[Any], Any, Any]:
    """The model's settings, the prompts loaded and encoded as a training run does, and the
    settings a result depends on: (source, cfg, settings, records, encoded, tokenizer)."""
    from scalerl.assembly.evaluate import resolve_source
    from scalerl.data.difficulty import DifficultySettings
    from scalerl.data.loaders import load_prompts
    from scalerl.data.tokenize import check_template, encode_prompts, resolve_system_prompt
    from scalerl.model_identity import model_identity

    source = resolve_source(job.model, warn=warn)
    cfg = difficulty_config(source, engine=job.engine, max_new_tokens=job.max_new_tokens)
    d = cfg.data
    template = job.template or d.template
    if job.system_prompt is not None or job.think:
        system = resolve_system_prompt(job.think, job.system_prompt)
    else:
        system = resolve_system_prompt(d.think_system_prompt, d.system_prompt)
    check_template(template, system)
    max_prompt_tokens = job.max_prompt_tokens or d.max_prompt_tokens
    on_error = "skip" if job.skip else d.on_bad_row

    from scalerl.rollout.factory import check_engine_available

    check_engine_available(cfg.generation.engine)
    loaded = load_prompts(job.prompts, field_map=dict(job.field_map or {}),
                          default_task=job.default_task or d.default_task, split=job.split, format=job.format,
                          on_error=on_error)
    from scalerl.training.policy import load_tokenizer

    tokenizer = bind_chat_template_kwargs(load_tokenizer(cfg.model), cfg.data.chat_template_kwargs)
    enc = encode_prompts(loaded.records, tokenizer, max_prompt_tokens=max_prompt_tokens, system_prompt=system,
                         on_error=on_error, template=template)
    records = enc.records
    for rejects in (loaded.rejects, enc.rejects):
        if rejects:
            say(f"{what}: skipped {rejects.summary()}")

    settings = DifficultySettings(
        model=model_identity(source.model), engine=cfg.generation.engine, k=job.k,
        temperature=job.temperature, seed=job.seed, max_new_tokens=cfg.generation.max_new_tokens,
        template=template, system_prompt=system, length_control=cfg.generation.length_control.kind,
        top_p=cfg.generation.top_p, top_k=cfg.generation.top_k,
    )
    return source, cfg, settings, list(records), enc, tokenizer


def rate_difficulty(
    job: SamplingJob,
    *,
    out: Path,
    on_chunk: Callable[[int, int], None] | None = None,
    say: Say = lambda message: None,
    warn: Say | None = None,
) -> DifficultyOutcome:
    """Rate every prompt of `job.prompts` with `job.model` and write the annotated records to `out`."""
    from scalerl.data.difficulty import PartialFile, annotate, estimate_pass_rates, partial_path
    from scalerl.data.loaders import write_jsonl_atomic

    source, cfg, settings, records, enc, tokenizer = _prepare(job, say=say, warn=warn, what="difficulty")
    work = partial_path(out)
    if job.restart:
        work.unlink(missing_ok=True)
    created = not work.exists()
    partial = PartialFile.open(work, settings)
    resumed = len(partial.done)
    if resumed:
        torn = " (a line cut by the interruption: dropped, redone)" if partial.torn_lines else ""
        say(f"difficulty: resuming {work}: {resumed} of {len(records)} prompts done{torn}")
    try:
        started = time.perf_counter()
        if len(partial.done) < len(records):
            tasks = {r.task for r in records}
            with open_engine(cfg, source.model, tokenizer, job.device, tasks) as (generate, scorer, params):
                def run_chunk(part: Sequence[Any]) -> list[Any]:
                    # Looked up at each call: a test may stand in for it.
                    from scalerl.evaluation.difficulty import score_chunk

                    return score_chunk(part, lambda r: enc.token_ids[r.id], generate, scorer, params,
                                       settings)

                results = estimate_pass_rates(records, partial, run_chunk, chunk_size=job.chunk,
                                              on_chunk=on_chunk)
        else:
            results = estimate_pass_rates(records, partial, lambda part: [], on_chunk=on_chunk)
        write_jsonl_atomic(annotate(records, results, settings, source.model), out)
        partial.remove()
        return DifficultyOutcome(results=results, resumed=resumed, engine=cfg.generation.engine,
                                 seconds=time.perf_counter() - started)
    except BaseException:
        # The work file is kept only for what it lets a rerun skip: one this session made and that
        # holds no rated prompt (bad input found late, an engine that failed to start) goes.
        if created and not partial.done:
            partial.remove()
        elif partial.done:
            say(f"difficulty: {len(partial.done)} rated prompt(s) kept in {work}; the same command continues")
        raise


@dataclass(frozen=True)
class GenerateOutcome:
    """What a `generate_sft` call did: the counts written to the sidecar, and where."""

    counts: Any  # scalerl.data.generate.GenerateCounts
    resumed: int
    engine: str
    stats: Path
    seconds: float


def write_json_atomic(data: Any, path: Path) -> None:
    """`data` as indented JSON, whole or not at all."""
    import json

    from scalerl.atomic import atomic_path

    with atomic_path(path, suffix=".json") as tmp:
        text = json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False)
        tmp.write_text(text + "\n", encoding="utf-8")


def write_rows_atomic(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """JSON lines, whole or not at all."""
    import json

    from scalerl.atomic import atomic_path

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, suffix=".jsonl") as tmp, tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def generate_sft(
    job: SamplingJob,
    *,
    out: Path,
    stats: Path,
    rule: str,
    on_chunk: Callable[[int, int], None] | None = None,
    say: Say = lambda message: None,
    warn: Say | None = None,
) -> GenerateOutcome:
    """Sample every prompt `job.k` times with `job.model`, verify, and write the SFT rows `rule` keeps
    to `out` and the counts to `stats` (`scalerl.data.generate`); resumable from `OUT.partial`."""
    from scalerl.data.difficulty import estimate_pass_rates, partial_path
    from scalerl.data.generate import SamplesFile, build_rows, select

    select([], rule)  # an unknown rule is refused before any compute
    source, cfg, settings, records, enc, tokenizer = _prepare(job, say=say, warn=warn, what="generate")
    work = partial_path(out)
    if job.restart:
        work.unlink(missing_ok=True)
    partial = SamplesFile.open(work, settings)
    resumed = len(partial.done)
    if resumed:
        say(f"generate: resuming {work}: {resumed} of {len(records)} prompts done")
    started = time.perf_counter()

    def decode(ids: Sequence[int]) -> str:
        return str(tokenizer.decode(list(ids), skip_special_tokens=True))

    if len(partial.done) < len(records):
        tasks = {r.task for r in records}
        with open_engine(cfg, source.model, tokenizer, job.device, tasks) as (generate, scorer, params):
            def run_chunk(part: Sequence[Any]) -> list[Any]:
                from scalerl.evaluation.difficulty import sample_chunk

                return sample_chunk(part, lambda r: enc.token_ids[r.id], generate, scorer, params, settings,
                                    decode)

            results = estimate_pass_rates(records, partial, run_chunk, chunk_size=job.chunk,
                                          on_chunk=on_chunk)
    else:
        results = estimate_pass_rates(records, partial, lambda part: [], on_chunk=on_chunk)
    rows, counts = build_rows(records, results, rule, source.model)
    # The rows first, then the counts that describe them; the work file goes last.
    from scalerl.ownership import writing_output

    with writing_output(out, "--out"):  # an unwritable folder: exit 2 naming the flag
        write_rows_atomic(rows, out)
    with writing_output(stats, "--stats"):
        write_json_atomic({"settings": settings.to_dict(), "prompts_file": str(job.prompts),
                           **counts.to_dict()}, stats)
    partial.remove()
    return GenerateOutcome(counts=counts, resumed=resumed, engine=cfg.generation.engine, stats=stats,
                           seconds=time.perf_counter() - started)


class open_engine:  # noqa: N801 (a context manager used like a function)
    """The model in the engine `generation.engine` names, a verifier-backed scorer, the sampling
    parameters (length control included), exactly as `scalerl eval` builds them."""

    def __init__(self, cfg: RunConfig, model: str, tokenizer: Any, device: str | None,
                 tasks: set[str] | frozenset[str] = frozenset()) -> None:
        self.cfg, self.model, self.tokenizer, self.device = cfg, model, tokenizer, device
        self.tasks = tasks  # checked against the verifiers (and the sandbox's isolation) first
        self._closers: list[Any] = []

    def __enter__(self) -> tuple[Any, Any, Any]:
        from scalerl.assembly.sections import engine_spec, sampling_params
        from scalerl.pipeline.driver import success_threshold
        from scalerl.rewards import RewardRouter
        from scalerl.rewards.groups import GroupScorer
        from scalerl.rollout.factory import build_engine, close_engine

        cfg, tok = self.cfg, self.tokenizer
        try:
            router = RewardRouter(cfg.rewards)
            self._closers.append(router.close)
            router.check_tasks(set(self.tasks))  # an unverifiable task or an unisolated sandbox: exit 2
            scorer = GroupScorer(router, lambda ids: str(tok.decode(ids, skip_special_tokens=True)),
                                 max_workers=cfg.rewards.max_workers,
                                 success_threshold=success_threshold(cfg.rewards))
            self._closers.append(scorer.close)
            pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
            spec = engine_spec(cfg, model_path=self.model, eos_token_ids=(int(tok.eos_token_id),),
                               pad_token_id=int(pad))
            model = None
            if spec.kind == "embedded":
                from scalerl.training.policy import load_policy

                try:
                    model = load_policy(cfg.model, self.device).model
                except OSError as err:
                    raise MissingInputError(f"{self.model}: cannot load a model from it ({err})") from None
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


__all__ = ["DifficultyOutcome", "GenerateOutcome", "difficulty_config", "generate_sft", "open_engine",
           "rate_difficulty"]
