"""scalerl.scaling must work without torch (numpy/scipy only; matplotlib only when plotting)."""

from __future__ import annotations

import subprocess
import sys

# One fresh interpreter: list sys.modules after the imports, then again after drawing a plot.
PROBE = """
import sys
import scalerl.scaling, scalerl.cli.fit, scalerl.cli.fit_cross, scalerl.scaling.analysis, scalerl.scaling.logs
print(" ".join(sorted(sys.modules)))
import os, tempfile
import numpy as np
from scalerl.scaling import fit_sigmoid
from scalerl.scaling.plot import FitPlotItem, plot_fits
c = np.geomspace(100, 1e5, 20)
y = 0.3 + 0.3 / (1 + (3000 / c) ** 1.5)
plot_fits([FitPlotItem("x", fit_sigmoid(c, y))], os.path.join(tempfile.mkdtemp(), "a.png"))
print(" ".join(sorted(sys.modules)))
"""


def test_scaling_never_imports_torch_and_plots_without_pyplot() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=180, check=True
    )
    after_import, after_plot = (set(line.split()) for line in proc.stdout.splitlines()[-2:])
    assert "scalerl.scaling" in after_import and "scipy" in after_import
    for mods in (after_import, after_plot):
        assert not any(m == "torch" or m.startswith("torch.") for m in mods)
    assert "matplotlib" not in after_import  # imported lazily, only when a plot is requested
    assert not any(m.split(".")[0] == "tensorboard" for m in after_import)  # only to read event files
    assert "matplotlib" in after_plot
    assert "matplotlib.pyplot" not in after_plot  # Figure + Agg canvas: no global backend state
