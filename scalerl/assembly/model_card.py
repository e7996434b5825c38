"""The model card `scalerl export` writes beside the weights (`README.md`, Hugging Face's convention).

What a reader of an exported model needs to judge it, from the run's own files: the base model, the
data, the recipe and every key the run changed from it, the final held-out pass rate, and the
sigmoid fitted to the run's curve (A with its interval and whether the fit is flagged). Pushing to a
hub is the user's step (`huggingface-cli upload DIR`). A model that belongs to no run gets a card
that says so.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from scalerl.assembly.run import resolve_run_config
from scalerl.config import RunConfig
from scalerl.telemetry.metrics_log import METRICS_FILE, read_rows

#: Keys that name or place a run rather than train it: not listed as changes.
NOT_CHANGES = ("name", "output_dir", "recipe")


def _flat(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from _flat(value, f"{path}.")
        else:
            yield path, value


def changed_keys(cfg: RunConfig) -> dict[str, tuple[Any, Any]]:
    """key -> (the recipe's value, the run's) for every key the run sets differently from its recipe."""
    recipe = resolve_run_config(cfg.recipe or "scalerl", [], [])
    base = dict(_flat(recipe.model_dump(mode="json")))
    ours = dict(_flat(cfg.model_dump(mode="json")))
    return {k: (base.get(k), v) for k, v in sorted(ours.items())
            if base.get(k) != v and k.split(".")[0] not in NOT_CHANGES}


def _fit_lines(run_dir: Path) -> list[str]:
    from scalerl.scaling.analysis import FitOptions, analyze_curve
    from scalerl.scaling.io import read_run_dir
    from scalerl.scaling.validation import CurveError

    try:
        curve = read_run_dir(run_dir, x="flops")
        result = analyze_curve(curve, FitOptions(n_boot=200, errors="local_level"))
    except (CurveError, ValueError, OSError) as err:
        return [f"- no fit of the held-out curve: {err}"]
    fit = result.fit
    lo, hi = result.boot.interval("A") if result.boot is not None else (float("nan"), float("nan"))
    status = "ok" if result.reliable else "FLAGGED: " + "; ".join(result.warnings)
    return [f"- fitted asymptote A = {fit.A:.4f} (95% interval [{lo:.4f}, {hi:.4f}]), B = {fit.B:.3g}, "
            f"C_mid = {fit.C_mid:.4g} FLOPs, on {curve.x.size} evaluations",
            f"- fit status: {status}",
            f"- refit with `scalerl fit {run_dir} --x flops`"]


def model_card(model: str, run_dir: Path | None, cfg: RunConfig, merged_lora: bool) -> str:
    """The card's Markdown text."""
    lines = ["---", "library_name: transformers", "tags: [scalerl, reinforcement-learning]", "---", "",
             f"# {Path(model).name}", ""]
    if run_dir is None:
        lines += ["Exported by `scalerl export` from a model that belongs to no scalerl run: nothing "
                  "is known of how it was trained.", ""]
        return "\n".join(lines)
    base = cfg.model.name_or_path or "the embedded tiny default"
    data = (cfg.data.train_path or cfg.data.source
            or f"the built-in synthetic task `{cfg.data.synthetic.task}`")
    lines += [f"RL post-training with [scalerl](https://pypi.org/project/scalerl/) from `{model}`.", "",
              "## Training", "",
              f"- base model: `{base}`" + (" (LoRA adapter merged into it)" if merged_lora else ""),
              f"- data: `{data}`" if cfg.data.train_path else f"- data: {data}",
              f"- recipe: `{cfg.recipe or 'scalerl'}`, {cfg.max_steps} steps "
              f"(loss `{cfg.algorithm.loss_type}`, off-policy `{cfg.pipeline.off_policy}` "
              f"k={cfg.pipeline.k})"]
    changes = changed_keys(cfg)
    if changes:
        lines += ["", "Keys set differently from the recipe:", "",
                  "| key | recipe | this run |", "| --- | --- | --- |"]
        lines += [f"| `{k}` | `{a}` | `{b}` |" for k, (a, b) in changes.items()]
    lines += ["", "## Held-out pass rate", ""]
    evals = [r for r in read_rows(run_dir / METRICS_FILE) if r.get("kind") == "eval"] \
        if (run_dir / METRICS_FILE).is_file() else []
    if evals:
        last = evals[-1]
        lines.append(f"- final: {float(last['val_pass_rate']):.4f} at step {last['step']} "
                     f"(mean@{cfg.eval.k} on {cfg.data.heldout_size} held-out prompts)")
        lines += _fit_lines(run_dir)
    else:
        lines.append("- the run logged no evaluation")
    lines += ["", "Pushing to a hub is yours to do, e.g. `huggingface-cli upload NAME DIR`.", ""]
    return "\n".join(lines)


__all__ = ["changed_keys", "model_card"]
