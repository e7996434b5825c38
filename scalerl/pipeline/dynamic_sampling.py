"""DAPO dynamic sampling: keep a group only if it carries a learning signal.

A group whose rewards are all equal has zero advantage for every sample, so it contributes no
gradient and shrinks the effective batch. DAPO (arXiv 2503.14476, Sec. 3.2) drops such groups and
keeps generating until the batch holds `B` informative ones. Here the decision is made per finished
group; the generator's admission loop refills the capacity a drop frees, so every mode gets the
behaviour without a mode-specific loop. Disabled, every group is kept (ScaleRL's zero-variance
filter then happens inside the trainer's loss instead).
"""

from __future__ import annotations

from collections.abc import Sequence

from scalerl.algorithms.filters import is_informative_group


class DynamicSampling:
    """Keep/drop decisions with counts of both."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = bool(enabled)
        self.kept = 0
        self.dropped = 0

    def keep(self, rewards: Sequence[float]) -> bool:
        keep = not self.enabled or is_informative_group(rewards)
        if keep:
            self.kept += 1
        else:
            self.dropped += 1
        return keep
