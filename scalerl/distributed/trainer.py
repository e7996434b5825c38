"""The sharded trainer as Ray actors, and its controller-side `Trainer`.

`TrainerRankWorker` is the body of one rank's actor: it joins the FSDP process group (gloo on CPU,
NCCL on GPU, with `distributed.timeout_s` as the group timeout, so a lost peer ends a collective
instead of hanging it for the default 30 minutes), builds its rank of the trainer, and serves the
controller: `step` (every rank gets the full batch and trains its slice), `gather` (every rank takes
part in gathering the full weights; rank 0 puts them in the object store in buckets), the
collective weight-sync endpoints (`stream_weights`: every rank gathers bucket by bucket from its
shards while rank 0 broadcasts each one, so no process holds the whole model), and checkpoint
save / load.

`RayTrainer` implements the pipeline's `Trainer` protocol over those actors. Each call waits on all
ranks with the timeout; a rank whose process died or that did not answer raises
`TrainerRankError` naming it (the run stops; `--resume` continues from the last checkpoint).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from scalerl.config import AlgorithmConfig, DistributedConfig, ModelConfig, OptimConfig
from scalerl.distributed.channel import RemoteWeights
from scalerl.distributed.cluster import PeerError, free_port, import_ray, node_ip, startup_hint, wait_all
from scalerl.distributed.weights import BucketMeta, WeightGroup, bucket_state, plan_buckets, stream_to_group
from scalerl.rollout.fingerprint import Fingerprint, state_fingerprints
from scalerl.telemetry.compute import ComputeMeter, flop_params
from scalerl.training.batch import ScoredGroup
from scalerl.training.checkpoint import CheckpointState
from scalerl.training.trainer import TrainerSettings

RANK_CONCURRENCY = 2  # a step or a sync, plus the controller's liveness questions


class TrainerRankError(RuntimeError):
    """A trainer rank died, failed or timed out; the message names the rank."""


def settings_payload(model: ModelConfig, settings: TrainerSettings, d: DistributedConfig,
                     lora_seed: int = 0) -> dict[str, Any]:
    """What a rank needs to build its trainer, as JSON-able values (read back by `settings_from_payload`);
    `lora_seed` draws a LoRA adapter's initial A (the run's `seed`, as the local trainer's)."""
    return {
        "lora_seed": int(lora_seed),
        "model": model.model_dump(mode="json"),
        "algorithm": settings.algorithm.model_dump(mode="json"),
        "optim": settings.optim.model_dump(mode="json"),
        "temperature": settings.temperature,
        "max_new_tokens": settings.max_new_tokens,
        "distributed": d.model_dump(mode="json"),
    }


def settings_from_payload(payload: dict[str, Any]) -> tuple[ModelConfig, TrainerSettings, DistributedConfig]:
    settings = TrainerSettings(
        algorithm=AlgorithmConfig.model_validate(payload["algorithm"]),
        optim=OptimConfig.model_validate(payload["optim"]),
        temperature=float(payload["temperature"]),
        max_new_tokens=payload["max_new_tokens"],
    )
    return (ModelConfig.model_validate(payload["model"]), settings,
            DistributedConfig.model_validate(payload["distributed"]))


def lora_meter_kwargs(n_params: int, n_trainable: int) -> dict[str, int]:
    """`ComputeMeter`'s LoRA pricing: training tokens at `4N + 2 N_adapter`, generation and reference
    passes at the base's N (`scalerl.telemetry.compute`); nothing when every parameter trains."""
    if n_trainable >= n_params:
        return {}
    return {"trainable_params": n_trainable, "generation_params": n_params - n_trainable}


@dataclass
class RankInfo:
    rank: int
    pid: int
    version: int
    n_params: int
    n_trainable: int  # the adapter's N for LoRA (a training token costs 4N + 2 N_adapter), else n_params
    resumed: CheckpointState | None  # what the rank restored, when resuming
    vocab_size: int = 0  # the model's embedding rows (the weight-sync probe's vocabulary)


class TrainerRankWorker:
    """One trainer rank inside a Ray actor (module docstring)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.trainer: Any = None
        self._group: WeightGroup | None = None

    def rendezvous(self) -> tuple[str, int]:
        """An address on this rank's node where a process group's store can listen."""
        return node_ip(), free_port()

    def setup(self, payload: dict[str, Any], host: str, port: int, resume: str | None) -> RankInfo:
        from scalerl.distributed.fsdp import ShardedTrainerRank
        from scalerl.distributed.group import ProcessGroupSpec

        model, settings, d = settings_from_payload(payload)
        gpu = d.trainer_num_gpus > 0 and torch.cuda.is_available()
        # Ray sets CUDA_VISIBLE_DEVICES to the GPU it granted this actor: it is cuda:0 here.
        spec = ProcessGroupSpec(self.rank, self.world_size, f"tcp://{host}:{port}", timeout_s=d.timeout_s,
                                backend="nccl" if gpu else "gloo", device="cuda:0" if gpu else "cpu")
        self.trainer = ShardedTrainerRank(model, settings, spec, lora_seed=int(payload.get("lora_seed", 0)))
        # The rank's trainer counts the step's work (the whole batch); the controller's meter takes
        # rank 0's counts. LoRA: priced as the local trainer's (`assembly.local.policy_meter`).
        n = flop_params(self.trainer.policy.model)
        trainable = flop_params(self.trainer.policy.model, trainable_only=True) if self.trainer.lora else n
        self.meter = ComputeMeter(n, **lora_meter_kwargs(n, trainable))
        self.trainer.trainer.meter = self.meter
        saved = self.trainer.load(resume) if resume is not None else None
        vocab = int(self.trainer.policy.model.get_input_embeddings().weight.shape[0])
        return RankInfo(self.rank, os.getpid(), int(self.trainer.version), n, trainable, saved, vocab)

    def probe_logprobs(self, probe: Sequence[Sequence[int]]) -> tuple[int, list[list[float]]]:
        """The weight-sync probe scored by this rank's trainer (every rank together: the forward
        gathers the FSDP shards), with the version it holds (`scalerl.rollout.probe`)."""
        return int(self.trainer.version), self.trainer.trainer.probe_logprobs(probe)

    def step(self, groups: Sequence[ScoredGroup]) -> dict[str, Any]:
        before = self.meter.state_dict()
        metrics = self.trainer.step(groups)
        after = self.meter.state_dict()
        work = {k: after[k] - before[k] for k in ("trained_tokens", "trained_samples", "logprob_tokens")}
        return {"metrics": metrics, "work": work, "version": int(self.trainer.version)}

    def gather(self, bucket_bytes: int, fingerprint_dtype: str | None = None
               ) -> tuple[list[BucketMeta], list[Any], dict[str, Fingerprint] | None] | None:
        """Object-store sync: all ranks gather the full weights (a collective); rank 0 puts them in
        buckets and fingerprints them in the engines' weight dtype (`fingerprint_dtype`; None: none)."""
        state = self.trainer.engine_state_dict()  # LoRA: merged
        if self.rank != 0:
            return None
        assert state is not None
        buckets = plan_buckets(state, bucket_bytes)
        prints = None
        if fingerprint_dtype is not None:
            prints = state_fingerprints(state, getattr(torch, fingerprint_dtype))
        ray = import_ray()
        return buckets, [ray.put(bucket_state(state, b)) for b in buckets], prints

    def plan_stream(self, bucket_bytes: int) -> list[BucketMeta]:
        """Rank 0, local: the bucket plan of a streamed sync, from the shards' global shapes and
        dtypes (nothing is gathered)."""
        return plan_buckets(self.trainer.engine_tensors(), bucket_bytes)

    def stream_weights(self, version: int, buckets: list[BucketMeta], fingerprint_dtype: str | None = None
                       ) -> dict[str, Fingerprint] | None:
        """Every rank (collective sync, streamed): gather the weights bucket by bucket while rank 0
        broadcasts each bucket to the engines as soon as it is whole (`weights.stream_to_group`):
        no rank ever holds the full model (LoRA: each adapted layer merged as it is gathered). Rank 0
        returns the fingerprints of what it sent."""
        if int(self.trainer.version) != version:
            raise RuntimeError(f"trainer rank {self.rank} holds version {self.trainer.version}, asked to "
                               f"send {version}")
        if self.rank == 0 and self._group is None:
            raise RuntimeError("trainer rank 0: stream_weights before init_weight_group")
        prints: dict[str, Fingerprint] = {}
        dtype = getattr(torch, fingerprint_dtype) if fingerprint_dtype is not None else None
        def on_bucket(bucket: dict[str, torch.Tensor]) -> None:
            if dtype is not None:
                prints.update(state_fingerprints(bucket, dtype))

        stream_to_group(self.trainer.engine_tensors(), buckets, self.trainer.device,
                        self._group if self.rank == 0 else None, on_bucket if dtype is not None else None)
        return prints if self.rank == 0 and dtype is not None else None

    def full_state(self) -> dict[str, torch.Tensor] | None:
        """Every rank (collective): the full CPU state dict on rank 0 (None elsewhere), for a consumer
        in the controller's process that reads a streamed sync's weights as a mapping (LoRA: merged)."""
        return self.trainer.engine_state_dict()

    def init_weight_group(
        self, host: str, port: int, world_size: int, backend: str, timeout_s: float
    ) -> None:
        if self._group is not None:
            self._group.close()
        self._group = WeightGroup(host, port, 0, world_size, backend, timeout_s)

    def save(self, run_dir: str, step: int, extra: dict[str, Any], keep: int | None) -> str:
        return str(self.trainer.save(run_dir, step, extra=extra, keep=keep))

    def state(self) -> dict[str, Any]:
        return self.trainer.state_dict()


class RayTrainer:
    """`Trainer` over `trainer_world_size` rank actors (module docstring)."""

    def __init__(self, model: ModelConfig, settings: TrainerSettings, distributed: DistributedConfig, *,
                 resume: str | Path | None = None, meter_devices: int | None = None,
                 lora_seed: int = 0) -> None:
        ray = import_ray()
        d = distributed
        self.timeout_s = d.timeout_s
        self.bucket_bytes = int(d.bucket_mb * (1 << 20))
        self.put_weights = d.weight_sync == "object_store"
        remote = ray.remote(TrainerRankWorker)
        self.actors = [
            remote.options(num_cpus=d.trainer_num_cpus, num_gpus=d.trainer_num_gpus,
                           max_concurrency=RANK_CONCURRENCY).remote(r, d.trainer_world_size)
            for r in range(d.trainer_world_size)
        ]
        self.names = [f"trainer rank {r}" for r in range(d.trainer_world_size)]
        try:
            infos = self._start(settings_payload(model, settings, d, lora_seed), d, resume)
        except BaseException:
            self.close()
            raise
        self.last_gather_s = 0.0
        # The engines' weight dtype, set once they are up (the assembly: `pool.weight_dtype`): rank 0
        # then fingerprints what it sends, and the channel checks every engine against it.
        self.fingerprint_dtype: str | None = None
        self._version = infos[0].version
        self.resumed: CheckpointState | None = infos[0].resumed
        self.n_params = infos[0].n_params
        self.vocab_size = infos[0].vocab_size
        self.dtype = model.dtype  # the ranks' compute precision (the probe's tolerance)
        devices = meter_devices if meter_devices is not None else d.trainer_world_size + d.num_engines
        self.meter = ComputeMeter(self.n_params, num_devices=devices,
                                  role_devices={"generator": d.num_engines, "trainer": d.trainer_world_size},
                                  **lora_meter_kwargs(self.n_params, infos[0].n_trainable))

    def _start(
        self, payload: dict[str, Any], d: DistributedConfig, resume: str | Path | None
    ) -> list[RankInfo]:
        try:
            host, port = self._all(lambda r, a: a.rendezvous.remote(), "trainer rendezvous",
                                   d.startup_timeout_s, ranks=[0])[0]
            path = None if resume is None else str(resume)
            return self._all(lambda r, a: a.setup.remote(payload, host, port, path), "trainer start-up",
                             d.startup_timeout_s)
        except TrainerRankError as err:
            if not isinstance(err.__cause__, PeerError) or err.__cause__.kind != "timeout":
                raise
            hint = startup_hint("trainer ranks", d.trainer_num_cpus, d.trainer_num_gpus)
            raise TrainerRankError(f"{err}; {hint}") from err

    # ------------------------------------------------------------------------------ plumbing
    def _all(self, call: Any, what: str, timeout_s: float | None = None,
             ranks: Sequence[int] | None = None) -> list[Any]:
        ranks = list(range(len(self.actors))) if ranks is None else list(ranks)
        refs = {self.names[r]: call(r, self.actors[r]) for r in ranks}
        try:
            out = wait_all(refs, timeout_s if timeout_s is not None else self.timeout_s, what)
        except PeerError as err:
            raise TrainerRankError(f"{err} -- the run stops; `scalerl train --resume` continues from the "
                                   "last checkpoint") from err
        return [out[self.names[r]] for r in ranks]

    # ------------------------------------------------------------------------------ Trainer protocol
    @property
    def version(self) -> int:
        return self._version

    def step(self, groups: Sequence[ScoredGroup]) -> dict[str, float]:
        ray = import_ray()
        ref = ray.put(list(groups))  # one copy in the object store, read by every rank
        with self.meter.busy("trainer"):
            results = self._all(lambda r, a: a.step.remote(ref), "trainer step")
        versions = {res["version"] for res in results}
        if len(versions) != 1:
            raise TrainerRankError(f"trainer ranks disagree on the version after a step: {sorted(versions)}")
        self._version = versions.pop()
        # Every rank's meter counts the whole step (all ranks' rows): rank 0's is the run's.
        work = results[0]["work"]
        self.meter.add_training(int(work["trained_tokens"]), int(work["trained_samples"]))
        if work["logprob_tokens"]:
            self.meter.add_logprob_pass(int(work["logprob_tokens"]))
        return dict(results[0]["metrics"])

    def weights_for_engine(self) -> Mapping[str, torch.Tensor]:
        """Object-store sync: every rank gathers (a collective on all ranks), then rank 0 puts the
        buckets. Collective sync: only the plan; the channel's broadcast streams the buckets from
        the shards (`TrainerRankWorker.stream_weights`), so nothing is gathered here."""
        put = self.put_weights
        start = time.perf_counter()
        dtype = self.fingerprint_dtype
        if not put:
            [buckets] = self._all(lambda r, a: a.plan_stream.remote(self.bucket_bytes), "weight plan",
                                  ranks=[0])
            self.last_gather_s = time.perf_counter() - start
            return RemoteWeights(self._version, buckets, None, self.actors[0], self.timeout_s,
                                 senders=list(self.actors), fingerprint_dtype=dtype, fetch=self._full_state)
        results = self._all(lambda r, a: a.gather.remote(self.bucket_bytes, dtype), "weight gather")
        self.last_gather_s = time.perf_counter() - start
        buckets, refs, prints = results[0]
        return RemoteWeights(self._version, buckets, refs, self.actors[0], self.timeout_s,
                             fingerprints=prints)

    def probe_logprobs(self, probe: Sequence[Sequence[int]], version: int) -> list[list[float]]:
        """The weight-sync probe scored by the trainer's ranks (all of them: a collective), which
        must hold `version` (rank 0's result)."""
        results = self._all(lambda r, a: a.probe_logprobs.remote(list(map(list, probe))), "weight-sync probe")
        held, logprobs = results[0]
        if held != version:
            raise RuntimeError(f"weight-sync probe: the trainer ranks are at version {held}, the sync being "
                               f"verified is version {version}")
        return logprobs

    def _full_state(self) -> dict[str, torch.Tensor]:
        return self._all(lambda r, a: a.full_state.remote(), "weight gather")[0]

    # ------------------------------------------------------------------------------ checkpoints
    def save(
        self, run_dir: str | Path, step: int, extra: Mapping[str, Any] | None = None, keep: int | None = None
    ) -> Path:
        """Every rank writes its DCP shards (rank 0 also the HF export); once all have, rank 0 writes
        `state.json` with `extra` (the driver's state) last and renames the checkpoint into place."""
        payload = dict(extra or {})
        paths = self._all(lambda r, a: a.save.remote(str(run_dir), step, payload, keep), "checkpoint save")
        return Path(paths[0])

    def state_dict(self) -> dict[str, Any]:
        return dict(self._all(lambda r, a: a.state.remote(), "trainer state", ranks=[0])[0])

    def close(self) -> None:
        ray = import_ray()
        for a in self.actors:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(a)
