"""An MoE trainer's weights in the layout vLLM loaded: transformers 5 fuses each block's experts into
two parameters, its `save_pretrained` writes them one tensor per expert (what vLLM reads), and
`per_expert_tensors` must split the trainer's state into exactly those names and values, or a
weight update of an MoE model is refused (or loads the wrong rows)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from scalerl.models.tiny import TinyModelSpec, build_tiny_model
from scalerl.rollout.vllm_engine import per_expert_tensors


def test_the_fused_experts_split_into_the_saved_checkpoints_tensors(tmp_path: Path) -> None:
    spec = TinyModelSpec(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64,
                         num_experts=4, num_experts_per_tok=2)
    model = build_tiny_model(spec, seed=3)
    state = model.state_dict()
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in state)  # fused in memory
    model.save_pretrained(tmp_path)
    saved = {}
    for f in sorted(tmp_path.glob("*.safetensors")):
        saved.update(load_file(str(f)))
    split = per_expert_tensors(state)
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    assert set(split) - tied == set(saved) - tied
    for name, value in saved.items():
        torch.testing.assert_close(split[name], value, rtol=0, atol=0, msg=name)
    dense = build_tiny_model(TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                           intermediate_size=64)).state_dict()
    assert per_expert_tensors(dense).keys() == dense.keys()  # a dense model passes as it is
