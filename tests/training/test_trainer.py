"""Trainer behaviour: bad-step handling, no-op steps, metrics, KL/TIS/masking options, learning."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from scalerl.assembly.sections import trainer_settings
from scalerl.config import AlgorithmConfig, OptimConfig, RunConfig, TisConfig
from scalerl.data.records import PromptRecord
from scalerl.rollout.protocol import Completion
from scalerl.telemetry.compute import ComputeMeter, flop_params
from scalerl.training.batch import ScoredGroup, collate
from scalerl.training.trainer import Trainer, TrainingDivergedError


def _params(policy) -> list[torch.Tensor]:
    return [p.detach().clone() for p in policy.model.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_step_updates_weights_version_and_reports_metrics(make_policy, make_groups):
    policy = make_policy()
    groups = make_groups(policy, n_groups=3, n=4, zero_variance_groups=1, version=0)
    trainer = Trainer(policy, AlgorithmConfig(), OptimConfig(lr=1e-3, warmup_steps=2))
    before = _params(policy)
    m = trainer.step(groups)
    assert trainer.version == 1 and m["version"] == 1.0
    assert not _same(before, _params(policy))
    assert m["skipped_nonfinite"] == 0.0 and m["skipped_no_signal"] == 0.0
    assert m["zero_variance_frac"] == pytest.approx(1 / 3)
    assert m["kept_samples"] == 8.0 and m["batch_samples"] == 12.0
    # finish reasons cycle stop/length/stop/interrupted over the 4 samples of each group
    assert m["truncation_rate"] == pytest.approx(0.25) and m["interruption_rate"] == pytest.approx(0.25)
    assert m["lr"] == pytest.approx(1e-3 * 0.5)  # first of 2 warm-up steps
    for key in ("loss", "grad_norm", "entropy", "is_ratio_mean", "is_ratio_max", "clip_frac_high",
                "response_length_mean", "version_lag_mean", "tokens_per_s", "reward_mean", "pass_rate"):
        assert math.isfinite(m[key]), key
    assert m["version_lag_mean"] == 0.0


def test_version_lag_counts_tokens_from_older_policies(make_policy, make_groups):
    policy = make_policy()
    trainer = Trainer(policy, AlgorithmConfig(), OptimConfig(lr=1e-3))
    trainer.version = 5
    groups = make_groups(policy, n_groups=2, n=2, version=2)
    groups[0].completions[0].versions = [4] * groups[0].completions[0].num_tokens
    m = trainer.step(groups)
    lags = [5 - v for g in groups for c in g.completions for v in c.versions]
    assert m["version_lag_mean"] == pytest.approx(sum(lags) / len(lags))
    assert m["version_lag_max"] == 3.0


def test_all_zero_variance_groups_is_a_counted_noop(make_policy, make_groups):
    policy = make_policy()
    groups = make_groups(policy, n_groups=2, n=3, zero_variance_groups=2)
    trainer = Trainer(policy, AlgorithmConfig(), OptimConfig())
    before = _params(policy)
    m = trainer.step(groups)
    assert m["skipped_no_signal"] == 1.0 and m["zero_variance_frac"] == 1.0
    assert trainer.noop_steps == 1 and trainer.version == 0 and trainer.bad_steps == 0
    assert _same(before, _params(policy))


def test_zero_variance_filter_equals_training_on_informative_groups(make_policy, make_groups):
    base = make_policy()
    groups = make_groups(base, n_groups=3, n=3, zero_variance_groups=1)
    a = Trainer(copy.deepcopy(base), AlgorithmConfig(), OptimConfig())
    b = Trainer(copy.deepcopy(base), AlgorithmConfig(), OptimConfig())
    la = a.compute_gradients(groups)["loss"]
    lb = b.compute_gradients(groups[1:])["loss"]
    assert la == pytest.approx(lb, rel=1e-6)
    unfiltered = Trainer(copy.deepcopy(base), AlgorithmConfig(zero_variance_filter=False), OptimConfig())
    assert unfiltered.compute_gradients(groups)["loss"] != pytest.approx(la, rel=1e-3)


def test_nan_behaviour_logprob_skips_step_and_is_counted(make_policy, make_groups):
    policy = make_policy()
    trainer = Trainer(policy, AlgorithmConfig(), OptimConfig(max_consecutive_bad_steps=3))
    good = make_groups(policy, n_groups=2, n=3)
    bad = make_groups(policy, n_groups=2, n=3)
    bad[1].completions[2].logprobs[0] = float("nan")
    before = _params(policy)
    m = trainer.step(bad)
    assert m["skipped_nonfinite"] == 1.0 and math.isnan(m["loss"])
    assert trainer.bad_steps == 1 and trainer.consecutive_bad_steps == 1 and trainer.version == 0
    assert _same(before, _params(policy))
    assert trainer.scheduler.last_epoch == 0
    m = trainer.step(good)
    assert m["skipped_nonfinite"] == 0.0 and trainer.version == 1
    assert trainer.consecutive_bad_steps == 0 and trainer.bad_steps == 1


def test_nonfinite_gradient_skips_step(make_policy, make_groups):
    policy = make_policy()
    trainer = Trainer(policy, AlgorithmConfig(), OptimConfig())
    weight = policy.model.get_input_embeddings().weight
    handle = weight.register_hook(lambda g: g * float("inf"))
    before = _params(policy)
    m = trainer.step(make_groups(policy))
    handle.remove()
    assert m["skipped_nonfinite"] == 1.0 and trainer.bad_steps == 1
    assert _same(before, _params(policy))
    assert all(p.grad is None for p in policy.model.parameters())


def test_consecutive_bad_steps_stop_training(make_policy, make_groups):
    policy = make_policy()
    trainer = Trainer(policy, AlgorithmConfig(), OptimConfig(max_consecutive_bad_steps=3))
    bad = make_groups(policy, n_groups=2, n=2)
    bad[0].completions[0].logprobs[0] = float("inf")
    trainer.step(bad)
    trainer.step(bad)
    with pytest.raises(TrainingDivergedError, match=r"3 consecutive .*max_consecutive_bad_steps=3"):
        trainer.step(bad)


def test_nonfinite_weights_are_caught_before_the_loss(make_policy, make_groups):
    policy = make_policy()
    groups = make_groups(policy)
    trainer = Trainer(policy, AlgorithmConfig(), OptimConfig())
    with torch.no_grad():
        next(policy.model.parameters()).fill_(float("nan"))
    m = trainer.step(groups)
    assert m["skipped_nonfinite"] == 1.0


def test_learning_raises_logprob_of_rewarded_completions(make_policy):
    """Toy reward: 1 for completions containing token 42. A few on-policy steps must make the
    rewarded completions more likely and the others less likely."""
    policy = make_policy()
    prompt = [10, 11, 12]
    responses = [[42, 20, 21], [20, 21, 22], [23, 42], [24, 25], [42, 26, 27, 28], [29, 30]]
    rewards = [1.0 if 42 in r else 0.0 for r in responses]

    def groups_now() -> list[ScoredGroup]:
        comps = [
            Completion("p", i, prompt, r, [0.0] * len(r), [0] * len(r), [True] * len(r), "stop", 0)
            for i, r in enumerate(responses)
        ]
        group = ScoredGroup(PromptRecord(id="p", task="toy", prompt="x"), comps, rewards)
        lp = trainer.compute_logprobs(collate([group], policy.pad_token_id))
        for i, c in enumerate(comps):
            c.logprobs = lp[i, : c.num_tokens].tolist()  # on-policy behaviour log-probs
        return [group]

    trainer = Trainer(policy, AlgorithmConfig(), OptimConfig(lr=3e-3, warmup_steps=0))

    def seq_logprobs() -> torch.Tensor:
        lp = trainer.compute_logprobs(collate(groups_now(), policy.pad_token_id))
        return lp.sum(dim=1)

    start = seq_logprobs()
    for _ in range(5):
        m = trainer.step(groups_now())
        assert m["skipped_nonfinite"] == 0.0
        assert m["is_ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # on-policy
    end = seq_logprobs()
    good = torch.tensor(rewards) > 0
    assert bool((end[good] > start[good]).all())
    assert bool((end[~good] < start[~good]).all())


def test_kl_term_uses_frozen_initial_reference_lazily(make_policy, make_groups):
    policy = make_policy()
    groups = make_groups(policy)
    trainer = Trainer(policy, AlgorithmConfig(kl_coef=0.1), OptimConfig(lr=3e-3))
    assert trainer._reference is None
    m0 = trainer.step(groups)
    assert m0["kl"] == pytest.approx(0.0, abs=1e-7)  # reference == policy before the first update
    assert trainer._reference is not None
    trainer.step(groups)
    m2 = trainer.step(groups)
    assert m2["kl"] > 1e-6
    ref_param = next(trainer.reference.parameters())
    assert not ref_param.requires_grad


def test_kl_needs_reference_factory(make_policy):
    policy = make_policy()
    policy.reference_factory = None
    with pytest.raises(ValueError, match="reference"):
        Trainer(policy, AlgorithmConfig(kl_coef=0.1), OptimConfig())


def test_recomputed_old_logprobs_and_tis(make_policy, make_groups):
    policy = make_policy()
    groups = make_groups(policy, noise=0.5)
    algo = AlgorithmConfig(recompute_old_logprobs=True, tis=TisConfig(enabled=True, cap=1.5))
    trainer = Trainer(copy.deepcopy(policy), algo, OptimConfig())
    m = trainer.compute_gradients(groups)
    assert m["is_ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # pi_train == pi_old before the update
    assert m["tis_weight_mean"] != pytest.approx(1.0, abs=1e-3)
    plain = Trainer(copy.deepcopy(policy), AlgorithmConfig(), OptimConfig()).compute_gradients(groups)
    assert plain["is_ratio_mean"] != pytest.approx(1.0, abs=1e-3)  # pi_train / pi_gen with noisy pi_gen
    with pytest.raises(ValueError, match="recompute_old_logprobs"):
        Trainer(policy, AlgorithmConfig(tis=TisConfig(enabled=True)), OptimConfig())


def test_attach_old_logprobs_fills_groups(make_policy, make_groups):
    policy = make_policy()
    groups = make_groups(policy, noise=0.5)
    trainer = Trainer(policy, AlgorithmConfig(recompute_old_logprobs=True), OptimConfig())
    trainer.attach_old_logprobs(groups)
    c = groups[0].completions[1]
    assert len(groups[0].old_logprobs[1]) == c.num_tokens
    assert groups[0].old_logprobs[1] != pytest.approx(c.logprobs, abs=1e-3)


def test_offpolicy_sequence_mask_drops_drifted_negative_samples(make_policy, make_groups):
    policy = make_policy()
    groups = make_groups(policy, noise=0.0)
    for g in groups:
        for c in g.completions:
            c.logprobs = [x + 2.0 for x in c.logprobs]  # generator thought tokens were far likelier
    algo = AlgorithmConfig(offpolicy_mask_delta=0.5)
    m = Trainer(policy, algo, OptimConfig()).compute_gradients(groups)
    assert 0.0 < m["offpolicy_masked_frac"] < 1.0


def test_compute_meter_counts_trained_tokens(make_policy, make_groups):
    policy = make_policy()
    meter = ComputeMeter(flop_params(policy.model))
    trainer = Trainer(policy, AlgorithmConfig(zero_variance_filter=False), OptimConfig())
    groups = make_groups(policy)
    trainer.step(groups)
    batch = collate(groups, policy.pad_token_id)
    assert meter.trained_tokens == 0  # the meter was not given to the trainer
    trainer.meter = meter
    trainer.step(groups)
    assert meter.trained_tokens == batch.num_tokens
    assert meter.flops == 6 * meter.n_params * batch.num_tokens
    assert meter.busy_seconds["trainer"] > 0


def test_bf16_autocast_step_runs_with_fp32_head(make_policy, make_groups):
    policy = make_policy(dtype="bfloat16")
    groups = make_groups(policy)
    trainer = Trainer(policy, AlgorithmConfig(), OptimConfig(lr=1e-3))
    lp = trainer.compute_logprobs(collate(groups, policy.pad_token_id))
    assert lp.dtype == torch.float32
    m = trainer.step(groups)
    assert m["skipped_nonfinite"] == 0.0 and trainer.version == 1
    assert next(policy.model.parameters()).dtype == torch.float32  # fp32 master weights


def test_from_config_and_weights_for_engine(make_policy, make_groups):
    policy = make_policy()
    cfg = RunConfig()
    trainer = Trainer.from_settings(trainer_settings(cfg), policy)
    assert trainer.temperature == cfg.generation.temperature
    weights = trainer.weights_for_engine()
    name, tensor = next(iter(weights.items()))
    assert tensor.device.type == "cpu"
    assert tensor.data_ptr() != policy.model.state_dict()[name].data_ptr()
    with pytest.raises(ValueError, match="max_new_tokens"):
        Trainer(policy, AlgorithmConfig(aggregation="constant"), OptimConfig())
