"""Leave-one-out and grid variants: counts, exact differences from the base, names, errors."""

from __future__ import annotations

import re
from typing import Any

import pytest

from scalerl.config import ConfigError, RunConfig, parse_override
from scalerl.recipes import load_recipe_config
from scalerl.studies import (
    LOO_AXES,
    Variant,
    apply_variant,
    check_key,
    format_value,
    grid_variants,
    loo_axis_names,
    loo_variants,
    parse_grid_arg,
    parse_grid_args,
)

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]*")


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _diff(a: RunConfig, b: RunConfig) -> dict[str, tuple[Any, Any]]:
    fa, fb = _flat(a.model_dump()), _flat(b.model_dump())
    return {k: (fa[k], fb[k]) for k in fa if fa[k] != fb[k]}


@pytest.fixture(scope="module")
def scalerl_cfg() -> RunConfig:
    return load_recipe_config("scalerl")


# ---------------------------------------------------------------------------------------------
# Leave-one-out

# For each axis, the keys (and new values) its ScaleRL leave-one-out run changes.
SCALERL_LOO = {
    "loo-loss": {"algorithm.loss_type": ("cispo", "grpo")},
    "loo-aggregation": {"algorithm.aggregation": ("prompt", "sample")},
    "loo-adv_norm": {"algorithm.adv_norm": ("batch", "group")},
    "loo-fp32_lm_head": {"model.fp32_lm_head": (True, False)},
    "loo-zero_variance_filter": {"algorithm.zero_variance_filter": (True, False)},
    "loo-no_positive_resampling": {"algorithm.no_positive_resampling": (True, False)},
    "loo-off_policy": {"pipeline.off_policy": ("pipeline", "ppo_offpolicy")},
    "loo-length_control": {"generation.length_control.kind": ("interruption", "overlong_penalty")},
}


def test_scalerl_has_one_loo_variant_per_axis_each_changing_exactly_its_keys(scalerl_cfg: RunConfig) -> None:
    variants = loo_variants(scalerl_cfg)
    assert len(variants) == len(LOO_AXES) == 8
    assert [v.name for v in variants] == list(SCALERL_LOO)
    for v in variants:
        assert _diff(scalerl_cfg, apply_variant(scalerl_cfg, v)) == SCALERL_LOO[v.name], v.name
        assert v.description
        assert SAFE_NAME.fullmatch(v.name)


def test_loo_overrides_also_apply_over_the_recipe_itself(scalerl_cfg: RunConfig) -> None:
    for v in loo_variants(scalerl_cfg):
        via_recipe = load_recipe_config("scalerl", overrides=v.overrides)
        assert via_recipe == apply_variant(scalerl_cfg, v)


def test_reverting_every_axis_of_scalerl_gives_the_papers_base_algorithm(scalerl_cfg: RunConfig) -> None:
    everything = [o for v in loo_variants(scalerl_cfg) for o in v.overrides]
    reverted = apply_variant(scalerl_cfg, everything)
    # The base recipe interrupts over-long thinking like every run of the paper; the length axis
    # reverts to the penalty it was compared against instead.
    base = load_recipe_config("base", overrides=["generation.length_control.kind=overlong_penalty"])
    assert _diff(reverted, base) == {"recipe": ("scalerl", "base")}


@pytest.mark.parametrize(
    ("recipe", "names"),
    [
        ("base", ["loo-length_control"]),
        ("qwen_dapo", ["loo-loss", "loo-aggregation", "loo-zero_variance_filter", "loo-length_control"]),
        (
            "minimax",
            [
                "loo-loss",
                "loo-aggregation",
                "loo-fp32_lm_head",
                "loo-zero_variance_filter",
                "loo-length_control",
            ],
        ),
    ],
)
def test_axes_a_base_already_shares_with_the_baseline_yield_no_variant(recipe: str, names: list[str]) -> None:
    cfg = load_recipe_config(recipe)
    variants = loo_variants(cfg)
    assert [v.name for v in variants] == names
    for v in variants:
        assert set(_diff(cfg, apply_variant(cfg, v))) == {o.split("=", 1)[0] for o in v.overrides}


def test_qwen_dapo_loss_axis_only_moves_the_clip_to_the_baseline() -> None:
    cfg = load_recipe_config("qwen_dapo")
    (loss,) = [v for v in loo_variants(cfg) if v.name == "loo-loss"]
    assert loss.overrides == ["algorithm.eps_high=0.28"]
    assert _diff(cfg, apply_variant(cfg, loss)) == {"algorithm.eps_high": (0.26, 0.28)}


def test_off_policy_axis_sets_k_8_when_the_base_uses_another_lag(scalerl_cfg: RunConfig) -> None:
    base = apply_variant(scalerl_cfg, ["pipeline.k=4"])
    (v,) = loo_variants(base, axes=["off_policy"])
    assert v.overrides == ["pipeline.off_policy=ppo_offpolicy", "pipeline.k=8"]


def test_axes_can_be_chosen_and_unknown_axes_are_named(scalerl_cfg: RunConfig) -> None:
    picked = loo_variants(scalerl_cfg, axes=["length_control", "loss"])
    assert [v.name for v in picked] == ["loo-loss", "loo-length_control"]  # LOO_AXES order
    assert loo_variants(scalerl_cfg, axes=[]) == []
    with pytest.raises(ValueError, match=r"unknown leave-one-out axis 'fp32'; axes: loss, aggregation"):
        loo_variants(scalerl_cfg, axes=["fp32"])
    assert loo_axis_names() == [a.name for a in LOO_AXES]


# ---------------------------------------------------------------------------------------------
# Grid


def test_grid_is_the_cartesian_product_last_key_fastest(scalerl_cfg: RunConfig) -> None:
    grid = {"pipeline.k": [1, 4, 8], "algorithm.loss_type": ["cispo", "grpo"]}
    variants = grid_variants(scalerl_cfg, grid)
    assert len(variants) == 6
    assert [v.name for v in variants] == [
        "k-1__loss_type-cispo",
        "k-1__loss_type-grpo",
        "k-4__loss_type-cispo",
        "k-4__loss_type-grpo",
        "k-8__loss_type-cispo",
        "k-8__loss_type-grpo",
    ]
    assert variants[3].overrides == ["pipeline.k=4", "algorithm.loss_type=grpo"]
    for v in variants:
        resolved = apply_variant(scalerl_cfg, v)
        k, loss = (o.split("=", 1)[1] for o in v.overrides)
        assert (resolved.pipeline.k, resolved.algorithm.loss_type) == (int(k), loss)
        assert set(_diff(scalerl_cfg, resolved)) <= {"pipeline.k", "algorithm.loss_type"}


def test_grid_sizes_multiply(scalerl_cfg: RunConfig) -> None:
    grid = {
        "optim.lr": [1e-4, 3e-4],
        "generation.n": [4, 8, 16],
        "model.fp32_lm_head": [True, False],
        "generation.length_control.think_budget": [[8, 16], [16, 32]],
    }
    variants = grid_variants(scalerl_cfg, grid)
    assert len(variants) == 2 * 3 * 2 * 2
    assert len({v.name for v in variants}) == len(variants)
    assert all(SAFE_NAME.fullmatch(v.name) for v in variants)
    assert apply_variant(scalerl_cfg, variants[-1]).generation.length_control.think_budget == (16, 32)


def test_grid_names_use_full_paths_when_leaf_names_clash(scalerl_cfg: RunConfig) -> None:
    (v,) = grid_variants(scalerl_cfg, {"pipeline.k": [2], "eval.k": [3]})
    assert v.name == "pipeline.k-2__eval.k-3"


def test_grid_names_keep_distinct_values_distinct(scalerl_cfg: RunConfig) -> None:
    variants = grid_variants(scalerl_cfg, {"model.name_or_path": [None, "null", "org/model", "org_model"]})
    names = [v.name for v in variants]
    assert len(set(names)) == 4
    assert names[0] == "name_or_path-null" and names[3] == "name_or_path-org_model"
    resolved = [apply_variant(scalerl_cfg, v).model.name_or_path for v in variants]
    assert resolved == [None, "null", "org/model", "org_model"]


def test_grid_names_are_bounded(scalerl_cfg: RunConfig) -> None:
    (v,) = grid_variants(scalerl_cfg, {"data.system_prompt": ["x" * 400]})
    assert len(v.name) <= 200 and SAFE_NAME.fullmatch(v.name)


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ({"pipeline.kk": [1]}, r"pipeline\.kk: unknown key 'pipeline\.kk' \(did you mean 'k'\?\)"),
        ({"pipelin.k": [1]}, r"pipelin\.k: unknown key 'pipelin'"),
        ({"pipeline": [1]}, r"pipeline: is a section, not a setting; its keys: off_policy, k"),
        ({"pipeline.k.x": [1]}, r"pipeline\.k\.x: pipeline\.k is a setting"),
        ({"pipeline.k": []}, r"pipeline\.k: no value to try"),
        ({"pipeline.k": [2, 2]}, r"pipeline\.k: value 2 given twice"),
        ({"pipeline.k": [1, 0]}, r"pipeline\.k: value 0 is not valid: .*pipeline\.k"),
        ({"algorithm.loss_type": ["ppo"]}, r"algorithm\.loss_type: value 'ppo' is not valid"),
        ({}, r"grid: no key to vary"),
    ],
)
def test_bad_grids_are_errors_naming_the_key(scalerl_cfg: RunConfig, grid: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        grid_variants(scalerl_cfg, grid)


def test_parse_grid_arg_reads_values_like_overrides() -> None:
    assert parse_grid_arg("pipeline.k=1,4,8") == ("pipeline.k", [1, 4, 8])
    assert parse_grid_arg("optim.lr=3e-4, 1e-4") == ("optim.lr", [3e-4, 1e-4])
    assert parse_grid_arg("model.fp32_lm_head=true,false") == ("model.fp32_lm_head", [True, False])
    assert parse_grid_arg("model.name_or_path=null,a/b") == ("model.name_or_path", [None, "a/b"])
    assert parse_grid_arg("generation.length_control.think_budget=[8, 16],[16,32]") == (
        "generation.length_control.think_budget",
        [[8, 16], [16, 32]],
    )
    assert parse_grid_arg('data.system_prompt="a, b",c') == ("data.system_prompt", ["a, b", "c"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pipeline.k", r"expected key\.path=v1,v2"),
        ("pipeline.k=", r"pipeline\.k: .*empty value"),
        ("pipeline.k=1,,2", r"pipeline\.k: .*empty value"),
        ("pipeline.kk=1", r"pipeline\.kk: unknown key"),
        ("=1", r"empty key segment"),
    ],
)
def test_parse_grid_arg_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_grid_arg(text)


def test_parse_grid_args_combines_and_rejects_repeated_keys(scalerl_cfg: RunConfig) -> None:
    grid = parse_grid_args(["pipeline.k=1,2", "algorithm.adv_norm=batch,group,none"])
    assert len(grid_variants(scalerl_cfg, grid)) == 6
    with pytest.raises(ValueError, match=r"pipeline\.k: given twice"):
        parse_grid_args(["pipeline.k=1", "pipeline.k=2"])


# ---------------------------------------------------------------------------------------------
# Values and keys


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("grpo", "grpo"),
        ("org/model-1.5B", "org/model-1.5B"),
        ("true", '"true"'),
        ("yes", '"yes"'),
        ("a b", '"a b"'),
        (True, "true"),
        (None, "null"),
        (8, "8"),
        (0.28, "0.28"),
        (1e-5, "1e-05"),
        (float("inf"), ".inf"),
        ((48, 64), "[48, 64]"),
        ({"prompt": "question"}, '{"prompt": "question"}'),
    ],
)
def test_format_value_round_trips_through_overrides(value: Any, text: str) -> None:
    assert format_value(value) == text
    back = parse_override(f"k={text}")[1]
    want = list(value) if isinstance(value, tuple) else value
    assert back == want and type(back) is type(want)


def test_values_an_override_cannot_carry_are_refused() -> None:
    with pytest.raises(ValueError, match="cannot be written as an override"):
        format_value("1e-3")  # an override reads it back as the number 0.001
    with pytest.raises(ValueError, match="cannot write"):
        format_value(object())


def test_check_key_accepts_settings_only() -> None:
    assert check_key("generation.length_control.kind") == ("generation", "length_control", "kind")
    with pytest.raises(ValueError, match="is a section"):
        check_key("generation.length_control")


def test_variant_overrides_that_do_not_validate_raise_config_errors(scalerl_cfg: RunConfig) -> None:
    with pytest.raises(ConfigError, match=r"pipeline\.k"):
        apply_variant(scalerl_cfg, Variant("bad", ["pipeline.k=0"]))
