"""Checkpoints of a sharded trainer: DCP shards, an HF export, and the local layout's completeness rule.

Layout of `<run_dir>/checkpoints/step_000120/` (the same directory names and `state.json` rule as
`scalerl.training.checkpoint`, so `latest_checkpoint()` and `list_checkpoints()` work unchanged):

    dcp/                                   model + optimizer, sharded (torch.distributed.checkpoint);
                                           DCP reshards on load, so another world size can resume
    model.safetensors, config.json, ...    the full model, `from_pretrained(path)` loads it
    tokenizer files
    scheduler.pt                           LR schedule (the same on every rank)
    rng/rank_00000.pt, ...                 each rank's RNG states
    state.json                             step, trainer counters, world size, the caller's extra
    manifest.json                          size and SHA-256 of every file, shards included

A LoRA model (a peft model, `model.lora.r` > 0) keeps only what training changes: `dcp/` holds the
adapter and its optimizer state (the frozen base is the run's `model.name_or_path`, left out), and
`adapter/` (peft's format, `PeftModel.from_pretrained(base, it)`, the local trainer's layout)
replaces the HF export.

Every rank writes into one hidden temporary directory (the run directory must be on a
filesystem all ranks see); once every rank has finished, rank 0 writes `state.json` and renames
the directory into place (`finish_checkpoint` writes the manifest first, hashing every rank's
files). A rank that fails makes all ranks raise (naming it) instead of leaving its peers waiting,
and the temporary directory is removed by the next save. Loading verifies the manifest on rank 0
before any rank reads a shard: a corrupt file is an error naming it on every rank.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import FSDPModule
from transformers import PreTrainedModel

from scalerl.distributed.group import barrier
from scalerl.models.lora import is_lora
from scalerl.training.checkpoint import (
    ADAPTER_DIR,
    STATE_FILE,
    CheckpointState,
    begin_checkpoint,
    finish_checkpoint,
    load_torch_file,
    rng_state,
    set_rng_state,
    verify_checkpoint,
    write_state,
)

logger = logging.getLogger(__name__)

DCP_DIR = "dcp"
RNG_DIR = "rng"
SHARDING_KEY = "sharding"  # in state.json's "trainer": the saving world size, whether optimizer state exists
T = TypeVar("T")


class CheckpointRankError(RuntimeError):
    """A rank failed its part of a sharded checkpoint; raised on every rank."""


def _on_all_ranks(what: str, fn: Callable[[], T]) -> T:
    """Run `fn` on this rank; if it raises on ANY rank, raise on every rank, naming the ranks."""
    error: BaseException | None = None
    result: Any = None
    try:
        result = fn()
    except Exception as err:
        error = err
    reports: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(reports, None if error is None else f"{type(error).__name__}: {error}")
    failed = [(r, msg) for r, msg in enumerate(reports) if msg is not None]
    if failed:
        detail = "; ".join(f"rank {r}: {msg}" for r, msg in failed)
        raise CheckpointRankError(f"{what} failed on rank(s) {[r for r, _ in failed]}: {detail}") from error
    return result


def _from_rank0(value: T) -> T:
    """Rank 0's `value` on every rank."""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _rng_file(directory: Path, rank: int) -> Path:
    return directory / RNG_DIR / f"rank_{rank:05d}.pt"


def _plain_class(model: nn.Module) -> type[PreTrainedModel]:
    """The Hugging Face class under FSDP's dynamic `FSDP<Class>` subclass."""
    for cls in type(model).__mro__:
        if issubclass(cls, PreTrainedModel) and not issubclass(cls, FSDPModule):
            return cls
    raise TypeError(f"{type(model).__name__}: not a Hugging Face PreTrainedModel")


def export_pretrained(model: nn.Module, state: Mapping[str, torch.Tensor], path: Path) -> None:
    """Write `state` (a full state dict of `model`) as `save_pretrained` does, loadable by
    `from_pretrained(path)`: the model class is instantiated without memory (meta device), takes
    the tensors as they are (strictly: every key, no extra), and saves itself."""
    cls = _plain_class(model)
    with torch.device("meta"):
        plain = cls._from_config(model.config)
    plain.load_state_dict(dict(state), strict=True, assign=True)
    plain.save_pretrained(str(path))


def _dcp_options(model: nn.Module) -> StateDictOptions:
    """What DCP saves and loads: everything, or for a LoRA model the trainable (adapter) tensors
    only (the frozen base is rebuilt from the run's model on load)."""
    return StateDictOptions(ignore_frozen_params=is_lora(model))


def save_sharded_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    tokenizer: Any | None,
    trainer_state: Mapping[str, Any],
    extra: Mapping[str, Any] | None,
    keep: int | None,
    device: torch.device,
) -> Path:
    """Write the checkpoint of `step` from every rank (collective); return its final path."""
    rank = dist.get_rank()
    # The caller's state must be JSON; checked first, on every rank, before anything is written.
    try:
        json.dumps({"trainer": dict(trainer_state), "extra": dict(extra or {})}, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"extra/trainer_state: checkpoint state must be JSON (finite numbers, str keys): "
                         f"{err}") from None

    def stage() -> tuple[Path, Path]:
        tmp, final = begin_checkpoint(run_dir, step, keep, token=f"{os.getpid()}-sharded")
        tmp.mkdir()
        return tmp, final

    # Rank 0 clears stale temporaries and creates the directory before anyone writes into it.
    staged = _on_all_ranks("checkpoint staging", stage if rank == 0 else lambda: None)
    tmp, final = _from_rank0(staged)
    try:
        # An optimizer that never stepped has no state; asking DCP for it would initialise it
        # (an AdamW step with zero gradients), changing the run being saved.
        with_optimizer = bool(optimizer.state)
        lora = is_lora(model)
        options = _dcp_options(model)
        if with_optimizer:
            msd, osd = get_state_dict(model, optimizer, options=options)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp / DCP_DIR))
        else:
            dcp.save({"model": get_model_state_dict(model, options=options)},
                     checkpoint_id=str(tmp / DCP_DIR))
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                                    ignore_frozen_params=lora))

        def write_rank_files() -> None:
            rng = _rng_file(tmp, rank)
            rng.parent.mkdir(parents=True, exist_ok=True)
            torch.save(rng_state(), rng)
            if rank == 0:
                if lora:
                    # peft picks the adapter's tensors out of the gathered (trainable) state dict.
                    model.save_pretrained(str(tmp / ADAPTER_DIR), state_dict=full)
                else:
                    export_pretrained(model, full, tmp)
                if tokenizer is not None:
                    tokenizer.save_pretrained(str(tmp))
                torch.save(scheduler.state_dict(), tmp / "scheduler.pt")

        _on_all_ranks("checkpoint write", write_rank_files)

        def publish() -> Path | None:
            if rank != 0:
                return None
            write_state(
                tmp,
                step,
                {**trainer_state, SHARDING_KEY: {"world_size": dist.get_world_size(),
                                                 "optimizer_saved": with_optimizer}},
                extra,
            )
            return finish_checkpoint(tmp, final, run_dir, keep)

        _on_all_ranks("checkpoint publish", publish)
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    barrier(device)
    return final


def load_sharded_checkpoint(
    path: str | Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    restore_rng: bool,
    device: torch.device,
) -> CheckpointState:
    """Restore model, optimizer, scheduler (and this rank's RNG) in place (collective)."""
    ckpt = Path(path)

    def read_meta() -> dict[str, Any]:
        state_file = ckpt / STATE_FILE
        if not state_file.is_file():
            raise FileNotFoundError(f"{ckpt}: not a complete checkpoint (no {STATE_FILE})")
        if not (ckpt / DCP_DIR).is_dir():
            raise FileNotFoundError(
                f"{ckpt}: no {DCP_DIR}/ shards (a single-process checkpoint? load it with Trainer.load)"
            )
        if dist.get_rank() == 0 and not verify_checkpoint(ckpt):
            logger.warning("%s: no manifest (written by an older scalerl); loading it unverified", ckpt)
        return json.loads(state_file.read_text(encoding="utf-8"))

    meta = _on_all_ranks(f"reading {ckpt}", read_meta)
    trainer_meta = dict(meta["trainer"])
    sharding = trainer_meta.pop(SHARDING_KEY, {})
    saved_world = int(sharding.get("world_size", dist.get_world_size()))
    with_optimizer = bool(sharding.get("optimizer_saved", True))
    lora = is_lora(model)
    if lora != (ckpt / ADAPTER_DIR).is_dir():
        # Checked on every rank alike (the directory is on a filesystem all ranks see).
        raise ValueError(f"{ckpt}: " + (
            f"the model is a LoRA model but the checkpoint holds no {ADAPTER_DIR}/ (written by a run "
            "without model.lora)" if lora else
            f"the checkpoint holds a LoRA adapter ({ADAPTER_DIR}/), the model has none (set model.lora.* "
            "as in the run that wrote it)"))
    options = _dcp_options(model)
    # LoRA: the frozen base is not in the checkpoint, so the load cannot be strict; every trainable
    # tensor must be there (DCP raises on a key the checkpoint lacks) and nothing else may be.
    load_options = StateDictOptions(ignore_frozen_params=lora, strict=not lora)
    if with_optimizer:
        msd, osd = get_state_dict(model, optimizer, options=options)
        dcp.load({"model": msd, "optim": osd}, checkpoint_id=str(ckpt / DCP_DIR))
        result = set_state_dict(model, optimizer, model_state_dict=msd, optim_state_dict=osd,
                                options=load_options)
    else:
        msd = get_model_state_dict(model, options=options)
        dcp.load({"model": msd}, checkpoint_id=str(ckpt / DCP_DIR))
        result = set_model_state_dict(model, msd, options=load_options)
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if result.unexpected_keys or missing:
        raise ValueError(f"{ckpt / DCP_DIR}: the adapter does not fit the model (unexpected "
                         f"{list(result.unexpected_keys)[:3]}, missing {missing[:3]})")

    def restore_local() -> None:
        scheduler.load_state_dict(load_torch_file(ckpt / "scheduler.pt"))
        if restore_rng:
            rank = dist.get_rank()
            own = _rng_file(ckpt, rank)
            if own.is_file():
                set_rng_state(load_torch_file(own))
            else:
                logger.info("%s: saved by %d ranks, no RNG state for rank %d; RNG not restored",
                            ckpt, saved_world, rank)

    _on_all_ranks(f"restoring {ckpt}", restore_local)
    barrier(device)
    return CheckpointState(path=ckpt, step=int(meta["step"]), trainer=trainer_meta, extra=meta["extra"])
