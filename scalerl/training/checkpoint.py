"""Checkpoints: everything needed to continue a run exactly, written atomically.

Layout of `<run_dir>/checkpoints/step_000120/`:

    model.safetensors, config.json, tokenizer files   `from_pretrained(path)` loads the policy
    adapter/                                           instead, for a LoRA policy: its adapter, peft's
                                                       format (PeftModel.from_pretrained(base, it))
    optimizer.pt, scheduler.pt                         torch state dicts
    rng.pt                                             python, numpy, torch (CPU and CUDA) RNG states
    state.json                                         step, trainer counters, the caller's extra state

    manifest.json                                      size and SHA-256 of every other file

A checkpoint is built in a hidden temporary directory and renamed into place, `state.json` and then
`manifest.json` written last inside it (every file fsynced first), so a directory named `step_*`
is always complete: a crash mid-save leaves only a temporary directory, which the next save
removes. Old checkpoints are deleted by renaming them to a temporary name first, so a crash in the
middle of a deletion cannot leave a half-deleted `step_*` that looks complete.

Loading verifies the manifest (`verify_checkpoint`): a missing, truncated or altered file is a
`CorruptCheckpointError` naming the file, never a load of garbage. `latest_valid_checkpoint` is
what `--resume` uses: the newest checkpoint that verifies, with a warning for each newer one that
does not (those are moved aside to `corrupt-step_*`, so a later save of the same step cannot mix
with them). A checkpoint without a manifest (deleted, or written before manifests existed) is
refused by `require_verified` and by `latest_valid_checkpoint(trust_unverified=False)` (what
`scalerl train --resume` and `scalerl export` use unless `--trust-unverified`); library loads take it
with a warning. Saving a step again keeps one good copy at every instant (`finish_checkpoint`,
`recover_interrupted_saves`). A save that fails (a full disk: ENOSPC) removes its temporary
directory and leaves the previous checkpoints as they were.
"""

from __future__ import annotations

import hashlib
import json
import logging
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

from scalerl.models.lora import ADAPTER_NAME, is_lora

logger = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
STATE_FILE = "state.json"
ADAPTER_DIR = "adapter"  # a LoRA policy's adapter, in peft's format
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "scalerl-checkpoint-manifest"
MANIFEST_VERSION = 1
_STEP_DIR = re.compile(r"^step_(\d+)$")
_TMP_PREFIX = ".tmp-"
#: the previous copy of a step being saved again, kept under this name until the new copy is in
#: place (not `_TMP_PREFIX`: a crash between the two renames must not leave it to the next cleanup)
_OLD_PREFIX = ".old-"
_OLD_DIR = re.compile(r"^\.old-(step_\d+)-")
QUARANTINE_PREFIX = "corrupt-"
_HASH_CHUNK = 1 << 20


class CorruptCheckpointError(ValueError):
    """A checkpoint whose files do not match its manifest (or cannot be read); names the file."""


class CheckpointWriteError(RuntimeError):
    """Writing a checkpoint failed (e.g. ENOSPC); the earlier checkpoints are untouched."""


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
    found: dict[int, Path] = {}
    orphans: dict[int, Path] = {}
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / STATE_FILE).is_file():
            found[int(match.group(1))] = child
        old = _OLD_DIR.match(child.name)
        if old and (child / STATE_FILE).is_file():
            orphans[int(old.group(1).removeprefix("step_"))] = child
    # A re-save interrupted between its two renames: the previous copy stands for its step.
    for step, path in orphans.items():
        found.setdefault(step, path)
    return sorted(found.items())


def recover_interrupted_saves(root: Path) -> None:
    """Finish what a re-save of a step left when it stopped between its two renames
    (`finish_checkpoint`): the previous copy `.old-step_N-*` goes back to `step_N` if that is absent,
    and is removed once a complete `step_N` stands in its place."""
    if not root.is_dir():
        return
    for child in sorted(root.iterdir()):
        match = _OLD_DIR.match(child.name)
        if not match:
            continue
        final = root / match.group(1)
        if (final / STATE_FILE).is_file() and (final / MANIFEST_FILE).is_file():
            shutil.rmtree(child, ignore_errors=True)
        elif not final.exists() and (child / STATE_FILE).is_file():
            os.replace(child, final)
            _fsync_dir(root)


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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems do not sync directories; the files themselves are synced
    finally:
        os.close(fd)


def _checkpoint_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.relative_to(directory).as_posix()
                  != MANIFEST_FILE)


def write_manifest(directory: str | Path) -> Path:
    """Fsync every file under `directory` and record its size and SHA-256 in `manifest.json`
    (written last, fsynced, then the directories)."""
    root = Path(directory)
    files: dict[str, dict[str, Any]] = {}
    for path in _checkpoint_files(root):
        with path.open("rb") as f:
            os.fsync(f.fileno())
        files[path.relative_to(root).as_posix()] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    manifest = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "files": files}
    out = root / MANIFEST_FILE
    with out.open("w", encoding="utf-8") as f:
        f.write(json.dumps(manifest, indent=1, sort_keys=True))
        f.flush()
        os.fsync(f.fileno())
    for sub in sorted({p.parent for p in _checkpoint_files(root)} | {root}, reverse=True):
        _fsync_dir(sub)
    return out


# Checkpoints verified by this process: path -> the manifest's (mtime_ns, size). Loading after a
# `--resume` selection would otherwise hash every file twice.
_verified: dict[str, tuple[int, int]] = {}


def verify_checkpoint(path: str | Path) -> bool:
    """Check every file of a checkpoint against its manifest.

    Returns True when verified, False for a checkpoint without a manifest (written before
    manifests existed; only its `state.json` is checked). Raises `CorruptCheckpointError` naming
    the first file that is missing, truncated, altered or unreadable.
    """
    ckpt = Path(path)
    state_file = ckpt / STATE_FILE
    manifest_file = ckpt / MANIFEST_FILE
    if not state_file.is_file():
        raise CorruptCheckpointError(f"{state_file}: missing (not a complete checkpoint)")
    if not manifest_file.is_file():
        _read_state(state_file)
        return False
    stat = manifest_file.stat()
    key = str(ckpt.resolve())
    if _verified.get(key) == (stat.st_mtime_ns, stat.st_size):
        return True
    try:
        manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
        files = manifest["files"]
        if manifest.get("format") != MANIFEST_FORMAT or not isinstance(files, dict):
            raise ValueError("not a scalerl checkpoint manifest")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CorruptCheckpointError(f"{manifest_file}: unreadable manifest ({err})") from None
    for rel, entry in sorted(files.items()):
        file = ckpt / rel
        if not file.is_file():
            raise CorruptCheckpointError(f"{file}: missing (listed in {MANIFEST_FILE})")
        size = file.stat().st_size
        if size != entry["size"]:
            raise CorruptCheckpointError(f"{file}: {size} bytes, {MANIFEST_FILE} says {entry['size']} "
                                         "(truncated or altered)")
        if _sha256(file) != entry["sha256"]:
            raise CorruptCheckpointError(f"{file}: SHA-256 differs from {MANIFEST_FILE} (corrupt)")
    _read_state(state_file)
    _verified[key] = (stat.st_mtime_ns, stat.st_size)
    return True


def _read_state(state_file: Path) -> dict[str, Any]:
    try:
        meta = json.loads(state_file.read_text(encoding="utf-8"))
        if not isinstance(meta, dict) or not isinstance(meta.get("step"), int):
            raise ValueError("no integer 'step'")
    except (OSError, ValueError) as err:
        raise CorruptCheckpointError(f"{state_file}: unreadable ({err})") from None
    return meta


def unverified_error(path: str | Path, flag: str = "--trust-unverified") -> CorruptCheckpointError:
    """The refusal of a checkpoint without a manifest: its files cannot be checked."""
    return CorruptCheckpointError(
        f"{Path(path) / MANIFEST_FILE}: missing, so the checkpoint's files cannot be verified (the manifest "
        f"was deleted, or a scalerl from before manifests wrote it); pass {flag} to load it anyway")


def require_verified(path: str | Path, *, trust_unverified: bool = False,
                     warn: Callable[[str], None] | None = None) -> None:
    """`verify_checkpoint`, and a checkpoint without a manifest is refused (`unverified_error`)
    unless `trust_unverified`, when `warn` hears that it loads unverified."""
    if verify_checkpoint(path):
        return
    if not trust_unverified:
        raise unverified_error(path)
    (warn or logger.warning)(f"{path}: no {MANIFEST_FILE}; loading it unverified (--trust-unverified)")


def quarantine_checkpoint(path: str | Path) -> Path:
    """Move a corrupt checkpoint aside (`corrupt-step_NNNNNN`, kept for inspection): it is no
    longer listed, and a later save of the same step starts clean."""
    ckpt = Path(path)
    target = ckpt.with_name(f"{QUARANTINE_PREFIX}{ckpt.name}")
    n = 1
    while target.exists():
        target = ckpt.with_name(f"{QUARANTINE_PREFIX}{ckpt.name}-{n}")
        n += 1
    os.replace(ckpt, target)
    return target


def latest_valid_checkpoint(
    run_dir: str | Path,
    *,
    warn: Callable[[str], None] | None = None,
    quarantine: bool = True,
    trust_unverified: bool = True,
) -> Path | None:
    """The newest checkpoint of a run that verifies (None if the run has none).

    Each newer one that fails verification is reported through `warn` (default: the log) and,
    with `quarantine`, moved aside. If checkpoints exist but none verifies, raises
    `CorruptCheckpointError` naming each one's bad file. The newest one without a manifest is
    taken with a warning when `trust_unverified`, else refused (`unverified_error`): a missing
    manifest is not a damaged file to pass over, and loading it unchecked is the user's call.
    """
    say = warn or logger.warning
    problems: list[str] = []
    for _, path in reversed(list_checkpoints(run_dir)):
        try:
            verified = verify_checkpoint(path)
        except CorruptCheckpointError as err:
            problems.append(str(err))
            where = ""
            if quarantine:
                where = f"; moved aside to {quarantine_checkpoint(path).name}"
            say(f"checkpoint {path.name} is corrupt: {err}{where}; falling back to the previous checkpoint")
            continue
        if not verified:
            if not trust_unverified:
                raise unverified_error(path)
            say(f"{path}: no {MANIFEST_FILE} (written by an older scalerl); loading it unverified")
        return path
    if problems:
        raise CorruptCheckpointError(f"no valid checkpoint under {checkpoint_dir(run_dir)}: "
                                     + "; ".join(problems))
    return None


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
    recover_interrupted_saves(root)
    for stale in root.glob(f"{_TMP_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step_{step:06d}"
    return root / f"{_TMP_PREFIX}{final.name}-{token}", final


def finish_checkpoint(tmp: Path, final: Path, run_dir: str | Path, keep: int | None) -> Path:
    """Write `tmp`'s manifest, move it to `final`, then delete all but the newest `keep` checkpoints."""
    write_manifest(tmp)
    if final.exists():
        # Saving the same step again (e.g. after a resume): the old copy goes only once the new
        # one is in place. Between the two renames the old copy is `.old-step_N-*`, which
        # `list_checkpoints` still lists and `recover_interrupted_saves` puts back after a crash.
        old = final.parent / f"{_OLD_PREFIX}{final.name}-{tmp.name.removeprefix(_TMP_PREFIX)}"
        os.replace(final, old)
        _fsync_dir(final.parent)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(final.parent)
    if keep is not None:
        for _, old_path in list_checkpoints(run_dir)[:-keep]:
            remove_checkpoint(old_path)
    return final


def remove_checkpoint(path: Path) -> None:
    """Delete a checkpoint: renamed to a temporary name first (atomic), so that a crash during the
    deletion leaves a temporary directory (removed by the next save), never a partial `step_*`."""
    doomed = path.with_name(f"{_TMP_PREFIX}del-{path.name}-{os.getpid()}")
    try:
        os.replace(path, doomed)
    except OSError:
        return
    shutil.rmtree(doomed, ignore_errors=True)


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
    files: Mapping[str, Any] | None = None,
) -> Path:
    """Write the checkpoint of `step`; then delete all but the newest `keep` checkpoints.

    `extra` is the caller's opaque state (prompt pool, counters, compute meter), stored as JSON;
    `files` maps file names to objects stored with `torch.save` (tensors, containers of them and
    of plain values: what `torch.load(weights_only=True)` reads back). `extra_files(directory)`
    writes more files into the checkpoint before it is marked complete (e.g. a critic's weights
    and optimizer); the manifest covers them too.
    """
    tmp, final = begin_checkpoint(run_dir, step, keep, token=str(os.getpid()))
    tmp.mkdir()
    try:
        if is_lora(model):
            # peft's format (adapter_config.json, adapter_model.safetensors): the base is the run's.
            model.save_pretrained(str(tmp / ADAPTER_DIR))
        else:
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
        for name, obj in (files or {}).items():
            if Path(name).name != name or name in (STATE_FILE, MANIFEST_FILE):
                raise ValueError(f"files: {name!r} is not a plain, free file name")
            torch.save(obj, tmp / name)
        write_state(tmp, step, trainer_state, extra)
        return finish_checkpoint(tmp, final, run_dir, keep)
    except ValueError:  # the caller's state (not JSON): a bug to report as it is
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except Exception as err:  # OSError (ENOSPC, EIO), and writers that raise a bare Exception for it
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointWriteError(f"{final}: checkpoint not written ({err}); the earlier checkpoints "
                                   "are unchanged") from err
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
    own_keys = set(model.state_dict())
    if set(state) - own_keys and hasattr(model, "from_pretrained"):
        # transformers >= 5 saves some architectures (the MoE experts, fused in memory) in their
        # original per-tensor layout and converts them back on loading: let it.
        fresh = type(model).from_pretrained(str(path), dtype=next(model.parameters()).dtype)
        state = dict(fresh.state_dict())
        if set(state) == own_keys:
            model.load_state_dict(state, strict=True)
            return
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


def load_adapter_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Load the LoRA adapter of checkpoint `path` (`adapter/`, peft's format) into `model`, a peft
    model with the same adapter settings (rank, alpha, target modules)."""
    adapter = Path(path) / ADAPTER_DIR
    if not is_lora(model):
        raise ValueError(f"{adapter}: the checkpoint holds a LoRA adapter, the model has none "
                         "(set model.lora.* as in the run that wrote it)")
    if not adapter.is_dir():
        raise ValueError(f"{path}: the model is a LoRA model but the checkpoint holds no {ADAPTER_DIR}/ "
                         "(it was written by a run without model.lora)")
    from peft.utils import set_peft_model_state_dict

    saved = json.loads((adapter / "adapter_config.json").read_text())
    own = model.peft_config[ADAPTER_NAME]
    for key in ("r", "lora_alpha"):
        if saved.get(key) != getattr(own, key):
            raise ValueError(f"{adapter}: adapter {key}={saved.get(key)}, the model's {getattr(own, key)} "
                             "(model.lora.r / model.lora.alpha must match the run that wrote it)")
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(model, weights, adapter_name=ADAPTER_NAME)
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if result.unexpected_keys or missing:
        raise ValueError(f"{adapter}: adapter does not fit the model (unexpected "
                         f"{list(result.unexpected_keys)[:3]}, missing {missing[:3]})")


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
    if not verify_checkpoint(ckpt):
        logger.warning("%s: no %s (written by an older scalerl); loading it unverified", ckpt, MANIFEST_FILE)
    meta = _read_state(state_file)
    try:
        if is_lora(model) or (ckpt / ADAPTER_DIR).is_dir():
            load_adapter_weights(model, ckpt)
        else:
            load_model_weights(model, ckpt)
    except (OSError, RuntimeError) as err:  # safetensors: a header or a tensor it cannot read
        raise CorruptCheckpointError(f"{ckpt}: model weights unreadable ({err})") from None
    device = next(model.parameters()).device
    if optimizer is not None:
        optimizer.load_state_dict(load_torch_file(ckpt / "optimizer.pt", map_location=device))
    if scheduler is not None:
        scheduler.load_state_dict(load_torch_file(ckpt / "scheduler.pt"))
    if restore_rng:
        set_rng_state(load_torch_file(ckpt / "rng.pt"))
    return CheckpointState(path=ckpt, step=int(meta["step"]), trainer=meta.get("trainer", {}),
                           extra=meta.get("extra", {}))


def load_torch_file(path: Path, map_location: Any = None) -> Any:
    """`torch.load(path, weights_only=True)`; an unreadable file is a `CorruptCheckpointError` naming it."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{path}: missing") from None
    except Exception as err:  # torch raises RuntimeError, pickle errors, EOFError for bad files
        raise CorruptCheckpointError(f"{path}: unreadable ({type(err).__name__}: {err})") from None
