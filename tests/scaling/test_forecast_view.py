"""What a person reads of the live forecast (scaling.live): one fit's state, the steady state
shown (hysteresis over fits), and the text the progress line and `scalerl watch` both print."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
from test_live_forecast import eval_rows, write_run

from scalerl.config import ForecastConfig
from scalerl.scaling.live import HOLD, fit_state, forecast_text, steady_state


def shown_per_fit(states: list[str], hold: int) -> list[str | None]:
    return [steady_state(states[: i + 1], hold) for i in range(len(states))]


def changes(seq: list[str | None]) -> int:
    return sum(1 for a, b in pairwise(seq) if a != b)


def test_a_state_that_alternates_fit_to_fit_is_shown_steady() -> None:
    noisy = ["open", "flagged", "open", "flagged", "open", "flagged", "open"]
    # Every fit's own state (hold 1, the rule without hysteresis) flips six times in seven fits.
    assert shown_per_fit(noisy, 1) == noisy and changes(shown_per_fit(noisy, 1)) == 6
    # Held for 2 fits before it shows, no alternation ever shows: the first state stays.
    assert shown_per_fit(noisy, 2) == ["open"] * 7
    assert HOLD == 2


def test_a_lasting_change_shows_hold_minus_one_fits_after_it_first_appears() -> None:
    real = ["open", "open", "open", "pinned", "pinned", "pinned"]
    assert shown_per_fit(real, 2) == ["open", "open", "open", "open", "pinned", "pinned"]
    assert shown_per_fit(real, 3) == ["open", "open", "open", "open", "open", "pinned"]
    # A blip inside a lasting state does not show; a change back after it does, once held.
    seq = ["flagged", "open", "open", "flagged", "open", "pinned", "pinned", "open", "open"]
    assert shown_per_fit(seq, 2) == ["flagged", "flagged", "open", "open", "open", "open", "pinned",
                                     "pinned", "open"]
    assert steady_state([]) is None
    with pytest.raises(ValueError, match="hold"):
        steady_state(["open"], 0)


def test_one_fits_state_pinned_means_unflagged_and_narrower_than_two_a_width() -> None:
    assert fit_state("ok", 0.60, 0.639, 0.02) == "pinned"  # 0.039 < 2 x 0.02
    assert fit_state("ok", 0.60, 0.641, 0.02) == "open"
    assert fit_state("ok", 0.60, 0.641, 0.025) == "pinned"
    assert fit_state("flagged:misfit", 0.60, 0.601, 0.02) == "flagged"  # narrow, not trusted
    assert fit_state("failed:no rise", None, None, 0.02) == "failed"


def test_the_text_shows_the_interval_and_the_point_only_once_pinned() -> None:
    row = {"forecast_A": 0.712, "forecast_A_lo": 0.70, "forecast_A_hi": 0.73, "forecast_status": "ok"}
    assert forecast_text({**row, "forecast_shown": "pinned"}) == "A 0.712 [0.700, 0.730] pinned"
    # The same fit while the shown state has not yet turned (hysteresis): no point.
    assert forecast_text({**row, "forecast_shown": "open"}) == "A in [0.700, 0.730], not pinned"
    flagged = {**row, "forecast_status": "flagged:A_at_bound", "forecast_shown": "flagged"}
    assert forecast_text(flagged) == "A in [0.700, 0.730], flagged:A_at_bound"
    # A row without the shown state (another reader's fit): its own state under a_width.
    assert forecast_text(row, a_width=0.02) == "A 0.712 [0.700, 0.730] pinned"
    assert forecast_text(row, a_width=0.01) == "A in [0.700, 0.730], not pinned"
    assert forecast_text({"val_pass_rate": 0.3}) is None
    assert forecast_text({"forecast_status": "failed:no data"}) == "A unknown (failed:no data)"


def test_eval_rows_log_the_steady_state_under_the_configured_a_width(tmp_path: Path) -> None:
    """A clean curve whose interval narrows: under a_width 0.035 the fits of the last two
    evaluations are pinned (width < 0.07), so the last row shows pinned (held 2 fits)."""
    rows = write_run(tmp_path / "r", eval_rows(16, noise=0.01), ForecastConfig(a_width=0.035))
    fits = [r for r in rows if r["kind"] == "eval" and "forecast_A" in r]
    own = []
    for r in fits:  # each fit's own state, written out: flagged, else pinned if width < 2 x 0.035
        width = r["forecast_A_hi"] - r["forecast_A_lo"]
        own.append("flagged" if r["forecast_status"] != "ok" else ("pinned" if width < 0.07 else "open"))
    shown = []
    for i, s in enumerate(own):  # the hysteresis rule, written out: change after 2 equal fits
        shown.append(s if i == 0 or (own[i - 1] == s) else shown[-1])
    assert [r["forecast_shown"] for r in fits] == shown
    assert own[-2:] == ["pinned", "pinned"] and shown[-1] == "pinned"
    assert "pinned" not in shown[:-2]  # the point is hidden until then
    assert forecast_text(fits[-1]).startswith(f"A {fits[-1]['forecast_A']:.3f} [")  # type: ignore[union-attr]
    assert forecast_text(fits[-3]).startswith("A in [")  # type: ignore[union-attr]


@pytest.mark.slow  # 11 fits of 1000 bootstrap resamples: about 30 s on one core
def test_on_the_demos_recorded_curve_the_swinging_point_is_hidden_and_the_state_holds() -> None:
    """The live forecast replayed on the demo's recorded curve (tests/scaling/data/demo_curve.csv,
    x = FLOPs), evaluations 11-21 (steps 100-200): the fits' point A swings between 0.73 and 1.0
    and their own state alternates ok/flagged five times; the state shown changes once (to open,
    held by the last two fits), and the point is never printed (never pinned)."""
    from dataclasses import replace

    from scalerl.scaling.io import read_curves
    from scalerl.scaling.live import forecast_curve

    (curve,) = read_curves(Path(__file__).parent / "data" / "demo_curve.csv", x="flops")
    cfg = ForecastConfig(x="flops")
    points, own, texts = [], [], []
    for k in range(11, curve.x.size + 1):
        sub = replace(curve, x=curve.x[:k], y=curve.y[:k], truncation=None,
                      extra={n: v[:k] for n, v in curve.extra.items()})
        f = forecast_curve(sub, cfg)
        assert f is not None and f.A is not None
        points.append(f.A)
        own.append(fit_state(f.status, f.A_lo, f.A_hi, cfg.a_width))
        texts.append(forecast_text({"forecast_A": f.A, "forecast_A_lo": f.A_lo, "forecast_A_hi": f.A_hi,
                                    "forecast_status": f.status, "forecast_shown": steady_state(own)}))
    assert max(points) - min(points) > 0.2
    shown = shown_per_fit(own, HOLD)
    assert changes(own) == 5 and changes(shown) == 1 and shown[-1] == "open" and own[-2:] == ["open"] * 2
    assert all(t is not None and t.startswith("A in [") for t in texts)
