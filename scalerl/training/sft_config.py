"""SFT hyper-parameters (no torch here: the command line builds `scalerl sft --help` from them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SFTConfig:
    """SFT hyper-parameters. The defaults are the tiny model's warm start (see docs/training.md)."""

    steps: int = 400
    batch_size: int = 32
    lr: float = 2e-3
    warmup_steps: int = 20
    weight_decay: float = 0.01
    grad_clip: float | None = 1.0
    seed: int = 0
    max_length: int = 512

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "max_length"):
            if getattr(self, name) <= 0:
                raise ValueError(f"sft.{name}: must be positive, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"sft.lr: must be positive, got {self.lr}")


__all__ = ["SFTConfig"]
