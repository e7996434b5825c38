"""Shared cases for the FSDP2 tests: a tiny Qwen2 config, scored groups, and 1-process references.

Imported by the test modules and, by name, by the spawned ranks (tests/distributed is on the
spawned processes' sys.path), so everything here is deterministic from its arguments.
"""

from __future__ import annotations

from typing import Any

import torch

from scalerl.assembly.sections import trainer_settings
from scalerl.config import AlgorithmConfig, ModelConfig, OptimConfig, RunConfig, TinyModelConfig
from scalerl.data.records import PromptRecord
from scalerl.rollout.protocol import Completion
from scalerl.training.batch import ScoredGroup, collate
from scalerl.training.forward import response_forward
from scalerl.training.policy import load_policy
from scalerl.training.trainer import Trainer

TINY = TinyModelConfig(
    hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64,
    max_position_embeddings=128,
)
MAX_NEW_TOKENS = 16
# Step metrics that are timings, not results.
TIMING_KEYS = {"step_time_s", "tokens_per_s"}
# How the step was split and laid out (passes, padding share): differ by design between layouts.
LAYOUT_KEYS = {"micro_batches", "padding_frac"}


def run_config(
    *, model: dict[str, Any] | None = None, optim: dict[str, Any] | None = None, **algorithm: Any
) -> RunConfig:
    return RunConfig(
        model=ModelConfig(tiny=TINY, init_seed=0, **(model or {})),
        algorithm=AlgorithmConfig(**algorithm),
        optim=OptimConfig(**({"micro_batch_size": 2} | (optim or {}))),
        generation={"max_new_tokens": MAX_NEW_TOKENS},
    )


@torch.no_grad()
def scored_groups(seed: int, sizes: tuple[int, ...] = (4, 4, 4, 3), noise: float = 0.4,
                  zero_variance: int = 0) -> list[ScoredGroup]:
    """Groups of random prompts/responses of varied lengths (the last `zero_variance` groups with
    equal rewards), behaviour log-probs = the initial policy's plus noise, some tokens masked."""
    policy = load_policy(ModelConfig(tiny=TINY, init_seed=0), device="cpu")
    vocab = policy.model.get_input_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(seed)

    def ids(k: int) -> list[int]:
        return torch.randint(8, vocab, (k,), generator=g).tolist()

    groups = []
    for gi, n in enumerate(sizes):
        prompt = ids(int(torch.randint(2, 9, (1,), generator=g)))
        completions = []
        for k in range(n):
            length = int(torch.randint(1, MAX_NEW_TOKENS - 4, (1,), generator=g))
            mask = [True] * length
            if k % 3 == 2 and length > 3:
                mask[1:3] = [False, False]
            completions.append(Completion(
                request_id=f"s{seed}p{gi}", sample_index=k, prompt_ids=prompt, token_ids=ids(length),
                logprobs=[0.0] * length, versions=[0] * length, loss_mask=mask,
                finish_reason="stop" if k % 2 else "length", start_version=0,
            ))
        if gi >= len(sizes) - zero_variance:
            rewards = [1.0] * n
        else:
            rewards = [float(x) for x in torch.randint(0, 2, (n,), generator=g).tolist()]
            rewards[0], rewards[1] = 1.0, 0.0
        groups.append(ScoredGroup(record=PromptRecord(id=f"s{seed}p{gi}", task="toy", prompt="x"),
                                  completions=completions, rewards=rewards))
    batch = collate(groups, policy.pad_token_id)
    lp = response_forward(policy.model, batch, temperature=1.0, fp32_lm_head=True).logprobs
    row = 0
    for group in groups:
        for c in group.completions:
            jitter = torch.randn(c.num_tokens, generator=g) * noise
            c.logprobs = (lp[row, : c.num_tokens] + jitter).tolist()
            row += 1
    return groups


def local_trainer(cfg: RunConfig) -> Trainer:
    return Trainer.from_settings(trainer_settings(cfg), load_policy(cfg.model, device="cpu"))


def local_gradients(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in trainer.policy.model.named_parameters() if p.grad is not None}


def local_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.policy.model.state_dict().items()}


def assert_close_tensors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str,
                         rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert set(got) == set(want), f"{what}: names differ: {sorted(set(got) ^ set(want))[:5]}"
    assert any(float(t.abs().max()) > 0 for t in want.values()), f"{what}: all zero"
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=rtol, atol=atol,
                                   msg=lambda m, n=name: f"{what} {n}: {m}")


def assert_same_metrics(got: dict[str, float], want: dict[str, float], what: str,
                        rel: float = 1e-5, abs_: float = 1e-6) -> None:
    import math

    keys = set(want) - TIMING_KEYS - LAYOUT_KEYS
    assert keys <= set(got), f"{what}: metrics missing {sorted(keys - set(got))}"
    for key in sorted(keys):
        a, b = got[key], want[key]
        if math.isnan(b):
            assert math.isnan(a), f"{what}: {key} = {a}, expected NaN"
        else:
            assert abs(a - b) <= abs_ + rel * abs(b), f"{what}: {key} = {a}, expected {b}"
