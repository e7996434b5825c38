"""One object a training loop logs through: metrics file, optional sinks, alarm, progress bar.

`log_step` / `log_eval` stamp every row with the compute meter's cumulative totals (so each eval
row carries `compute_device_hours`, `flops`, `samples`, `tokens`, the x axis of the scaling fits),
append it to `metrics.jsonl`, forward it to TensorBoard / W&B when enabled, check the truncation
alarm and move the progress bar.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from scalerl.config import LoggingConfig
from scalerl.telemetry.alarms import TruncationAlarm
from scalerl.telemetry.compute import ComputeMeter
from scalerl.telemetry.metrics_log import SAMPLES_FILE, MetricsLog
from scalerl.telemetry.progress import Progress
from scalerl.telemetry.sinks import Sink, TensorBoardSink, WandbSink

EVAL_REQUIRED_KEYS: tuple[str, ...] = ("val_pass_rate",)


ForecastText = Callable[[Mapping[str, Any]], "str | None"]


def eval_line(step: int, row: Mapping[str, Any], forecast_text: ForecastText | None = None) -> str:
    """One printed line per evaluation, so a long run shows its curve as it goes. `forecast_text`
    (the composition root passes `scalerl.scaling.live.forecast_text`, the function `scalerl
    watch` prints with) turns the row's live forecast into what a person reads."""
    line = f"eval at step {step}: val_pass_rate {float(row['val_pass_rate']):.3f}"
    n, k, t = row.get("val_num_prompts"), row.get("val_k"), row.get("val_time_s")
    if isinstance(n, (int, float)) and isinstance(k, (int, float)):
        took = f", {float(t):.0f} s" if isinstance(t, (int, float)) else ""
        line += f" ({int(n)} prompts x {int(k)} samples{took})"
    text = forecast_text(row) if forecast_text is not None else None
    if text:  # the live forecast (scaling.live), when the run has one
        line += f"; forecast {text}"
    return line


class RunTelemetry:
    def __init__(
        self,
        run_dir: str | Path,
        logging_cfg: LoggingConfig,
        *,
        max_steps: int,
        meter: ComputeMeter | None = None,
        resume_step: int | None = None,
        run_name: str = "run",
        run_config: Mapping[str, Any] | None = None,
        alarm: TruncationAlarm | None = None,
        forecast_text: ForecastText | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.forecast_text = forecast_text
        self.meter = meter
        self.alarm = alarm or TruncationAlarm()
        # Sinks first: a missing optional package should fail before the log file is touched.
        self.sinks: list[Sink] = []
        if logging_cfg.tensorboard:
            old_events = (self.run_dir / "tensorboard").is_dir()
            purge = resume_step + 1 if resume_step is not None else (0 if old_events else None)
            self.sinks.append(TensorBoardSink(self.run_dir, purge_step=purge))
        if logging_cfg.wandb:
            self.sinks.append(
                WandbSink(self.run_dir, logging_cfg.wandb_project, run_name, run_config,
                          resume=resume_step is not None, resume_step=resume_step)
            )
        self.log = MetricsLog(self.run_dir, resume_step=resume_step)
        # Samples of a resumed run past its checkpoint are dropped like its metric rows: the steps
        # after it are trained again and log their own.
        self.samples = (MetricsLog(self.run_dir, resume_step=resume_step, filename=SAMPLES_FILE)
                        if logging_cfg.samples_every else None)
        for sink in self.sinks:
            after = getattr(sink, "replay_after", None)
            if after is None:
                continue
            # What the sink may have lost (a killed session's unwritten rows), from the log itself.
            for row in self.log.rows():
                if row["step"] > after:
                    sink.log(row["kind"], row["step"], row)
        self.progress = Progress(max_steps, initial_step=resume_step or 0, enabled=logging_cfg.progress)

    def _stamp(self, metrics: Mapping[str, Any]) -> dict[str, Any]:
        # The meter is the one source of the cumulative compute keys: a same-named per-step metric
        # must not overwrite the x axis of the scaling fits.
        stamped = dict(metrics)
        if self.meter is not None:
            stamped.update(self.meter.snapshot())
        return stamped

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        row = self.log.log_step(step, self._stamp(metrics))
        for sink in self.sinks:
            sink.log("step", step, row)
        message = self.alarm.check(step, row.get("truncation_rate"))
        if message:
            self.progress.write(f"warning: {message}")
        self.progress.update(step, row)
        return row

    def log_eval(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        missing = [k for k in EVAL_REQUIRED_KEYS if k not in metrics]
        if missing:
            raise ValueError(f"eval row for step {step}: missing required key(s) {', '.join(missing)}")
        row = self.log.log_eval(step, self._stamp(metrics))
        for sink in self.sinks:
            sink.log("eval", step, row)
        self.progress.write(eval_line(step, row, self.forecast_text))
        self.progress.update(step, row)
        return row

    def log_samples(self, step: int, rows: list[Mapping[str, Any]]) -> None:
        """Append one `sample` row per trained sample shown (`logging.samples_every`), and show
        them as a table in each sink (TensorBoard text, W&B table)."""
        if self.samples is None:
            return
        for row in rows:
            self.samples.write("sample", step, row)
        for sink in self.sinks:
            sink.log_samples(step, rows)

    def close(self) -> None:
        self.progress.close()
        self.log.close()
        if self.samples is not None:
            self.samples.close()
        for sink in self.sinks:
            sink.close()

    def __enter__(self) -> RunTelemetry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
