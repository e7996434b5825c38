r"""SFT-data curation: the rules that drop a prompt/response row, each drop counted by its reason.

ScaleRL (arXiv 2510.13786, App. A.3) cleans its SFT data by removing trivial prompts, dropping
solution traces over 12k tokens and decontaminating against AIME 2024/2025 and MATH-500 (that last
step is `scalerl data decontaminate`). Kimi k1.5 (arXiv 2501.12599, Sec. 2.3) and Open-Reasoner-Zero
exclude proof and multiple-choice questions: a rule-based verifier cannot check a proof, and an
option letter can be guessed. `sft_drop_reason` applies, in this order, the first that matches:

1. `proof`: the prompt asks for a proof (`is_proof_prompt`): it contains, case-insensitive and as
   whole words, "prove", "proof", "show that" or "demonstrate that" (so "improve", "show your work"
   and "shown that" do not count);
2. `multiple choice`: the row's answer (its `answer` column, else the response's final answer: the
   last `\boxed{...}`, else the last "answer is X" / "Answer: X") is one option letter (`B`, `(B)`,
   `B.`) and the prompt labels at least two options with letters (`scalerl.data.curate`'s rule for
   prompt files, the same regular expressions);
3. `trivial`: the base model's pass rate on the prompt (from a `scalerl data difficulty` run) is at
   least `trivial_at` (default 1.0: solved by every one of its k samples);
4. `trace over N tokens`: the response is longer than `max_trace_tokens` tokens (ScaleRL: 12k).

Pure: strings and numbers in, a reason or None out; `scalerl data curate` reads and writes files.
"""

from __future__ import annotations

import re

from scalerl.data.curate import is_proof_prompt, multiple_choice

_BOXED = re.compile(r"\\boxed\s*\{((?:[^{}]|\{[^{}]*\})*)\}")
_ANSWER_IS = re.compile(r"(?:answer\s+is|answer\s*:)\s*\(?([A-Za-z0-9][^\s.,;)]*)\)?", re.IGNORECASE)

DEFAULT_TRIVIAL_AT = 1.0
SCALERL_MAX_TRACE_TOKENS = 12_000


def final_answer(response: str) -> str | None:
    """The response's final answer: its last `\\boxed{...}`, else its last "answer is X"."""
    boxed = _BOXED.findall(response)
    if boxed:
        return str(boxed[-1])
    said = _ANSWER_IS.findall(response)
    return str(said[-1]) if said else None


def sft_drop_reason(
    prompt: str,
    response: str,
    *,
    answer: str | None = None,
    base_pass_rate: float | None = None,
    trivial_at: float = DEFAULT_TRIVIAL_AT,
    trace_tokens: int | None = None,
    max_trace_tokens: int | None = None,
    drop_proofs: bool = True,
    drop_multiple_choice: bool = True,
) -> str | None:
    """Why a prompt/response row is dropped (the module docstring's rules, first match), or None."""
    if drop_proofs and is_proof_prompt(prompt):
        return "proof"
    if drop_multiple_choice:
        given = answer if answer is not None else final_answer(response)
        if given is not None and multiple_choice(prompt, given):
            return "multiple choice"
    if base_pass_rate is not None and base_pass_rate >= trivial_at:
        return "trivial"
    if max_trace_tokens is not None and trace_tokens is not None and trace_tokens > max_trace_tokens:
        return f"trace over {max_trace_tokens} tokens"
    return None


__all__ = ["DEFAULT_TRIVIAL_AT", "SCALERL_MAX_TRACE_TOKENS", "final_answer", "is_proof_prompt",
           "multiple_choice", "sft_drop_reason"]
