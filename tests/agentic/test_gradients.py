"""Environment tokens are never trained: appending a tool result to a trajectory changes no
gradient, under every loss aggregation, and their (garbage) behaviour log-probs do not count."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from scalerl.algorithms.aggregation import token_weights
from scalerl.config import AlgorithmConfig, OptimConfig
from scalerl.training.policy import load_policy
from scalerl.training.trainer import Trainer
from tests.training.conftest import build_groups, tiny_model_config


def with_tool_results(groups, seed: int = 5):
    """The same groups, each completion followed by an environment segment (loss-masked)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for group in groups:
        completions = []
        for c in group.completions:
            k = int(torch.randint(1, 9, (1,), generator=g))
            env = torch.randint(8, 100, (k,), generator=g).tolist()
            completions.append(replace(
                c, token_ids=[*c.token_ids, *env],
                logprobs=[*c.logprobs, *(torch.rand(k, generator=g) * -40).tolist()],  # garbage
                versions=[*c.versions, *[c.versions[-1]] * k], loss_mask=[*c.loss_mask, *[False] * k]))
        out.append(replace(group, completions=completions))
    return out


@pytest.mark.parametrize("aggregation", ["sample", "prompt", "token", "constant"])
@pytest.mark.parametrize("loss_type", ["cispo", "grpo"])
def test_appending_a_tool_result_changes_no_gradient(aggregation: str, loss_type: str) -> None:
    grads = []
    for extend in (False, True):
        policy = load_policy(tiny_model_config(0), device="cpu")
        groups = build_groups(policy, n_groups=3, n=4, seed=1)
        if extend:
            groups = with_tool_results(groups)
        algo = AlgorithmConfig(loss_type=loss_type, aggregation=aggregation, zero_variance_filter=False)
        trainer = Trainer(policy, algo, OptimConfig(micro_batch_size=5), max_new_tokens=40)
        trainer.compute_gradients(groups)
        grads.append(torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None]))
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("aggregation", ["sample", "prompt", "token", "constant"])
def test_aggregation_weights_count_model_tokens_only(aggregation: str) -> None:
    # Rows: model 3 | env 4 | model 2 ; model 5 ; model 1 | env 6   (True = model token)
    layout = [[1, 1, 1, 0, 0, 0, 0, 1, 1], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0, 0]]
    t = max(map(len, layout))
    mask = torch.tensor([row + [0] * (t - len(row)) for row in layout], dtype=torch.bool)
    compact = torch.zeros_like(mask)
    for i, row in enumerate(layout):
        compact[i, : sum(row)] = True  # the same model tokens without the environment segments
    groups = torch.tensor([0, 0, 1])
    w = token_weights(mask, groups, aggregation, max_tokens=16)
    w_compact = token_weights(compact, groups, aggregation, max_tokens=16)
    assert torch.all(w[~mask] == 0)
    for i in range(3):
        torch.testing.assert_close(w[i][mask[i]], w_compact[i][compact[i]])
