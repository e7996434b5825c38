"""LoRA (`model.lora.*`): adapter-only optimizer, the base as KL reference, merged weights for the
engines (verified: a skipped adapter sync is caught), peft-format checkpoints, exact resume, the
FLOPs of a partly frozen model, and a LoRA critic (its own adapter on its own base copy)."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch

from scalerl.config import AlgorithmConfig, ConfigError, LoraConfig, OptimConfig, load_config
from scalerl.models.lora import lora_delta, merged_state_dict
from scalerl.pipeline.local import EngineWeightChannel
from scalerl.rollout.embedded import EmbeddedEngine
from scalerl.rollout.fingerprint import WeightSyncError
from scalerl.telemetry.compute import ComputeMeter, flop_params, train_flops_per_token
from scalerl.training.batch import collate
from scalerl.training.checkpoint import ADAPTER_DIR, latest_checkpoint
from scalerl.training.forward import response_forward
from scalerl.training.policy import apply_lora
from scalerl.training.trainer import Trainer

LORA = LoraConfig(r=4, alpha=8.0)


def _lora_policy(make_policy, seed: int = 0, lora: LoraConfig = LORA):
    return apply_lora(make_policy(seed), lora)


def _trainer(policy, **algo) -> Trainer:
    return Trainer(policy, AlgorithmConfig(**algo), OptimConfig(lr=5e-3, warmup_steps=0))


@torch.no_grad()
def _logprobs(model, groups, pad: int) -> torch.Tensor:
    batch = collate(groups, pad)
    return response_forward(model, batch, temperature=1.0, fp32_lm_head=True).logprobs


def _adapted(policy) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in policy.model.named_parameters()}


# -- config -------------------------------------------------------------------------------------


def test_lora_keys_default_off_and_parse_from_overrides():
    assert load_config(overrides=[]).model.lora.r == 0
    cfg = load_config(overrides=["model.lora.r=8", "model.lora.alpha=32", "model.lora.dropout=0.05",
                                 "model.lora.target_modules=[q_proj,v_proj]"])
    assert (cfg.model.lora.r, cfg.model.lora.alpha, cfg.model.lora.dropout) == (8, 32.0, 0.05)
    assert cfg.model.lora.target_modules == ["q_proj", "v_proj"]
    assert load_config(overrides=["model.lora.r=8"]).model.lora.target_modules == "all-linear"


def test_lora_runs_with_the_critic_and_on_the_fsdp_ranks():
    # tests/distributed/test_fsdp_lora.py: the 2-rank LoRA step equals the 1-process one;
    # test_lora_critic_* below: the critic's own adapter.
    cfg = load_config(overrides=["model.lora.r=8", "distributed.backend=ray"])
    assert cfg.model.lora.r == 8 and cfg.distributed.backend == "ray"
    cfg = load_config(overrides=["model.lora.r=8", "algorithm.baseline=critic", "algorithm.adv_norm=batch"])
    assert cfg.model.lora.r == 8 and cfg.algorithm.baseline == "critic"


def test_unknown_target_module_is_a_config_error(make_policy):
    with pytest.raises(ConfigError, match=r"model\.lora\.target_modules"):
        apply_lora(make_policy(), LoraConfig(r=4, target_modules=["no_such_proj"]))


# -- the wrapped policy -------------------------------------------------------------------------


def test_only_the_adapter_is_trainable_and_in_the_optimizer(make_policy):
    policy = _lora_policy(make_policy)
    trainer = _trainer(policy)
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    adapters = {id(p) for n, p in policy.model.named_parameters() if ".lora_" in n}
    assert optimized == adapters and adapters
    assert all(not p.requires_grad for n, p in policy.model.named_parameters() if ".lora_" not in n)
    # Every linear layer of the decoder is adapted by default (7 per Qwen2 layer), not the head.
    layers = len(policy.model.get_decoder().layers)
    assert sum(n.endswith("lora_A.default.weight") for n, _ in policy.model.named_parameters()) == 7 * layers
    assert policy.reference_factory is None


def test_a_step_moves_the_adapter_only_and_merged_weights_are_w_plus_scaled_ba(make_policy, make_groups):
    policy = _lora_policy(make_policy)
    groups = make_groups(policy)
    before = _adapted(policy)
    _trainer(policy).step(groups)
    after = _adapted(policy)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all(".lora_" in n for n in changed)
    assert any("lora_B" in n for n in changed)  # B leaves 0: the adapter now changes the model

    merged = merged_state_dict(policy.model)
    assert _adapted(policy).keys() == after.keys()
    assert all(torch.equal(after[n], p) for n, p in _adapted(policy).items())  # not mutated
    reference = copy.deepcopy(policy.model).merge_and_unload().state_dict()
    assert merged.keys() == reference.keys()
    for key, value in reference.items():
        torch.testing.assert_close(merged[key], value, rtol=0, atol=1e-6)
    q = policy.model.get_base_model().model.layers[0].self_attn.q_proj
    expected = q.base_layer.weight + 2.0 * q.lora_B["default"].weight @ q.lora_A["default"].weight
    torch.testing.assert_close(merged["model.layers.0.self_attn.q_proj.weight"], expected.detach())
    # The merged model computes what the adapted model computes.
    pad = policy.pad_token_id
    torch.testing.assert_close(_logprobs(policy.generation_copy(), groups, pad),
                               _logprobs(policy.model, groups, pad), rtol=0, atol=1e-5)


def test_lora_delta_closed_form():
    a = torch.tensor([[1.0, 2.0, 0.0]])  # r = 1, d_in = 3
    b = torch.tensor([[1.0], [-1.0]])  # d_out = 2
    assert torch.equal(lora_delta(a, b, 0.5), torch.tensor([[0.5, 1.0, 0.0], [-0.5, -1.0, 0.0]]))


def test_kl_reference_is_the_base_without_a_second_copy(make_policy, make_groups):
    policy = _lora_policy(make_policy)
    groups = make_groups(policy)
    trainer = _trainer(policy, kl_coef=0.5, kl_in_reward=True)
    trainer.step(groups)
    trainer.step(groups)
    base = make_policy()  # the same seed: the weights the adapter sits on
    pad = policy.pad_token_id
    batch = collate(groups, pad)
    with trainer._reference_model() as ref:
        assert ref is policy.model  # the policy itself, adapter disabled: no other model
        ref_lp = trainer.compute_logprobs(batch, ref)
    mask = batch.response_mask
    torch.testing.assert_close(ref_lp[mask], _logprobs(base.model, groups, pad)[mask], rtol=0, atol=1e-5)
    # Outside the block the adapter is back on (the old-log-prob pass uses it).
    assert not torch.allclose(trainer.compute_logprobs(batch)[mask], ref_lp[mask])
    assert trainer._reference is None


# -- the engines --------------------------------------------------------------------------------


def _engine(policy) -> EmbeddedEngine:
    return EmbeddedEngine(policy.generation_copy(), fp32_lm_head=True, eos_token_ids=(policy.eos_token_id,),
                          pad_token_id=policy.pad_token_id)


def test_engine_gets_verified_merged_weights_and_a_skipped_adapter_sync_is_caught(
    make_policy, make_groups, monkeypatch
):
    policy = _lora_policy(make_policy)
    trainer = _trainer(policy)
    engine = _engine(policy)
    channel = EngineWeightChannel(engine)
    groups = make_groups(policy)
    trainer.step(groups)
    channel.publish(trainer.weights_for_engine(), trainer.version)  # verified: no error
    assert channel.verification.checks == 1 and channel.verification.verified_tensors > 0
    pad = policy.pad_token_id
    torch.testing.assert_close(_logprobs(engine.model, groups, pad), _logprobs(policy.model, groups, pad),
                               rtol=0, atol=1e-5)

    trainer.step(make_groups(policy, seed=1))
    # verl#7495: the adapter trained but the engine kept the old weights (the load was skipped).
    monkeypatch.setattr(engine, "_load_weights_locked", lambda state: None)
    with pytest.raises(WeightSyncError, match=r"lora|proj"):
        channel.publish(trainer.weights_for_engine(), trainer.version)


def test_the_fingerprint_sees_the_adapter_in_the_merged_weights(make_policy, make_groups):
    from scalerl.rollout.fingerprint import same, state_fingerprints

    policy = _lora_policy(make_policy)
    base = {k: v.clone() for k, v in merged_state_dict(policy.model).items()}  # B = 0: the base
    _trainer(policy).step(make_groups(policy))
    merged = merged_state_dict(policy.model)
    fa, fb = state_fingerprints(base), state_fingerprints(merged)
    differ = {k for k in fa if not same(fa[k], fb[k])}
    adapted = {f"{n.split('.lora_A')[0]}.weight".removeprefix("base_model.model.")
               for n, _ in policy.model.named_parameters() if "lora_A" in n}
    assert differ == adapted


# -- checkpoints --------------------------------------------------------------------------------


def test_checkpoint_holds_a_peft_adapter_that_peft_loads(make_policy, make_groups, tmp_path):
    from peft import PeftModel

    policy = _lora_policy(make_policy)
    trainer = _trainer(policy)
    groups = make_groups(policy)
    trainer.step(groups)
    path = trainer.save(tmp_path, step=1)
    assert (path / ADAPTER_DIR / "adapter_config.json").is_file()
    assert not list(path.glob("*.safetensors"))  # the base is the run's, not copied per checkpoint
    loaded = PeftModel.from_pretrained(make_policy().model, str(path / ADAPTER_DIR))
    pad = policy.pad_token_id
    torch.testing.assert_close(_logprobs(loaded, groups, pad), _logprobs(policy.model, groups, pad),
                               rtol=0, atol=0)


def test_resume_from_a_lora_checkpoint_is_exact(make_policy, make_groups, tmp_path):
    policy = _lora_policy(make_policy)
    batches = [make_groups(policy, seed=s) for s in range(3)]
    a = _trainer(policy)
    a.step(batches[0])
    a.step(batches[1])
    a.save(tmp_path, step=2)
    rng = (random.random(), float(np.random.rand()), torch.rand(3))
    m_a = a.step(batches[2])

    b = _trainer(_lora_policy(make_policy))  # a fresh adapter on the same base
    assert b.load(latest_checkpoint(tmp_path)).step == 2 and b.version == 2
    assert (random.random(), float(np.random.rand())) == rng[:2] and torch.equal(torch.rand(3), rng[2])
    m_b = b.step(batches[2])
    assert m_a["loss"] == m_b["loss"] and m_a["lr"] == m_b["lr"]
    for (na, pa), (nb, pb) in zip(a.policy.model.named_parameters(), b.policy.model.named_parameters(),
                                  strict=True):
        assert na == nb and torch.equal(pa, pb)


def test_a_lora_checkpoint_refuses_a_model_without_lora_or_of_another_rank(make_policy, tmp_path):
    policy = _lora_policy(make_policy)
    trainer = _trainer(policy)
    path = trainer.save(tmp_path, step=0)
    with pytest.raises(ValueError, match="LoRA adapter"):
        _trainer(make_policy()).load(path)
    with pytest.raises(ValueError, match="r=4"):
        _trainer(_lora_policy(make_policy, lora=LoraConfig(r=8))).load(path)


# -- compute ------------------------------------------------------------------------------------


def test_train_flops_per_token_closed_forms():
    assert train_flops_per_token(1000) == 6000.0  # full fine-tuning: 6N
    assert train_flops_per_token(1000, 1000) == 6000.0
    assert train_flops_per_token(1000, 0) == 4000.0  # frozen: forward + activation gradients only
    # LoRA: N = N_base + N_adapter, 4 N_base + 6 N_adapter.
    assert train_flops_per_token(900 + 100, 100) == 4 * 900 + 6 * 100
    with pytest.raises(ValueError, match="trainable_params"):
        train_flops_per_token(10, 11)


def test_lora_meter_prices_training_at_4n_plus_2_adapter_and_generation_at_the_base(make_policy):
    from scalerl.assembly.local import policy_meter

    full = make_policy()
    n_base = flop_params(full.model)
    policy = apply_lora(full, LORA)
    n = flop_params(policy.model)
    adapter = flop_params(policy.model, trainable_only=True)
    assert adapter == sum(p.numel() for name, p in policy.model.named_parameters() if ".lora_" in name)
    assert n == n_base + adapter
    meter = policy_meter(policy)
    meter.add_training(10, 1)
    assert meter.flops == 10 * (4 * n_base + 6 * adapter)
    meter.add_generation(3, 1, prompt_tokens=2)
    assert meter.flops == 10 * (4 * n_base + 6 * adapter) + 5 * 2 * n_base
    plain = ComputeMeter(n_base)
    plain.add_training(10, 1)
    assert plain.flops == 10 * 6 * n_base


# -- export and eval of a LoRA run ----------------------------------------------------------------


def _lora_run(make_policy, make_groups, tiny, tmp_path):
    """A run directory as `scalerl train` leaves it: config.yaml naming the base, start_model.json,
    one LoRA checkpoint."""
    import json

    from scalerl.config import RunConfig, config_to_yaml
    from scalerl.model_identity import model_identity

    base_dir = tmp_path / "base"
    make_policy().save_pretrained(base_dir)
    run = tmp_path / "run"
    run.mkdir()
    cfg = RunConfig(model={"name_or_path": str(base_dir), "tiny": tiny.model_dump(),
                           "lora": LORA.model_dump()})
    (run / "config.yaml").write_text(config_to_yaml(cfg))
    (run / "start_model.json").write_text(json.dumps(model_identity(str(base_dir))))
    policy = _lora_policy(make_policy)
    groups = make_groups(policy)
    trainer = _trainer(policy)
    trainer.step(groups)
    trainer.save(run, step=1)
    return run, base_dir, policy, groups


def test_export_writes_merged_weights_that_from_pretrained_loads(make_policy, make_groups, tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    from scalerl.cli import main

    run, _, policy, groups = _lora_run(make_policy, make_groups, tiny, tmp_path)
    out = tmp_path / "merged"
    assert main(["export", str(run), "--out", str(out)]) == 0
    card = (out / "README.md").read_text()  # the model card beside the weights
    assert "(LoRA adapter merged into it)" in card and "## Held-out pass rate" in card
    model = AutoModelForCausalLM.from_pretrained(out)
    pad = policy.pad_token_id
    torch.testing.assert_close(_logprobs(model, groups, pad), _logprobs(policy.model, groups, pad),
                               rtol=0, atol=1e-5)
    before = sorted(p.name for p in out.iterdir())
    assert main(["export", str(run), "--out", str(out)]) == 2  # never overwrites
    assert sorted(p.name for p in out.iterdir()) == before


def test_eval_source_of_a_lora_checkpoint_is_the_adapter_on_the_recorded_base(make_policy, make_groups, tiny,
                                                                              tmp_path):
    from scalerl.assembly.evaluate import resolve_source, source_policy
    from scalerl.inputs import InputError

    run, base_dir, policy, groups = _lora_run(make_policy, make_groups, tiny, tmp_path)
    loaded = source_policy(resolve_source(str(run)), "cpu")
    pad = policy.pad_token_id
    torch.testing.assert_close(_logprobs(loaded.model, groups, pad), _logprobs(policy.model, groups, pad),
                               rtol=0, atol=0)
    make_policy(seed=5).save_pretrained(base_dir)  # the base changed under the run: refused
    with pytest.raises(InputError, match="differ from those the run started from"):
        source_policy(resolve_source(str(run)), "cpu")


# -- `scalerl train model.lora.r=...` end to end ------------------------------------------------


@pytest.fixture(scope="module")
def warm_tiny(tmp_path_factory):
    from scalerl.assembly.warm_start import warm_start_default
    from scalerl.config import RunConfig
    from scalerl.training.sft import SFTConfig

    tiny = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64,
            "max_position_embeddings": 256}
    base = RunConfig.model_validate({"model": {"tiny": tiny}, "data": {"synthetic": {"num_prompts": 60}}})
    return warm_start_default(base, SFTConfig(steps=2, batch_size=4), cache_dir=tmp_path_factory.mktemp("c"))


def _train_lora(model, out, mode: str, steps: int, *extra: str) -> int:
    from scalerl.cli import main

    return main(["train", "--recipe", "base", "--model", str(model), "--output-dir", str(out),
                 "--max-steps", str(steps), "--off-policy", mode, "--max-lag", "2",
                 "model.lora.r=4", "optim.lr=1e-2", "algorithm.kl_coef=0.01",
                 "data.synthetic.num_prompts=60", "data.heldout_size=4", "generation.n=2",
                 "generation.max_new_tokens=16", "generation.length_control.kind=none",
                 "pipeline.prompts_per_step=2", "eval.every=2", "eval.k=1", "logging.progress=false",
                 "rewards.max_workers=1", "checkpoint.every=2",
                 "rewards.verifiers.math=lora_helpers:digit_share", "rewards.partial_credit=true", *extra])


def _steps(run) -> list[dict]:
    import json

    rows = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    return [r for r in rows if r["kind"] == "step"]


@pytest.mark.parametrize(("mode", "schedule"), [("sync", "threaded"), ("ppo_offpolicy", "interleaved"),
                                                ("pipeline", "interleaved")])
def test_train_with_lora_in_every_mode_syncs_verified_merged_weights(warm_tiny, tmp_path, mode, schedule):
    run = tmp_path / mode
    assert _train_lora(warm_tiny, run, mode, 3, "--schedule", schedule) == 0
    steps = _steps(run)
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["grad_norm"] > 0 for s in steps)  # every step trained the adapter
    # Verified syncs of the merged weights (the step row is logged before that step's own sync).
    assert steps[-1]["weight_verify_checks"] >= 1 and steps[-1]["weight_verify_tensors"] > 0
    assert (run / "checkpoints" / "step_000003" / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    if mode == "sync":  # every token on-policy: the engine's merged model is the trainer's model
        assert all(s["logprob_mismatch"] < 1e-4 for s in steps if s["logprob_mismatch_tokens"] > 0)


def test_train_with_lora_resumes_exactly(warm_tiny, tmp_path):
    from safetensors.torch import load_file

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert _train_lora(warm_tiny, straight, "pipeline", 4, "--schedule", "interleaved") == 0
    assert _train_lora(warm_tiny, resumed, "pipeline", 2, "--schedule", "interleaved") == 0
    assert _train_lora(warm_tiny, resumed, "pipeline", 4, "--schedule", "interleaved", "--resume") == 0
    a = load_file(str(straight / "checkpoints" / "step_000004" / ADAPTER_DIR / "adapter_model.safetensors"))
    b = load_file(str(resumed / "checkpoints" / "step_000004" / ADAPTER_DIR / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    losses = [s["loss"] for s in _steps(straight)]
    assert losses == [s["loss"] for s in _steps(resumed)] and any(x != 0 for x in losses)
    ckpts = straight / "checkpoints"
    first = load_file(str(ckpts / "step_000002" / ADAPTER_DIR / "adapter_model.safetensors"))
    assert any(not torch.equal(first[k], a[k]) for k in a)  # the adapter moved after the resume point


def test_scalerl_sft_refuses_lora_keys(tmp_path):
    from scalerl.cli import main

    assert main(["sft", "--output", str(tmp_path / "o"), "model.lora.r=8"]) == 2
    assert not (tmp_path / "o").exists()


# -- a LoRA critic ------------------------------------------------------------------------------

CRITIC_ALGO = AlgorithmConfig(baseline="critic", adv_norm="none", loss_type="grpo", aggregation="token",
                              zero_variance_filter=False)


def test_lora_critic_has_its_own_adapter_on_a_frozen_base_and_its_value_loss_drops(make_policy, make_groups):
    from scalerl.training.critic import Critic

    policy = _lora_policy(make_policy, lora=LoraConfig(r=8, alpha=16.0))
    groups = make_groups(make_policy(), n_groups=3, n=4)
    meter = ComputeMeter(flop_params(policy.model))
    trainer = Trainer(policy, CRITIC_ALGO, OptimConfig(lr=5e-3, warmup_steps=0), meter=meter)
    critic = trainer.advantages
    assert isinstance(critic, Critic)
    model = critic.model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n or n.startswith("head.") for n in trainable)
    assert any(".lora_" in n for n in trainable) and {"head.weight", "head.bias"} <= trainable
    optimized = {id(p) for g in critic.optimizer.param_groups for p in g["params"]}
    assert optimized == {id(p) for p in model.parameters() if p.requires_grad}
    # Its own tensors: nothing shared with the policy (base or adapter).
    assert not {id(p) for p in model.parameters()} & {id(p) for p in policy.model.parameters()}
    rank = {p.shape[0] for n, p in model.named_parameters() if ".lora_A." in n}
    assert rank == {8}
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    adapter_before = {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_B." in n}

    losses = [trainer.step(groups)["value_loss"] for _ in range(6)]
    assert all(np.isfinite(losses)) and losses[-1] < 0.5 * losses[0], losses
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if not p.requires_grad)
    assert any(not torch.equal(p, adapter_before[n]) for n, p in model.named_parameters() if ".lora_B." in n)
    # Priced as a partly frozen model: 4N + 2 N_trainable per critic token, not 6N.
    n, nt = flop_params(model), flop_params(model, trainable_only=True)
    assert critic.n_trainable == nt < n
    tokens = collate(groups, policy.pad_token_id).num_tokens
    assert meter.auxiliary_trained_tokens == 6 * tokens
    # Policy forward + backward (6N: this meter prices every policy weight), critic values (2N_c)
    # and one critic update (4N_c + 2N_c,trainable), six steps.
    assert meter.flops == 6 * (6 * meter.n_params + 2 * n + 4 * n + 2 * nt) * tokens


def test_lora_critic_checkpoint_resumes_exactly(make_policy, make_groups, tmp_path):
    groups = make_groups(make_policy(), n_groups=2, n=4)
    optim = OptimConfig(lr=5e-3, warmup_steps=0)
    a = Trainer(_lora_policy(make_policy), CRITIC_ALGO, optim)
    a.step(groups)
    path = a.save(tmp_path, step=1)
    assert (path / ADAPTER_DIR).is_dir() and (path / "critic" / "model.safetensors").is_file()
    b = Trainer(_lora_policy(make_policy), CRITIC_ALGO, optim)
    b.load(path)
    ma, mb = a.step(groups), b.step(groups)
    assert ma["value_loss"] == pytest.approx(mb["value_loss"], rel=1e-6)
    for (name, x), (_, y) in zip(a.advantages.model.state_dict().items(),
                                 b.advantages.model.state_dict().items(), strict=True):
        torch.testing.assert_close(y, x, rtol=1e-6, atol=1e-7, msg=name)
