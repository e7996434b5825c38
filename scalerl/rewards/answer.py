"""Where the answer sits in a completion: after the thinking, in the last `\\boxed{}` or code fence.

ScaleRL (arXiv 2510.13786, appendix A.3) scores only the text after `</think>`; the thinking
itself never earns reward. Rules, applied to already-decoded text:

* a completion with `</think>` answers after its last `</think>` (templates that put `<think>`
  in the prompt produce completions with only the closing tag);
* a completion that opens `<think>` and never closes it has no answer (truncated reasoning);
* a completion without either tag is all answer.

In the answer part, a math answer is the last complete `\\boxed{}`; without one, the content of
the last complete `<answer>...</answer>` (the tags DeepSeek-R1-Zero's template asks for, the
`r1` prompt template of `scalerl.data.tokenize`).
"""

from __future__ import annotations

import re

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"

# `\boxed{x}`, `\boxed {x}` and `\fbox{x}`: the command, optional spaces, then a balanced group.
_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)\s*\{")

# A fenced block: ``` or ~~~ (3+), optional info string (language), body, same fence closing.
_FENCE = re.compile(
    r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)\n(?P<body>.*?)^[ \t]*(?P=fence)[ \t]*$",
    re.DOTALL | re.MULTILINE,
)
# Fallback for a closing fence glued to the last line (```python\nprint(1)```), common in samples.
_LOOSE_FENCE = re.compile(r"```[^\n`]*\n(?P<body>.*?)```", re.DOTALL)


def strip_thinking(completion: str) -> str | None:
    """The answer part of `completion`, or None when the thinking never closed."""
    close = completion.rfind(THINK_CLOSE)
    if close >= 0:
        return completion[close + len(THINK_CLOSE):]
    if THINK_OPEN in completion:
        return None
    return completion


def _balanced_group(text: str, open_brace: int) -> str | None:
    """The content of the `{...}` group opening at `open_brace`; escaped braces do not count."""
    depth = 0
    i = open_brace
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2  # `\{`, `\}` and `\\` are literal characters, not group delimiters
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_brace + 1:i]
        i += 1
    return None


def extract_boxed(text: str) -> str | None:
    """The content of the last complete `\\boxed{...}` / `\\fbox{...}` in `text`, braces balanced.

    `\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`. An unterminated last box falls back to the
    previous complete one; no box at all gives None.
    """
    for match in reversed(list(_BOX_COMMAND.finditer(text))):
        content = _balanced_group(text, match.end() - 1)
        if content is not None:
            return content.strip()
    return None


def extract_answer_tag(text: str) -> str | None:
    """The content of the last complete `<answer>...</answer>` in `text` (stripped), or None.

    An empty one counts as none: it gives nothing to judge.
    """
    close = text.rfind(ANSWER_CLOSE)
    while close >= 0:
        open_ = text.rfind(ANSWER_OPEN, 0, close)
        if open_ >= 0:
            content = text[open_ + len(ANSWER_OPEN):close].strip()
            return content or None
        close = text.rfind(ANSWER_CLOSE, 0, close)
    return None


def extract_final_answer(completion: str) -> str | None:
    """The answer after the thinking: its last `\\boxed{}`, else its last `<answer>` tag, else None."""
    answer_part = strip_thinking(completion)
    if answer_part is None:
        return None
    boxed = extract_boxed(answer_part)
    return boxed if boxed is not None else extract_answer_tag(answer_part)


def extract_code(completion: str) -> str | None:
    """The body of the last fenced code block after the thinking, or None when there is none.

    Any language tag is accepted (the program is run as Python); an empty block counts as none.
    """
    answer_part = strip_thinking(completion)
    if answer_part is None:
        return None
    blocks = [m.group("body") for m in _FENCE.finditer(answer_part)]
    if not blocks:
        blocks = [m.group("body") for m in _LOOSE_FENCE.finditer(answer_part)]
    if not blocks or not blocks[-1].strip():
        return None
    return blocks[-1]
