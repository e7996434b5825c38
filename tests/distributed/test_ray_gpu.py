"""On a GPU: a 1-rank FSDP2 trainer on CUDA exporting its weights into engine actors on the same GPU
(the embedded engine, and vLLM when installed), through the object store (NCCL needs one device per
rank, so on a single GPU the collective path is not exercised). Skipped without CUDA; written for the
GPU machine, not run on the CPU machines this project is developed on (docs/distributed.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from test_ray_trainer import TINY, groups_for

from scalerl.assembly.sections import trainer_settings
from scalerl.assembly.warm_start import warm_start_default
from scalerl.config import RunConfig
from scalerl.distributed.channel import RayWeightChannel
from scalerl.distributed.engine_actor import EngineFactory
from scalerl.distributed.pool import EnginePool
from scalerl.distributed.trainer import RayTrainer
from scalerl.rollout.factory import EngineSpec
from scalerl.rollout.protocol import GenerationRequest, SamplingParams
from scalerl.training.sft import SFTConfig

pytestmark = [pytest.mark.distributed, pytest.mark.gpu]

KINDS = ["embedded", *(["vllm"] if importlib.util.find_spec("vllm") is not None else [])]


@pytest.mark.parametrize("kind", KINDS)
def test_cuda_rank_exports_into_an_engine_on_the_gpu(ray_cluster: object, tmp_path: Path, kind: str) -> None:
    ray = ray_cluster
    if ray.cluster_resources().get("GPU", 0) < 1:  # type: ignore[attr-defined]
        pytest.skip("the Ray instance sees no GPU")
    base = RunConfig.model_validate({"model": {"tiny": TINY}, "data": {"synthetic": {"num_prompts": 40}}})
    model_dir = str(warm_start_default(base, SFTConfig(steps=2, batch_size=4), cache_dir=tmp_path / "sft"))
    cfg = RunConfig.model_validate({
        "model": {"name_or_path": model_dir}, "generation": {"n": 4, "max_new_tokens": 16},
        "optim": {"lr": 1e-3, "warmup_steps": 0},
        "distributed": {"backend": "ray", "trainer_world_size": 1, "trainer_num_gpus": 0.5,
                        "engine_num_gpus": 0.5, "timeout_s": 120, "startup_timeout_s": 600},
    })
    trainer = RayTrainer(cfg.model, trainer_settings(cfg), cfg.distributed)
    vllm_options = {"engine_kwargs": {"gpu_memory_utilization": 0.3}, "enforce_eager": True}
    options = vllm_options if kind == "vllm" else {}
    spec = EngineSpec(kind=kind, model_path=model_dir, fp32_lm_head=True, seed=0,  # type: ignore[arg-type]
                      max_batch_size=4, eos_token_ids=(0,), options=options)
    pool = EnginePool.launch([EngineFactory(spec, device="cuda")], cfg.distributed)
    try:
        channel = RayWeightChannel(pool, mode="object_store", timeout_s=120)
        params = SamplingParams(n=2, temperature=0.0, max_new_tokens=8)
        probe = [GenerationRequest("probe", [5, 6, 7], params)]
        before = [c.logprobs for c in pool.generate(probe)]
        trainer.step(groups_for(model_dir))
        weights = trainer.weights_for_engine()
        assert all(t.device.type == "cpu" for t in dict(weights).values())
        channel.publish(weights, trainer.version)
        assert pool.version == trainer.version == 1
        after = pool.generate(probe)
        assert all(c.versions == [1] * c.num_tokens for c in after)
        assert [c.logprobs for c in after] != before
        print(f"{kind}: weight sync {channel.last_seconds:.3f} s, gather {trainer.last_gather_s:.3f} s")
    finally:
        pool.close()
        trainer.close()
    assert torch.cuda.is_available()
