"""The tiny tool_math run the study and Ray tests share, and its agentic warm start.

The warm start SFTs a 2-layer model on tool-use traces only (500 steps, a few seconds): it calls the
calculator in most episodes. It memorises the 36 training prompts and cannot copy unseen operands,
so its held-out pass rate is 0: these runs check what trajectories do, not that they learn.
"""

from __future__ import annotations

from pathlib import Path

from scalerl.assembly.warm_start import warm_start_default
from scalerl.config import load_config
from scalerl.training.sft import SFTConfig

OVERRIDES: list[str] = [
    "model.tiny.hidden_size=64",
    "model.tiny.num_layers=2",
    "model.tiny.num_heads=2",
    "model.tiny.num_kv_heads=1",
    "model.tiny.intermediate_size=128",
    "model.tiny.max_position_embeddings=512",
    "data.synthetic.task=tool_math",
    "data.synthetic.num_prompts=40",
    "data.heldout_size=4",
    "generation.n=2",
    "generation.max_new_tokens=96",  # a calculator call is ~80 characters
    "generation.max_batch_size=8",
    "generation.length_control.kind=none",
    "pipeline.prompts_per_step=2",
    "pipeline.k=2",
    "eval.every=1",
    "eval.k=2",
    "logging.progress=false",
    "rewards.max_workers=1",
    "max_steps=4",
    "agentic.environment=tools",
    "agentic.tools=[calculator]",
    "agentic.max_total_tokens=160",
    "agentic.sft_tool_fraction=1.0",
]


def warm_start_tool_model(cache_dir: Path) -> str:
    """The agentic warm start of the `OVERRIDES` run, cached in `cache_dir`."""
    cfg = load_config(overrides=OVERRIDES)
    return str(warm_start_default(cfg, SFTConfig(steps=500, batch_size=4), cache_dir=cache_dir))
