"""Shared fixtures for the scalerl.scaling tests: synthetic curves and the shipped reference data."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from scalerl.scaling.forms import sigmoid_reward
from scalerl.scaling.io import Curve, read_curves, reference_csv

SyntheticCurve = Callable[..., tuple[NDArray[np.float64], NDArray[np.float64]]]


@pytest.fixture
def synthetic() -> SyntheticCurve:
    """``make(A, B, C_mid, R0, c_max, n, noise, seed, c_min)`` -> (compute, reward) with Gaussian noise."""

    def make(
        A: float = 0.62,
        B: float = 1.8,
        C_mid: float = 5000.0,
        R0: float = 0.4,
        c_max: float = 50000.0,
        n: int = 60,
        noise: float = 0.005,
        seed: int = 0,
        c_min: float | None = None,
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        rng = np.random.default_rng(seed)
        c = np.linspace(c_min if c_min is not None else c_max / n, c_max, n)
        return c, sigmoid_reward(c, A, B, C_mid, R0) + rng.normal(0.0, noise, n)

    return make


@pytest.fixture(scope="session")
def dense_8b() -> Curve:
    """The digitized ScaleRL 8B dense curve of Fig. 1 (shipped as package data)."""
    return read_curves(reference_csv("scalerl_8b_dense_fig1a"))[0]


@pytest.fixture(scope="session")
def scout_moe() -> Curve:
    return read_curves(reference_csv("scalerl_scout_moe_fig1a"))[0]


def write_run(
    root: Path,
    name: str,
    compute: NDArray[np.float64],
    reward: NDArray[np.float64],
    config_name: str | None = None,
    steps_per_eval: int = 100,
    recipe: str | None = None,
) -> Path:
    """Write a scalerl-style run directory: step rows between eval rows, and a config.yaml."""
    d = root / name
    d.mkdir(parents=True)
    with (d / "metrics.jsonl").open("w") as fh:
        for i, (c, r) in enumerate(zip(compute, reward, strict=True)):
            step = i * steps_per_eval
            fh.write(json.dumps({"kind": "step", "step": step + 1, "loss": 0.5, "reward_mean": 0.1}) + "\n")
            fh.write(
                json.dumps(
                    {
                        "kind": "eval",
                        "step": step,
                        "epoch": step / 1000,
                        "compute_device_hours": float(c),
                        "flops": float(c) * 3.6e18,
                        "samples": step * 512,
                        "tokens": step * 512 * 1000,
                        "val_pass_rate": float(r),
                    }
                )
                + "\n"
            )
    if config_name is not None:
        extra = f"recipe: {recipe}\n" if recipe else ""
        (d / "config.yaml").write_text(f"name: {config_name}\nseed: 0\n{extra}")
    return d


@pytest.fixture
def run_writer() -> Callable[..., Path]:
    return write_run
