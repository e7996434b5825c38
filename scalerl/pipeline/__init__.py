"""Off-policy pipelines (`sync`, `ppo_offpolicy`, `pipeline`), admission control, and the driver.

See docs/pipeline.md. `Driver(settings, Components(...)).run()` trains (`DriverSettings`: built
by the composition root); the pieces it wires are usable alone: `StalenessController` (the max-lag
admission rule), `Generator` (the rollout loop), `GroupScorer` (bounded-parallel verification),
`DynamicSampling`, `batch_metrics`, `ThreadedEnginePool` (several engines in this process behind
one `Engine`).
"""

from typing import TYPE_CHECKING

from scalerl._lazy import lazy_exports

# Imported on first use (scalerl/_lazy.py): the command line (`scalerl.cli`) imports this package
# without paying for torch.
_EXPORTS = {
    "Components": "scalerl.pipeline.driver",
    "Driver": "scalerl.pipeline.driver",
    "DynamicSampling": "scalerl.pipeline.dynamic_sampling",
    "EngineWeightChannel": "scalerl.pipeline.local",
    "ThreadedEnginePool": "scalerl.pipeline.engine_pool",
    "Generator": "scalerl.pipeline.generator",
    "GeneratorCounters": "scalerl.pipeline.generator",
    "GroupQueue": "scalerl.pipeline.interfaces",
    "GroupScorer": "scalerl.rewards.groups",
    "InterleavedBatches": "scalerl.pipeline.modes",
    "IntervalMeter": "scalerl.pipeline.stats",
    "LocalGroupQueue": "scalerl.pipeline.local",
    "PipelineBatches": "scalerl.pipeline.modes",
    "PromptSource": "scalerl.pipeline.interfaces",
    "ReadyGroup": "scalerl.pipeline.interfaces",
    "RoundBatches": "scalerl.pipeline.modes",
    "RunResult": "scalerl.pipeline.driver",
    "ScoredBatch": "scalerl.rewards.groups",
    "Scorer": "scalerl.rewards.groups",
    "StalenessController": "scalerl.pipeline.staleness",
    "StalenessError": "scalerl.pipeline.staleness",
    "Trainer": "scalerl.pipeline.interfaces",
    "WeightChannel": "scalerl.pipeline.interfaces",
    "batch_metrics": "scalerl.pipeline.stats",
    "run_training": "scalerl.pipeline.driver",
    "success_threshold": "scalerl.pipeline.driver",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from scalerl.pipeline.driver import Components, Driver, RunResult, run_training, success_threshold
    from scalerl.pipeline.dynamic_sampling import DynamicSampling
    from scalerl.pipeline.engine_pool import ThreadedEnginePool
    from scalerl.pipeline.generator import Generator, GeneratorCounters
    from scalerl.pipeline.interfaces import (
        GroupQueue,
        PromptSource,
        ReadyGroup,
        Scorer,
        Trainer,
        WeightChannel,
    )
    from scalerl.pipeline.local import EngineWeightChannel, LocalGroupQueue
    from scalerl.pipeline.modes import InterleavedBatches, PipelineBatches, RoundBatches
    from scalerl.pipeline.staleness import StalenessController, StalenessError
    from scalerl.pipeline.stats import IntervalMeter, batch_metrics
    from scalerl.rewards.groups import GroupScorer, ScoredBatch

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
