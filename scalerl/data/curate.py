r"""Prompt-set curation from model-based pass rates (Kimi k1.5) and the easy/hard split (IsoCompute).

`curate(records, ...)` does three things, in this order, each counted:

0. **Proofs.** A prompt that asks for a proof ("prove", "proof", "show that", "demonstrate that",
   whole words, any case) is dropped as `proof` (Kimi k1.5 and Open-Reasoner-Zero exclude proof
   questions: no rule-based verifier checks a proof); `drop_proofs=False` keeps them.

1. **Easy to guess.** Kimi k1.5 (arXiv 2501.12599, Sec. 2.3) excludes questions "easy to guess,
   such as multiple-choice, true/false": a policy can collect their reward without reasoning, which
   teaches guessing. The rule here (`guess_reason`), on records with a gold answer, after
   normalising it (case, spaces, `$`, `\text{}`, `\boxed{}`, a trailing period):
   - `multiple choice`: the answer is one option letter (`B`, `(B)`, `B.`, `B)`) and the prompt
     labels at least two options with letters in one of those styles;
   - `yes/no`: the answer is yes, no, true or false (or correct / incorrect);
   - `common answer` (tiny answer sets): at least `max_answer_share` of the set's answer-bearing
     prompts, and at least `MIN_COMMON_COUNT` (3) of them, share this answer, so one constant guess
     earns that share of the reward; a set whose answers come from a handful of values loses all of
     them. (The count floor keeps two colliding answers in a small set from counting.)
   Code prompts (tests, no answer) are never guessable by this rule.
2. **Pass-rate range.** Keep `min_pass_rate <= pass rate <= max_pass_rate`, the pass rate being
   `metadata["model_difficulty"]["pass_rate"]` (written by `scalerl data difficulty`), or a plain
   `pass_rate` column. The defaults [0.05, 0.95] drop prompts the model never or always solves at
   k = 10: they give zero-variance groups, no gradient (the zero-variance filter would drop them
   anyway, after paying for their generation).
3. **Easy / hard split.** Prompts with pass rate `>= split_at` are easy, the rest hard: the two
   sets the IsoCompute work studies separately (the compute-optimal number of samples per prompt
   and batch size differ between them).

Pure: records in, records out; `scalerl data curate` reads and writes the files.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from scalerl.data.difficulty import METADATA_KEY
from scalerl.data.records import PromptRecord
from scalerl.data.rejects import DataError

YES_NO: frozenset[str] = frozenset({"yes", "no", "true", "false", "correct", "incorrect"})
# An option label: "(A)", "A)", "A." or "A:" at the start of a line or after whitespace, then text.
_OPTION = re.compile(r"(?:^|(?<=\s))\(?([A-J])(?:\)|\.|:)\s*\S", re.MULTILINE)
_LETTER = re.compile(r"^\(?([a-j])\)?\.?$")
# A prompt asking for a proof: whole words, case-insensitive (`scalerl.data.sft_curate`, rule 1).
_PROOF = re.compile(r"\b(?:prove|proof|show\s+that|demonstrate\s+that)\b", re.IGNORECASE)
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|boxed)\s*\{([^{}]*)\}")

DEFAULT_MIN_PASS_RATE = 0.05
DEFAULT_MAX_PASS_RATE = 0.95
DEFAULT_SPLIT_AT = 0.5
DEFAULT_MAX_ANSWER_SHARE = 0.05
MIN_COMMON_COUNT = 3


def normalize_answer(answer: str) -> str:
    """A gold answer reduced for comparison: no `$`, `\\text{}`/`\\boxed{}` wrappers, spaces, case,
    trailing period."""
    text = answer.strip()
    for _ in range(3):  # nested wrappers: \boxed{\text{Yes}}
        text = _TEXT.sub(r"\1", text)
    text = text.replace("$", "").replace(" ", "").lower()
    return text.rstrip(".")


def _option_labels(prompt: str) -> set[str]:
    return {m.group(1) for m in _OPTION.finditer(prompt)}


def _prompt_text(record: PromptRecord) -> str:
    if record.prompt is not None:
        return record.prompt
    return "\n".join(t["content"] for t in record.messages or [] if t["role"] == "user")


def is_proof_prompt(prompt: str) -> bool:
    """Whether the prompt asks for a proof: "prove", "proof", "show that" or "demonstrate that" as
    whole words, any case ("improve", "show your work", "shown that" do not count)."""
    return _PROOF.search(prompt) is not None


def multiple_choice(prompt: str, answer: str) -> bool:
    """Whether `answer` is one option letter that `prompt` lists among at least two lettered options."""
    letter = _LETTER.match(normalize_answer(answer))
    if letter is None:
        return False
    labels = _option_labels(prompt)
    return letter.group(1).upper() in labels and len(labels) >= 2


def guess_reason(record: PromptRecord, answer_counts: Counter[str], n_answers: int,
                 max_answer_share: float = DEFAULT_MAX_ANSWER_SHARE) -> str | None:
    """Why `record` is easy to guess (see the module docstring), or None.

    `answer_counts` counts the normalised answers of the whole set (`n_answers` records with one).
    """
    if record.answer is None:
        return None
    norm = normalize_answer(record.answer)
    if multiple_choice(_prompt_text(record), record.answer):
        return "multiple choice"
    if norm in YES_NO:
        return "yes/no"
    count = answer_counts.get(norm, 0)
    if count >= MIN_COMMON_COUNT and count / n_answers >= max_answer_share:
        return "common answer"
    return None


def pass_rate_of(record: PromptRecord) -> float:
    """The record's model-based pass rate; `DataError` naming the record when it has none."""
    where = record.source or f"prompt {record.id!r}"
    meta = record.metadata.get(METADATA_KEY)
    value = meta.get("pass_rate") if isinstance(meta, dict) else record.metadata.get("pass_rate")
    if value is None:
        raise DataError(f"{where}: no pass rate (metadata.{METADATA_KEY}.pass_rate or a pass_rate column); "
                        "run `scalerl data difficulty` first")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= 1:
        raise DataError(f"{where}: pass rate {value!r} is not a number in [0, 1]")
    return float(value)


@dataclass
class CurateResult:
    """What `curate` kept (and how it split it) and what it dropped, by reason."""

    kept: list[PromptRecord]
    easy: list[PromptRecord]
    hard: list[PromptRecord]
    dropped: list[tuple[PromptRecord, str]] = field(default_factory=list)

    def counts(self) -> Counter[str]:
        return Counter(reason for _, reason in self.dropped)


def curate(
    records: Sequence[PromptRecord],
    *,
    min_pass_rate: float = DEFAULT_MIN_PASS_RATE,
    max_pass_rate: float = DEFAULT_MAX_PASS_RATE,
    split_at: float = DEFAULT_SPLIT_AT,
    max_answer_share: float = DEFAULT_MAX_ANSWER_SHARE,
    drop_guessable: bool = True,
    drop_proofs: bool = True,
) -> CurateResult:
    """Filter and split `records` (see the module docstring); order is kept in every output."""
    if not 0 <= min_pass_rate <= max_pass_rate <= 1:
        raise ValueError(f"--pass-rate: need 0 <= lo <= hi <= 1, got [{min_pass_rate}, {max_pass_rate}]")
    if not 0 <= split_at <= 1:
        raise ValueError(f"--split-at: must be in [0, 1], got {split_at}")
    if not 0 < max_answer_share <= 1:
        raise ValueError(f"--max-answer-share: must be in (0, 1], got {max_answer_share}")
    rates = [pass_rate_of(r) for r in records]  # every record is checked before anything is decided
    answers = Counter(normalize_answer(r.answer) for r in records if r.answer is not None)
    n_answers = sum(answers.values())
    result = CurateResult(kept=[], easy=[], hard=[])
    for record, rate in zip(records, rates, strict=True):
        reason = "proof" if drop_proofs and is_proof_prompt(_prompt_text(record)) else None
        if reason is None and drop_guessable:
            reason = guess_reason(record, answers, n_answers, max_answer_share)
        if reason is None and not min_pass_rate <= rate <= max_pass_rate:
            reason = "pass rate below range" if rate < min_pass_rate else "pass rate above range"
        if reason is not None:
            result.dropped.append((record, reason))
            continue
        result.kept.append(record)
        (result.easy if rate >= split_at else result.hard).append(record)
    return result


__all__ = [
    "DEFAULT_MAX_ANSWER_SHARE",
    "DEFAULT_MAX_PASS_RATE",
    "DEFAULT_MIN_PASS_RATE",
    "DEFAULT_SPLIT_AT",
    "MIN_COMMON_COUNT",
    "YES_NO",
    "CurateResult",
    "curate",
    "guess_reason",
    "is_proof_prompt",
    "multiple_choice",
    "normalize_answer",
    "pass_rate_of",
]
