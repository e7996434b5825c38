"""FSDP2 ranks as Ray actors behind the `Trainer` protocol: the 2-rank step equals the 1-process
step, the weights reach engine actors intact over both transports, a checkpoint resumes on another
world size and trains on, and a dead rank stops the step with an error naming it."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from training.conftest import build_groups

from scalerl.assembly.sections import trainer_settings
from scalerl.assembly.warm_start import warm_start_default
from scalerl.config import ModelConfig, RunConfig
from scalerl.distributed.channel import RayWeightChannel
from scalerl.distributed.engine_actor import EngineFactory
from scalerl.distributed.pool import EnginePool
from scalerl.distributed.trainer import RayTrainer, TrainerRankError
from scalerl.rollout.embedded import EmbeddedEngine
from scalerl.rollout.factory import EngineSpec
from scalerl.rollout.fingerprint import WeightSyncError
from scalerl.rollout.probe import SyncProbe, probe_sequences
from scalerl.rollout.protocol import GenerationRequest, SamplingParams
from scalerl.telemetry.compute import ComputeMeter, flop_params
from scalerl.training.policy import load_model, load_policy
from scalerl.training.sft import SFTConfig
from scalerl.training.trainer import Trainer

pytestmark = pytest.mark.distributed

TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64,
        "max_position_embeddings": 256}


def ray_trainer(cfg: RunConfig, **kwargs: Any) -> RayTrainer:
    """The run's trainer ranks, built from its sections as the composition root builds them."""
    return RayTrainer(cfg.model, trainer_settings(cfg), cfg.distributed, **kwargs)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    base = RunConfig.model_validate({"model": {"tiny": TINY}, "data": {"synthetic": {"num_prompts": 40}}})
    cache = tmp_path_factory.mktemp("sft")
    return str(warm_start_default(base, SFTConfig(steps=2, batch_size=4), cache_dir=cache))


def run_config(model_dir: str, world: int, sync: str = "object_store", algorithm: dict | None = None,
               **dist: object) -> RunConfig:
    return RunConfig.model_validate({
        "model": {"name_or_path": model_dir},
        "algorithm": algorithm or {},
        "generation": {"n": 4, "max_new_tokens": 16},
        "optim": {"lr": 1e-3, "warmup_steps": 0, "micro_batch_size": 3},
        "distributed": {"backend": "ray", "trainer_world_size": world, "trainer_num_cpus": 0.5,
                        "engine_num_cpus": 0.5, "weight_sync": sync, "timeout_s": 60,
                        "startup_timeout_s": 180, **dist},
    })


def groups_for(model_dir: str, seed: int = 0) -> list:
    policy = load_policy(ModelConfig(name_or_path=model_dir), device="cpu")
    return build_groups(policy, n_groups=3, n=4, seed=seed)


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def test_two_rank_step_equals_one_process(ray_cluster: object, model_dir: str) -> None:
    # With a KL term: the sharded reference model runs too, and its log-prob pass is metered.
    cfg = run_config(model_dir, world=2, algorithm={"kl_coef": 0.05})
    policy = load_policy(cfg.model, device="cpu")
    meter = ComputeMeter(flop_params(policy.model))
    local = Trainer.from_settings(trainer_settings(cfg), policy, meter)
    trainer = ray_trainer(cfg)
    try:
        for seed in (0, 1):
            groups = groups_for(model_dir, seed)
            want = local.step(groups)
            got = trainer.step(groups)
            assert got["version"] == want["version"] == seed + 1 and trainer.version == seed + 1
            for key in ("loss", "policy_loss", "kl", "grad_norm", "batch_tokens", "kept_samples"):
                assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
        assert max_diff(dict(trainer.weights_for_engine()), policy.weights_for_engine()) < 1e-5
        # The controller's meter counted the steps' work as the local trainer's meter did.
        assert trainer.meter.n_params == meter.n_params
        assert trainer.meter.trained_tokens == meter.trained_tokens > 0
        assert trainer.meter.logprob_tokens == meter.logprob_tokens > 0
        assert trainer.meter.flops == pytest.approx(meter.flops)
    finally:
        trainer.close()


def _logprobs(engine: object, prompt: list[int], copies: int = 1) -> list[list[float]]:
    """Per request: sampled tokens and their log-probs (seeded, so equal weights draw equal tokens)."""
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=12, seed=3)
    requests = [GenerationRequest(f"probe/{i}", prompt, params) for i in range(copies)]
    out = engine.generate(requests)  # type: ignore[attr-defined]
    return [[x for c in out if c.request_id == r.request_id for x in [*c.logprobs, *map(float, c.token_ids)]]
            for r in requests]


def test_weights_reach_every_engine_over_both_transports(ray_cluster: object, model_dir: str) -> None:
    cfg = run_config(model_dir, world=2, bucket_mb=0.01)  # several buckets
    trainer = ray_trainer(cfg)
    spec = EngineSpec(kind="embedded", model_path=model_dir, fp32_lm_head=True, seed=0, max_batch_size=4,
                      eos_token_ids=(0,))
    pool = EnginePool.launch([EngineFactory(spec), EngineFactory(spec)], cfg.distributed)
    reference = EmbeddedEngine(load_model(cfg.model, torch.device("cpu")), max_batch_size=4,
                               fp32_lm_head=True, eos_token_ids=(0,))
    [before] = _logprobs(reference, [5, 6, 7])
    sequences = probe_sequences(trainer.vocab_size, 0)
    try:
        for version, sync in enumerate(("object_store", "collective"), start=1):
            probe = SyncProbe(sequences, partial(trainer.probe_logprobs, sequences), dtype=trainer.dtype)
            channel = RayWeightChannel(pool, mode=sync, timeout_s=60, probe=probe)
            trainer.put_weights = sync == "object_store"
            trainer.step(groups_for(model_dir, version))
            weights = trainer.weights_for_engine()
            assert (weights.refs is not None) == (sync == "object_store")  # type: ignore[attr-defined]
            channel.publish(weights, trainer.version)
            assert pool.version == version and all(m.version == version for m in pool.members)
            assert channel.last_seconds > 0 and channel.syncs == 1
            # both engines scored the probe as the trainer's ranks do (one check per sync)
            figures = channel.metrics()
            assert figures["weight_verify_probe_checks"] == 1 and figures["weight_verify_probe_gap"] < 1e-5

            reference.update_weights(dict(weights), version)
            [after] = _logprobs(reference, [5, 6, 7])
            assert after != before
            before = after
            # Two requests at once: least-loaded placement puts one on each engine; both sample
            # exactly as the reference does with the trainer's weights.
            for got in _logprobs(pool, [5, 6, 7], copies=2):
                assert got == pytest.approx(after, abs=1e-6), sync
            assert [m.samples for m in pool.members] == [2 * version, 2 * version]
        # The trainer steps on and the engines are not sent the weights: the probe of the trainer's
        # version on the stale engines stops, naming an engine, the version and the gap.
        trainer.step(groups_for(model_dir, 7))
        with pytest.raises(WeightSyncError, match=r"engine \d+ does not compute the policy of version 3: .*"
                                                  r"\(tolerance 0\.001 for float32"):
            channel._probe(trainer.version)
    finally:
        pool.close()
        trainer.close()


def test_checkpoint_resumes_on_another_world_size(
    ray_cluster: object, model_dir: str, tmp_path: Path
) -> None:
    two = ray_trainer(run_config(model_dir, world=2))
    try:
        two.step(groups_for(model_dir, 0))
        path = two.save(tmp_path, 1, extra={"pipeline": {"marker": 7}}, keep=2)
        assert path == tmp_path / "checkpoints" / "step_000001" and (path / "state.json").is_file()
        saved = dict(two.weights_for_engine())
        one = ray_trainer(run_config(model_dir, world=1), resume=path)
        try:
            assert one.resumed is not None and one.resumed.step == 1
            assert one.resumed.extra == {"pipeline": {"marker": 7}} and one.version == 1
            assert max_diff(dict(one.weights_for_engine()), saved) == 0.0
            # Optimizer state came back too: the next step is the same on both.
            groups = groups_for(model_dir, 1)
            a, b = two.step(groups), one.step(groups)
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
            assert max_diff(dict(two.weights_for_engine()), dict(one.weights_for_engine())) < 1e-5
        finally:
            one.close()
    finally:
        two.close()
    # The HF export of the checkpoint loads as a plain model.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path))
    assert max_diff({k: v for k, v in model.state_dict().items() if k in saved}, saved) == 0.0


def test_dead_rank_stops_the_step_naming_it(ray_cluster: object, model_dir: str) -> None:
    ray = ray_cluster
    trainer = ray_trainer(run_config(model_dir, world=2, timeout_s=20))
    try:
        ray.kill(trainer.actors[1])  # type: ignore[attr-defined]
        start = time.monotonic()
        with pytest.raises(TrainerRankError, match=r"(?s)trainer rank 1 died.*--resume"):
            trainer.step(groups_for(model_dir))
        assert time.monotonic() - start < 20 + 10
    finally:
        trainer.close()

