"""The Python API: `scalerl.train(...)` and `scalerl.evaluate(...)`, what `scalerl train` and
`scalerl eval` do, called from Python (docs/python-api.md).

    import scalerl
    result = scalerl.train(model="Qwen/Qwen2.5-0.5B-Instruct", train_dataset=rows,
                           reward_funcs=[my_reward], recipe="scalerl", output_dir="runs/mine",
                           **{"optim.lr": 1e-6, "max_steps": 200})
    result.run_dir, result.rows[-1], result.fit

The same composition root (`scalerl.assembly`) and the same checks as the commands: the config is
layered recipe < `config` files or mapping < `overrides` < the arguments, checked before any work
(`check_run_inputs`); bad input raises the exception the command reports with exit status 2
(`ConfigError`, `InputError`, `DataError`, all `ValueError`s), its message naming the key. A run that
fails on its own side (exit 1 for the command) raises `RunFailedError`; a run stopped by a signal
returns with its `exit_status`.

`train_dataset`: a path (any `data.train_path`: file, folder, list, Hub id), a list of dicts, or a
`datasets.Dataset`. Rows handed over in memory are written to `RUN_DIR/train_dataset.jsonl` once
the checks pass, and `data.train_path` names that file, so the run folder is complete (`scalerl eval
RUN_DIR` reads it). `reward_funcs`: callables, `fn` strings, or `rewards.functions` entries
(mappings), in the styles of `scalerl.rewards.functions`; a callable importable by its module and
name is saved as that dotted path, any other (defined in `__main__`, a lambda, a closure) is known
by its `__name__` in this process only.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalerl.config import ConfigError, RunConfig, build_config, deep_merge, set_path, yaml_layer
from scalerl.inputs import InputError

TRAIN_DATASET_FILE = "train_dataset.jsonl"
Layer = tuple[dict[str, Any], dict[tuple[str, ...], str]]


class RunFailedError(RuntimeError):
    """A run that failed on its own side (a checkpoint that could not be written, a diverged
    trainer, too many verifier failures): what `scalerl train` exits 1 for."""


@dataclass
class TrainResult:
    """A finished `scalerl.train`: the run folder, its `metrics.jsonl` rows, and the fit of its
    held-out curve (`scalerl fit RUN_DIR`'s; None with `fit_error` saying why when it cannot be fitted,
    e.g. fewer evaluations than parameters)."""

    run_dir: Path
    config: RunConfig
    exit_status: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    fit: Any = None
    fit_error: str | None = None

    @property
    def step_rows(self) -> list[dict[str, Any]]:
        """The training rows (those with a `loss`)."""
        return [r for r in self.rows if "loss" in r]

    @property
    def eval_rows(self) -> list[dict[str, Any]]:
        """The held-out evaluation rows (those with `val_pass_rate`)."""
        return [r for r in self.rows if "val_pass_rate" in r]


@dataclass
class EvalResult:
    """A finished `scalerl.evaluate`: the metrics (`val_pass_rate`, `val_pass_at_k`, ... without the
    `val_` prefix, as `scalerl eval` prints them), how many prompts, and the model evaluated."""

    metrics: dict[str, float]
    prompts: int
    model: str


def override_layer(overrides: Mapping[str, Any], where: str) -> Layer:
    """Overrides as a config layer: keys dotted (`{"optim.lr": 1e-6}`) or nested (`{"optim": {"lr":
    1e-6}}`), merged in order; each key's origin is `where(key=...)` in error messages."""
    tree: dict[str, Any] = {}
    origins: dict[tuple[str, ...], str] = {}
    for key, value in overrides.items():
        if not isinstance(key, str) or not key or any(not p for p in key.split(".")):
            raise ConfigError(f"{where}: override key {key!r} is not a config key such as 'optim.lr'")
        path = key.split(".")
        sub: dict[str, Any] = {}
        set_path(sub, path, value)
        tree = deep_merge(tree, sub)
        origins[tuple(path)] = f"{where}({key}=...)"
    return tree, origins


def _config_layers(config: str | os.PathLike[str] | Mapping[str, Any] | Sequence[Any] | None,
                   where: str) -> list[Layer]:
    if config is None:
        return []
    if isinstance(config, Mapping):
        return [override_layer(config, f"{where} config")]
    items = [config] if isinstance(config, (str, os.PathLike)) else list(config)
    layers: list[Layer] = []
    for item in items:
        if isinstance(item, Mapping):
            layers.append(override_layer(item, f"{where} config"))
            continue
        if not Path(item).is_file():
            raise InputError(f"config: {item}: no such file")
        layers.append(yaml_layer(item))
    return layers


def _rows(dataset: Any, key: str) -> list[dict[str, Any]] | None:
    """In-memory rows (a list of mappings, a `datasets.Dataset`), or None for a path."""
    if isinstance(dataset, (str, os.PathLike)):
        return None
    if isinstance(dataset, Sequence) and all(isinstance(x, (str, os.PathLike)) for x in dataset):
        return None  # a list of paths
    to_list = getattr(dataset, "to_list", None)
    if callable(to_list) and not isinstance(dataset, list):  # datasets.Dataset
        dataset = to_list()
    if not isinstance(dataset, Sequence) or isinstance(dataset, (bytes, Mapping)):
        raise InputError(f"{key}: expected a path, a list of paths, a list of dicts or a datasets.Dataset, "
                         f"got {type(dataset).__name__}")
    rows = list(dataset)
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise InputError(f"{key}[{i}]: expected a dict (a row), got {type(row).__name__}")
    if not rows:
        raise InputError(f"{key}: no rows")
    return [dict(r) for r in rows]


def _write_rows(rows: list[dict[str, Any]], path: Path, key: str) -> None:
    lines = []
    for i, row in enumerate(rows):
        try:
            lines.append(json.dumps(row, ensure_ascii=False))
        except (TypeError, ValueError) as err:
            raise InputError(f"{key}[{i}]: not JSON-serializable ({err})") from None
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _dotted_path(fn: Any) -> str | None:
    """`module:qualname` of a function importable by that path (not `__main__`, a lambda or a
    closure), else None."""
    from scalerl.rewards.registry import import_object

    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or not qualname or "<" in qualname:
        return None
    try:
        return f"{module}:{qualname}" if import_object(f"{module}:{qualname}") is fn else None
    except ValueError:
        return None


@contextmanager
def _registered(reward_funcs: Sequence[Any] | None, reward_weights: Sequence[float] | None
                ) -> Iterator[list[dict[str, Any]] | None]:
    """`reward_funcs` as `rewards.functions` entries; callables registered under their names for
    the duration (`scalerl.rewards.functions.register_reward_function`)."""
    if reward_funcs is None:
        if reward_weights is not None:
            raise InputError("reward_weights: given without reward_funcs")
        yield None
        return
    from scalerl.rewards.functions import register_reward_function, unregister_reward_function

    funcs = list(reward_funcs)
    if reward_weights is not None and len(reward_weights) != len(funcs):
        raise InputError(f"reward_weights: {len(reward_weights)} weights for {len(funcs)} reward_funcs")
    entries: list[dict[str, Any]] = []
    registered: list[str] = []
    try:
        for i, item in enumerate(funcs):
            entry = dict(item) if isinstance(item, Mapping) else {"fn": item}
            fn = entry.get("fn")
            dotted = _dotted_path(fn) if callable(fn) else None
            if dotted is not None:  # importable: the saved config names it, a resumed run finds it
                entry["fn"] = dotted
            elif callable(fn):
                base = getattr(fn, "__name__", "")
                name = base if base.isidentifier() else f"reward_{i}"
                taken = {e.get("name") or e["fn"] for e in entries}
                if name in taken:
                    name = f"{name}_{i}"
                register_reward_function(name, fn)
                registered.append(name)
                entry["fn"] = name
            elif not isinstance(fn, str):
                raise InputError(f"reward_funcs[{i}]: expected a callable, a 'module:function' string or "
                                 f"a mapping with 'fn', got {type(item).__name__}")
            if reward_weights is not None:
                entry["weight"] = reward_weights[i]
            entries.append(entry)
        yield entries
    finally:
        for name in registered:
            unregister_reward_function(name)


def _resolve(recipe: str | None, config: Any, overrides: Mapping[str, Any], args: Mapping[str, Any],
             where: str) -> RunConfig:
    from scalerl.recipes import recipe_path

    tree, _ = override_layer(overrides, where)
    clash = sorted(k for k in args if _has(tree, k.split(".")))
    if clash:
        raise InputError(f"{where}: {clash[0]} is given both as an argument and as an override; keep one")
    layers = [yaml_layer(recipe_path(recipe or "scalerl")), *_config_layers(config, where),
              override_layer(overrides, where), override_layer(args, where)]
    cfg = build_config(layers)
    cfg.recipe = recipe or cfg.recipe or "scalerl"
    return cfg


def _has(tree: Mapping[str, Any], path: Sequence[str]) -> bool:
    node: Any = tree
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return False
        node = node[key]
    return True


def _fit(run_dir: Path) -> tuple[Any, str | None]:
    """`scalerl fit RUN_DIR`'s fit with its defaults, or None and why not."""
    from scalerl.scaling.analysis import FitOptions, analyze_curve
    from scalerl.scaling.io import read_run_dir

    try:
        return analyze_curve(read_run_dir(run_dir), FitOptions()), None
    except ValueError as err:
        return None, str(err)


def train(
    model: str | None = None,
    train_dataset: Any = None,
    reward_funcs: Sequence[Callable[..., Any] | str | Mapping[str, Any]] | None = None,
    *,
    recipe: str | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    config: str | os.PathLike[str] | Mapping[str, Any] | Sequence[Any] | None = None,
    reward_weights: Sequence[float] | None = None,
    device: str | None = None,
    say: Callable[[str], None] | None = None,
    **overrides: Any,
) -> TrainResult:
    """Train one run, as `scalerl train` (module doc). `model`: a Hugging Face name or folder (None:
    the embedded tiny default, warm-started); `overrides`: config keys, dotted or nested
    (`**{"optim.lr": 1e-6}`, `max_steps=200`, `data={"split": "train"}`); `say`: where the run's
    lines go (None: the `scalerl.assembly.run` logger)."""
    from scalerl.assembly.inputs import check_run_inputs
    from scalerl.assembly.run import (
        ERROR_LOG,
        METRICS_FILE,
        TRAIN_KIND,
        default_name,
        log_say,
        prepare_model,
        train_run,
    )
    from scalerl.inputs import check_device
    from scalerl.ownership import check_output_dir_owned, claim_output_dir

    where = "scalerl.train"
    say = say or log_say
    rows = _rows(train_dataset, "train_dataset") if train_dataset is not None else None
    with _registered(reward_funcs, reward_weights) as functions, \
            tempfile.TemporaryDirectory(prefix="scalerl-train-rows-") as scratch:
        args: dict[str, Any] = {}
        if model is not None:
            args["model.name_or_path"] = str(model)
        if output_dir is not None:
            args["output_dir"] = str(output_dir)
        if functions is not None:
            args["rewards.functions"] = functions
        if train_dataset is not None:
            if rows is None:
                paths = train_dataset
                args["data.train_path"] = (str(paths) if isinstance(paths, (str, os.PathLike))
                                           else [str(p) for p in paths])
            else:
                staged = Path(scratch) / TRAIN_DATASET_FILE
                _write_rows(rows, staged, "train_dataset")
                args["data.train_path"] = str(staged)
        cfg = default_name(_resolve(recipe, config, overrides, args, where))
        from scalerl.rollout.factory import check_engine_available  # torch: only when running

        check_engine_available(cfg.generation.engine)
        check_device(device)
        run_dir = Path(cfg.output_dir)
        if (run_dir / METRICS_FILE).exists():
            raise InputError(f"output_dir: {run_dir} already holds a run ({METRICS_FILE}); choose another "
                             "output_dir (or resume it with `scalerl train --resume`)")
        try:
            check_run_inputs(cfg)  # before the warm start and before anything is written
        except ValueError as err:
            if rows is None or str(scratch) not in str(err):
                raise
            # Rows handed over in memory: name them, not the scratch file (line N is row N-1).
            shown = str(err).replace(str(Path(scratch) / TRAIN_DATASET_FILE), "train_dataset (JSON lines)")
            raise type(err)(shown) from None
        from scalerl.assembly.advice import tiny_default_advice

        for line in tiny_default_advice(cfg):  # a named model on the tiny model's defaults, as train warns
            say(f"train: warning: {line}")
        check_output_dir_owned(run_dir, TRAIN_KIND, "output_dir")
        cfg = prepare_model(cfg, say=say)
        created = not run_dir.exists()
        try:
            if rows is not None:  # the rows become part of the run folder, named by its config
                claim_output_dir(run_dir, TRAIN_KIND, "output_dir")
                kept = run_dir / TRAIN_DATASET_FILE
                _write_rows(rows, kept, "train_dataset")
                cfg = cfg.model_copy(deep=True)
                cfg.data.train_path = str(kept)
            status = train_run(cfg, run_dir, device=device, say=say, owner=TRAIN_KIND)
        except BaseException:
            # A run that stopped before its first row leaves no folder we made (as train_run does for
            # the folders it makes; the rows written here made this one).
            if created and not (run_dir / METRICS_FILE).exists() and not (run_dir / ERROR_LOG).exists():
                shutil.rmtree(run_dir, ignore_errors=True)
            raise
    if status == 1:
        raise RunFailedError(f"the run in {run_dir} failed; its sessions.jsonl says why")
    metrics = run_dir / METRICS_FILE
    lines = metrics.read_text(encoding="utf-8").splitlines() if metrics.is_file() else []
    fit, fit_error = _fit(run_dir)
    rows_out = [json.loads(line) for line in lines if line.strip()]
    return TrainResult(run_dir=run_dir, config=cfg, exit_status=status, rows=rows_out, fit=fit,
                       fit_error=fit_error)


def evaluate(
    model: str | os.PathLike[str],
    dataset: Any = None,
    reward_funcs: Sequence[Callable[..., Any] | str | Mapping[str, Any]] | None = None,
    *,
    k: int | None = None,
    temperature: float | None = None,
    max_prompts: int | None = None,
    reward_weights: Sequence[float] | None = None,
    device: str | None = None,
    **overrides: Any,
) -> EvalResult:
    """Evaluate, as `scalerl eval`: `model` a run folder (its latest checkpoint, its config and, with
    no `dataset`, its held-out split), a checkpoint, a saved model or a Hub name; `dataset` as
    `train`'s `train_dataset`, read with the run's `data` keys; `overrides` as `train`'s."""
    from scalerl.assembly.evaluate import EvalSource, eval_records, evaluate_source, resolve_source
    from scalerl.assembly.inputs import check_verifiers
    from scalerl.assembly.sections import gold_free
    from scalerl.data.loaders import load_prompts
    from scalerl.inputs import check_device

    where = "scalerl.evaluate"
    check_device(device)
    source = resolve_source(str(model))
    rows = _rows(dataset, "dataset") if dataset is not None else None
    with _registered(reward_funcs, reward_weights) as functions, \
            tempfile.TemporaryDirectory(prefix="scalerl-eval-rows-") as scratch:
        args: dict[str, Any] = {} if functions is None else {"rewards.functions": functions}
        base = source.config.model_dump(mode="json", exclude_unset=False)
        cfg = build_config([(base, {}), override_layer(overrides, where), override_layer(args, where)])
        source = EvalSource(source.model, source.run_dir, cfg)
        if dataset is None:
            records, _ = eval_records(source, None, max_prompts)
        else:
            path: Any = dataset
            if rows is not None:
                path = Path(scratch) / "dataset.jsonl"
                _write_rows(rows, path, "dataset")
            d = cfg.data
            try:
                records = load_prompts(path, field_map=d.field_map, default_task=d.default_task,
                                       format=d.format, on_error=d.on_bad_row, gold_free_tasks=gold_free(cfg),
                                       subset=d.subset, split=d.split, keys=("data.subset", "data.split")
                                       ).records
            except (ValueError, OSError) as err:
                raise InputError(f"dataset: {err}") from None
            records = records[:max_prompts] if max_prompts is not None else records
        check_verifiers(cfg, {task: ["dataset"] for task in {r.task for r in records}})
        metrics = evaluate_source(source, records, k=k if k is not None else cfg.eval.k,
                                  temperature=cfg.eval.temperature if temperature is None else temperature,
                                  seed=cfg.seed, device=device)
    return EvalResult(metrics=dict(metrics), prompts=len(records), model=source.model)


__all__ = ["EvalResult", "RunFailedError", "TrainResult", "evaluate", "override_layer", "train"]
