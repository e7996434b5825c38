"""Ablation studies over recipes: which runs to make (`variants`); the runner comes later.

    from scalerl.recipes import load_recipe_config
    from scalerl.studies import grid_variants, loo_variants, parse_grid_arg

    base = load_recipe_config("scalerl")
    for v in loo_variants(base):  # one run per design axis reverted to the paper's baseline
        print(v.name, v.overrides)
    for v in grid_variants(base, dict([parse_grid_arg("pipeline.k=1,4,8")])):
        print(v.name, v.overrides)
"""

from scalerl.studies.variants import (
    LOO_AXES,
    LooAxis,
    Variant,
    apply_variant,
    check_key,
    format_value,
    grid_variants,
    loo_axis_names,
    loo_variants,
    override,
    parse_grid_arg,
    parse_grid_args,
)

__all__ = [
    "LOO_AXES",
    "LooAxis",
    "Variant",
    "apply_variant",
    "check_key",
    "format_value",
    "grid_variants",
    "loo_axis_names",
    "loo_variants",
    "override",
    "parse_grid_arg",
    "parse_grid_args",
]
