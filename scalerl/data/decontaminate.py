"""Decontamination: drop training prompts that share word n-grams with evaluation sets.

ScaleRL decontaminates its SFT and RL data against its evaluation sets; the rule here is the one
GPT-3 used for its benchmarks (Brown et al. 2020, "Language Models are Few-Shot Learners",
appendix C): texts are lower-cased, punctuation is dropped and they are split on whitespace (as in
EleutherAI lm-evaluation-harness, `scripts/clean_training_data/janitor.py`, which reimplements it);
a training prompt is contaminated by an evaluation item when they share a 13-gram, or, for an item
shorter than 13 words, when the whole item occurs in the prompt.

`threshold` gives the stricter-to-trigger variant of PaLM (Chowdhery et al. 2022, sec. 8: an
example is contaminated when at least 70% of its 8-grams occur in the training data): a pair
matches only when the prompt holds at least `threshold` of the evaluation item's distinct n-grams
(`--n 8 --threshold 0.7` is PaLM's rule). `threshold=None` is GPT-3's "any shared n-gram".

The text compared is a record's prompt (a chat record: its user and system turns), never its
answer: two problems with the same answer are not the same problem.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from scalerl.data.records import PromptRecord

DEFAULT_N = 13  # GPT-3, appendix C
_PUNCT = re.compile(r"[^\w\s]")


def words(text: str) -> list[str]:
    """Lower-cased words, punctuation and symbols dropped, split on whitespace.

    janitor.py deletes punctuation; here each punctuation or symbol character is a word break
    instead, because deleting it merges different arithmetic: "Compute 5+33" and "Compute 53+3"
    both become "compute 533" (on the demo's synthetic prompts that made a false match)."""
    return _PUNCT.sub(" ", text.lower()).split()


def ngrams(tokens: Sequence[str], n: int) -> set[tuple[str, ...]]:
    """The distinct contiguous n-grams of `tokens` (none when there are fewer than n)."""
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


def record_text(record: PromptRecord) -> str:
    """What is compared: the prompt text, or the non-assistant turns of a chat record."""
    if record.prompt is not None:
        return record.prompt
    return "\n".join(t["content"] for t in record.messages or () if t["role"] != "assistant")


def normal_text(record: PromptRecord) -> str:
    """A record's compared text as its words (`words`): case, punctuation and spacing ignored."""
    return " ".join(words(record_text(record)))


def overlap_ids(train: Iterable[PromptRecord], items: Iterable[PromptRecord]) -> list[str]:
    """Ids of the evaluation `items` whose prompt is, word for word (`normal_text`), a training
    prompt's: the same problem on both sides, whatever its id. A run reports their count per set."""
    seen = {normal_text(r) for r in train}
    return [item.id for item in items if normal_text(item) in seen]


@dataclass(frozen=True)
class Match:
    """One contaminated (prompt, evaluation item) pair."""

    prompt_id: str
    prompt_source: str
    set_name: str
    item_id: str
    item_source: str
    shared: int  # distinct n-grams in common (1 for a short item found whole)
    item_ngrams: int  # the item's distinct n-grams (1 for a short item)
    example: str  # one shared n-gram (or the short item), normalised

    @property
    def fraction(self) -> float:
        return self.shared / self.item_ngrams

    def to_dict(self) -> dict[str, object]:
        return {"prompt_id": self.prompt_id, "prompt_source": self.prompt_source, "set": self.set_name,
                "item_id": self.item_id, "item_source": self.item_source, "shared_ngrams": self.shared,
                "item_ngrams": self.item_ngrams, "fraction": round(self.fraction, 6),
                "example": self.example}


@dataclass
class DecontaminationResult:
    """The prompts kept, the prompts dropped, and every matching pair (a dropped prompt may match
    several items)."""

    kept: list[PromptRecord]
    dropped: list[PromptRecord]
    matches: list[Match] = field(default_factory=list)

    def dropped_by_set(self) -> dict[str, int]:
        """Prompts dropped because of each set (a prompt matching two sets counts for both)."""
        out: dict[str, set[str]] = {}
        for m in self.matches:
            out.setdefault(m.set_name, set()).add(m.prompt_id)
        return {name: len(ids) for name, ids in sorted(out.items())}


class NgramIndex:
    """The n-grams of every evaluation item, each pointing at the items that hold it."""

    def __init__(self, sets: dict[str, Sequence[PromptRecord]], n: int = DEFAULT_N) -> None:
        if n < 1:
            raise ValueError(f"n: must be >= 1, got {n}")
        self.n = n
        self.items: list[tuple[str, PromptRecord, int]] = []  # (set, record, distinct n-grams)
        self.index: dict[tuple[str, ...], list[int]] = {}
        self.short: dict[int, dict[tuple[str, ...], list[int]]] = {}  # length -> whole item -> items
        for name, records in sets.items():
            for record in records:
                tokens = words(record_text(record))
                i = len(self.items)
                if not tokens:
                    continue
                if len(tokens) < n:  # GPT-3: a short item contaminates when found whole
                    self.short.setdefault(len(tokens), {}).setdefault(tuple(tokens), []).append(i)
                    self.items.append((name, record, 1))
                    continue
                grams = ngrams(tokens, n)
                self.items.append((name, record, len(grams)))
                for g in grams:
                    self.index.setdefault(g, []).append(i)

    def shared(self, text: str) -> dict[int, tuple[int, tuple[str, ...]]]:
        """item -> (distinct n-grams shared with `text`, one of them)."""
        tokens = words(text)
        found: dict[int, tuple[int, tuple[str, ...]]] = {}
        for g in ngrams(tokens, self.n):
            for i in self.index.get(g, ()):
                count, example = found.get(i, (0, g))
                found[i] = (count + 1, example)
        for length, wholes in self.short.items():
            for g in ngrams(tokens, length) & wholes.keys():
                for i in wholes[g]:
                    found[i] = (1, g)
        return found


def decontaminate(
    prompts: Iterable[PromptRecord],
    against: dict[str, Sequence[PromptRecord]],
    *,
    n: int = DEFAULT_N,
    threshold: float | None = None,
) -> DecontaminationResult:
    """Split `prompts` into those that match no item of `against` (set name -> records) and the rest.

    A pair matches when it shares at least one n-gram (`threshold` None, GPT-3), or at least
    `threshold` of the item's distinct n-grams (PaLM's rule with n=8, threshold=0.7).
    """
    if threshold is not None and not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold: must be in (0, 1], got {threshold}")
    index = NgramIndex(against, n)
    result = DecontaminationResult(kept=[], dropped=[])
    for record in prompts:
        pairs = []
        for i, (count, example) in sorted(index.shared(record_text(record)).items()):
            name, item, total = index.items[i]
            if threshold is not None and count < threshold * total:
                continue
            pairs.append(Match(record.id, record.source, name, item.id, item.source, count, total,
                               " ".join(example)))
        if pairs:
            result.dropped.append(record)
            result.matches.extend(pairs)
        else:
            result.kept.append(record)
    return result


__all__ = ["DEFAULT_N", "DecontaminationResult", "Match", "NgramIndex", "decontaminate", "ngrams",
           "normal_text", "overlap_ids", "record_text", "words"]
