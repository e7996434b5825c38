"""Language consistency: the share of a response's letters written in one script.

DeepSeek-V3.2 (arXiv 2512.02556, §3.1 "Reward design") adds a language-consistency reward beside
the rule-based outcome and length terms, so a reasoning model answers in the language it was asked
in. The rule here works on Unicode scripts, which needs no language model:

1. Remove what is not prose: fenced code blocks (```...```), inline code (`...`), display and
   inline math (`$$...$$`, `\\[...\\]`, `\\(...\\)`, `$...$`) and LaTeX commands (`\\frac`, ...).
2. Keep the letters (Unicode category L*); each letter's script is the first word of its Unicode
   name (`LATIN`, `CYRILLIC`, `GREEK`, `ARABIC`, `HEBREW`, `DEVANAGARI`, `THAI`, `HANGUL`,
   `HIRAGANA`, `KATAKANA`), with `CJK ...` ideographs as `han`. Names are lower case.
3. The score is (letters in the target script) / (all letters), in [0, 1]; a response with no
   letters left scores 1.0 (nothing in another script).

The target is the script named in the `fn` (`language_consistency:cyrillic`), else the row's
`language` column when it names a script, else the prompt's dominant script (most letters, after
the same removal). A prompt with no letters and no named target has no target: the score is None
(no score, counted as such by `rewards.functions`).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Callable
from typing import Any

#: Scripts a target may name (the first word of a letter's Unicode name; `han` for CJK ideographs).
SCRIPTS = frozenset({"latin", "han", "cyrillic", "greek", "arabic", "hebrew", "devanagari", "thai",
                     "hangul", "hiragana", "katakana", "armenian", "georgian", "bengali", "tamil"})

_NOT_PROSE = re.compile(
    r"```.*?```"            # fenced code
    r"|`[^`\n]*`"           # inline code
    r"|\$\$.*?\$\$"         # display math
    r"|\\\[.*?\\\]"         # \[ ... \]
    r"|\\\(.*?\\\)"         # \( ... \)
    r"|\$[^$\n]*\$"         # inline math
    r"|\\[A-Za-z]+",        # a LaTeX command left outside math
    re.DOTALL)


def prose(text: str) -> str:
    """`text` without code, math and LaTeX commands (rule 1 of the module doc)."""
    return _NOT_PROSE.sub(" ", text)


def script_of(char: str) -> str | None:
    """The script of a letter (rule 2), None for a character that is not a letter."""
    if not unicodedata.category(char).startswith("L"):
        return None
    name = unicodedata.name(char, "")
    if not name:
        return None
    first = name.split(" ", 1)[0].lower()
    return "han" if first == "cjk" else first


def script_counts(text: str) -> Counter[str]:
    """Letters per script in the prose of `text`."""
    return Counter(s for s in map(script_of, prose(text)) if s is not None)


def dominant_script(text: str) -> str | None:
    """The script with the most letters in the prose of `text` (ties: the alphabetically first)."""
    counts = script_counts(text)
    if not counts:
        return None
    return min(counts, key=lambda s: (-counts[s], s))


def consistency(response: str, target: str) -> float:
    """Share of the response's prose letters in `target` (rule 3); 1.0 with no letters."""
    counts = script_counts(response)
    total = sum(counts.values())
    return 1.0 if total == 0 else counts[target] / total


def _prompt_text(prompt: Any) -> str:
    """A TRL prompt as text: the string, or the user turns' contents of a chat."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(str(t.get("content", "")) for t in prompt or [] if t.get("role") == "user")


def _completion_text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    return "".join(str(t.get("content", "")) for t in completion or [])


def language_consistency_fn(named: str | None) -> Callable[..., list[float | None]]:
    """The reward function for `fn: language_consistency[:script]`, in TRL's signature
    (`f(prompts, completions, **columns)`, so rows need no gold answer); ValueError for a script
    name not in SCRIPTS."""
    if named is not None and named.lower() not in SCRIPTS:
        raise ValueError(f"unknown script {named!r}; one of {sorted(SCRIPTS)}")
    fixed = None if named is None else named.lower()

    def language_consistency(prompts: list[Any], completions: list[Any],
                             **columns: Any) -> list[float | None]:
        languages = columns.get("language") or [None] * len(completions)
        out: list[float | None] = []
        for prompt, completion, column in zip(prompts, completions, languages, strict=True):
            target = fixed
            if target is None:
                if isinstance(column, str) and column.lower() in SCRIPTS:
                    target = column.lower()
                else:
                    target = dominant_script(_prompt_text(prompt))
            out.append(None if target is None else consistency(_completion_text(completion), target))
        return out

    return language_consistency


__all__ = ["SCRIPTS", "consistency", "dominant_script", "language_consistency_fn", "prose",
           "script_counts", "script_of"]
