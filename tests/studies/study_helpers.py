"""Shared pieces of the study tests: a tiny real config, and a stand-in for `train_run` that writes a
run directory whose held-out curve is a known sigmoid (so fits can be checked against the truth)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from scalerl.config import RunConfig, config_to_yaml

# The smallest run that exercises the real pipeline: a 1-layer model, 2 groups of 2 per step.
TINY_OVERRIDES: list[str] = [
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "model.tiny.num_heads=2",
    "model.tiny.num_kv_heads=1",
    "model.tiny.intermediate_size=64",
    "model.tiny.max_position_embeddings=512",
    "data.synthetic.num_prompts=40",
    "data.heldout_size=4",
    "generation.n=2",
    "generation.max_new_tokens=12",
    "generation.max_batch_size=8",
    "generation.length_control.kind=none",
    "pipeline.prompts_per_step=2",
    "pipeline.k=2",
    "eval.every=1",
    "eval.k=2",
    "logging.progress=false",
    "rewards.max_workers=1",
    "max_steps=2",
]


def sigmoid(c: np.ndarray, A: float, B: float, C_mid: float, R0: float) -> np.ndarray:
    out = np.full(c.shape, R0, dtype=np.float64)
    pos = c > 0
    out[pos] = R0 + (A - R0) / (1.0 + (C_mid / c[pos]) ** B)
    return out


def write_curve(run_dir: Path, cfg: RunConfig, A: float, B: float = 1.5, C_mid: float = 40.0, R0: float = 0.2,
                n_evals: int = 21, span: float = 200.0, noise: float = 0.0, seed: int = 0) -> None:
    """A finished-looking run directory: config.yaml and eval rows on the given sigmoid."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config_to_yaml(cfg))
    rng = np.random.default_rng(seed)
    x = np.linspace(0.0, span, n_evals)
    y = sigmoid(x, A, B, C_mid, R0) + noise * rng.standard_normal(n_evals)
    with (run_dir / "metrics.jsonl").open("w") as fh:
        for i, (c, r) in enumerate(zip(x, y, strict=True)):
            fh.write(json.dumps({"kind": "step", "step": i, "loss": 0.1}) + "\n")
            row = {"kind": "eval", "step": i, "val_pass_rate": float(r), "flops": float(c) * 1e9,
                   "compute_device_hours": float(c)}
            fh.write(json.dumps(row) + "\n")


class FakeTrain:
    """`train_run` stand-in: records its calls, writes a sigmoid run, or raises for chosen runs.

    `curve(cfg)` gives the (A, B, C_mid) of a run from its config.
    """

    def __init__(self, curve: Callable[[RunConfig], tuple[float, float, float]] | None = None,
                 fail: set[str] | None = None, noise: float = 0.003) -> None:
        self.curve = curve or (lambda cfg: (0.6, 1.5, 40.0))
        self.fail = fail or set()
        self.noise = noise
        self.calls: list[tuple[str, Any]] = []

    def __call__(self, cfg: RunConfig, run_dir: Path, *, resume: Path | None = None,
                 device: str | None = None) -> int:
        self.calls.append((cfg.name, resume))
        if cfg.name in self.fail:
            (Path(run_dir) / "metrics.jsonl").parent.mkdir(parents=True, exist_ok=True)
            (Path(run_dir) / "metrics.jsonl").write_text("")
            raise RuntimeError(f"boom in {cfg.name}")
        A, B, C_mid = self.curve(cfg)
        seed = int(cfg.generation.seed) + 17 * int(math.fsum(map(ord, cfg.name)))
        write_curve(Path(run_dir), cfg, A, B, C_mid, noise=self.noise, seed=seed)
        return 0

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.calls]
