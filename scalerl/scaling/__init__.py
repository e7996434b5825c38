"""Predictive compute scaling for RL post-training (ScaleRL, Khatri et al. 2025, arXiv 2510.13786).

From an early slice of a run's held-out reward curve, predict where it ends, with honest
uncertainty, and compare recipes the way the paper does. numpy/scipy only (matplotlib lazily for
plots): no torch, so it works on logs from any framework.

    from scalerl.scaling import fit_sigmoid, fit_power_law, bootstrap
    fit = fit_sigmoid(compute, reward, r0=None, min_compute=None, max_compute=None, method="fast")
    fit.A, fit.B, fit.C_mid, fit.R0, fit.predict(compute), fit.diagnostics
"""

from scalerl.scaling.compare import (
    Comparison,
    Recipe,
    compare,
    crossovers,
    efficiency_slope,
    efficiency_transform,
    fixed_A_refit,
    recipe_name,
    standing_at,
)
from scalerl.scaling.cross_model import CrossModelFit, efficiency_k, fit_cross_model
from scalerl.scaling.diagnostics import Diagnostics
from scalerl.scaling.downsample import record_breaking
from scalerl.scaling.forms import power_law_reward, sigmoid_power_law_D, sigmoid_reward
from scalerl.scaling.grids import PAPER_A_GRID, PAPER_C_MID_GRID, GridOptimum
from scalerl.scaling.io import Curve, read_curves, read_many, reference_csv
from scalerl.scaling.power_law import PowerLawFit, fit_power_law
from scalerl.scaling.sigmoid import SigmoidFit, fit_sigmoid
from scalerl.scaling.uncertainty import (
    Bootstrap,
    ProfileInterval,
    SeedSpread,
    bootstrap,
    profile_A,
    seed_spread,
)

__all__ = [
    "PAPER_A_GRID",
    "PAPER_C_MID_GRID",
    "Bootstrap",
    "Comparison",
    "CrossModelFit",
    "Curve",
    "Diagnostics",
    "GridOptimum",
    "PowerLawFit",
    "ProfileInterval",
    "Recipe",
    "SeedSpread",
    "SigmoidFit",
    "bootstrap",
    "compare",
    "crossovers",
    "efficiency_k",
    "efficiency_slope",
    "efficiency_transform",
    "fit_cross_model",
    "fit_power_law",
    "fit_sigmoid",
    "fixed_A_refit",
    "power_law_reward",
    "profile_A",
    "read_curves",
    "read_many",
    "recipe_name",
    "record_breaking",
    "reference_csv",
    "seed_spread",
    "sigmoid_power_law_D",
    "sigmoid_reward",
    "standing_at",
]
