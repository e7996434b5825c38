"""Checkpoints carry a manifest; a corrupt one is never loaded; a full disk leaves the last one usable."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from scalerl.config import AlgorithmConfig, ModelConfig, OptimConfig, TinyModelConfig
from scalerl.training import checkpoint as ckpt_mod
from scalerl.training.checkpoint import (
    MANIFEST_FILE,
    CheckpointWriteError,
    CorruptCheckpointError,
    latest_valid_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from scalerl.training.policy import load_policy
from scalerl.training.trainer import Trainer

TINY = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                       max_position_embeddings=64)


@pytest.fixture
def trainer() -> Trainer:
    return Trainer(load_policy(ModelConfig(tiny=TINY), device="cpu"), AlgorithmConfig(), OptimConfig())


def _save(trainer: Trainer, run: Path, step: int, keep: int | None = None) -> Path:
    blob = {"blob.pt": {"t": torch.arange(step)}}
    return trainer.save(run, step, extra={"step": step}, keep=keep, files=blob)


def test_manifest_lists_every_file_with_size_and_hash(trainer: Trainer, tmp_path: Path) -> None:
    path = _save(trainer, tmp_path, 3)
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    on_disk = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {MANIFEST_FILE}
    assert set(manifest["files"]) == on_disk
    assert {"model.safetensors", "optimizer.pt", "rng.pt", "state.json", "blob.pt"} <= on_disk
    for rel, entry in manifest["files"].items():
        assert entry["size"] == (path / rel).stat().st_size
    assert verify_checkpoint(path) is True


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "manifest"])
def test_a_damaged_file_is_named_and_never_loaded(trainer: Trainer, tmp_path: Path, damage: str) -> None:
    path = _save(trainer, tmp_path, 1)
    target = path / ("model.safetensors" if damage != "manifest" else MANIFEST_FILE)
    data = target.read_bytes()
    if damage == "truncate":
        target.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        target.write_bytes(data[:-9] + bytes([data[-9] ^ 0x01]) + data[-8:])
    elif damage == "delete":
        target.unlink()
    else:
        target.write_text("{not json")
    before = [p.detach().clone() for p in trainer.policy.model.parameters()]
    with pytest.raises(CorruptCheckpointError, match=str(target).replace(".", r"\.")):
        load_checkpoint(path, model=trainer.policy.model, optimizer=trainer.optimizer)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.policy.model.parameters(), strict=True))


def test_corrupt_latest_falls_back_with_a_warning_and_is_moved_aside(
    trainer: Trainer, tmp_path: Path
) -> None:
    for step in (2, 4, 6):
        _save(trainer, tmp_path, step)
    bad = tmp_path / "checkpoints" / "step_000006" / "optimizer.pt"
    bad.write_bytes(bad.read_bytes()[:100])
    warnings: list[str] = []
    assert latest_valid_checkpoint(tmp_path, warn=warnings.append).name == "step_000004"
    assert len(warnings) == 1 and "step_000006" in warnings[0] and "optimizer.pt" in warnings[0]
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 4]
    assert (tmp_path / "checkpoints" / "corrupt-step_000006" / "optimizer.pt").exists()
    # The same step saved again starts clean, and is valid.
    assert verify_checkpoint(_save(trainer, tmp_path, 6))


def test_every_checkpoint_corrupt_is_an_error_naming_each(trainer: Trainer, tmp_path: Path) -> None:
    for step in (1, 2):
        (_save(trainer, tmp_path, step) / "rng.pt").write_bytes(b"garbage")
    with pytest.raises(CorruptCheckpointError) as info:
        latest_valid_checkpoint(tmp_path, warn=lambda m: None)
    assert "step_000002/rng.pt" in str(info.value) and "step_000001/rng.pt" in str(info.value)


def test_a_checkpoint_without_manifest_loads_with_a_warning(trainer: Trainer, tmp_path: Path, caplog) -> None:
    path = _save(trainer, tmp_path, 1)
    (path / MANIFEST_FILE).unlink()  # as written before manifests existed
    assert verify_checkpoint(path) is False
    assert load_checkpoint(path, model=trainer.policy.model).step == 1
    assert "unverified" in caplog.text
    (path / "rng.pt").write_bytes(b"garbage")  # still never garbage: the unreadable file is named
    with pytest.raises(CorruptCheckpointError, match=r"rng\.pt"):
        load_checkpoint(path, model=trainer.policy.model)


def test_enospc_while_writing_leaves_the_previous_checkpoint_usable(
    trainer: Trainer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _save(trainer, tmp_path, 1)
    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):
        if str(f).endswith("optimizer.pt"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(ckpt_mod.torch, "save", full_disk)
    with pytest.raises(CheckpointWriteError, match="No space left on device") as info:
        _save(trainer, tmp_path, 2, keep=1)
    assert "step_000002" in str(info.value)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1]
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))
    assert verify_checkpoint(first) and load_checkpoint(first, model=trainer.policy.model).step == 1


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, check=False)
    return done.returncode == 0


def test_a_real_full_disk_leaves_the_previous_checkpoint_usable(trainer: Trainer, tmp_path: Path) -> None:
    """On a tmpfs sized for one checkpoint and a half: the second save hits a real ENOSPC."""
    mnt = tmp_path / "small"
    probe = _save(trainer, tmp_path / "probe", 1)
    size = sum(p.stat().st_size for p in probe.rglob("*") if p.is_file())
    if not _mount_tmpfs(mnt, f"{int(size * 1.5) // 1024 + 64}k"):
        pytest.skip("cannot mount a tmpfs here (needs root and mount)")
    try:
        first = _save(trainer, mnt, 1)
        with pytest.raises(CheckpointWriteError, match="No space left on device"):
            _save(trainer, mnt, 2)
        assert [s for s, _ in list_checkpoints(mnt)] == [1]
        assert verify_checkpoint(first) and load_checkpoint(first, model=trainer.policy.model).step == 1
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_deleting_old_checkpoints_never_leaves_a_partial_one(
    trainer: Trainer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash in the middle of removing an old checkpoint (rmtree half done) leaves a hidden
    temporary directory, not a `step_*` whose state.json survived its weights."""
    _save(trainer, tmp_path, 1)

    def crash_midway(path, *args, **kwargs):
        victim = Path(path)
        for f in sorted(victim.glob("*.safetensors")):
            f.unlink()
        raise KeyboardInterrupt  # the process dies here

    monkeypatch.setattr(ckpt_mod.shutil, "rmtree", crash_midway)
    with pytest.raises(KeyboardInterrupt):
        _save(trainer, tmp_path, 2, keep=1)
    monkeypatch.undo()
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2]
    assert latest_valid_checkpoint(tmp_path).name == "step_000002"


def test_a_file_name_that_is_not_plain_is_refused(trainer: Trainer, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="plain"):
        save_checkpoint(tmp_path, 1, model=trainer.policy.model, files={"../x.pt": {}})
