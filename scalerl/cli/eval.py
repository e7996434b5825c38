"""`scalerl eval`: mean@k (pass@k, reward, lengths) of a checkpoint or model on held-out prompts.

    scalerl eval runs/demo                                   # the run's latest checkpoint, its held-out split
    scalerl eval runs/demo/checkpoints/step_000200 --k 8
    scalerl eval Qwen/Qwen3-0.6B --data problems.jsonl --max-prompts 200 --json
    scalerl eval ~/.cache/scalerl/sft/tiny-...     # a model dir: the synthetic task's held-out split
    scalerl eval runs/demo --data gsm8k/test.jsonl --format gsm8k    # a benchmark in its own layout

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
from typing import Any

from scalerl.assembly.evaluate import eval_records, evaluate_source, resolve_source
from scalerl.cli.argtypes import positive_int
from scalerl.data.benchmarks import BENCHMARK_FORMATS
from scalerl.data.loaders import FORMATS


def render(metrics: dict[str, float], header: str) -> str:
    k = int(metrics["k"])
    rows = [
        (f"mean@{k} (pass rate)", f"{metrics['pass_rate']:.4f}"),
        (f"pass@{k}", f"{metrics['pass_at_k']:.4f}"),
        ("reward mean", f"{metrics['reward_mean']:.4f}"),
        ("response length", f"{metrics['response_length']:.1f} tokens"),
        ("truncated", f"{metrics['truncation_rate']:.1%}"),
        ("interrupted", f"{metrics['interruption_rate']:.1%}"),
        *([("entropy", f"{metrics['entropy']:.4f} nats/token (sampled-token estimate)")]
          if "entropy" in metrics else []),
        ("verifier failures", f"{int(metrics['verifier_failures'])}"),
        ("time", f"{metrics['time_s']:.1f} s"),
    ]
    tasks = sorted(key.split("/", 1)[1] for key in metrics if key.startswith("pass_rate/"))
    if len(tasks) > 1:  # a multi-task set: each task's mean@k too
        rows += [(f"mean@{k} {task}", f"{metrics[f'pass_rate/{task}']:.4f} "
                  f"({int(metrics[f'num_prompts/{task}'])} prompts)") for task in tasks]
    width = max(len(name) for name, _ in rows)
    return "\n".join([header, *(f"  {name:<{width}}  {value}" for name, value in rows)])


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
    p.add_argument("--subset", help="the config (subset) of a --data dataset or folder holding several")
    p.add_argument("--split", help="the split of a --data dataset or folder holding several")
    p.add_argument("--format", choices=FORMATS, default="auto",
                   help="how --data is read: a file type (default auto: by suffix) or a benchmark's "
                        f"published layout ({', '.join(BENCHMARK_FORMATS)}; docs/data.md)")
    p.add_argument("--k", type=positive_int, metavar="K",
                   help="samples per prompt (default: the run's eval.k)")
    p.add_argument("--temperature", type=_temperature, metavar="T",
                   help="sampling temperature (default: the run's eval.temperature)")
    p.add_argument("--max-prompts", type=positive_int, metavar="N", help="evaluate the first N prompts only")
    p.add_argument("--seed", type=int, help="evaluation seed (default: the run's seed)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda if available)")
    p.add_argument("--engine", choices=("embedded", "vllm"),
                   help="generation engine (config key generation.engine; default: the run's, or embedded)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--save-samples", metavar="FILE",
                   help="write every sample (prompt, response, reward, correct) to FILE as JSONL")
    p.add_argument("--overwrite", action="store_true", help="with --save-samples: replace an existing FILE")
    p.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from scalerl.inputs import check_device

    check_device(args.device)
    save = None
    if args.save_samples is not None:  # before any model is loaded
        from scalerl.ownership import check_output_file

        save = check_output_file(args.save_samples, "--save-samples", overwrite=args.overwrite)
    source = resolve_source(args.model, warn=lambda m: print(f"eval: warning: {m}", file=sys.stderr))
    if args.engine is not None:
        source.config.generation.engine = args.engine
    cfg = source.config
    from scalerl.rollout.factory import check_engine_available  # torch: imported only when running

    check_engine_available(cfg.generation.engine)
    k = args.k if args.k is not None else cfg.eval.k
    temperature = args.temperature if args.temperature is not None else cfg.eval.temperature
    seed = args.seed if args.seed is not None else cfg.seed
    records, what = eval_records(source, args.data, args.max_prompts, args.format, subset=args.subset,
                                 split=args.split)
    metrics = evaluate_source(source, records, k=k, temperature=temperature, seed=seed, device=args.device,
                              save_samples=save)
    if args.json:
        out = {"model": source.model, "run_dir": None if source.run_dir is None else str(source.run_dir),
               "data": args.data, "format": args.format, "prompts": what, "k": k, "temperature": temperature,
               "seed": seed,
               "metrics": metrics}
        sys.stdout.write(json.dumps(out, indent=2, allow_nan=False) + "\n")
    else:
        header = f"eval: {source.model} on {what} (k={k}, temperature {temperature:g}, seed {seed})"
        sys.stdout.write(render(metrics, header) + "\n")
    return 0


__all__ = ["register", "render", "run_eval"]
