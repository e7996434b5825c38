"""The critic (PPO with a value model): GAE advantages, its own update and FLOPs, checkpoints, config
errors; the token-level KL reward (REINFORCE++) and the square-root LR rule."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from scalerl.algorithms import discounted_returns, token_rewards
from scalerl.assembly.sections import trainer_settings
from scalerl.config import AlgorithmConfig, ConfigError, OptimConfig, RunConfig, load_config
from scalerl.telemetry.compute import ComputeMeter, flop_params
from scalerl.training.batch import collate
from scalerl.training.critic import Critic, CriticDivergedError, ValueModel
from scalerl.training.optim import scaled_lr
from scalerl.training.trainer import Trainer

CRITIC = AlgorithmConfig(baseline="critic", adv_norm="none", loss_type="grpo", aggregation="token",
                         zero_variance_filter=False)


def _critic_params(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.advantages.model.state_dict().items()}


def test_first_advantages_are_the_returns_and_both_models_learn(make_policy, make_groups):
    policy = make_policy()
    groups = make_groups(policy, n_groups=3, n=4)
    trainer = Trainer(policy, CRITIC, OptimConfig(lr=1e-3, warmup_steps=0))
    critic = trainer.advantages
    assert isinstance(critic, Critic)
    batch = collate(groups, policy.pad_token_id)
    adv, metrics = critic.estimate(batch, batch.rewards, None)
    # The value head starts at 0, and with gamma = lambda = 1 (Open-Reasoner-Zero) A_t = R - V_t = R.
    want = torch.where(batch.response_mask, batch.rewards[:, None].expand_as(adv), 0.0)
    torch.testing.assert_close(adv, want)
    assert metrics["value_mean"] == 0.0

    before_policy = [p.detach().clone() for p in policy.model.parameters()]
    before_critic = _critic_params(trainer)
    m = trainer.step(groups)
    assert m["skipped_nonfinite"] == 0.0 and trainer.version == 1
    assert math.isfinite(m["value_loss"]) and m["value_loss"] > 0 and math.isfinite(m["critic_grad_norm"])
    assert m["critic_lr"] == pytest.approx(1e-3)
    assert not all(torch.equal(a, b) for a, b in zip(before_policy, policy.model.parameters(), strict=True))
    after = _critic_params(trainer)
    assert not torch.equal(after["head.weight"], before_critic["head.weight"])
    # The next estimate sees the trained critic: values move toward the returns.
    _, later = critic.estimate(batch, batch.rewards, None)
    assert later["value_mean"] != 0.0
    critic._pending = None


def test_values_of_a_row_do_not_depend_on_the_batch_it_is_padded_into(make_policy, make_groups):
    policy = make_policy()
    groups = make_groups(policy, n_groups=2, n=3)
    value_model = ValueModel.from_causal_lm(copy.deepcopy(policy.model))
    torch.nn.init.normal_(value_model.head.weight, std=0.5)
    critic = Critic(value_model, CRITIC.critic, CRITIC, OptimConfig())
    batch = collate(groups, policy.pad_token_id)
    full = critic.values(batch)
    for row in range(len(batch)):
        alone = critic.values(batch.select([row]))
        n = int(batch.response_lengths[row])
        torch.testing.assert_close(full[row, :n], alone[0, :n], rtol=1e-5, atol=1e-6)
        assert full[row, n:].abs().sum() == 0


def test_the_critic_update_does_not_depend_on_the_micro_batch_size(make_policy, make_groups):
    base = make_policy()
    groups = make_groups(base, n_groups=2, n=4) + make_groups(base, n_groups=1, n=2, seed=5)
    results = []
    for mbs in (1, 3, 64):
        optim = OptimConfig(lr=1e-3, micro_batch_size=mbs, warmup_steps=0)
        trainer = Trainer(copy.deepcopy(base), CRITIC, optim)
        torch.manual_seed(0)
        torch.nn.init.normal_(trainer.advantages.model.head.weight, std=0.1)
        metrics = trainer.step(groups)
        results.append((metrics, _critic_params(trainer)))
    ref_metrics, ref = results[0]
    for metrics, params in results[1:]:
        assert metrics["value_loss"] == pytest.approx(ref_metrics["value_loss"], rel=1e-5)
        for name, value in params.items():
            torch.testing.assert_close(value, ref[name], rtol=1e-4, atol=1e-6, msg=name)


def test_critic_compute_is_counted_in_flops(make_policy, make_groups):
    policy = make_policy()
    meter = ComputeMeter(flop_params(policy.model))
    trainer = Trainer(policy, CRITIC, OptimConfig(), meter=meter)
    n_critic = flop_params(trainer.advantages.model)
    assert 0 < n_critic < meter.n_params  # the backbone without the vocabulary head
    groups = make_groups(policy)
    tokens = collate(groups, policy.pad_token_id).num_tokens
    trainer.step(groups)
    # Policy forward + backward (6N), critic values (2N_c) and one critic update (6N_c).
    assert meter.flops == 6 * meter.n_params * tokens + 2 * n_critic * tokens + 6 * n_critic * tokens
    assert meter.auxiliary_trained_tokens == tokens and meter.trained_tokens == tokens


def test_checkpoint_restores_the_critic_and_resumed_steps_match(make_policy, make_groups, tmp_path):
    groups = make_groups(make_policy(), n_groups=2, n=4)
    algo = CRITIC.model_copy(update={"critic": CRITIC.critic.model_copy(update={"lr_scale": 5.0})})
    a = Trainer(make_policy(), algo, OptimConfig(lr=1e-3, warmup_steps=2))
    a.step(groups)
    path = a.save(tmp_path, step=1)
    assert (path / "critic" / "model.safetensors").is_file() and (path / "critic" / "optimizer.pt").is_file()
    b = Trainer(make_policy(), algo, OptimConfig(lr=1e-3, warmup_steps=2))
    b.load(path)
    assert b.advantages.steps == 1 and b.version == 1
    for name, value in _critic_params(a).items():
        torch.testing.assert_close(_critic_params(b)[name], value, rtol=0, atol=0, msg=name)
    ma, mb = a.step(groups), b.step(groups)
    assert ma["value_loss"] == pytest.approx(mb["value_loss"], rel=1e-6)
    assert ma["critic_lr"] == mb["critic_lr"] == pytest.approx(5e-3)  # warm-up continued, not restarted
    for name, value in _critic_params(a).items():
        torch.testing.assert_close(_critic_params(b)[name], value, rtol=1e-6, atol=1e-7, msg=name)
    # A checkpoint without a critic is named as such.
    plain = Trainer(make_policy(), AlgorithmConfig(), OptimConfig())
    other = plain.save(tmp_path / "plain", step=1)
    with pytest.raises(FileNotFoundError, match="has no critic"):
        Trainer(make_policy(), algo, OptimConfig()).load(other)


def test_a_nonfinite_critic_gradient_skips_the_critic_update_only(make_policy, make_groups):
    policy = make_policy()
    groups = make_groups(policy)
    trainer = Trainer(policy, CRITIC, OptimConfig(lr=1e-3, max_consecutive_bad_steps=2))
    critic = trainer.advantages
    before = _critic_params(trainer)
    hook = critic.model.head.weight.register_hook(lambda g: g * math.nan)
    m = trainer.step(groups)
    assert trainer.version == 1  # the policy step was taken
    assert m["critic_skipped_nonfinite"] == 1.0 and m["critic_bad_steps_total"] == 1.0
    assert all(torch.equal(v, before[k]) for k, v in _critic_params(trainer).items())
    with pytest.raises(CriticDivergedError, match="2 consecutive critic updates skipped"):
        trainer.step(groups)
    hook.remove()


def test_nonfinite_critic_values_skip_the_step(make_policy, make_groups):
    policy = make_policy()
    trainer = Trainer(policy, CRITIC, OptimConfig())
    with torch.no_grad():
        trainer.advantages.model.head.bias.fill_(math.inf)
    m = trainer.step(make_groups(policy))
    assert m["skipped_nonfinite"] == 1.0 and trainer.version == 0 and trainer.bad_steps == 1


def test_critic_config_errors_name_the_keys():
    with pytest.raises(ConfigError, match="adv_norm: 'group' divides group-centred"):
        load_config(overrides=["algorithm.baseline=critic", "algorithm.adv_norm=group"])
    with pytest.raises(ConfigError, match="loss_type: 'kimi' needs one advantage per sample"):
        load_config(overrides=["algorithm.baseline=critic", "algorithm.loss_type=kimi",
                               "algorithm.adv_norm=none"])
    with pytest.raises(ConfigError, match=r"algorithm.baseline: 'critic' .* local trainer only"):
        load_config(overrides=["algorithm.baseline=critic", "distributed.backend=ray"])
    with pytest.raises(ConfigError, match="kl_reward_level: 'token' needs kl_in_reward"):
        load_config(overrides=["algorithm.kl_reward_level=token"])


def test_a_separate_critic_model_must_read_the_policys_tokens(make_policy, tmp_path, model_config):
    from scalerl.training.policy import load_policy

    other = load_policy(model_config(seed=3), device="cpu")
    other.model.save_pretrained(str(tmp_path / "critic"))
    separate = CRITIC.critic.model_copy(update={"model": str(tmp_path / "critic")})
    algo = CRITIC.model_copy(update={"critic": separate})
    trainer = Trainer(make_policy(), algo, OptimConfig())
    own = dict(other.model.named_parameters())
    for name, p in trainer.advantages.model.backbone.named_parameters():
        torch.testing.assert_close(p, own[f"model.{name}"], msg=name)


def test_token_level_kl_reward_is_reinforce_pp(make_policy, make_groups):
    policy = make_policy()
    groups = make_groups(policy, n_groups=2, n=4)
    algo = AlgorithmConfig(adv_norm="none", kl_coef=0.5, kl_in_reward=True, kl_reward_level="token",
                           zero_variance_filter=False)
    trainer = Trainer(policy, algo, OptimConfig(lr=1e-2, warmup_steps=0))
    trainer.step(groups)  # the policy moves away from the reference
    batch = collate(groups, policy.pad_token_id)
    lp = trainer.compute_logprobs(batch)
    ref = trainer.compute_logprobs(batch, trainer.reference)
    metrics: dict[str, float] = {}
    prepared = trainer._prepare(groups, metrics)
    assert prepared is not None
    adv = prepared[0].advantages
    mask = batch.response_mask
    centred = batch.rewards - batch.rewards.view(2, 4).mean(dim=1).repeat_interleave(4)
    want = discounted_returns(token_rewards(centred, mask, 0.5 * torch.where(mask, lp - ref, 0.0)), mask)
    assert float((lp - ref)[mask].abs().max()) > 1e-4  # the KL is not trivially 0
    torch.testing.assert_close(adv, want, rtol=1e-5, atol=1e-6)


def test_square_root_lr_rule(make_policy):
    assert scaled_lr(1e-4, 256, 64, "sqrt") == pytest.approx(2e-4)
    assert scaled_lr(1e-4, 16, 64, "sqrt") == pytest.approx(0.5e-4)
    assert scaled_lr(1e-4, 256, 64, "none") == 1e-4
    cfg = RunConfig.model_validate({"optim": {"lr": 1e-4, "lr_scaling": "sqrt", "lr_reference_batch": 64},
                                    "pipeline": {"prompts_per_step": 32}, "generation": {"n": 8}})
    assert Trainer.from_settings(trainer_settings(cfg), make_policy()).optim_cfg.lr == pytest.approx(2e-4)


def test_vapo_decoupled_and_length_adaptive_lambdas(make_policy, make_groups):
    """VAPO: the policy's advantages use their own lambda (fixed, or 1 - 1/(alpha l) per sample);
    the value targets use `value_lambda`."""
    from scalerl.algorithms import gae_advantages, length_adaptive_lambda

    policy = make_policy()
    groups = make_groups(policy, n_groups=2, n=4)
    batch = collate(groups, policy.pad_token_id)
    mask = batch.response_mask
    for critic_cfg, lam in [({"gae_lambda": 0.95, "value_lambda": 1.0}, 0.95),
                            ({"length_adaptive_alpha": 0.5, "value_lambda": 1.0},
                             length_adaptive_lambda(mask.sum(dim=-1), 0.5).float())]:
        algo = CRITIC.model_copy(update={"critic": CRITIC.critic.model_copy(update=critic_cfg)})
        trainer = Trainer(make_policy(), algo, OptimConfig())
        critic = trainer.advantages
        torch.nn.init.normal_(critic.model.head.weight, std=0.5)
        adv, _ = critic.estimate(batch, batch.rewards, None)
        values, returns = critic._pending
        rewards = token_rewards(batch.rewards, mask)
        want_adv, _ = gae_advantages(rewards, values, mask, 1.0, lam)
        _, want_ret = gae_advantages(rewards, values, mask, 1.0, 1.0)
        torch.testing.assert_close(adv, want_adv)
        torch.testing.assert_close(returns, want_ret)
        assert not torch.allclose(want_adv, gae_advantages(rewards, values, mask, 1.0, 1.0)[0])
