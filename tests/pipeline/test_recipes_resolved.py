"""Every preset, end to end: a one-step `scalerl train --recipe <name>` records in `resolved.json`
what its built trainer, advantage estimator, prompt pool, driver and engine use
(`scalerl.assembly.resolved`, read from the objects), and each entry equals the recipe's YAML
source (a key the recipe leaves unset: the built-in default of `RunConfig()`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from scalerl.cli import main
from scalerl.config import RunConfig
from scalerl.recipes import recipe_path
from tests.tiny_runs import warm_tiny_model

from .test_recipes_train import _config, _steps


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return warm_tiny_model(tmp_path_factory)

RECIPES = sorted(p.stem for p in recipe_path("scalerl").parent.glob("*.yaml"))
DEFAULTS = RunConfig().model_dump(mode="json")
PROMPTS_PER_STEP = 2  # the test's own config (`_config`), not the recipe's


def _source(recipe: str, dotted: str) -> Any:
    """The value the recipe's YAML file sets at `dotted`, else the built-in default."""
    node: Any = yaml.safe_load(recipe_path(recipe).read_text())
    default: Any = DEFAULTS
    for key in dotted.split("."):
        default = default[key]
        node = node.get(key, _UNSET) if isinstance(node, dict) else _UNSET
    return default if node is _UNSET else node


_UNSET = object()


def _expected(recipe: str) -> dict[str, Any]:
    a = lambda key: _source(recipe, f"algorithm.{key}")  # noqa: E731
    loss = a("loss_type")
    clipped = loss in ("grpo", "gspo")
    kl = a("kl_coef") > 0
    lc_kind = _source(recipe, "generation.length_control.kind")
    lc = lambda key: _source(recipe, f"generation.length_control.{key}")  # noqa: E731
    baseline = a("baseline")
    advantages: dict[str, Any] = {"baseline": baseline, "adv_norm": a("adv_norm")}
    if baseline == "critic":
        advantages.update(estimator="Critic", gamma=a("critic.gamma"), gae_lambda=a("critic.gae_lambda"),
                          value_clip=a("critic.value_clip"), updates_per_step=a("critic.updates_per_step"))
    else:
        advantages["estimator"] = "OutcomeAdvantages"
    mode, k = _source(recipe, "pipeline.off_policy"), _source(recipe, "pipeline.k")
    top_p, top_k = _source(recipe, "generation.top_p"), _source(recipe, "generation.top_k")
    truncates = top_p < 1.0 or top_k > 0
    return {
        "objective": {
            "loss_type": loss,
            "eps_low": a("eps_low") if clipped else None,
            "eps_high": a("eps_high") if clipped else None,
            "eps_max": a("eps_max") if loss == "cispo" else None,
            "dual_clip_c": a("dual_clip_c") if clipped else None,
            "kimi_tau": a("kimi_tau") if loss == "kimi" else None,
            "aggregation": a("aggregation"),
            "entropy_coef": a("entropy_coef"),
            "kl_coef": a("kl_coef"),
            "kl_estimator": a("kl_estimator") if kl else None,
            "kl_in_reward": a("kl_in_reward") if kl else None,
            "kl_reward_level": a("kl_reward_level") if kl and a("kl_in_reward") else None,
            "tis": {"level": a("tis.level"), "cap": a("tis.cap")} if a("tis.enabled") else None,
            "recompute_old_logprobs": a("recompute_old_logprobs"),
            "offpolicy_mask_delta": a("offpolicy_mask_delta"),
            "keep_sampling_mask": a("keep_sampling_mask"),
            "keep_routing": a("keep_routing"),
            "zero_variance_filter": a("zero_variance_filter"),
        },
        "advantages": advantages,
        "head": {"trainer_fp32_lm_head": _source(recipe, "model.fp32_lm_head"),
                 "engine_fp32_lm_head": _source(recipe, "model.fp32_lm_head")},
        "pool": {"no_positive_resampling": a("no_positive_resampling"),
                 "retire_threshold": a("retire_threshold"),
                 "curriculum": {key: a(f"curriculum.{key}") for key in DEFAULTS["algorithm"]["curriculum"]}},
        "driver": {
            "off_policy": mode,
            "max_lag": k if mode == "pipeline" else (0 if mode == "sync" else k - 1),
            "prompts_per_step": PROMPTS_PER_STEP,
            "dynamic_sampling": a("dynamic_sampling"),
            "length_shaping": {"kind": lc_kind, "kimi_coef": lc("kimi_coef"),
                               "kimi_warmup_steps": lc("kimi_warmup_steps")}
            if lc_kind in ("kimi", "overlong_penalty") else None,
            "forced_interruption": lc_kind == "interruption",
            "top_p": top_p,
            "return_support": a("keep_sampling_mask") and truncates,
        },
    }


def _observed(resolved: dict[str, Any]) -> dict[str, Any]:
    """The entries of `resolved.json` that `_expected` predicts, in its shape."""
    exp_keys = _expected(RECIPES[0])
    obj = {k: resolved["objective"][k] for k in exp_keys["objective"]}
    adv = resolved["advantages"]
    shaping = resolved["driver"]["length_shaping"]
    drv = resolved["driver"]
    return {
        "objective": obj,
        "advantages": {k: adv[k] for k in adv if k not in ("value_lambda", "critic_lr")},
        "head": {k: resolved["head"][k] for k in ("trainer_fp32_lm_head", "engine_fp32_lm_head")},
        "pool": resolved["pool"],
        "driver": {
            "off_policy": drv["off_policy"], "max_lag": drv["max_lag"],
            "prompts_per_step": drv["prompts_per_step"],
            "dynamic_sampling": drv["dynamic_sampling"],
            "length_shaping": None if shaping is None else {k: shaping[k] for k in
                                                            ("kind", "kimi_coef", "kimi_warmup_steps")},
            "forced_interruption": drv["forced_interruption"] is not None,
            "top_p": drv["sampling"]["top_p"],
            "return_support": drv["sampling"]["return_support"],
        },
    }


def test_every_preset_is_covered() -> None:
    assert len(RECIPES) >= 14 and "scalerl" in RECIPES and "base" in RECIPES


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_preset_run_uses_what_its_recipe_says(recipe: str, tiny_model: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / recipe
    assert main(["train", "--recipe", recipe, "-c", str(_config(tiny_model, run_dir, 1))]) == 0
    assert [r["step"] for r in _steps(run_dir)] == [1]
    resolved = json.loads((run_dir / "resolved.json").read_text())
    assert resolved["trainer"] == "Trainer"
    want, got = _expected(recipe), _observed(resolved)
    for section in want:
        assert got[section] == want[section], (recipe, section)
