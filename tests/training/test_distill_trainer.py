"""On-policy distillation in the trainer: the gradient is the closed form's, a few steps pull the
student to the teacher, the teacher's forward pass is counted, and a short run trains with it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from scalerl.algorithms import token_weights
from scalerl.config import AlgorithmConfig, ConfigError, DistillConfig, OptimConfig, RunConfig, build_config
from scalerl.telemetry import ComputeMeter, flop_params
from scalerl.training.batch import collate
from scalerl.training.policy import load_policy
from scalerl.training.trainer import Trainer
from tests.training.conftest import TINY, tiny_model_config


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("teacher") / "m"
    load_policy(tiny_model_config(seed=1), device="cpu").save_pretrained(path)
    return path


def assert_grads_equal(got: list[torch.Tensor], model: torch.nn.Module) -> None:
    """The step's gradients `got` equal those the closed form's backward left in `model`."""
    for g, p in zip(got, model.parameters(), strict=True):
        assert torch.allclose(g, p.grad, atol=1e-6, rtol=1e-4)


def _algo(teacher: Path, **kw: object) -> AlgorithmConfig:
    return AlgorithmConfig(aggregation="token", distill=DistillConfig(teacher=str(teacher), **kw))


def test_pure_distillation_gradient_is_the_closed_form(make_policy, make_groups, teacher_dir: Path) -> None:
    """On-policy (ratio 1), no outcome term: the policy-gradient loss -sum_t w_t A_t log pi_s(y_t)
    with A_t = -coef d_t has the gradient of coef/2 sum_t w_t d_t^2, d_t = log pi_s - log pi_t."""
    policy = make_policy()
    groups = make_groups(policy, noise=0.0, zero_variance_groups=3)  # every group's rewards equal
    trainer = Trainer(policy, _algo(teacher_dir, coef=0.7, reward_weight=0.0), OptimConfig(lr=1e-3))
    metrics = trainer.compute_gradients(groups)
    assert metrics["kept_samples"] == 12  # equal-reward groups are kept: they carry the teacher's signal
    got = [p.grad.clone() for p in policy.model.parameters()]

    batch = collate(groups, policy.pad_token_id)
    policy.model.zero_grad(set_to_none=True)
    with torch.no_grad():
        teacher_lp = trainer.compute_logprobs(batch, trainer.teacher)
    from scalerl.training.forward import response_forward

    lp = response_forward(policy.model, batch, temperature=1.0, fp32_lm_head=True).logprobs
    mask = batch.response_mask
    w = token_weights(mask, batch.group_ids, "token", None)[:, : lp.shape[1]]
    d = torch.where(mask, lp - teacher_lp, 0.0)
    (0.5 * 0.7 * (w * d * d).sum()).backward()
    assert_grads_equal(got, policy.model)


def test_steps_pull_the_student_to_the_teacher_and_count_its_flops(make_policy, make_groups,
                                                                    teacher_dir: Path) -> None:
    policy = make_policy()
    meter = ComputeMeter(flop_params(policy.model))
    trainer = Trainer(policy, _algo(teacher_dir, reward_weight=0.0), OptimConfig(lr=3e-3, warmup_steps=0),
                      meter=meter)
    groups = make_groups(policy, noise=0.0)
    batch = collate(groups, policy.pad_token_id)

    def sq_gap() -> float:
        d = trainer.compute_logprobs(batch) - trainer.compute_logprobs(batch, trainer.teacher)
        return float((d[batch.response_mask] ** 2).mean())

    before = sq_gap()
    flops0, lp_tokens0 = meter.flops, meter.logprob_tokens
    m = trainer.step(make_groups(policy, noise=0.0))
    # The teacher's forward over the batch: 2 N_teacher per token (and the 6N training pass).
    assert meter.logprob_tokens - lp_tokens0 == batch.num_tokens
    teacher_n = flop_params(trainer.teacher)
    assert meter.flops - flops0 == pytest.approx(2 * teacher_n * batch.num_tokens + 6 * meter.n_params
                                                 * batch.num_tokens)
    assert math.isfinite(m["distill_reverse_kl"])
    for _ in range(4):
        trainer.step(make_groups(policy, noise=0.0))
    assert sq_gap() < 0.8 * before


def test_config_rules_name_the_keys(teacher_dir: Path) -> None:
    with pytest.raises(ConfigError, match="loss_type"):
        build_config([({"algorithm": {"loss_type": "kimi", "distill": {"teacher": "t"}}}, {})])
    with pytest.raises(ConfigError, match=r"distill\.teacher"):
        build_config([({"algorithm": {"distill": {"teacher": "t"}}, "distributed": {"backend": "ray"}}, {})])
    with pytest.raises(ConfigError, match=r"algorithm\.distill\.teacher"):
        policy = load_policy(tiny_model_config(), device="cpu")
        Trainer(policy, _algo(teacher_dir.parent / "missing"), OptimConfig()).teacher  # noqa: B018


def test_a_short_pure_distillation_run(teacher_dir: Path, tmp_path: Path) -> None:
    from scalerl.assembly.build import build_training
    from scalerl.telemetry import read_rows

    cfg = RunConfig.model_validate({
        "max_steps": 6,
        "model": {"tiny": TINY.model_dump()},
        "data": {"synthetic": {"num_prompts": 40}, "heldout_size": 0},
        "generation": {"n": 4, "max_new_tokens": 12, "max_batch_size": 16,
                       "length_control": {"kind": "none"}},
        "pipeline": {"off_policy": "sync", "prompts_per_step": 4},
        "optim": {"lr": 3e-3, "warmup_steps": 0},
        "algorithm": {"distill": {"teacher": str(teacher_dir), "reward_weight": 0.0}},
        "eval": {"every": 1000, "at_start": False},
        "logging": {"progress": False},
    })
    with build_training(cfg, tmp_path / "run", device="cpu", checkpoints=False) as run:
        run.driver.run()
    rows = [r for r in read_rows(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "step"]
    kl = [r["distill_reverse_kl"] for r in rows]
    assert len(kl) == 6 and all(math.isfinite(x) for x in kl)
    assert all(r["skipped_no_signal"] == 0 for r in rows)  # no group dropped for equal rewards
    assert kl[-1] < kl[0], kl


@pytest.mark.parametrize("estimator", ["sampled", "full"])
def test_a_student_that_is_its_teacher_has_no_reverse_kl(teacher_dir: Path, tmp_path: Path,
                                                         estimator: str) -> None:
    """The engine's sampling log-probs and the teacher's, computed by the trainer, line up token for
    token at the sampling temperature: a student started from the teacher's own weights measures a
    reverse KL of 0 on its first step (an off-by-one or a temperature mismatch gives nats)."""
    from scalerl.assembly.build import build_training
    from scalerl.telemetry import read_rows

    cfg = RunConfig.model_validate({
        "max_steps": 1,
        "model": {"name_or_path": str(teacher_dir)},
        "data": {"synthetic": {"num_prompts": 40}, "heldout_size": 0},
        "generation": {"n": 4, "max_new_tokens": 12, "max_batch_size": 16, "temperature": 0.7},
        "pipeline": {"off_policy": "sync", "prompts_per_step": 4},
        "algorithm": {"distill": {"teacher": str(teacher_dir), "reward_weight": 0.0,
                                  "estimator": estimator}},
        "eval": {"every": 1000, "at_start": False},
        "logging": {"progress": False},
    })
    with build_training(cfg, tmp_path / "run", device="cpu", checkpoints=False) as run:
        run.driver.run()
    (row,) = [r for r in read_rows(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "step"]
    if estimator == "sampled":
        assert row["distill_teacher_logprob"] < -0.1  # the samples are not all near-certain tokens
    assert abs(row["distill_reverse_kl"]) < 1e-5, row["distill_reverse_kl"]


def _full_kl_reference(policy, teacher, batch, temperature: float = 1.0) -> torch.Tensor:
    """KL(pi_s || pi_t) per response position from the two models' whole logits, by hand."""
    def logits(model: torch.nn.Module) -> torch.Tensor:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids).logits.float()
        p = batch.prompt_width
        return out[:, p - 1: p - 1 + batch.response_ids.shape[1]] / temperature

    log_s = torch.log_softmax(logits(policy.model), -1)
    with torch.no_grad():
        log_t = torch.log_softmax(logits(teacher), -1)
    return (log_s.exp() * (log_s - log_t)).sum(-1)


@pytest.mark.parametrize(("chunk", "micro_tokens"), [(None, None), (3, None), (None, 24), (5, 24)])
def test_full_estimator_gradient_is_the_closed_form(make_policy, make_groups, teacher_dir: Path,
                                                    chunk: int | None, micro_tokens: int | None) -> None:
    """`estimator: full`, no outcome term: the step's gradient is that of
    coef * sum_t w_t KL(pi_s || pi_t)_t over the whole vocabulary: chunked LM head or not, padded
    or packed token-budget micro-batches."""
    policy = make_policy()
    groups = make_groups(policy, noise=0.0, zero_variance_groups=3)
    algo = AlgorithmConfig(aggregation="token", distill=DistillConfig(
        teacher=str(teacher_dir), coef=0.7, reward_weight=0.0, estimator="full"))
    trainer = Trainer(policy, algo, OptimConfig(lr=1e-3, logit_chunk_tokens=chunk,
                                                micro_batch_tokens=micro_tokens))
    metrics = trainer.compute_gradients(groups)
    assert metrics["kept_samples"] == 12
    assert metrics["micro_batches"] > 1 if micro_tokens else metrics["micro_batches"] == 1
    got = [p.grad.clone() for p in policy.model.parameters()]

    batch = collate(groups, policy.pad_token_id)
    policy.model.zero_grad(set_to_none=True)
    mask = batch.response_mask
    kl = _full_kl_reference(policy, trainer.teacher, batch)
    w = token_weights(mask, batch.group_ids, "token", None)[:, : kl.shape[1]]
    assert metrics["distill_reverse_kl"] == pytest.approx(float(kl.detach()[mask].mean()), rel=1e-5)
    (0.7 * (w * torch.where(mask, kl, 0.0)).sum()).backward()
    assert_grads_equal(got, policy.model)


def test_full_estimator_counts_the_teacher_once_and_pulls_to_it(make_policy, make_groups,
                                                                teacher_dir: Path) -> None:
    policy = make_policy()
    meter = ComputeMeter(flop_params(policy.model))
    algo = AlgorithmConfig(aggregation="token", distill=DistillConfig(
        teacher=str(teacher_dir), reward_weight=0.0, estimator="full"))
    trainer = Trainer(policy, algo, OptimConfig(lr=3e-3, warmup_steps=0), meter=meter)
    batch = collate(make_groups(policy, noise=0.0), policy.pad_token_id)

    def mean_kl() -> float:
        with torch.no_grad():
            return float(_full_kl_reference(policy, trainer.teacher, batch)[batch.response_mask].mean())

    before = mean_kl()
    flops0 = meter.flops
    trainer.step(make_groups(policy, noise=0.0))
    # the teacher's decoder ran inside the training pass: 2 N_teacher per token, as the sampled
    # estimator's separate pass is counted (and the 6N training pass)
    teacher_n = flop_params(trainer.teacher)
    assert meter.flops - flops0 == pytest.approx(2 * teacher_n * batch.num_tokens + 6 * meter.n_params
                                                 * batch.num_tokens)
    for _ in range(4):
        trainer.step(make_groups(policy, noise=0.0))
    assert mean_kl() < 0.8 * before


def test_full_estimator_refuses_keep_sampling_mask() -> None:
    with pytest.raises(ConfigError, match=r"distill\.estimator"):
        build_config([({"algorithm": {"keep_sampling_mask": True,
                                      "distill": {"teacher": "t", "estimator": "full"}}}, {})])
