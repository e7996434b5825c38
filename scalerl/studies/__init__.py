"""Studies over recipes: which runs to make, running them, fitting and tabulating them.

* `variants`: leave-one-out and grid variants as override lists (pure; nothing runs).
* `runs`: the study runner (in process, one run after another, resumable, failures contained).
* `fitting`, `report`: each run fitted on the first half of its compute; seeds combined; the
  paper's Fig. 7 table (A, B, B at a shared A, C_mid, with intervals) and plots.
* `ablate` (`scalerl ablate`), `demo` (`scalerl demo`, settings in `demo.yaml`), `accuracy` (the
  predictive-accuracy study behind `benchmarks/predictive_accuracy.py`); their command lines are
  `scalerl.cli.ablate` and `scalerl.cli.demo`. Runs are built by `scalerl.assembly.run`.
* `ray_runs`: study runs as Ray tasks (`scalerl ablate --ray`).

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
