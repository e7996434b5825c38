"""`scalerl eval`: mean@k (pass@k, reward, lengths) of a checkpoint or model on held-out prompts.

    scalerl eval runs/demo                                   # the run's latest checkpoint, its held-out split
    scalerl eval runs/demo/checkpoints/step_000200 --k 8
    scalerl eval Qwen/Qwen3-0.6B --data problems.jsonl --max-prompts 200 --json
    scalerl eval ~/.cache/scalerl/sft/tiny-...     # a model dir: the synthetic task's held-out split

What is evaluated on, unless `--data PATH` names a prompt file or folder:

* a run directory, or a checkpoint inside one (`RUN/checkpoints/step_N/`): the run's own held-out
  split (`RUN/heldout_ids.json` over the prompts its `config.yaml` names), with its generation,
  length-control, system-prompt and reward settings, and its evaluation seed, so evaluating the
  checkpoint of an evaluated step reproduces that step's `val_*` numbers;
* any other model (a saved directory or a Hugging Face name): the held-out split a default run
  would use on the built-in synthetic task, with the default settings.

Generation uses the engine `generation.engine` names (the run's, `--engine`, or the embedded
default) and scoring the rewards router, exactly as evaluations during training
(`scalerl.evaluation.evaluate`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from scalerl.config import RunConfig, build_config, yaml_layer

RUN_CONFIG = "config.yaml"
HELDOUT_IDS = "heldout_ids.json"


@dataclass(frozen=True)
class EvalSource:
    """What to load and where its settings come from."""

    model: str  # a directory or a hub name, `from_pretrained`-loadable
    run_dir: Path | None  # the run the model belongs to, if any
    config: RunConfig


def _run_config(run_dir: Path) -> RunConfig:
    return build_config([yaml_layer(run_dir / RUN_CONFIG)])


def resolve_source(spec: str) -> EvalSource:
    """A run dir (its latest checkpoint), a checkpoint in a run, a model dir, or a hub name."""
    from scalerl.training.checkpoint import latest_valid_checkpoint

    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / RUN_CONFIG).is_file() and not (path / "config.json").is_file():
            # The newest checkpoint that verifies; a corrupt newer one is named and left in place.
            ckpt = latest_valid_checkpoint(path, quarantine=False,
                                           warn=lambda m: print(f"eval: warning: {m}", file=sys.stderr))
            if ckpt is None:
                raise FileNotFoundError(
                    f"{path}: a run directory without a checkpoint under {path / 'checkpoints'} "
                    "(runs write one at the end; checkpoint.every adds more)"
                )
            return EvalSource(str(ckpt), path, _run_config(path))
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path}: neither a run directory ({RUN_CONFIG}) nor a saved model "
                                    "(config.json)")
        run = path.parent.parent
        if path.parent.name == "checkpoints" and (run / RUN_CONFIG).is_file():
            return EvalSource(str(path), run, _run_config(run))
        return EvalSource(str(path), None, RunConfig())
    if path.exists():
        raise ValueError(f"{path}: expected a run directory, a checkpoint or model directory, or a hub name")
    # A hub name is `name` or `owner/name`; anything else that does not exist is a mistyped path.
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1 or not spec.strip():
        raise FileNotFoundError(f"{spec}: no such directory")
    return EvalSource(spec, None, RunConfig())


def eval_records(source: EvalSource, data: str | None, max_prompts: int | None) -> tuple[list[Any], str]:
    """The prompts to evaluate on and a description of them."""
    from scalerl.assembly.build import load_records
    from scalerl.data import load_heldout_ids, load_prompts, split_by_ids, split_heldout

    cfg = source.config
    if data is not None:
        records = load_prompts(data, default_task=cfg.data.default_task, on_error=cfg.data.on_bad_row).records
        what = f"{data}"
    elif source.run_dir is not None:
        ids_file = source.run_dir / HELDOUT_IDS
        if not ids_file.is_file():
            raise FileNotFoundError(f"{ids_file}: the run's held-out split is missing (pass --data PATH)")
        records = split_by_ids(load_records(cfg), load_heldout_ids(ids_file)).heldout
        what = f"the held-out split of {source.run_dir}"
    else:
        records = split_heldout(load_records(cfg), cfg.data.heldout_size, cfg.data.heldout_seed).heldout
        what = "the held-out split of the built-in synthetic task"
    if not records:
        raise ValueError(f"no prompts to evaluate in {what}")
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
) -> dict[str, float]:
    """Load the model into the configured engine and evaluate `records` (keys without a prefix)."""
    from scalerl.rollout.factory import build_engine, close_engine, spec_from_config
    from scalerl.training.policy import load_policy

    cfg = source.config.model_copy(deep=True)
    # The checkpoint holds its own tokenizer files; a tokenizer named in the run's config is the one
    # they were saved from.
    cfg.model.name_or_path = source.model
    cfg.model.tokenizer = None
    try:
        policy = load_policy(cfg.model, device)
    except OSError as err:  # a hub name that does not resolve, or a directory without weights
        raise FileNotFoundError(f"{source.model}: cannot load a model from it ({err})") from None
    tokenizer = policy.tokenizer
    spec = spec_from_config(cfg, model_path=source.model, eos_token_ids=(int(tokenizer.eos_token_id),),
                            pad_token_id=policy.pad_token_id)
    engine = build_engine(spec, model=policy.model if spec.kind == "embedded" else None)
    try:
        return _evaluate_with(engine, cfg, tokenizer, records, k=k, temperature=temperature, seed=seed)
    finally:
        close_engine(engine)


def _evaluate_with(engine: Any, cfg: RunConfig, tokenizer: Any, records: list[Any], *, k: int,
                   temperature: float, seed: int) -> dict[str, float]:
    from scalerl.assembly.build import sampling_params
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
            from scalerl.agentic.setup import build_agentic

            agentic = build_agentic(cfg, tokenizer, engine, router, decode)
            closers.append(agentic.close)
            engine, encode, verdicts = agentic.engine, agentic.encode, agentic.scorer
        scorer = GroupScorer(verdicts, decode, max_workers=cfg.rewards.max_workers,
                             success_threshold=success_threshold(cfg))
        closers.append(scorer.close)
        # The same request seeds as the evaluations during training (prefix and seed), so a
        # checkpoint of an evaluated step reproduces that evaluation.
        return evaluate(engine.generate, records, encode, k, params, scorer,
                        seed=seed, prefix="", request_prefix="eval/heldout/")
    finally:
        for close in reversed(closers):
            close()


def render(metrics: dict[str, float], header: str) -> str:
    k = int(metrics["k"])
    rows = [
        (f"mean@{k} (pass rate)", f"{metrics['pass_rate']:.4f}"),
        (f"pass@{k}", f"{metrics['pass_at_k']:.4f}"),
        ("reward mean", f"{metrics['reward_mean']:.4f}"),
        ("response length", f"{metrics['response_length']:.1f} tokens"),
        ("truncated", f"{metrics['truncation_rate']:.1%}"),
        ("interrupted", f"{metrics['interruption_rate']:.1%}"),
        ("verifier failures", f"{int(metrics['verifier_failures'])}"),
        ("time", f"{metrics['time_s']:.1f} s"),
    ]
    tasks = sorted(key.split("/", 1)[1] for key in metrics if key.startswith("pass_rate/"))
    if len(tasks) > 1:  # a multi-task set: each task's mean@k too
        rows += [(f"mean@{k} {task}", f"{metrics[f'pass_rate/{task}']:.4f} "
                  f"({int(metrics[f'num_prompts/{task}'])} prompts)") for task in tasks]
    width = max(len(name) for name, _ in rows)
    return "\n".join([header, *(f"  {name:<{width}}  {value}" for name, value in rows)])


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


def _temperature(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a temperature >= 0, got {text}")
    return value


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "eval",
        help="mean@k / pass@k of a checkpoint or model on held-out prompts",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="CHECKPOINT_OR_MODEL",
                   help="run directory, checkpoint directory, saved model directory or hub name")
    p.add_argument("--data", metavar="PATH", help="prompt file or folder (default: see above)")
    p.add_argument("--k", type=_positive_int, metavar="K",
                   help="samples per prompt (default: the run's eval.k)")
    p.add_argument("--temperature", type=_temperature, metavar="T",
                   help="sampling temperature (default: the run's eval.temperature)")
    p.add_argument("--max-prompts", type=_positive_int, metavar="N", help="evaluate the first N prompts only")
    p.add_argument("--seed", type=int, help="evaluation seed (default: the run's seed)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda if available)")
    p.add_argument("--engine", choices=("embedded", "vllm"),
                   help="generation engine (config key generation.engine; default: the run's, or embedded)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    source = resolve_source(args.model)
    if args.engine is not None:
        source.config.generation.engine = args.engine
    cfg = source.config
    from scalerl.rollout.factory import check_engine_available  # torch: imported only when running

    check_engine_available(cfg.generation.engine)
    k = args.k if args.k is not None else cfg.eval.k
    temperature = args.temperature if args.temperature is not None else cfg.eval.temperature
    seed = args.seed if args.seed is not None else cfg.seed
    records, what = eval_records(source, args.data, args.max_prompts)
    metrics = evaluate_source(source, records, k=k, temperature=temperature, seed=seed, device=args.device)
    if args.json:
        out = {"model": source.model, "run_dir": None if source.run_dir is None else str(source.run_dir),
               "data": args.data, "prompts": what, "k": k, "temperature": temperature, "seed": seed,
               "metrics": metrics}
        sys.stdout.write(json.dumps(out, indent=2, allow_nan=False) + "\n")
    else:
        header = f"eval: {source.model} on {what} (k={k}, temperature {temperature:g}, seed {seed})"
        sys.stdout.write(render(metrics, header) + "\n")
    return 0


__all__ = ["EvalSource", "eval_records", "evaluate_source", "register", "resolve_source", "run_eval"]
