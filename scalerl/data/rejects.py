"""Bad input rows: the error they raise and the tally kept when they are skipped instead.

Every place that can drop a row (loading, validation, tokenization, splitting) reports it here, so
a run can always say how many rows it lost and where the first few were, rather than crashing deep
in training or silently shrinking the prompt set.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

OnError = Literal["error", "skip"]
ON_ERROR_CHOICES: tuple[str, ...] = ("error", "skip")

logger = logging.getLogger("scalerl.data")


class DataError(ValueError):
    """Bad prompt data. The message names the file:line (or record id) and the field."""


class MissingDataError(DataError, FileNotFoundError):
    """A prompt file or folder that does not exist."""


class RowError(Exception):
    """One row is unusable; `reason` is a short category used for counting ("missing answer", ...)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class RejectLog:
    """Rows rejected so far, counted by reason, with the locations of the first few of each reason."""

    max_examples: int = 5
    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __bool__(self) -> bool:
        return self.total > 0

    def add(self, reason: str, where: str, message: str) -> None:
        self.counts[reason] += 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < self.max_examples:
            shown.append(f"{where}: {message}" if where else message)

    def merge(self, other: RejectLog) -> None:
        for reason, n in other.counts.items():
            self.counts[reason] += n
            shown = self.examples.setdefault(reason, [])
            room = self.max_examples - len(shown)
            shown.extend(other.examples.get(reason, [])[: max(room, 0)])

    def summary(self) -> str:
        """Multi-line report: the total, then each reason with its count and first locations."""
        if not self.total:
            return "no rows rejected"
        lines = [f"{self.total} row(s) rejected:"]
        for reason, n in self.counts.most_common():
            lines.append(f"  {reason}: {n}")
            lines.extend(f"    {ex}" for ex in self.examples.get(reason, []))
            hidden = n - len(self.examples.get(reason, []))
            if hidden > 0:
                lines.append(f"    ... and {hidden} more")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, int]:
        return dict(self.counts)


def check_on_error(on_error: str) -> OnError:
    if on_error not in ON_ERROR_CHOICES:
        raise ValueError(f"on_error: must be one of {ON_ERROR_CHOICES}, got {on_error!r}")
    return on_error  # type: ignore[return-value]


#: How each interface drops-and-counts bad rows instead of failing.
SKIP_HINT = ("(to drop and count these rows instead: `data.on_bad_row: skip` in a run config or "
             "`data.on_bad_row=skip` on the command line, `--skip` for `scalerl data check`, "
             "`on_error='skip'` in Python)")


def settle(rejects: RejectLog, on_error: OnError, what: str) -> None:
    """End of a pass over `what`: raise with every bad row listed, or log the skipped ones.

    Raising only after the whole pass (not at the first bad row) lets one error message tell the
    user every problem in the file at once, with the count.
    """
    if not rejects:
        return
    if on_error == "error":
        raise DataError(f"{what}: {rejects.summary()}\n{SKIP_HINT}")
    logger.warning("%s: skipped %s", what, rejects.summary())
