"""A FLOPs axis for logs that count tokens or steps, priced by scalerl's compute-meter convention.

Other frameworks log steps and tokens, not compute. ``FlopsAxis`` turns what they log into a
``flops`` column on every row, before the curve is built:

* ``tokens`` (``--x COL --params N``): each token is generated (or prefilled) once and trained
  on once: ``2N + 6N = 8N`` FLOPs per token.
* generated and trained tokens logged apart (``--gen-tokens COL --train-tokens COL --params N``):
  ``2N`` per generated or scored token, ``6N`` per trained token; ``--scored-tokens COL`` adds
  forward-only passes (a reference model, old-log-prob recomputation) at ``2N`` each.
* steps (``--x COL --flops-per-step F``): ``F`` per step.

The constants are those of ``scalerl.telemetry.compute`` (``FORWARD_FLOPS_PER_PARAM = 2``,
``TRAIN_FLOPS_PER_PARAM = 6``: Kaplan et al. 2020, arXiv 2001.08361, Sec. 2.1); they are written
out here because the fits never import torch, and ``tests/scaling/test_compute_axis.py`` checks
that the two agree. N counts the parameters that take part in a per-token matmul (the meter's N:
every parameter except the input-embedding table). The attention context term is left out, as in
the meter.

Columns are cumulative counts by default (TRL's ``num_tokens``, scalerl's ``tokens``);
``per_step=True`` sums per-step values in log order (verl's ``perf/total_num_tokens``). A row
without a column takes that column's last value before it (an evaluation logged between two
training logs); a row that comes before any value of a needed column gets no FLOPs, so a y
value there is an error naming the row.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scalerl.scaling.validation import CurveError

#: FLOPs per parameter per token of a forward pass (generation, prefill, scoring): as
#: ``scalerl.telemetry.compute.FORWARD_FLOPS_PER_PARAM``.
FORWARD_FLOPS_PER_PARAM = 2
#: FLOPs per parameter per token of a training forward + backward: as
#: ``scalerl.telemetry.compute.TRAIN_FLOPS_PER_PARAM``.
TRAIN_FLOPS_PER_PARAM = 6
#: The column the conversion writes (and the fit's x).
FLOPS_COLUMN = "flops"


@dataclass(frozen=True)
class FlopsAxis:
    """How to price a log's counts in FLOPs (see the module docstring).

    ``terms`` pairs each counted column with its FLOPs per unit; build one with ``from_tokens``,
    ``from_token_kinds`` or ``from_steps``.
    """

    terms: tuple[tuple[str, float], ...]
    description: str
    per_step: bool = False

    @staticmethod
    def from_tokens(column: str, n_params: float, per_step: bool = False) -> FlopsAxis:
        """``8N`` per token: generated once (``2N``) and trained once (``6N``)."""
        n = _params(n_params)
        rate = (FORWARD_FLOPS_PER_PARAM + TRAIN_FLOPS_PER_PARAM) * n
        return FlopsAxis(((column, rate),), f"flops = {column} x 8N = {column} x {rate:.6g} "
                         f"(N = {n:.6g}: each token generated once at 2N and trained once at 6N)", per_step)

    @staticmethod
    def from_token_kinds(n_params: float, generated: str | None = None, trained: str | None = None,
                         scored: str | None = None, per_step: bool = False) -> FlopsAxis:
        """``2N`` per generated or scored token, ``6N`` per trained token."""
        n = _params(n_params)
        terms = [(col, float(k * n)) for col, k in ((generated, FORWARD_FLOPS_PER_PARAM),
                                                    (scored, FORWARD_FLOPS_PER_PARAM),
                                                    (trained, TRAIN_FLOPS_PER_PARAM)) if col]
        if not terms:
            raise CurveError("a FLOPs axis from token counts needs --gen-tokens, --train-tokens or "
                             "--scored-tokens")
        names = {generated: "2N", scored: "2N", trained: "6N"}
        text = " + ".join(f"{col} x {names[col]}" for col, _ in terms)
        return FlopsAxis(tuple(terms), f"flops = {text} (N = {n:.6g}: 2N per generated or scored token, "
                         "6N per trained token)", per_step)

    @staticmethod
    def from_steps(column: str, flops_per_step: float) -> FlopsAxis:
        """``F`` FLOPs per step (the user's own estimate of one step's compute)."""
        f = float(flops_per_step)
        if not math.isfinite(f) or f <= 0:
            raise CurveError(f"--flops-per-step: expected a positive number, got {flops_per_step}")
        return FlopsAxis(((column, f),), f"flops = {column} x {f:.6g} (--flops-per-step)")

    def columns(self) -> tuple[str, ...]:
        return tuple(col for col, _ in self.terms)

    def apply(self, rows: Sequence[tuple[int, Mapping[str, object]]],
              where: Callable[[int, str], str]) -> list[tuple[int, dict[str, object]]]:
        """Every row with a ``flops`` value (rows before any count of a column get none).

        ``where(n, column)`` locates row ``n`` for an error message. A count that is not a finite
        number >= 0, or a cumulative count that goes down, is an error naming the row.
        """
        state: dict[str, float] = {}
        prev: dict[str, tuple[int, float]] = {}
        out = []
        for n, row in rows:
            for col, _ in self.terms:
                value = row.get(col)
                if value is None or (isinstance(value, str) and not value.strip()):
                    continue
                v = _count(value, where(n, col), col)
                if self.per_step:
                    state[col] = state.get(col, 0.0) + v
                else:
                    if col in prev and v < prev[col][1]:
                        raise CurveError(
                            f"{where(n, col)}: {col} = {v:g} goes down "
                            f"(an earlier row has {prev[col][1]:g}); "
                            "a per-step count? pass --per-step")
                    prev[col] = (n, v)
                    state[col] = v
            new = {k: v for k, v in row.items() if k != FLOPS_COLUMN}
            if all(col in state for col, _ in self.terms):
                new[FLOPS_COLUMN] = sum(rate * state[col] for col, rate in self.terms)
            out.append((n, new))
        if not any(col in state for col, _ in self.terms):
            raise CurveError(f"no row has {' or '.join(self.columns())}: nothing to convert to FLOPs")
        return out


def _params(n_params: float) -> float:
    n = float(n_params)
    if not math.isfinite(n) or n <= 0:
        raise CurveError(f"--params: expected a positive parameter count, got {n_params}")
    return n


def _count(value: object, where: str, column: str) -> float:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise CurveError(f"{where}: {column} = {value!r} is not a number") from None
    if isinstance(value, bool) or not math.isfinite(v) or v < 0:
        raise CurveError(f"{where}: {column} = {value!r} is not a count (a finite number >= 0)")
    return v
