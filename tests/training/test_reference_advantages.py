"""One real `Trainer.step` on a stale batch against advantages written out here from the papers.

For every `algorithm.baseline` (group_mean = GRPO, leave_one_out = RLOO, none = REINFORCE++, critic =
PPO with GAE) and every `adv_norm` it allows, the gradient the trainer's optimizer receives must
equal the gradient of a reference loss computed in this file with its own arithmetic: log-probs from
each sample run alone (no padding, no `training.forward`), advantages from the formulas below (never
`scalerl.algorithms`), the PPO clipped surrogate with the token mean. The batch is off-policy: the
behaviour log-probs come from other weights (ratios far from 1, tokens beyond both clips) and the
groups have unequal sizes, so that RLOO's factor n/(n-1) survives the batch normalisation.
"""

from __future__ import annotations

import math

import pytest
import torch

from scalerl.config import AlgorithmConfig, CriticConfig, OptimConfig
from scalerl.training.batch import ScoredGroup
from scalerl.training.trainer import Trainer

EPS = 1e-6  # the advantage normalisations' epsilon (std + eps)
EPS_LOW, EPS_HIGH = 0.2, 0.28
GAMMA, LAMBDA = 0.9, 0.8
KL_COEF = 0.05


# -- the batch ---------------------------------------------------------------------------------------


def _stale_groups(make_policy, make_groups) -> list[ScoredGroup]:
    """Responses scored by another model (seed 1): behaviour log-probs of other weights. Rewards
    are set by hand: real-valued, no group constant, groups of 4, 4, 4 and 3 samples."""
    other = make_policy(seed=1)
    groups = make_groups(other, n_groups=3, n=4, noise=0.2) + make_groups(other, n_groups=1, n=3, seed=7)
    rewards = [[1.0, 0.0, 0.25, 0.0], [0.5, 0.0, 1.0, 1.0], [1.0, 0.75, 0.0, 0.25], [1.0, 0.0, 0.0]]
    for g, r in zip(groups, rewards, strict=True):
        g.rewards = r
    return groups


def _samples(groups: list[ScoredGroup]):
    """(group index, prompt ids, response ids, loss mask, behaviour log-probs, reward) per sample."""
    for gi, g in enumerate(groups):
        for c, r in zip(g.completions, g.rewards, strict=True):
            yield gi, list(c.prompt_ids), list(c.token_ids), list(c.loss_mask), list(c.logprobs), float(r)


def _token_logprobs(model: torch.nn.Module, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log pi(y_t | x, y_<t) of each response token, the sample run alone (float64 softmax)."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) + len(response) - 1]
    logp = torch.log_softmax(logits.double(), dim=-1)
    return logp[torch.arange(len(response)), torch.tensor(response)]


# -- the advantages, from the papers -----------------------------------------------------------------


def _std(xs: list[float]) -> float:
    """Unbiased (n - 1) standard deviation."""
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _outcome_advantages(rewards: list[float], groups: list[int], baseline: str, adv_norm: str) -> list[float]:
    """GRPO (Shao et al. 2024 §4.1.2): c_i = r_i - mean_g; RLOO (Ahmadian et al. 2024 §3.2):
    c_i = r_i - mean of the *other* samples of the prompt; REINFORCE++ (Hu 2025 §3): c_i = r_i.
    adv_norm group: c_i / (std_g + eps) (std of the group's rewards, as GRPO); batch: (c_i - mean(c)) /
    (std(c) + eps) over the batch (ScaleRL; REINFORCE++'s global normalisation); none: c_i."""
    members: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    c = []
    for i, (r, g) in enumerate(zip(rewards, groups, strict=True)):
        others = [rewards[j] for j in members[g] if j != i]
        if baseline == "group_mean":
            c.append(r - (r + sum(others)) / (len(others) + 1))
        elif baseline == "leave_one_out":
            c.append(r - sum(others) / len(others))
        else:
            c.append(r)
    if adv_norm == "none":
        return c
    if adv_norm == "group":
        return [ci / (_std([c[j] for j in members[g]]) + EPS) for ci, g in zip(c, groups, strict=True)]
    mean = sum(c) / len(c)
    return [(ci - mean) / (_std(c) + EPS) for ci in c]


def _whiten_tokens(per_token: list[list[float]], steps: list[list[int]]) -> list[list[float]]:
    """(A - mean) / (std + eps) over every loss token of the batch (REINFORCE++ eq. 10; PPO's
    advantage whitening)."""
    flat = [a[t] for a, s in zip(per_token, steps, strict=True) for t in s]
    mean, sd = sum(flat) / len(flat), _std(flat)
    return [[(a[t] - mean) / (sd + EPS) if t in s else 0.0 for t in range(len(a))]
            for a, s in zip(per_token, steps, strict=True)]


def _gae(reward: float, values: list[float], steps: list[int], length: int) -> list[float]:
    """GAE (Schulman et al. 2016 eq. 16) over a response whose steps are its loss tokens: the
    outcome reward on the last step, V = 0 after it, delta_t = r_t + gamma V_t' - V_t,
    A_t = delta_t + gamma lambda A_t' (t' the next step)."""
    adv = [0.0] * length
    next_v, next_a = 0.0, 0.0
    for k in reversed(range(len(steps))):
        t = steps[k]
        r = reward if k == len(steps) - 1 else 0.0
        delta = r + GAMMA * next_v - values[t]
        next_a = delta + GAMMA * LAMBDA * next_a
        next_v = values[t]
        adv[t] = next_a
    return adv


def _token_returns(c: float, penalty: list[float], steps: list[int], length: int) -> list[float]:
    """REINFORCE++ eq. 8-9 (gamma = 1): the return to go c - sum_{s >= t} beta KL_s over the steps."""
    out = [0.0] * length
    for k, t in enumerate(steps):
        out[t] = c - sum(penalty[s] for s in steps[k:])
    return out


# -- the reference gradient --------------------------------------------------------------------------


def _reference_grads(policy, groups, advantages: list[list[float]]) -> dict[str, torch.Tensor]:
    """Gradient of the PPO clipped surrogate, token mean over the batch (`aggregation: token`):
    L = -1/|T| sum_{i,t} min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A), rho = pi / pi_behaviour."""
    model = policy.model
    model.zero_grad(set_to_none=True)
    terms, tokens = [], 0
    for (_, prompt, response, mask, behaviour, _), adv in zip(_samples(groups), advantages, strict=True):
        lp = _token_logprobs(model, prompt, response)
        rho = torch.exp(lp - torch.tensor(behaviour, dtype=torch.float64))
        a = torch.tensor(adv, dtype=torch.float64)
        surrogate = torch.minimum(rho * a, rho.clamp(1 - EPS_LOW, 1 + EPS_HIGH) * a)
        m = torch.tensor(mask)
        terms.append(-(surrogate * m).sum())
        tokens += int(m.sum())
    (torch.stack(terms).sum() / tokens).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def _step_grads(trainer: Trainer, groups) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The gradients the optimizer receives in one real `Trainer.step` (captured before AdamW)."""
    captured: dict[str, torch.Tensor] = {}
    names = {id(p): n for n, p in trainer.policy.model.named_parameters()}

    def grab(optimizer, args, kwargs):
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    captured[names[id(p)]] = p.grad.detach().clone()

    handle = trainer.optimizer.register_step_pre_hook(grab)
    try:
        metrics = trainer.step(groups)
    finally:
        handle.remove()
    assert metrics["version"] == 1.0 and metrics["skipped_nonfinite"] == 0.0
    return captured, metrics


def _assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    total = math.sqrt(sum(float(g.double().pow(2).sum()) for g in want.values()))
    assert total > 1e-4
    for name, g in got.items():
        torch.testing.assert_close(g.double(), want[name].double(), rtol=2e-4, atol=2e-6 * total, msg=name)


def _grad_distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Relative distance between two gradients (the test only discriminates if references differ)."""
    num = sum(float((a[n].double() - b[n].double()).pow(2).sum()) for n in a)
    den = sum(float(b[n].double().pow(2).sum()) for n in b)
    return math.sqrt(num / den)


def _algo(baseline: str, adv_norm: str, **kw) -> AlgorithmConfig:
    return AlgorithmConfig(loss_type="grpo", eps_low=EPS_LOW, eps_high=EPS_HIGH, aggregation="token",
                           baseline=baseline, adv_norm=adv_norm, **kw)


OPTIM = OptimConfig(grad_clip=None, warmup_steps=0, micro_batch_size=5)

OUTCOME_CASES = [("group_mean", "batch"), ("group_mean", "group"), ("group_mean", "none"),
                 ("leave_one_out", "batch"), ("leave_one_out", "group"), ("leave_one_out", "none"),
                 ("none", "batch"), ("none", "none")]


def _outcome_reference(policy, groups, baseline: str, adv_norm: str) -> dict[str, torch.Tensor]:
    rows = list(_samples(groups))
    adv = _outcome_advantages([r[5] for r in rows], [r[0] for r in rows], baseline, adv_norm)
    return _reference_grads(policy, groups, [[a] * len(r[2]) for a, r in zip(adv, rows, strict=True)])


@pytest.mark.parametrize(("baseline", "adv_norm"), OUTCOME_CASES)
def test_outcome_baselines_match_the_papers_off_policy(make_policy, make_groups, baseline, adv_norm):
    groups = _stale_groups(make_policy, make_groups)
    trainer = Trainer(make_policy(seed=0), _algo(baseline, adv_norm), OPTIM)
    want = _outcome_reference(trainer.policy, groups, baseline, adv_norm)
    got, metrics = _step_grads(trainer, groups)
    # Off-policy for real: ratios away from 1 and tokens beyond each side of the clip (the low clip
    # binds only on negative advantages: none with raw rewards >= 0 has none).
    assert metrics["is_ratio_max"] > 1.5 and metrics["is_ratio_min"] < 0.6
    assert metrics["clip_frac_high"] > 0
    assert metrics["clip_frac_low"] > 0 or (baseline, adv_norm) == ("none", "none")
    _assert_close(got, want)


def test_the_outcome_references_tell_the_baselines_apart(make_policy, make_groups):
    """Each baseline's reference differs from GRPO's under each norm where the papers differ (under
    `group` RLOO's n/(n-1) cancels against the std of its own c: identical up to eps, not tested)."""
    groups = _stale_groups(make_policy, make_groups)
    policy = make_policy(seed=0)
    for baseline, adv_norm in [("leave_one_out", "batch"), ("leave_one_out", "none"), ("none", "batch"),
                               ("none", "none")]:
        grpo = _outcome_reference(policy, groups, "group_mean", adv_norm)
        other = _outcome_reference(policy, groups, baseline, adv_norm)
        assert _grad_distance(other, grpo) > 0.02, (baseline, adv_norm)
    for adv_norm in ("group", "none"):
        assert _grad_distance(_outcome_reference(policy, groups, "group_mean", adv_norm),
                              _outcome_reference(policy, groups, "group_mean", "batch")) > 0.02


@pytest.mark.parametrize("adv_norm", ["batch", "none"])
def test_critic_gae_matches_ppo_off_policy(make_policy, make_groups, adv_norm):
    """PPO with a value model: GAE(gamma, lambda) from `algorithm.critic` over the loss tokens
    (interrupted samples' forced tokens are not steps), whitened over the batch's tokens or not."""
    groups = _stale_groups(make_policy, make_groups)
    critic = CriticConfig(gamma=GAMMA, gae_lambda=LAMBDA)
    trainer = Trainer(make_policy(seed=0), _algo("critic", adv_norm, critic=critic), OPTIM)
    value_model = trainer.advantages.model
    with torch.no_grad():  # a critic that has learned something: values that differ per token
        gen = torch.Generator().manual_seed(3)
        value_model.head.weight.copy_(torch.randn(value_model.head.weight.shape, generator=gen) * 0.5)
        value_model.head.bias.fill_(0.1)
    per_token, steps = [], []
    with torch.no_grad():
        for _, prompt, response, mask, _, reward in _samples(groups):
            ids = torch.tensor([prompt + response])
            hidden = value_model.backbone(input_ids=ids).last_hidden_state[0]
            v = (hidden[len(prompt) - 1 : len(prompt) + len(response) - 1].double()
                 @ value_model.head.weight[0].double() + float(value_model.head.bias))
            s = [t for t, keep in enumerate(mask) if keep]
            per_token.append(_gae(reward, v.tolist(), s, len(response)))
            steps.append(s)
    if adv_norm == "batch":
        per_token = _whiten_tokens(per_token, steps)
    want = _reference_grads(trainer.policy, groups, per_token)
    got, metrics = _step_grads(trainer, groups)
    assert metrics["clip_frac_low"] > 0 and metrics["clip_frac_high"] > 0
    _assert_close(got, want)
    # The values and gamma * lambda < 1 matter: no token's advantage is its sample's bare reward.
    rewards = [r[5] for r in _samples(groups)]
    assert all(abs(a[s[0]] - r) > 1e-3 for a, s, r in zip(per_token, steps, rewards, strict=True))


@pytest.mark.parametrize("baseline", ["none", "group_mean"])
def test_reinforce_pp_token_kl_returns_match_the_paper(make_policy, make_groups, baseline):
    """REINFORCE++ (and -baseline): the per-token KL in the reward, KL_t = log pi_old / pi_ref (k1),
    each token's return c_i - beta sum_{s >= t} KL_s, whitened over the batch's loss tokens."""
    groups = _stale_groups(make_policy, make_groups)
    policy = make_policy(seed=0)
    policy.reference_factory = lambda: make_policy(seed=2).model  # a reference other than the policy
    trainer = Trainer(policy, _algo(baseline, "batch", kl_coef=KL_COEF, kl_in_reward=True,
                                    kl_reward_level="token"), OPTIM)
    reference = make_policy(seed=2).model
    rows = list(_samples(groups))
    c = _outcome_advantages([r[5] for r in rows], [r[0] for r in rows], baseline, "none")
    per_token, steps = [], []
    with torch.no_grad():
        for ci, (_, prompt, response, mask, _, _) in zip(c, rows, strict=True):
            # pi_old: the trainer's weights before the update (nothing recomputed: the policy's own).
            ours = _token_logprobs(policy.model, prompt, response)
            kl = ours - _token_logprobs(reference, prompt, response)
            s = [t for t, keep in enumerate(mask) if keep]
            per_token.append(_token_returns(ci, (KL_COEF * kl).tolist(), s, len(response)))
            steps.append(s)
    want = _reference_grads(policy, groups, _whiten_tokens(per_token, steps))
    got, _ = _step_grads(trainer, groups)
    _assert_close(got, want)
