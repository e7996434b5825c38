"""Functions the FSDP2 tests run on spawned ranks (`spawn_ranks(fn, ...)` calls `fn(spec, *args)`)."""

from __future__ import annotations

import copy
import functools
import time
from pathlib import Path
from typing import Any

import torch
from fsdp_cases import scored_groups

from scalerl.assembly.sections import trainer_settings
from scalerl.config import RunConfig
from scalerl.distributed import ProcessGroupSpec, ShardedTrainerRank
from scalerl.distributed.group import barrier
from scalerl.training.batch import ScoredGroup
from scalerl.training.checkpoint import latest_checkpoint
from scalerl.training.forward import ResponseForward

Op = tuple[str, int]  # ("grad" | "step", batch number)

BATCHES: dict[int, dict[str, Any]] = {
    0: {"seed": 0},  # 15 rows: 7 on rank 0, 8 on rank 1
    1: {"seed": 1, "zero_variance": 1},
    2: {"seed": 2, "sizes": (2, 3, 5)},
    3: {"seed": 3},
    4: {"seed": 4, "sizes": (3, 5)},
}


@functools.cache
def _batch(number: int) -> list[ScoredGroup]:
    return scored_groups(**BATCHES[number])


def batch(number: int) -> list[ScoredGroup]:
    return copy.deepcopy(_batch(number))


Result = tuple[dict[str, float], dict[str, torch.Tensor]]


def run_ops(trainer: Any, ops: list[Op], rank0: bool) -> list[Result]:
    """Apply `ops` to a `ShardedTrainerRank` (or a local `Trainer`); per op its metrics and, on
    rank 0, the full gradients ("grad") or weights ("step")."""
    out = []
    for kind, number in ops:
        if kind == "grad":
            metrics = trainer.compute_gradients(batch(number))
            tensors = trainer.gradients() if isinstance(trainer, ShardedTrainerRank) else {
                n: p.grad.clone() for n, p in trainer.policy.model.named_parameters() if p.grad is not None}
        else:
            metrics = trainer.step(batch(number))
            if isinstance(trainer, ShardedTrainerRank):
                tensors = trainer.full_state_dict() or {}
            else:
                tensors = {k: v.detach().clone() for k, v in trainer.policy.model.state_dict().items()}
        out.append((metrics, tensors if rank0 else {}))
    return out


def cases_job(spec: ProcessGroupSpec, cases: dict[str, tuple[RunConfig, list[Op]]]) -> dict[str, Any]:
    """Every case on a fresh `ShardedTrainerRank`; results keyed by case name."""
    results: dict[str, Any] = {}
    for name, (cfg, ops) in cases.items():
        rank = ShardedTrainerRank(cfg.model, trainer_settings(cfg), spec)
        results[name] = run_ops(rank, ops, spec.rank == 0)
    return results


def nonfinite_job(spec: ProcessGroupSpec, cfg: RunConfig) -> dict[str, Any]:
    """Rank 1 alone sees NaN log-probs in its first pass: both ranks must skip (and count) the
    step, report the rank, and then train the next batch in step."""
    rank = ShardedTrainerRank(cfg.model, trainer_settings(cfg), spec)
    real_forward = rank.collectives.forward
    poisoned = {"left": 1 if spec.rank == 1 else 0}

    def forward(model: torch.nn.Module, mb: Any, **kwargs: Any) -> ResponseForward:
        out = real_forward(model, mb, **kwargs)
        if poisoned["left"] and torch.is_grad_enabled():
            poisoned["left"] -= 1
            out.logprobs = out.logprobs * float("nan")
        return out

    rank.collectives.forward = forward  # type: ignore[method-assign]
    before = rank.full_state_dict()
    skipped = rank.step(batch(0))
    after_skip = rank.full_state_dict()
    poisoned["left"] = 1 if spec.rank == 1 else 0
    try:
        rank.compute_gradients(batch(0))
        error = None
    except FloatingPointError as err:
        error = str(err)
    good = rank.step(batch(1))
    # A driver bug that hands the ranks different batches is refused on every rank, before any
    # model pass, so the ranks stay in step.
    try:
        rank.step(batch(spec.rank))
        mismatch = None
    except ValueError as err:
        mismatch = str(err)
    after_mismatch = rank.step(batch(2))
    return {
        "skipped": skipped, "good": good, "error": error, "bad_steps": rank.trainer.bad_steps,
        "version": rank.version, "before": before, "after_skip": after_skip, "mismatch": mismatch,
        "after_mismatch": after_mismatch,
    }


def checkpoint_job(spec: ProcessGroupSpec, cfg: RunConfig, run_dir: str) -> dict[str, Any]:
    """Uninterrupted: steps on batches 0..3. Interrupted: save after 2 steps, a fresh rank loads
    the checkpoint and takes steps 3 and 4. Also: a save that fails on rank 1 only."""
    out: dict[str, Any] = {}
    a = ShardedTrainerRank(cfg.model, trainer_settings(cfg), spec)
    a.step(batch(0))
    a.step(batch(1))
    out["weights_at_2"] = a.full_state_dict()
    t0 = time.perf_counter()
    out["path"] = str(a.save(run_dir, 2, extra={"pipeline": {"cursor": 17}}, keep=2))
    out["save_s"] = time.perf_counter() - t0
    out["continued"] = [a.step(batch(2)), a.step(batch(3))]
    out["weights_at_4"] = a.full_state_dict()

    b = ShardedTrainerRank(cfg.model, trainer_settings(cfg), spec)
    latest = latest_checkpoint(run_dir)
    t0 = time.perf_counter()
    state = b.load(latest)
    out["load_s"] = time.perf_counter() - t0
    out["loaded"] = {"step": state.step, "extra": state.extra, "trainer": state.trainer, "version": b.version,
                     "path": str(state.path)}
    out["weights_after_load"] = b.full_state_dict()
    out["resumed"] = [b.step(batch(2)), b.step(batch(3))]
    out["weights_resumed_4"] = b.full_state_dict()

    # A save that fails on rank 1 (its RNG file cannot be written) fails on every rank, names rank 1,
    # and leaves no step directory; the next save succeeds.
    import scalerl.distributed.checkpoint as ckpt_mod

    real_save = ckpt_mod.torch.save

    def failing_save(obj: Any, path: Any, *args: Any, **kwargs: Any) -> None:
        if spec.rank == 1 and "rng" in str(path):
            raise OSError("disk full (injected)")
        real_save(obj, path, *args, **kwargs)

    ckpt_mod.torch.save = failing_save  # type: ignore[assignment]
    try:
        b.save(run_dir, 5, keep=2)
        out["failed_save"] = None
    except Exception as err:
        out["failed_save"] = f"{type(err).__name__}: {err}"
    finally:
        ckpt_mod.torch.save = real_save  # type: ignore[assignment]
    barrier(b.device)
    out["after_failed_save"] = sorted(p.name for p in (Path(run_dir) / "checkpoints").iterdir())
    try:
        b.save(run_dir, 7, extra={"loss": float("nan")})
        out["bad_extra"] = None
    except ValueError as err:
        out["bad_extra"] = str(err)
    b.save(run_dir, 6, keep=2)
    barrier(b.device)
    out["after_next_save"] = sorted(p.name for p in (Path(run_dir) / "checkpoints").iterdir())
    return out


def resume_job(spec: ProcessGroupSpec, cfg: RunConfig, checkpoint: str) -> dict[str, Any]:
    """Load a checkpoint (written by another world size) and take steps 3 and 4."""
    rank = ShardedTrainerRank(cfg.model, trainer_settings(cfg), spec)
    state = rank.load(checkpoint)
    metrics = [rank.step(batch(2)), rank.step(batch(3))]
    weights = rank.full_state_dict()
    return {"step": state.step, "version": rank.version, "metrics": metrics, "weights": weights}


def meter_counts(trainer: Any) -> dict[str, int]:
    m = trainer.trainer.meter if isinstance(trainer, ShardedTrainerRank) else trainer.meter
    return {"trained_tokens": m.trained_tokens, "trained_samples": m.trained_samples,
            "logprob_tokens": m.logprob_tokens}


def meter_job(spec: ProcessGroupSpec, cfg: RunConfig) -> dict[str, int]:
    """A compute meter on a rank counts the whole step (every rank's rows)."""
    from scalerl.telemetry.compute import ComputeMeter

    rank = ShardedTrainerRank(cfg.model, trainer_settings(cfg), spec, meter=ComputeMeter(1000))
    rank.step(batch(0))
    rank.step(batch(1))
    return meter_counts(rank)


class _BrokenGroup:
    """A weight group whose broadcast fails from the second bucket on (an engine that died)."""

    def __init__(self) -> None:
        self.sent = 0

    def broadcast(self, flat: torch.Tensor) -> None:
        if self.sent >= 1:
            raise RuntimeError("engine 1 died")
        self.sent += 1


def stream_job(spec: ProcessGroupSpec, cfg: RunConfig) -> dict[str, Any]:
    """A streamed weight sync's gathering (`weights.gathered_buckets`, `stream_to_group`) on the
    shards after one step, against the full state dict; then a stream whose broadcast fails half-way
    on rank 0: every rank must still finish the gathering (no rank left in an all-gather), and the
    ranks must still train in step afterwards."""
    from scalerl.distributed.weights import gathered_buckets, plan_buckets, stream_to_group

    rank = ShardedTrainerRank(cfg.model, trainer_settings(cfg), spec)
    rank.step(batch(0))
    full = rank.full_state_dict()
    shards = rank.sharded_state_dict()
    buckets = plan_buckets(shards, 4096)  # several buckets
    flats = list(gathered_buckets(shards, buckets, rank.device, keep=spec.rank == 0))
    group = _BrokenGroup() if spec.rank == 0 else None
    try:
        stream_to_group(shards, buckets, rank.device, group)  # type: ignore[arg-type]
        failed = None
    except RuntimeError as err:
        failed = str(err)
    after = rank.step(batch(1))
    return {"full": full, "buckets": buckets, "flats": flats, "sharded_names": sorted(shards),
            "dtensors": sum(hasattr(t, "full_tensor") for t in shards.values()), "failed": failed,
            "sent": group.sent if group is not None else None, "after": after}


def step_suite_job(spec: ProcessGroupSpec, cases: dict[str, tuple[RunConfig, list[Op]]],
                   nonfinite_cfg: RunConfig, meter_cfg: RunConfig) -> dict[str, Any]:
    """`cases_job`, `nonfinite_job`, `meter_job` and `stream_job` in one spawn (starting ranks is the
    slow part)."""
    t0 = time.perf_counter()
    out = {"cases": cases_job(spec, cases), "nonfinite": nonfinite_job(spec, nonfinite_cfg),
           "meter": meter_job(spec, meter_cfg), "stream": stream_job(spec, nonfinite_cfg)}
    out["seconds"] = time.perf_counter() - t0
    return out

