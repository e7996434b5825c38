"""Tiny policies and hand-built scored groups for the trainer tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from scalerl.config import ModelConfig, TinyModelConfig
from scalerl.data.records import PromptRecord
from scalerl.rollout.protocol import Completion
from scalerl.training.batch import ScoredGroup, collate
from scalerl.training.forward import response_forward
from scalerl.training.policy import Policy, load_policy

TINY = TinyModelConfig(
    hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64,
    max_position_embeddings=128,
)


def tiny_model_config(seed: int = 0, **kw: object) -> ModelConfig:
    return ModelConfig(tiny=TINY, init_seed=seed, **kw)


@pytest.fixture
def tiny() -> TinyModelConfig:
    return TINY


@pytest.fixture
def model_config() -> Callable[..., ModelConfig]:
    return tiny_model_config


@pytest.fixture
def make_policy() -> Callable[..., Policy]:
    def make(seed: int = 0, **kw: object) -> Policy:
        return load_policy(tiny_model_config(seed, **kw), device="cpu")

    return make


@torch.no_grad()
def true_logprobs(policy: Policy, groups: list[ScoredGroup], temperature: float = 1.0) -> list[list[float]]:
    batch = collate(groups, policy.pad_token_id)
    lp = response_forward(policy.model, batch, temperature=temperature, fp32_lm_head=True).logprobs
    return [lp[i, : int(n)].tolist() for i, n in enumerate(batch.response_lengths)]


def build_groups(
    policy: Policy,
    *,
    n_groups: int = 3,
    n: int = 4,
    seed: int = 0,
    noise: float = 0.3,
    zero_variance_groups: int = 0,
    interrupted: bool = True,
    version: int = 0,
) -> list[ScoredGroup]:
    """Random prompts and responses of varied lengths; behaviour log-probs = the policy's own
    log-probs plus noise (so importance ratios differ from 1 and some clip)."""
    g = torch.Generator().manual_seed(seed)
    vocab = policy.model.get_input_embeddings().weight.shape[0]

    def rand_ids(k: int) -> list[int]:
        return torch.randint(8, vocab, (k,), generator=g).tolist()

    groups = []
    for gi in range(n_groups):
        prompt = rand_ids(int(torch.randint(2, 9, (1,), generator=g)))
        completions = []
        for k in range(n):
            length = int(torch.randint(1, 12, (1,), generator=g))
            loss_mask = [True] * length
            reason = ["stop", "length", "stop", "interrupted"][k % 4]
            if interrupted and reason == "interrupted" and length > 3:
                loss_mask[1:3] = [False, False]
            completions.append(
                Completion(
                    request_id=f"p{gi}",
                    sample_index=k,
                    prompt_ids=prompt,
                    token_ids=rand_ids(length),
                    logprobs=[0.0] * length,
                    versions=[version] * length,
                    loss_mask=loss_mask,
                    finish_reason=reason,  # type: ignore[arg-type]
                    start_version=version,
                )
            )
        if gi < zero_variance_groups:
            rewards = [1.0] * n
        else:
            rewards = [float(x) for x in torch.randint(0, 2, (n,), generator=g).tolist()]
            rewards[0], rewards[1] = 1.0, 0.0
        record = PromptRecord(id=f"p{gi}", task="toy", prompt="x")
        groups.append(ScoredGroup(record=record, completions=completions, rewards=rewards))

    exact = true_logprobs(policy, groups)
    row = 0
    for group in groups:
        for c in group.completions:
            jitter = (torch.randn(c.num_tokens, generator=g) * noise).tolist()
            c.logprobs = [a + b for a, b in zip(exact[row], jitter, strict=True)]
            row += 1
    return groups


@pytest.fixture
def make_groups() -> Callable[..., list[ScoredGroup]]:
    return build_groups
