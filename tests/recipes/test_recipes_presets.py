"""The bundled recipes: each loads, carries the settings its source assigns, and layers correctly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from scalerl.config import ConfigError, RunConfig, load_config
from scalerl.recipes import (
    RECIPES_DIR,
    list_recipes,
    load_recipe_config,
    recipe_info,
    recipe_names,
    recipe_path,
)

EXPECTED_NAMES = [
    "base",
    "deepseek_grpo",
    "deepseek_v32",
    "dr_grpo",
    "gspo",
    "kimi_k15",
    "magistral",
    "minimax",
    "ppo_orz",
    "qwen_dapo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "rloo",
    "scalerl",
]

# What each source assigns (ScaleRL Sec. 2 / 4 / App. A.16, Dr. GRPO Sec. 3.1, GSPO Sec. 5.1).
PAPER_SETTINGS: dict[str, dict[str, Any]] = {
    "scalerl": {
        "algorithm.loss_type": "cispo",
        "algorithm.aggregation": "prompt",
        "algorithm.adv_norm": "batch",
        "algorithm.zero_variance_filter": True,
        "algorithm.dynamic_sampling": False,
        "algorithm.no_positive_resampling": True,
        "algorithm.retire_threshold": 0.9,
        "algorithm.kl_coef": 0.0,
        "model.fp32_lm_head": True,
        "pipeline.off_policy": "pipeline",
        "pipeline.k": 8,
        "generation.length_control.kind": "interruption",
    },
    "base": {
        "algorithm.loss_type": "grpo",
        "algorithm.eps_low": 0.2,
        "algorithm.eps_high": 0.28,
        "algorithm.aggregation": "sample",
        "algorithm.adv_norm": "group",
        "algorithm.kl_coef": 0.0,
        "algorithm.zero_variance_filter": False,
        "algorithm.no_positive_resampling": False,
        "model.fp32_lm_head": False,
    },
    "deepseek_grpo": {
        "algorithm.loss_type": "grpo",
        "algorithm.eps_low": 0.2,
        "algorithm.eps_high": 0.2,
        "algorithm.aggregation": "sample",
        "algorithm.adv_norm": "group",
        "algorithm.kl_coef": 0.0,
        "pipeline.off_policy": "ppo_offpolicy",
        "pipeline.k": 8,
        "model.fp32_lm_head": False,
        "algorithm.zero_variance_filter": False,
    },
    "qwen_dapo": {
        "algorithm.loss_type": "grpo",
        "algorithm.eps_low": 0.2,
        "algorithm.eps_high": 0.26,
        "algorithm.aggregation": "prompt",
        "pipeline.off_policy": "ppo_offpolicy",
        "pipeline.k": 8,
        "algorithm.zero_variance_filter": True,
        "algorithm.dynamic_sampling": False,
        "model.fp32_lm_head": False,
    },
    "magistral": {
        "algorithm.loss_type": "grpo",
        "algorithm.eps_low": 0.2,
        "algorithm.eps_high": 0.26,
        "algorithm.aggregation": "prompt",
        "pipeline.off_policy": "pipeline",
        "pipeline.k": 8,
        "algorithm.zero_variance_filter": True,
    },
    "minimax": {
        "algorithm.loss_type": "cispo",
        "model.fp32_lm_head": True,
        "pipeline.off_policy": "ppo_offpolicy",
        "algorithm.aggregation": "prompt",
        "algorithm.zero_variance_filter": True,
        "algorithm.no_positive_resampling": False,
    },
    "dr_grpo": {
        "algorithm.loss_type": "grpo",
        "algorithm.aggregation": "constant",
        "algorithm.adv_norm": "none",
        "algorithm.kl_coef": 0.0,
    },
    "gspo": {
        "algorithm.loss_type": "gspo",
        "algorithm.eps_low": 3e-4,
        "algorithm.eps_high": 4e-4,
        "algorithm.aggregation": "sample",
        "algorithm.adv_norm": "group",
    },
    # RLOO (arXiv 2402.14740) Sec. 3.2: leave-one-out baseline, REINFORCE on-policy, sequence-level.
    "rloo": {
        "algorithm.baseline": "leave_one_out",
        "algorithm.adv_norm": "none",
        "algorithm.aggregation": "constant",
        "pipeline.off_policy": "sync",
        "algorithm.kl_coef": 0.0,
    },
    # REINFORCE++ (arXiv 2501.03262) eq. 8-10: token KL in the reward, global whitening, PPO clip.
    "reinforce_pp": {
        "algorithm.baseline": "none",
        "algorithm.adv_norm": "batch",
        "algorithm.kl_in_reward": True,
        "algorithm.kl_reward_level": "token",
        "algorithm.loss_type": "grpo",
    },
    "reinforce_pp_baseline": {
        "algorithm.baseline": "group_mean",
        "algorithm.adv_norm": "batch",
        "algorithm.kl_in_reward": True,
        "algorithm.kl_reward_level": "token",
    },
    # Open-Reasoner-Zero (arXiv 2503.24290) Sec. 2.2: PPO, GAE gamma = lambda = 1, no KL, critic lr 5x.
    "ppo_orz": {
        "algorithm.baseline": "critic",
        "algorithm.critic.gamma": 1.0,
        "algorithm.critic.gae_lambda": 1.0,
        "algorithm.critic.lr_scale": 5.0,
        "algorithm.adv_norm": "batch",
        "algorithm.kl_coef": 0.0,
        "algorithm.loss_type": "grpo",
    },
    # Kimi k1.5 (arXiv 2501.12599) Sec. 2.3.2-2.3.4.
    "kimi_k15": {
        "algorithm.loss_type": "kimi",
        "algorithm.baseline": "group_mean",
        "algorithm.adv_norm": "none",
        "algorithm.aggregation": "sample",
        "algorithm.curriculum.order": "easy_to_hard",
        "algorithm.curriculum.priority": "failure_rate",
        "generation.length_control.kind": "kimi",
        "pipeline.off_policy": "ppo_offpolicy",
    },
    # DeepSeek-V3.2 (arXiv 2512.02556) Sec. 3.1.
    "deepseek_v32": {
        "algorithm.loss_type": "grpo",
        "algorithm.adv_norm": "none",
        "algorithm.kl_estimator": "unbiased_k3",
        "algorithm.keep_sampling_mask": True,
        "generation.top_p": 0.95,
    },
}

# Every recipe writes these out, so its meaning never depends on the built-in defaults.
AXIS_KEYS = (
    "algorithm.loss_type",
    "algorithm.aggregation",
    "algorithm.baseline",
    "algorithm.adv_norm",
    "algorithm.kl_coef",
    "algorithm.zero_variance_filter",
    "algorithm.dynamic_sampling",
    "algorithm.no_positive_resampling",
    "model.fp32_lm_head",
    "pipeline.off_policy",
    "pipeline.k",
    "generation.length_control.kind",
)
# Algorithmic choices only: nothing that names a model, data, or output location.
ALLOWED_KEYS = {
    *AXIS_KEYS,
    "algorithm.eps_low",
    "algorithm.eps_high",
    "algorithm.eps_max",
    "algorithm.retire_threshold",
    "pipeline.prompts_per_step",
    "algorithm.kimi_tau",
    "algorithm.kl_in_reward",
    "algorithm.kl_reward_level",
    "algorithm.kl_estimator",
    "algorithm.offpolicy_mask_delta",
    "algorithm.keep_sampling_mask",
    *(f"algorithm.critic.{k}" for k in ("gamma", "gae_lambda", "value_lambda", "length_adaptive_alpha",
                                        "value_clip", "lr_scale", "updates_per_step")),
    *(f"algorithm.curriculum.{k}" for k in ("order", "priority", "ramp_prompts", "start_fraction")),
    "generation.top_p",
    "generation.length_control.kimi_coef",
    "generation.length_control.kimi_warmup_steps",
}


def _get(cfg: RunConfig, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _leaf_keys(tree: dict[str, Any], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for k, v in tree.items():
        path = f"{prefix}{k}"
        keys |= _leaf_keys(v, path + ".") if isinstance(v, dict) else {path}
    return keys


def _file_keys(name: str) -> set[str]:
    return _leaf_keys(yaml.safe_load(recipe_path(name).read_text()))


def test_the_named_recipes_are_bundled_and_listed_with_descriptions() -> None:
    assert recipe_names() == EXPECTED_NAMES
    listed = list_recipes()
    assert [name for name, _ in listed] == EXPECTED_NAMES
    for name, description in listed:
        assert description, name
        assert "\n" not in description
        assert not description.startswith("Source"), name


@pytest.mark.parametrize("name", EXPECTED_NAMES)
def test_every_recipe_names_its_source(name: str) -> None:
    info = recipe_info(name)
    assert info.path == RECIPES_DIR / f"{name}.yaml"
    assert "arXiv" in info.source, info.source
    # The header is the file's first lines: description first, then the source.
    lines = info.path.read_text().splitlines()
    assert lines[0] == f"# {info.description}"
    assert lines[1] == f"# Source: {info.source}"


@pytest.mark.parametrize("name", EXPECTED_NAMES)
def test_every_recipe_loads_validates_and_records_its_name(name: str) -> None:
    cfg = load_recipe_config(name)
    assert isinstance(cfg, RunConfig)
    assert cfg.recipe == name
    # The file alone is a valid partial config too (what a user gets by copying it).
    plain = load_config(recipe_path(name))
    assert plain.model_dump(exclude={"recipe"}) == cfg.model_dump(exclude={"recipe"})


@pytest.mark.parametrize("name", EXPECTED_NAMES)
def test_each_recipe_has_the_settings_its_source_assigns(name: str) -> None:
    cfg = load_recipe_config(name)
    for key, want in PAPER_SETTINGS[name].items():
        got = _get(cfg, key)
        assert type(got) is type(want), (key, got)
        assert got == (pytest.approx(want, rel=1e-12) if isinstance(want, float) else want), (key, got)


@pytest.mark.parametrize("name", EXPECTED_NAMES)
def test_recipes_set_only_algorithmic_keys_and_write_every_axis_out(name: str) -> None:
    keys = _file_keys(name)
    assert keys <= ALLOWED_KEYS, sorted(keys - ALLOWED_KEYS)
    assert set(AXIS_KEYS) <= keys, sorted(set(AXIS_KEYS) - keys)
    cfg = load_recipe_config(name)
    loss = cfg.algorithm.loss_type
    # Each loss's own parameters are written; the other losses' are not (they would be unused).
    clip = {"algorithm.eps_low", "algorithm.eps_high"}
    if loss == "cispo":
        assert "algorithm.eps_max" in keys and not keys & clip
    elif loss == "kimi":
        assert "algorithm.kimi_tau" in keys and not keys & {*clip, "algorithm.eps_max"}
    else:
        assert clip <= keys and "algorithm.eps_max" not in keys
    assert ("algorithm.kimi_tau" in keys) == (loss == "kimi")
    # Settings of a component are written only where the component is used.
    assert any(k.startswith("algorithm.critic.") for k in keys) == (cfg.algorithm.baseline == "critic")
    if "algorithm.kl_reward_level" in keys:
        assert cfg.algorithm.kl_in_reward and cfg.algorithm.kl_coef > 0


def test_larger_batch_recipes_keep_the_papers_80_to_48_ratio_on_the_default_batch() -> None:
    default = RunConfig().pipeline.prompts_per_step
    for name in ("qwen_dapo", "magistral", "minimax"):
        assert load_recipe_config(name).pipeline.prompts_per_step == round(default * 80 / 48)
    for name in ("scalerl", "base", "deepseek_grpo", "dr_grpo", "gspo", "rloo", "reinforce_pp",
                 "reinforce_pp_baseline", "ppo_orz", "kimi_k15", "deepseek_v32"):
        assert "pipeline.prompts_per_step" not in _file_keys(name)


def test_magistral_is_qwen_dapo_with_pipeline_rl() -> None:
    dapo = load_recipe_config("qwen_dapo").model_dump(exclude={"recipe"})
    magistral = load_recipe_config("magistral").model_dump(exclude={"recipe"})
    assert dapo["pipeline"].pop("off_policy") == "ppo_offpolicy"
    assert magistral["pipeline"].pop("off_policy") == "pipeline"
    assert dapo == magistral


def test_user_files_then_overrides_win_over_the_recipe(tmp_path: Path) -> None:
    user = tmp_path / "mine.yaml"
    user.write_text("model:\n  name_or_path: some/model\npipeline:\n  k: 2\n")
    cfg = load_recipe_config("scalerl", user, overrides=["pipeline.k=4", "algorithm.loss_type=gspo"])
    assert cfg.model.name_or_path == "some/model"
    assert cfg.pipeline.k == 4
    assert cfg.algorithm.loss_type == "gspo"
    assert cfg.pipeline.off_policy == "pipeline"  # untouched recipe setting
    relabelled = tmp_path / "relabel.yaml"
    relabelled.write_text("recipe: my_scalerl\n")
    assert load_recipe_config("scalerl", relabelled).recipe == "my_scalerl"


def test_errors_in_user_layers_name_the_file_and_line(tmp_path: Path) -> None:
    user = tmp_path / "typo.yaml"
    user.write_text("algorithm:\n  los_type: grpo\n")
    with pytest.raises(ConfigError, match=r"typo\.yaml:2: algorithm\.los_type: unknown key"):
        load_recipe_config("scalerl", user)
    with pytest.raises(ConfigError, match=r"override 'pipeline\.k=0'"):
        load_recipe_config("base", overrides=["pipeline.k=0"])


@pytest.mark.parametrize("bad", ["nope", "../config", "scalerl.yaml", "", "SCALERL"])
def test_unknown_recipe_names_list_the_known_ones(bad: str) -> None:
    with pytest.raises(ValueError, match=r"known recipes: base, deepseek_grpo, .*scalerl") as err:
        recipe_path(bad)
    assert repr(bad) in str(err.value)
    with pytest.raises(ValueError, match="unknown recipe"):
        load_recipe_config(bad)


def test_the_docs_document_every_recipe_with_its_source() -> None:
    """docs/recipes.md's recipe table is the recipe headers, row for row, and the README names
    every recipe: a recipe added, renamed or re-sourced without updating the docs fails here."""
    root = Path(__file__).resolve().parents[2]
    docs, readme = (root / "docs" / "recipes.md").read_text(), (root / "README.md").read_text()
    for name in recipe_names():
        info = recipe_info(name)
        assert info.description and info.source, name
        assert f"| `{name}` | {info.description} | {info.source} |" in docs, name
        assert f"`{name}`" in readme, name


OFF_POLICY_LABELS = {"sync": "sync", "ppo_offpolicy": "PPO-off-policy-{k}", "pipeline": "PipelineRL-{k}"}


def _docs_table(heading: str) -> dict[str, list[str]]:
    """The first table under `heading` in docs/recipes.md: recipe name -> its row's cells."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "recipes.md").read_text()
    section = text.split(f"\n{heading}\n", 1)[1]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0].strip("`")] = cells[1:]
        elif rows and not line.startswith("|"):
            break
    return rows


def test_the_docs_settings_table_matches_each_recipe() -> None:
    """docs/recipes.md's settings table has a row per recipe whose aggregation, off-policy mode,
    FP32-head and prompts-per-step cells are the recipe's resolved values."""
    rows = _docs_table("## The recipes")
    assert sorted(rows) == EXPECTED_NAMES
    for name, cells in rows.items():
        cfg = load_recipe_config(name)
        _loss, aggregation, _adv, off_policy, fp32, *_filters, prompts, _length = cells
        assert aggregation == cfg.algorithm.aggregation, name
        assert off_policy == OFF_POLICY_LABELS[cfg.pipeline.off_policy].format(k=cfg.pipeline.k), name
        assert fp32 == ("yes" if cfg.model.fp32_lm_head else "no"), name
        assert int(prompts) == cfg.pipeline.prompts_per_step, name
