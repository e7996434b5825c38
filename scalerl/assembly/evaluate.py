"""What `scalerl eval` (and `scalerl data difficulty`) evaluates, and the run that evaluates it.

`resolve_source(spec)` reads a run directory, a checkpoint inside one, a saved model or a hub name
into an `EvalSource`: the model to load and the `RunConfig` whose settings apply (the run's own, or
the defaults). `eval_records` picks the prompts (the run's held-out split unless a file is given),
and `evaluate_source` loads the model into the configured engine and evaluates them with the rewards
router, exactly as the evaluations during training (`scalerl.evaluation.evaluate`): the same
sampling, length control, system prompt and request seeds, so evaluating the checkpoint of an
evaluated step reproduces that step's `val_*` numbers. An agentic run is evaluated on trajectories.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from scalerl.config import RunConfig, build_config, yaml_layer
from scalerl.data.tokenize import bind_chat_template_kwargs
from scalerl.inputs import InputError, MissingInputError

RUN_CONFIG = "config.yaml"
ADAPTER_DIR = "adapter"  # scalerl.training.checkpoint.ADAPTER_DIR (not imported: that imports torch)
HELDOUT_IDS = "heldout_ids.json"


@dataclass(frozen=True)
class EvalSource:
    """What to load and where its settings come from."""

    model: str  # a directory or a hub name, `from_pretrained`-loadable
    run_dir: Path | None  # the run the model belongs to, if any
    config: RunConfig


def _run_config(run_dir: Path) -> RunConfig:
    return build_config([yaml_layer(run_dir / RUN_CONFIG)])


def resolve_source(spec: str, warn: Callable[[str], None] | None = None) -> EvalSource:
    """A run dir (its latest checkpoint), a checkpoint in a run, a model dir, or a hub name.

    `warn` hears of a corrupt newer checkpoint that was passed over."""
    from scalerl.training.checkpoint import latest_valid_checkpoint

    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / RUN_CONFIG).is_file() and not (path / "config.json").is_file():
            # The newest checkpoint that verifies; a corrupt newer one is named and left in place.
            ckpt = latest_valid_checkpoint(path, quarantine=False, warn=warn)
            if ckpt is None:
                raise MissingInputError(
                    f"{path}: a run directory without a checkpoint under {path / 'checkpoints'} "
                    "(runs write one at the end; checkpoint.every adds more)"
                )
            return EvalSource(str(ckpt), path, _run_config(path))
        if not (path / "config.json").is_file() and not (path / ADAPTER_DIR).is_dir():
            raise MissingInputError(f"{path}: neither a run directory ({RUN_CONFIG}) nor a saved model "
                                    f"(config.json) nor a LoRA checkpoint ({ADAPTER_DIR}/)")
        run = path.parent.parent
        if path.parent.name == "checkpoints" and (run / RUN_CONFIG).is_file():
            return EvalSource(str(path), run, _run_config(run))
        return EvalSource(str(path), None, RunConfig())
    if path.exists():
        raise InputError(f"{path}: expected a run directory, a checkpoint or model directory, or a hub name")
    # A hub name is `name` or `owner/name`; anything else that does not exist is a mistyped path.
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1 or not spec.strip():
        raise MissingInputError(f"{spec}: no such directory")
    return EvalSource(spec, None, RunConfig())


def lora_base(source: EvalSource) -> str:
    """The base model a LoRA checkpoint's adapter sits on: the run's `model.name_or_path`, or the
    starting model its `start_model.json` recorded (the embedded default's warm start), checked
    against the content hash recorded there (an adapter on other weights computes another model)."""
    from scalerl.model_identity import model_identity, read_start_model

    if source.run_dir is None:
        raise InputError(f"{source.model}: a LoRA checkpoint outside its run directory; its base model is "
                         f"named in {ADAPTER_DIR}/adapter_config.json (load it with "
                         "PeftModel.from_pretrained(base, CHECKPOINT/adapter))")
    start = read_start_model(source.run_dir) or {}
    name = source.config.model.name_or_path or start.get("name_or_path")
    if name is None:
        raise MissingInputError(f"{source.run_dir}: no base model recorded for the LoRA checkpoint "
                                "(model.name_or_path unset and no start_model.json)")
    recorded = start.get("sha256")
    if recorded and Path(name).is_dir() and model_identity(name).get("sha256") != recorded:
        raise InputError(f"{name}: the base model's weights differ from those the run started from "
                         f"({source.run_dir}/start_model.json); the adapter would sit on other weights")
    return str(name)


def source_policy(source: EvalSource, device: str | None = None) -> Any:
    """The `Policy` of `source`: a saved model, or a LoRA checkpoint's adapter (peft format,
    `adapter/`) on its run's base model (`lora_base`), with the checkpoint's tokenizer."""
    from scalerl.training.checkpoint import load_adapter_weights
    from scalerl.training.policy import apply_lora, load_policy

    cfg = source.config.model_copy(deep=True)
    lora = (Path(source.model) / ADAPTER_DIR).is_dir()
    # The checkpoint holds its own tokenizer files; a tokenizer named in the run's config is the one
    # they were saved from.
    cfg.model.name_or_path = lora_base(source) if lora else source.model
    cfg.model.tokenizer = source.model if lora else None
    if lora and cfg.model.lora.r == 0:
        raise InputError(f"{source.model}: holds a LoRA adapter but the run's config has model.lora.r=0")
    try:
        policy = load_policy(cfg.model, device)
    except OSError as err:  # a hub name that does not resolve, or a directory without weights
        raise MissingInputError(f"{cfg.model.name_or_path}: cannot load a model from it ({err})") from None
    if not lora:
        return policy
    policy = apply_lora(policy, cfg.model.lora, seed=cfg.seed)  # A is then loaded from the checkpoint
    try:
        load_adapter_weights(policy.model, source.model)
    except ValueError as err:
        raise InputError(str(err)) from None
    return policy


def eval_records(source: EvalSource, data: str | None, max_prompts: int | None,
                 fmt: str = "auto", subset: str | None = None, split: str | None = None
                 ) -> tuple[list[Any], str]:
    """The prompts to evaluate on and a description of them; `fmt` is how `data` is read (a file
    type or a benchmark layout, `scalerl.data.loaders.FORMATS`), `subset` and `split` which config
    and split of a dataset holding several (`--subset`, `--split`)."""
    from scalerl.assembly.build import load_records
    from scalerl.data import load_heldout_ids, load_prompts, split_by_ids, split_heldout

    cfg = source.config
    if data is None and fmt != "auto":
        raise InputError(f"--format {fmt}: reads the file named by --data; none was given")
    if data is not None:
        from scalerl.assembly.sections import gold_free

        records = load_prompts(data, default_task=cfg.data.default_task, format=fmt,
                               on_error=cfg.data.on_bad_row, gold_free_tasks=gold_free(cfg), subset=subset,
                               split=split, keys=("--subset", "--split")).records
        what = f"{data}" if fmt == "auto" else f"{data} ({fmt})"
    elif source.run_dir is not None:
        ids_file = source.run_dir / HELDOUT_IDS
        if not ids_file.is_file():
            raise MissingInputError(f"{ids_file}: the run's held-out split is missing (pass --data PATH)")
        records = split_by_ids(load_records(cfg), load_heldout_ids(ids_file)).heldout
        what = f"the held-out split of {source.run_dir}"
    else:
        records = split_heldout(load_records(cfg), cfg.data.heldout_size, cfg.data.heldout_seed).heldout
        what = "the held-out split of the built-in synthetic task"
    if not records:
        raise InputError(f"no prompts to evaluate in {what}")
    if max_prompts is not None:
        records = records[:max_prompts]
    return records, f"{len(records)} prompts of {what}"


def evaluate_source(
    source: EvalSource,
    records: list[Any],
    *,
    k: int,
    temperature: float,
    seed: int,
    device: str | None = None,
    save_samples: Path | None = None,
) -> dict[str, float]:
    """Load the model into the configured engine and evaluate `records` (keys without a prefix);
    `save_samples`: every sample written there as JSONL (prompt, response, reward), atomically."""
    import tempfile

    from scalerl.assembly.sections import engine_spec
    from scalerl.rollout.factory import build_engine, close_engine

    cfg = source.config.model_copy(deep=True)
    policy = source_policy(source, device)
    tokenizer = bind_chat_template_kwargs(policy.tokenizer, cfg.data.chat_template_kwargs)
    model_path, scratch = source.model, None
    if policy.lora and cfg.generation.engine != "embedded":
        # vLLM loads a directory: the adapter merged into its base, as the training run sent it.
        scratch = tempfile.TemporaryDirectory(prefix="scalerl-eval-merged-")
        policy.save_pretrained(scratch.name)
        model_path = scratch.name
    spec = engine_spec(cfg, model_path=model_path, eos_token_ids=(int(tokenizer.eos_token_id),),
                            pad_token_id=policy.pad_token_id)
    model = (policy.generation_copy() if policy.lora else policy.model) if spec.kind == "embedded" else None
    if cfg.agentic.context_fraction is not None:  # the trigger as a share of the model's window
        from scalerl.agentic.setup import with_context_window
        from scalerl.assembly.serve import model_context

        window = model_context(policy.model, getattr(spec, "max_model_len", None))
        cfg = cfg.model_copy(update={"agentic": with_context_window(cfg.agentic, window)})
    engine = build_engine(spec, model=model)
    try:
        return _evaluate_with(engine, cfg, tokenizer, records, k=k, temperature=temperature, seed=seed,
                              save_samples=save_samples)
    finally:
        close_engine(engine)
        if scratch is not None:
            scratch.cleanup()


def sample_lines(scored: Any, decode: Any) -> str:
    """Every scored sample as one JSON line: prompt, response, reward, correctness, finish reason."""
    import json

    lines = []
    for group in scored:
        record = group.record
        prompt = record.prompt if record.prompt is not None else record.messages
        for i, c in enumerate(group.completions):
            lines.append(json.dumps({
                "prompt_id": record.id, "task": record.task, "sample": i, "prompt": prompt,
                "answer": record.answer, "response": decode(list(c.token_ids)),
                "reward": float(group.rewards[i]), "correct": bool(group.correct[i]),
                "finish_reason": c.finish_reason, "tokens": len(c.token_ids)}, allow_nan=False))
    return "".join(line + "\n" for line in lines)


def _evaluate_with(engine: Any, cfg: RunConfig, tokenizer: Any, records: list[Any], *, k: int,
                   temperature: float, seed: int, save_samples: Path | None = None) -> dict[str, float]:
    from scalerl.assembly.sections import sampling_params
    from scalerl.data import encode_prompts, resolve_system_prompt
    from scalerl.evaluation.evaluator import evaluate
    from scalerl.pipeline.driver import success_threshold
    from scalerl.rewards import RewardRouter
    from scalerl.rewards.groups import GroupScorer

    d = cfg.data
    encoded = encode_prompts(records, tokenizer, max_prompt_tokens=d.max_prompt_tokens,
                             system_prompt=resolve_system_prompt(d.think_system_prompt, d.system_prompt),
                             on_error="error", template=d.template)
    router = RewardRouter(cfg.rewards)
    closers: list[Any] = [router.close]
    try:
        router.check_tasks({r.task for r in records})

        def decode(ids: list[int]) -> str:
            return str(tokenizer.decode(ids, skip_special_tokens=True))

        params = replace(sampling_params(cfg, tokenizer), temperature=temperature)
        check_params = getattr(engine, "check_params", None)
        if callable(check_params):
            check_params(params)
        encode: Any = lambda r: encoded.token_ids[r.id]  # noqa: E731
        verdicts: Any = router
        if cfg.agentic.environment is not None:  # an agentic run is evaluated on trajectories
            from scalerl.serving.setup import build_environment

            agentic = build_environment(cfg.agentic, tokenizer, engine, router, decode)
            closers.append(agentic.close)
            engine, encode, verdicts = agentic.engine, agentic.encode, agentic.scorer
        scorer = GroupScorer(verdicts, decode, max_workers=cfg.rewards.max_workers,
                             success_threshold=success_threshold(cfg.rewards))
        closers.append(scorer.close)
        # The same request seeds as the evaluations during training (prefix and seed), so a
        # checkpoint of an evaluated step reproduces that evaluation.
        def write_samples(scored: Any) -> None:
            from scalerl.atomic import write_atomic

            assert save_samples is not None
            write_atomic(save_samples, sample_lines(scored, decode))

        return evaluate(engine.generate, records, encode, k, params, scorer,
                        seed=seed, prefix="", request_prefix="eval/heldout/",
                        on_scored=write_samples if save_samples is not None else None)
    finally:
        for close in reversed(closers):
            close()


__all__ = ["HELDOUT_IDS", "RUN_CONFIG", "EvalSource", "eval_records", "evaluate_source", "lora_base",
           "resolve_source", "source_policy"]
