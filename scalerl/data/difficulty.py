"""Model-based difficulty (Kimi k1.5): each prompt's pass rate under k samples of a model.

Kimi k1.5 (Kimi Team 2025, arXiv 2501.12599, Sec. 2.3 "Prompt Set Curation") rates difficulty with
the model itself: generate answers k = 10 times at a relatively high temperature and take the pass
rate; lower means harder. This module holds the bookkeeping, with no engine in sight: the settings
a rate depends on, the per-prompt seeds, the resumable work file and the annotated output.
`estimate_pass_rates` runs any `run_chunk(records) -> [PassRate]` over the prompts not rated yet;
`scalerl.evaluation.difficulty.score_chunk` is that function for an engine and the verifiers, and
`scalerl data difficulty` wraps it all in a command that can be killed and rerun.

Resume, without duplicates, and reproducibly: results are appended to a work file beside the output
(`OUT.partial`) one chunk of prompts at a time, each chunk flushed and fsynced. Its first line holds
the settings (model identity, k, temperature, seed, lengths, template, system prompt); a rerun with
the same settings skips the prompts already there, one with other settings is refused (naming the
setting) rather than mixing two estimates in one file. A line torn by a kill is dropped and its
prompt redone. Every prompt's samples are seeded from (seed, prompt id) alone, so a prompt gives the
same pass rate whatever chunk, batch or session it runs in: a killed and resumed run writes the same
file as an uninterrupted one. The output itself is written once, atomically, when every prompt has
a result; then the work file is removed.

Output: the prompt records (as `write_jsonl` writes them, in input order) with
`metadata["model_difficulty"] = {"pass_rate", "correct", "k", "mean_length", "truncated",
"temperature", "model"}` (`mean_length` in generated tokens, `truncated` samples cut at the length
budget), which `scalerl data curate` reads.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scalerl.data.records import PromptRecord
from scalerl.data.rejects import DataError

PARTIAL_SUFFIX = ".partial"
PARTIAL_FORMAT = 1
METADATA_KEY = "model_difficulty"
_SEED_MOD = 1 << 63


@dataclass(frozen=True)
class DifficultySettings:
    """Everything a pass rate depends on; a work file is only resumed under equal settings."""

    model: Mapping[str, Any]  # `scalerl.model_identity.model_identity` of the model
    engine: str  # engines draw differently from the same seeds: one file, one engine
    k: int
    temperature: float
    seed: int
    max_new_tokens: int
    template: str
    system_prompt: str | None
    length_control: str
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"--k: must be >= 1, got {self.k}")
        if not self.temperature > 0:
            raise ValueError(f"--temperature: must be > 0 (pass rates need sampling), got {self.temperature}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["model"] = dict(self.model)
        return out


@dataclass(frozen=True)
class PassRate:
    """One prompt's estimate: `correct` of `k` samples verified, and what the samples looked like."""

    id: str
    correct: int
    k: int
    mean_length: float
    truncated: int
    verifier_failures: int

    @property
    def pass_rate(self) -> float:
        return self.correct / self.k

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PassRate:
        return cls(id=str(d["id"]), correct=int(d["correct"]), k=int(d["k"]),
                   mean_length=float(d["mean_length"]), truncated=int(d["truncated"]),
                   verifier_failures=int(d["verifier_failures"]))


def prompt_seed(seed: int, prompt_id: str) -> int:
    """The sampling seed of one prompt: a hash of (seed, id), independent of position and batch."""
    digest = hashlib.sha256(f"{seed}\0{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % _SEED_MOD


def partial_path(out: str | os.PathLike[str]) -> Path:
    """The work file of an output: `OUT.partial` beside it."""
    p = Path(out)
    return p.with_name(p.name + PARTIAL_SUFFIX)


def _diff(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> str | None:
    """The first key path where two settings dicts differ, or None."""
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, Mapping) and isinstance(vb, Mapping):
            found = _diff(va, vb, f"{prefix}{key}.")
            if found:
                return found
        elif va != vb:
            return f"{prefix}{key} ({va!r} then, {vb!r} now)"
    return None


class PartialFile:
    """The append-only work file: a settings header, then one `PassRate` per line.

    A subclass keeps other per-prompt results (anything with `id`, `k` and `to_dict`) by naming its
    own `HEADER_KEY` and `parse_result` (`scalerl.data.generate.SamplesFile`)."""

    HEADER_KEY = "scalerl_difficulty"

    @staticmethod
    def parse_result(d: Mapping[str, Any]) -> Any:
        return PassRate.from_dict(d)

    def __init__(self, path: Path, settings: DifficultySettings) -> None:
        self.path = path
        self.settings = settings
        self.done: dict[str, Any] = {}
        self.torn_lines = 0

    @classmethod
    def open(cls, path: str | os.PathLike[str], settings: DifficultySettings) -> Any:
        """Read what an earlier session left (or start a new file); `DataError` if it cannot be resumed."""
        pf = cls(Path(path), settings)
        if pf.path.exists() and pf._load():
            return pf
        # New, or killed while its first line was being written (then it holds no result).
        pf.path.parent.mkdir(parents=True, exist_ok=True)
        pf.path.unlink(missing_ok=True)
        header = {pf.HEADER_KEY: PARTIAL_FORMAT, "settings": settings.to_dict()}
        _append_lines(pf.path, [json.dumps(header, sort_keys=True)], create=True)
        return pf

    def _load(self) -> bool:
        """Read the file; False when it holds no complete line (nothing to resume)."""
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        # A file not ending in a newline was cut mid-line by a kill: that line is dropped and redone.
        complete, tail = lines[:-1], lines[-1]
        if tail:
            self.torn_lines = 1
            with self.path.open("r+b") as f:
                f.truncate(len(raw) - len(tail))
        if not complete:
            return False
        try:
            header = json.loads(complete[0])
        except json.JSONDecodeError:
            raise DataError(f"{self.path}:1: not a {self.HEADER_KEY} work file (delete it to start over)") \
                from None
        if not isinstance(header, dict) or header.get(self.HEADER_KEY) != PARTIAL_FORMAT:
            raise DataError(f"{self.path}:1: not a {self.HEADER_KEY} work file (delete it to start over)")
        diff = _diff(header.get("settings", {}), self.settings.to_dict())
        if diff is not None:
            raise DataError(
                f"{self.path}: was started with other settings: {diff}; rerun with the same settings to "
                "resume, or pass --restart to discard it"
            )
        for lineno, line in enumerate(complete[1:], start=2):
            try:
                result = self.parse_result(json.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                raise DataError(f"{self.path}:{lineno}: unreadable result line ({err}); delete the file "
                                "to start over") from None
            if result.id in self.done:
                raise DataError(f"{self.path}:{lineno}: prompt {result.id!r} appears twice")
            if result.k != self.settings.k:
                raise DataError(f"{self.path}:{lineno}: k={result.k}, the settings say {self.settings.k}")
            self.done[result.id] = result
        return True

    def append(self, results: Sequence[Any]) -> None:
        """Add results durably (flush + fsync): after this returns, a kill loses none of them."""
        fresh = [r for r in results if r.id not in self.done]
        if len(fresh) != len(results):
            raise ValueError("PartialFile.append: a prompt already has a result")
        _append_lines(self.path, [json.dumps(r.to_dict(), sort_keys=True) for r in fresh])
        self.done.update((r.id, r) for r in fresh)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def _append_lines(path: Path, lines: Sequence[str], create: bool = False) -> None:
    if not lines:
        return
    with path.open("x" if create else "a", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
        f.flush()
        os.fsync(f.fileno())


def estimate_pass_rates(
    records: Sequence[PromptRecord],
    partial: PartialFile,
    run_chunk: Callable[[Sequence[PromptRecord]], list[Any]],
    *,
    chunk_size: int = 64,
    on_chunk: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Pass rates (or any per-prompt results) of every record: those already in `partial`, then the
    rest chunk by chunk.

    `run_chunk` rates a list of records (`scalerl.evaluation.difficulty.score_chunk` bound to an
    engine); each chunk's results are
    appended to `partial` before the next starts. `on_chunk(done, total)` reports progress.
    A record id in `partial` but not in `records` means the input changed: an error.
    """
    if chunk_size < 1:
        raise ValueError(f"--chunk: must be >= 1, got {chunk_size}")
    ids = {r.id for r in records}
    stray = sorted(set(partial.done) - ids)
    if stray:
        raise DataError(f"{partial.path}: has results for {len(stray)} prompt(s) not in the input "
                        f"(first: {stray[0]!r}): the input changed; pass --restart to start over")
    todo = [r for r in records if r.id not in partial.done]
    total = len(records)
    if on_chunk is not None:
        on_chunk(total - len(todo), total)
    for start in range(0, len(todo), chunk_size):
        chunk = todo[start:start + chunk_size]
        results = run_chunk(chunk)
        if [r.id for r in results] != [r.id for r in chunk]:
            raise RuntimeError("difficulty: results do not match the chunk's prompts")
        partial.append(results)
        if on_chunk is not None:
            on_chunk(total - len(todo) + start + len(chunk), total)
    return {r.id: partial.done[r.id] for r in records}


def annotate(
    records: Iterable[PromptRecord], results: Mapping[str, PassRate], settings: DifficultySettings,
    model_name: str,
) -> list[PromptRecord]:
    """Copies of `records` with `metadata["model_difficulty"]` (see the module docstring)."""
    from dataclasses import replace

    out = []
    for r in records:
        res = results[r.id]
        meta = dict(r.metadata)
        meta[METADATA_KEY] = {"pass_rate": res.pass_rate, "correct": res.correct, "k": res.k,
                              "mean_length": res.mean_length, "truncated": res.truncated,
                              "temperature": settings.temperature, "model": model_name}
        out.append(replace(r, metadata=meta))
    return out


def histogram(results: Iterable[PassRate], k: int) -> list[int]:
    """How many prompts solved 0, 1, ..., k times out of k."""
    counts = [0] * (k + 1)
    for r in results:
        counts[r.correct] += 1
    return counts


__all__ = [
    "METADATA_KEY",
    "DifficultySettings",
    "PartialFile",
    "PassRate",
    "annotate",
    "estimate_pass_rates",
    "histogram",
    "partial_path",
    "prompt_seed",
]
