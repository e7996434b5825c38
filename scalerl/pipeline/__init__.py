"""Off-policy pipelines (`sync`, `ppo_offpolicy`, `pipeline`), admission control, and the driver.

See docs/pipeline.md. `Driver(config, Components(...)).run()` trains; the pieces it wires are
usable alone: `StalenessController` (the max-lag admission rule), `Generator` (the rollout loop),
`GroupScorer` (bounded-parallel verification), `DynamicSampling`, `batch_metrics`,
`ThreadedEnginePool` (several engines in this process behind one `Engine`).
"""

from scalerl.pipeline.driver import Components, Driver, RunResult, run_training, success_threshold
from scalerl.pipeline.dynamic_sampling import DynamicSampling
from scalerl.pipeline.engine_pool import ThreadedEnginePool
from scalerl.pipeline.generator import Generator, GeneratorCounters
from scalerl.pipeline.interfaces import GroupQueue, PromptSource, ReadyGroup, Scorer, Trainer, WeightChannel
from scalerl.pipeline.local import EngineWeightChannel, LocalGroupQueue
from scalerl.pipeline.modes import InterleavedBatches, PipelineBatches, RoundBatches
from scalerl.pipeline.scoring import GroupScorer, ScoredBatch
from scalerl.pipeline.staleness import StalenessController, StalenessError
from scalerl.pipeline.stats import IntervalMeter, batch_metrics

__all__ = [
    "Components",
    "Driver",
    "DynamicSampling",
    "EngineWeightChannel",
    "Generator",
    "GeneratorCounters",
    "GroupQueue",
    "GroupScorer",
    "InterleavedBatches",
    "IntervalMeter",
    "LocalGroupQueue",
    "PipelineBatches",
    "PromptSource",
    "ReadyGroup",
    "RoundBatches",
    "RunResult",
    "ScoredBatch",
    "Scorer",
    "StalenessController",
    "StalenessError",
    "ThreadedEnginePool",
    "Trainer",
    "WeightChannel",
    "batch_metrics",
    "run_training",
    "success_threshold",
]
