from __future__ import annotations

from pathlib import Path

import pytest

from scalerl.config import (
    ConfigError,
    RunConfig,
    config_to_yaml,
    load_config,
    parse_override,
)


def test_defaults_are_the_scalerl_recipe() -> None:
    cfg = RunConfig()
    assert cfg.algorithm.loss_type == "cispo"
    assert cfg.algorithm.aggregation == "prompt"
    assert cfg.algorithm.adv_norm == "batch"
    assert cfg.pipeline.off_policy == "pipeline" and cfg.pipeline.max_lag == 8
    assert cfg.model.fp32_lm_head and cfg.algorithm.zero_variance_filter
    assert cfg.optim.eps == 1e-15 and cfg.optim.weight_decay == 0.01


def test_override_values_are_parsed_as_yaml() -> None:
    assert parse_override("optim.lr=3e-4") == (["optim", "lr"], 3e-4)
    assert parse_override("generation.length_control.think_budget=[8, 16]") == (
        ["generation", "length_control", "think_budget"],
        [8, 16],
    )
    assert parse_override("algorithm.dual_clip_c=null") == (["algorithm", "dual_clip_c"], None)
    with pytest.raises(ConfigError, match=r"expected key\.path=value"):
        parse_override("optim.lr")


def test_yaml_then_overrides_later_wins(tmp_path: Path) -> None:
    f = tmp_path / "a.yaml"
    f.write_text("name: a\npipeline:\n  off_policy: sync\n  k: 2\n")
    cfg = load_config(f, overrides=["pipeline.k=4", "name=b"])
    assert (cfg.name, cfg.pipeline.off_policy, cfg.pipeline.k) == ("b", "sync", 4)


def test_unknown_key_names_path_line_and_suggestion(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("name: x\nalgorithm:\n  los_type: cispo\n")
    with pytest.raises(ConfigError) as info:
        load_config(f)
    msg = str(info.value)
    assert f"{f}:3: algorithm.los_type: unknown key" in msg
    assert "did you mean 'loss_type'" in msg


def test_bad_value_names_key_and_origin(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["optim.lr=-1", "algorithm.loss_type=ppo"])
    msg = str(info.value)
    assert "override 'optim.lr=-1': optim.lr: Input should be greater than 0" in msg
    assert "algorithm.loss_type" in msg and "'ppo'" in msg


def test_override_into_scalar_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"'name\.sub=1': name: Input should be a valid string"):
        load_config(overrides=["name.sub=1"])


def test_invalid_think_budget_order() -> None:
    with pytest.raises(ConfigError, match="think_budget"):
        load_config(overrides=["generation.length_control.think_budget=[10, 5]"])


def test_synthetic_level_weights_are_checked_against_the_range() -> None:
    cfg = load_config(overrides=["data.synthetic.difficulty=[4,8]", "data.synthetic.weights=[3,0,0,0,1]"])
    assert cfg.data.synthetic.weights == [3, 0, 0, 0, 1]
    with pytest.raises(ConfigError, match=r"data\.synthetic.*weights: need 5 non-negative weights"):
        load_config(overrides=["data.synthetic.difficulty=[4,8]", "data.synthetic.weights=[3,1]"])
    with pytest.raises(ConfigError, match="positive sum"):
        load_config(overrides=["data.synthetic.difficulty=[4,5]", "data.synthetic.weights=[0,0]"])
    with pytest.raises(ConfigError, match="math\\+code"):
        load_config(overrides=["data.synthetic.task=math+code", "data.synthetic.difficulty=[1,2]",
                               "data.synthetic.weights=[1,1]"])
    with pytest.raises(ConfigError, match=r"warm_start_difficulty: need 1 <= lo <= hi"):
        load_config(overrides=["data.synthetic.warm_start_difficulty=[5,4]"])


def test_missing_file_and_non_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    f = tmp_path / "list.yaml"
    f.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(f)


def test_yaml_round_trip(tmp_path: Path) -> None:
    cfg = load_config(overrides=["pipeline.off_policy=ppo_offpolicy", "generation.n=4"])
    f = tmp_path / "dump.yaml"
    f.write_text(config_to_yaml(cfg))
    assert load_config(f) == cfg


def test_a_rule_between_keys_names_each_key_and_where_it_was_set(tmp_path) -> None:
    """Issue: a cross-key rule was reported at the recipe's line with the whole resolved config on
    one line. Now: the keys, their values and where each was set."""
    from scalerl.config import ConfigError, load_config

    run = tmp_path / "run.yaml"
    run.write_text("algorithm:\n  baseline: critic\n")
    with pytest.raises(ConfigError) as info:
        load_config(run, overrides=["distributed.backend=ray"])
    text = str(info.value)
    lines = text.splitlines()
    assert len(lines) == 3, text  # the header, the rule, the keys
    assert lines[1].strip().startswith(f"{run}:2: algorithm.baseline: 'critic' (a value model")
    assert f"algorithm.baseline='critic' ({run}:2)" in lines[2]
    assert "distributed.backend='ray' (override 'distributed.backend=ray')" in lines[2]
    assert "'generation'" not in text and len(text) < 800  # never the whole config


def test_a_section_rule_names_its_keys_with_their_section(tmp_path) -> None:
    from scalerl.config import ConfigError, load_config

    with pytest.raises(ConfigError) as info:
        load_config(overrides=["agentic.context_strategy=summary"])
    head, keys = str(info.value).splitlines()[1:]
    assert head.strip() == ("override 'agentic.context_strategy=summary': agentic.context_strategy: "
                            "'summary' needs context_budget (tokens of one context window) or "
                            "context_fraction")
    assert keys.strip() == ("keys: agentic.context_strategy='summary' (override 'agentic.context_strategy="
                            "summary'), agentic.context_budget=None (default)")


def test_sandbox_keys_are_checked_at_load(tmp_path: Path) -> None:
    """`rewards.sandbox` is a typed section: a misspelt key or a bad bound is named with where it
    was set, at load time, and the saved config round-trips without machine paths in it."""
    f = tmp_path / "c.yaml"
    f.write_text("rewards:\n  sandbox:\n    max_parallel: 1\n    memroy_mb: 256\n")
    with pytest.raises(ConfigError) as info:
        load_config(f)
    assert f"{f}:4: rewards.sandbox.memroy_mb: unknown key (did you mean 'memory_mb'?)" in str(info.value)
    with pytest.raises(ConfigError, match=r"override 'rewards\.sandbox\.nproc=0': rewards\.sandbox\.nproc: "
                                          r"Input should be greater than 0"):
        load_config(overrides=["rewards.sandbox.nproc=0"])
    with pytest.raises(ConfigError, match=r"rewards\.sandbox\.isolation: Input should be 'auto'"):
        load_config(overrides=["rewards.sandbox.isolation=docker"])
    cfg = load_config(overrides=["rewards.sandbox.memory_mb=300", "rewards.sandbox.isolation=none"])
    assert cfg.rewards.sandbox.memory_mb == 300 and cfg.rewards.sandbox.tree_tasks == 18
    dumped = config_to_yaml(cfg)
    assert "python: null" in dumped and "unshare: null" in dumped  # resolved by the sandbox, not saved
    (tmp_path / "dump.yaml").write_text(dumped)
    assert load_config(tmp_path / "dump.yaml") == cfg
