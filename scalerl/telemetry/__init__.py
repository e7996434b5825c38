"""Run telemetry: the metrics log, the compute meter, optional sinks, alarms and the progress bar."""

from scalerl.telemetry.alarms import TruncationAlarm, TruncationWarning
from scalerl.telemetry.compute import ComputeMeter, flop_params
from scalerl.telemetry.metrics_log import METRICS_FILE, MetricsLog, read_rows
from scalerl.telemetry.progress import Progress
from scalerl.telemetry.run import RunTelemetry
from scalerl.telemetry.sinks import MissingDependencyError, TensorBoardSink, WandbSink

__all__ = [
    "METRICS_FILE",
    "ComputeMeter",
    "MetricsLog",
    "MissingDependencyError",
    "Progress",
    "RunTelemetry",
    "TensorBoardSink",
    "TruncationAlarm",
    "TruncationWarning",
    "WandbSink",
    "flop_params",
    "read_rows",
]
