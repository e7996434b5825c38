"""Checkpoints: everything needed to continue a run exactly, written atomically.

Layout of `<run_dir>/checkpoints/step_000120/`:

    model.safetensors, config.json, tokenizer files   `from_pretrained(path)` loads the policy
    optimizer.pt, scheduler.pt                         torch state dicts
    rng.pt                                             python, numpy, torch (CPU and CUDA) RNG states
    state.json                                         step, trainer counters, the caller's extra state

A checkpoint is built in a hidden temporary directory and renamed into place, and `state.json` is
written last inside it, so a directory named `step_*` is always complete: a crash mid-save leaves
only a temporary directory, which the next save removes.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

CHECKPOINT_DIR = "checkpoints"
STATE_FILE = "state.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_TMP_PREFIX = ".tmp-"


@dataclass
class CheckpointState:
    """What `load_checkpoint` returns besides restoring the objects in place."""

    path: Path
    step: int
    trainer: dict[str, Any]
    extra: dict[str, Any]


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run as (step, path), oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1][1] if ckpts else None


def checkpoint_step(path: str | Path) -> int | None:
    """The step a checkpoint directory was saved at (from its state file), or None if unreadable."""
    try:
        step = json.loads((Path(path) / STATE_FILE).read_text()).get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return int(step) if isinstance(step, int) else None


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "name": np_state[0],
            "keys": torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state(
        (n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _json_dump(obj: Any, path: Path, what: str) -> None:
    try:
        text = json.dumps(obj, indent=2, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{what}: checkpoint state must be JSON (finite numbers, str keys): {err}") from None
    with path.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def write_state(directory: Path, step: int, trainer_state: Mapping[str, Any] | None,
                extra: Mapping[str, Any] | None) -> None:
    """`state.json`: the step, the trainer's counters and the caller's extra state (written last:
    its presence marks a checkpoint complete)."""
    _json_dump(
        {"step": int(step), "trainer": dict(trainer_state or {}), "extra": dict(extra or {})},
        directory / STATE_FILE,
        "extra/trainer_state",
    )


def begin_checkpoint(run_dir: str | Path, step: int, keep: int | None, token: str) -> tuple[Path, Path]:
    """Check the arguments, clear stale temporaries and return `(tmp, final)` for `step`.

    `tmp` is a hidden directory (not created) named with `token`, which must be unique to this
    save; `final` is `<run_dir>/checkpoints/step_NNNNNN`.
    """
    if step < 0:
        raise ValueError(f"step: expected >= 0, got {step}")
    if keep is not None and keep < 1:
        raise ValueError(f"keep: expected >= 1, got {keep}")
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f"{_TMP_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step_{step:06d}"
    return root / f"{_TMP_PREFIX}{final.name}-{token}", final


def finish_checkpoint(tmp: Path, final: Path, run_dir: str | Path, keep: int | None) -> Path:
    """Move the complete `tmp` to `final`, then delete all but the newest `keep` checkpoints."""
    if final.exists():
        # Saving the same step again (e.g. after a resume): the old copy goes only once the new
        # one is complete.
        old = final.parent / f"{_TMP_PREFIX}old-{tmp.name.removeprefix(_TMP_PREFIX)}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    if keep is not None:
        for _, old_path in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old_path, ignore_errors=True)
    return final


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model: Any,
    tokenizer: Any | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    trainer_state: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    keep: int | None = None,
    extra_files: Callable[[Path], None] | None = None,
) -> Path:
    """Write the checkpoint of `step`; then delete all but the newest `keep` checkpoints.

    `extra` is the caller's opaque state (prompt pool, counters, compute meter), stored as JSON.
    `extra_files(directory)` writes more files into the checkpoint before it is marked complete
    (e.g. a critic's weights and optimizer).
    """
    tmp, final = begin_checkpoint(run_dir, step, keep, token=str(os.getpid()))
    tmp.mkdir()
    try:
        model.save_pretrained(str(tmp))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        if scheduler is not None:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        if extra_files is not None:
            extra_files(tmp)
        write_state(tmp, step, trainer_state, extra)
        return finish_checkpoint(tmp, final, run_dir, keep)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_model_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Load `*.safetensors` from `path` into `model` in place (tied weights may be absent on disk)."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors model weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise ValueError(f"{path}: weights not in the model: {', '.join(result.unexpected_keys[:5])}")
    if result.missing_keys:
        # save_pretrained writes a tied tensor once; the key it left out shares storage with one loaded.
        loaded_ptrs = {t.data_ptr() for k, t in model.state_dict().items() if k in state}
        own = model.state_dict()
        really_missing = [k for k in result.missing_keys if own[k].data_ptr() not in loaded_ptrs]
        if really_missing:
            raise ValueError(f"{path}: weights missing for {', '.join(really_missing[:5])}")


def load_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    restore_rng: bool = True,
) -> CheckpointState:
    """Restore model, optimizer, scheduler and RNG states in place; return step and saved state."""
    ckpt = Path(path)
    state_file = ckpt / STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(f"{ckpt}: not a complete checkpoint (no {STATE_FILE})")
    meta = json.loads(state_file.read_text(encoding="utf-8"))
    load_model_weights(model, ckpt)
    device = next(model.parameters()).device
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", map_location=device, weights_only=True))
    if scheduler is not None:
        scheduler.load_state_dict(torch.load(ckpt / "scheduler.pt", weights_only=True))
    if restore_rng:
        set_rng_state(torch.load(ckpt / "rng.pt", weights_only=True))
    return CheckpointState(path=ckpt, step=int(meta["step"]), trainer=meta["trainer"], extra=meta["extra"])
