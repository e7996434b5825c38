"""The identity of the model a run starts from, recorded in the run directory (`start_model.json`).

Two runs can only be compared as recipes when they start from the same weights. A run records
its starting model as `{"name_or_path", "sha256", "weights_bytes", ...}`: `sha256` is a content
hash of the weight files (`*.safetensors`, `*.bin`, `*.pt`, by name and bytes), so two copies of
one model agree wherever they live and a retrained warm start under the same path does not.
A Hub id that is not a local folder is identified by its name alone (`sha256` null), and the
embedded tiny model built from a config (no folder) by a digest of that config. Weight files past
`MAX_HASH_BYTES` in total are identified by their names and sizes (`sha256` null), so a large
model does not spend minutes hashing before its first step.

`scalerl compare` reads this file to say when its runs started from different models.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

START_MODEL_FILE = "start_model.json"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
MAX_HASH_BYTES = 16 * 2**30
_CHUNK = 2**20


def weight_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)


def weights_digest(files: list[Path]) -> str:
    """sha256 over each file's name and contents, in name order."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        with f.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
    return h.hexdigest()


def model_identity(name_or_path: str | None, tiny: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """JSON-ready identity of a model (see the module docstring)."""
    if name_or_path is None:
        config = {"tiny": dict(tiny or {})}
        digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
        return {"name_or_path": None, "sha256": None, "config_sha256": digest, **config}
    folder = Path(name_or_path).expanduser()
    if not folder.is_dir():
        return {"name_or_path": name_or_path, "sha256": None}
    files = weight_files(folder)
    size = sum(f.stat().st_size for f in files)
    out: dict[str, Any] = {"name_or_path": str(folder.resolve()), "weights_bytes": size,
                           "weight_files": [f.name for f in files]}
    out["sha256"] = weights_digest(files) if files and size <= MAX_HASH_BYTES else None
    info = folder / "sft_info.json"
    if info.is_file():
        with contextlib.suppress(OSError, ValueError, AttributeError):
            out["warm_start_key"] = json.loads(info.read_text()).get("key")
    return out


def identity_key(identity: Mapping[str, Any]) -> str:
    """What two runs must share to have started from the same model, short enough for a table:
    12 hex digits of the content hash when known (`sha256:1a2b3c4d5e6f`), else of the tiny
    config's digest, else the name with the weights' total size."""
    if identity.get("sha256"):
        return f"sha256:{str(identity['sha256'])[:12]}"
    if identity.get("config_sha256"):
        return f"tiny-config:{str(identity['config_sha256'])[:12]}"
    size = identity.get("weights_bytes")
    return f"{identity.get('name_or_path')}" + (f" ({size} bytes)" if size else "")


def read_start_model(run_dir: str | Path) -> dict[str, Any] | None:
    """A run directory's recorded starting model, or None (older runs, or not a scalerl run)."""
    p = Path(run_dir) / START_MODEL_FILE
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


__all__ = ["START_MODEL_FILE", "identity_key", "model_identity", "read_start_model"]
