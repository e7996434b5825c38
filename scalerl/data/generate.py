"""Rejection-sampled SFT data: a model's verified samples, one selection rule, SFT rows and counts.

Kimi k1.5 (arXiv 2501.12599, Sec. 2.3-2.4) warms up on long chain-of-thought data made by rejection
sampling: sample a model, keep what the verifier accepts. Its long2short step keeps the shortest
correct response of several; DeepSeek-V3.2 has specialist checkpoints generate each domain's data.
`scalerl data generate` samples every prompt k times (the engine half is
`scalerl.evaluation.difficulty.sample_chunk`), keeps the samples in a resumable work file
(`SamplesFile`, the same header-plus-lines file `scalerl data difficulty` resumes from, so a rerun
continues where a kill stopped it), and writes the rows `select` keeps.

Selection rules (`select`), over a prompt's verified samples; a sample cut at the length budget
(`finish_reason == "length"`) is never kept, correct or not, because SFT appends the end-of-sequence
token and would teach the model to stop mid-thought (counted as `correct_truncated`):

- `all_correct`: every correct sample, in sample order;
- `one_per_prompt`: the first correct sample (lowest sample index);
- `shortest_correct`: the correct sample with the fewest generated tokens (Kimi long2short);
- `longest_correct`: the correct sample with the most generated tokens;
ties go to the lower sample index. A prompt with no kept sample gives no row (counted).

Rows (`sft_row`): the prompt record's fields (`id` made `<prompt id>/<sample index>`) plus
`response`, which `scalerl sft` (`scalerl.training.sft_data`) reads as the target, and
`metadata.generated = {"prompt_id", "sample_index", "tokens", "correct", "k", "pass_rate", "rule",
"model"}`. The counts (`GenerateCounts`) go to a sidecar JSON beside the output.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from scalerl.data.difficulty import PartialFile
from scalerl.data.records import PromptRecord

RULES: tuple[str, ...] = ("all_correct", "one_per_prompt", "shortest_correct", "longest_correct")
METADATA_KEY = "generated"
STATS_SUFFIX = ".stats.json"


@dataclass(frozen=True)
class Sample:
    """One verified sample of a prompt."""

    index: int
    text: str
    correct: bool
    tokens: int
    truncated: bool

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Sample:
        return cls(index=int(d["index"]), text=str(d["text"]), correct=bool(d["correct"]),
                   tokens=int(d["tokens"]), truncated=bool(d["truncated"]))


@dataclass(frozen=True)
class PromptSamples:
    """All k samples of one prompt (one line of the work file)."""

    id: str
    samples: tuple[Sample, ...]
    verifier_failures: int = 0

    @property
    def k(self) -> int:
        return len(self.samples)

    @property
    def correct(self) -> int:
        return sum(s.correct for s in self.samples)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "samples": [asdict(s) for s in self.samples],
                "verifier_failures": self.verifier_failures}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PromptSamples:
        return cls(id=str(d["id"]), samples=tuple(Sample.from_dict(s) for s in d["samples"]),
                   verifier_failures=int(d.get("verifier_failures", 0)))


class SamplesFile(PartialFile):
    """`scalerl data generate`'s work file: a settings header, then one `PromptSamples` per line."""

    HEADER_KEY = "scalerl_generate"

    @staticmethod
    def parse_result(d: Mapping[str, Any]) -> PromptSamples:
        return PromptSamples.from_dict(d)


def select(samples: Sequence[Sample], rule: str) -> list[Sample]:
    """The samples `rule` keeps (see the module docstring), in sample order."""
    if rule not in RULES:
        raise ValueError(f"--select: one of {', '.join(RULES)}, got {rule!r}")
    ok = sorted((s for s in samples if s.correct and not s.truncated), key=lambda s: s.index)
    if not ok or rule == "all_correct":
        return ok
    if rule == "one_per_prompt":
        return ok[:1]
    if rule == "shortest_correct":
        return [min(ok, key=lambda s: (s.tokens, s.index))]
    return [min(ok, key=lambda s: (-s.tokens, s.index))]


def sft_row(record: PromptRecord, sample: Sample, result: PromptSamples, rule: str,
            model: str) -> dict[str, Any]:
    """One SFT row: the prompt record, the kept sample as `response`, where it came from."""
    row = {k: v for k, v in record.to_dict().items() if k != "source" and v is not None}
    meta = dict(record.metadata)
    meta[METADATA_KEY] = {"prompt_id": record.id, "sample_index": sample.index, "tokens": sample.tokens,
                          "correct": result.correct, "k": result.k,
                          "pass_rate": result.correct / result.k, "rule": rule, "model": model}
    row.update(id=f"{record.id}/{sample.index}", metadata=meta, response=sample.text)
    return row


@dataclass
class GenerateCounts:
    """What a generate run sampled and kept; `per_prompt` maps a prompt id to its numbers."""

    rule: str
    prompts: int = 0
    samples: int = 0
    correct: int = 0
    correct_truncated: int = 0
    verifier_failures: int = 0
    kept: int = 0
    prompts_kept: int = 0
    prompts_without_kept: int = 0
    per_prompt: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_rows(records: Iterable[PromptRecord], results: Mapping[str, PromptSamples], rule: str,
               model: str) -> tuple[list[dict[str, Any]], GenerateCounts]:
    """Every kept row, in prompt order then sample order, and the counts."""
    counts = GenerateCounts(rule=rule)
    rows: list[dict[str, Any]] = []
    for record in records:
        result = results[record.id]
        kept = select(result.samples, rule)
        counts.prompts += 1
        counts.samples += result.k
        counts.correct += result.correct
        counts.correct_truncated += sum(s.correct and s.truncated for s in result.samples)
        counts.verifier_failures += result.verifier_failures
        counts.kept += len(kept)
        counts.prompts_kept += bool(kept)
        counts.prompts_without_kept += not kept
        counts.per_prompt[record.id] = {"correct": result.correct, "k": result.k,
                                        "pass_rate": result.correct / result.k, "kept": len(kept)}
        rows.extend(sft_row(record, s, result, rule, model) for s in kept)
    return rows, counts


__all__ = ["METADATA_KEY", "RULES", "STATS_SUFFIX", "GenerateCounts", "PromptSamples", "Sample",
           "SamplesFile", "build_rows", "select", "sft_row"]
