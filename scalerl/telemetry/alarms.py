"""Instability alarms read off the step metrics.

ScaleRL (arXiv 2510.13786, A.15) found the truncation rate (share of responses cut at the
generation budget) to be the early signal of an unstable run: stable runs keep it low, runs that
later collapse show it climbing past ~10%. The alarm warns once when the rate crosses the threshold
and re-arms after it falls back below, so a sustained excursion is one warning, not one per step.
"""

from __future__ import annotations

import logging
import warnings

logger = logging.getLogger(__name__)

TRUNCATION_ALARM_THRESHOLD = 0.10


class TruncationWarning(UserWarning):
    """The truncation rate passed the alarm threshold."""


class TruncationAlarm:
    def __init__(self, threshold: float = TRUNCATION_ALARM_THRESHOLD) -> None:
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold: expected a rate in (0, 1), got {threshold}")
        self.threshold = threshold
        self.armed = True
        self.fired = 0

    def check(self, step: int, truncation_rate: float | None) -> str | None:
        """Return (and emit as a warning) the alarm message when the rate crosses the threshold."""
        if truncation_rate is None:
            return None
        if truncation_rate <= self.threshold:
            self.armed = True
            return None
        if not self.armed:
            return None
        self.armed = False
        self.fired += 1
        message = (
            f"step {step}: truncation rate {truncation_rate:.1%} is above {self.threshold:.0%}; "
            "rising truncation preceded instability in ScaleRL (A.15): consider a larger "
            "max_new_tokens, length control (interruption), or a lower learning rate"
        )
        logger.warning(message)
        warnings.warn(message, TruncationWarning, stacklevel=2)
        return message
