"""Every entry point runs on the inputs' device and agrees with the CPU result (CUDA when present)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from scalerl.algorithms import (
    apply_overlong_penalty,
    compute_advantages,
    entropy_from_logits,
    keep_sampling_logprobs,
    kimi_length_reward,
    kl_penalty,
    off_policy_sequence_mask,
    policy_loss,
    token_weights,
    top_k_top_p_support,
    zero_variance_mask,
)

from .conftest import MAX_TOKENS, Batch

NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, NO_CUDA])]


def _run_all(b: Batch, device: str) -> dict[str, torch.Tensor]:
    dev = torch.device(device)
    lp = b.logprobs.detach().to(dev).requires_grad_(True)
    old, beh, mask, gids = (x.to(dev) for x in (b.old_logprobs, b.behavior_logprobs, b.mask, b.group_ids))
    rewards = (b.advantages.to(dev) > 0).to(lp.dtype)
    out: dict[str, torch.Tensor] = {}
    out["adv_group"] = compute_advantages(rewards, gids, "group")
    out["adv_batch"] = compute_advantages(rewards, gids, "batch")
    out["zero_var"] = zero_variance_mask(rewards, gids)
    keep = off_policy_sequence_mask(lp, beh, out["adv_group"], mask, delta=0.05)
    out["keep"] = keep
    for loss_type in ("grpo", "gspo", "cispo"):
        for aggregation in ("sample", "prompt", "token", "constant"):
            loss, stats = policy_loss(
                lp,
                old,
                out["adv_group"],
                mask,
                gids,
                loss_type=loss_type,
                aggregation=aggregation,
                max_tokens=MAX_TOKENS,
                behavior_logprobs=beh,
                tis_cap=2.0,
                keep_mask=keep,
            )
            assert loss.device.type == dev.type
            (grad,) = torch.autograd.grad(loss, lp)
            out[f"{loss_type}-{aggregation}"] = loss.detach()
            out[f"{loss_type}-{aggregation}-grad"] = grad
            out[f"{loss_type}-{aggregation}-ratio_mean"] = torch.tensor(stats["ratio_mean"])
    out["weights"] = token_weights(mask, gids, "prompt")
    out["kl"] = kl_penalty(lp, old, "unbiased_k3", beh, mask=mask).detach()
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 7, 11, generator=gen, dtype=lp.dtype).to(dev)
    tokens = torch.randint(0, 11, (8, 7), generator=gen).to(dev)
    support = top_k_top_p_support(logits, top_k=6, top_p=0.9)
    support = support.scatter(-1, tokens[..., None], True)
    out["support"] = support
    out["entropy"] = entropy_from_logits(logits, mask)
    out["keep_logprobs"] = keep_sampling_logprobs(logits, tokens, support, mask)
    lengths = mask.sum(-1)
    out["overlong"] = apply_overlong_penalty(rewards, lengths, 6, 3)
    out["kimi"] = kimi_length_reward(lengths, rewards, gids)
    for name, value in out.items():
        if value.dim() > 0:
            assert value.device.type == dev.type, name
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_results_match_cpu(make_batch: Callable[..., Batch], device: str) -> None:
    b = make_batch(seed=9)
    reference = _run_all(b, "cpu")
    got = _run_all(b, device)
    assert got.keys() == reference.keys()
    for name, ref in reference.items():
        torch.testing.assert_close(got[name].cpu(), ref, rtol=1e-10, atol=1e-12, msg=name)
