"""SFT-data curation: the proof, multiple-choice, trivial-prompt and trace-length rules on
real-looking rows, `data curate` and `data decontaminate` on prompt/response files (rows written
back unchanged, every drop counted by reason), and `data curate` dropping proofs from prompt files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scalerl.cli import main
from scalerl.data import PromptRecord
from scalerl.data.curate import curate
from scalerl.data.sft_curate import final_answer, is_proof_prompt, sft_drop_reason
from scalerl.models.tiny import build_tiny_tokenizer

PROOFS = [
    "Prove that there are infinitely many primes.",
    "Show that for every positive integer n, n^3 - n is divisible by 6.",
    "Let ABC be a triangle with AB = AC. Demonstrate that the angles at B and C are equal.",
    "Give a proof of the AM-GM inequality for two non-negative reals.",
    "PROVE: if a | b and b | c then a | c.",
]
NOT_PROOFS = [
    "Compute 17 * 23. Show your work.",
    "It has been shown that x = 2 satisfies x^2 = 4. Find the other root.",
    "How can we improve the bound 3 < pi? Give the next integer below pi * 10.",
    "A proofreader reads 12 pages an hour. How many pages in 5 hours?",
]
MC_PROMPT = "Which of the following numbers is prime?\n(A) 4\n(B) 6\n(C) 7\n(D) 9"
MC_INLINE = "What is 2 + 2? A. 3 B. 4 C. 5 D. 22"


def test_proof_rule_on_real_looking_prompts() -> None:
    assert [is_proof_prompt(p) for p in PROOFS] == [True] * len(PROOFS)
    assert [is_proof_prompt(p) for p in NOT_PROOFS] == [False] * len(NOT_PROOFS)


def test_final_answer_and_multiple_choice_rule() -> None:
    assert final_answer(r"<think>half</think> so \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert final_answer(r"\boxed{3} no wait \boxed{C}") == "C"
    assert final_answer("7 is prime, so the answer is (C).") == "C"
    assert final_answer("Answer: B") == "B"
    assert final_answer("no answer here") is None
    assert sft_drop_reason(MC_PROMPT, r"7 is prime: \boxed{C}") == "multiple choice"
    assert sft_drop_reason(MC_PROMPT, "so the answer is (C).") == "multiple choice"
    assert sft_drop_reason(MC_INLINE, "2+2=4, the answer is B") == "multiple choice"
    assert sft_drop_reason(MC_PROMPT, r"\boxed{7}") is None  # the option's value, not its letter
    assert sft_drop_reason(MC_PROMPT, r"\boxed{E}") is None  # not one of the listed options
    # A letter answer with no options listed is not multiple choice.
    assert sft_drop_reason("Which letter comes first in the alphabet?", r"\boxed{A}") is None
    # The row's own answer column wins over the response's.
    assert sft_drop_reason(MC_PROMPT, r"\boxed{7}", answer="(C)") == "multiple choice"
    assert sft_drop_reason(MC_PROMPT, r"\boxed{C}", drop_multiple_choice=False) is None


def test_trivial_and_trace_length_boundaries() -> None:
    row = ("Compute 2+3", r"<think>2+3=5</think>\boxed{5}")
    assert sft_drop_reason(*row, base_pass_rate=1.0) == "trivial"
    assert sft_drop_reason(*row, base_pass_rate=0.9) is None
    assert sft_drop_reason(*row, base_pass_rate=0.75, trivial_at=0.75) == "trivial"
    assert sft_drop_reason(*row, trace_tokens=12_000, max_trace_tokens=12_000) is None
    assert sft_drop_reason(*row, trace_tokens=12_001, max_trace_tokens=12_000) == "trace over 12000 tokens"
    # First match wins: a proof that is also trivial is counted once, as a proof.
    assert sft_drop_reason(PROOFS[0], "...", base_pass_rate=1.0) == "proof"


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def sft_rows() -> list[dict[str, Any]]:
    long_trace = "<think>" + " ".join(["carry the one"] * 40) + r"</think>\boxed{1000}"
    return [
        {"id": "keep", "task": "math", "prompt": "Compute 17 * 23",
         "response": r"<think>17*23=391</think>\boxed{391}"},
        {"id": "proof", "prompt": PROOFS[1],
         "response": "Write n^3-n=(n-1)n(n+1), three consecutive integers."},
        {"id": "mc", "prompt": MC_PROMPT, "response": r"<think>7 has no divisors</think>\boxed{C}"},
        {"id": "easy", "task": "math", "prompt": "Compute 2+3", "response": r"<think>2+3=5</think>\boxed{5}"},
        {"id": "long", "task": "math", "prompt": "Compute 999+1", "response": long_trace},
        {"id": "chat", "messages": [{"role": "user", "content": "Compute 40+2"},
                                    {"role": "assistant", "content": r"\boxed{42}"}]},
    ]


def rated(path: Path, rates: dict[str, float]) -> Path:
    return write(path, [{"id": f"r{i}", "task": "math", "prompt": p, "answer": "0",
                         "metadata": {"model_difficulty": {"pass_rate": r, "k": 4}}}
                        for i, (p, r) in enumerate(rates.items())])


def test_curate_a_prompt_response_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = sft_rows()
    src = write(tmp_path / "sft.jsonl", rows)
    base = rated(tmp_path / "rated.jsonl", {"Compute 17 * 23": 0.25, PROOFS[1]: 0.0, MC_PROMPT: 1.0,
                                            "Compute 2+3": 1.0, "Compute 999+1": 0.5, "Compute 40+2": 0.75})
    tok = build_tiny_tokenizer()
    lengths = {r["id"]: len(tok.encode(r["response"], add_special_tokens=False))
               for r in rows if "response" in r}
    limit = lengths["long"] - 1
    assert all(n <= limit for key, n in lengths.items() if key != "long")  # only "long" is over the limit
    out, dropped = tmp_path / "out.jsonl", tmp_path / "dropped.jsonl"
    assert main(["data", "curate", str(src), "--out", str(out), "--dropped", str(dropped), "--trivial-from",
                 str(base), "--max-trace-tokens", str(limit)]) == 0
    assert read(out) == [rows[0], rows[5]]  # kept rows written back as read
    assert [(r["id"], r["curate_dropped"]) for r in read(dropped)] == [
        ("proof", "proof"), ("mc", "multiple choice"), ("easy", "trivial"),
        ("long", f"trace over {limit} tokens")]
    text = capsys.readouterr().out
    assert "6 prompt/response rows" in text and "kept 2, dropped 4" in text
    for reason in ("proof: 1", "multiple choice: 1", "trivial: 1", f"trace over {limit} tokens: 1"):
        assert f"dropped, {reason}" in text
    # --trivial-at lowers the bar: the chat row (0.75) goes too.
    out2 = tmp_path / "out2.jsonl"
    assert main(["data", "curate", str(src), "--out", str(out2), "--trivial-from", str(base),
                 "--trivial-at", "0.75"]) == 0
    assert [r["id"] for r in read(out2)] == ["keep", "long"]


def test_curate_pair_file_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write(tmp_path / "sft.jsonl", sft_rows())
    partial = rated(tmp_path / "rated.jsonl", {"Compute 17 * 23": 0.25})
    out = tmp_path / "out.jsonl"
    assert main(["data", "curate", str(src), "--out", str(out), "--trivial-from", str(partial)]) == 2
    assert f"{src}:2: prompt not in --trivial-from" in capsys.readouterr().err and not out.exists()
    assert main(["data", "curate", str(src), "--easy", str(out)]) == 2
    assert "--easy: the easy/hard split applies to prompt files" in capsys.readouterr().err
    prompts = write(tmp_path / "p.jsonl", [{"id": "a", "task": "math", "prompt": "Compute 1+1", "answer": "2",
                                            "pass_rate": 0.5}])
    assert main(["data", "curate", str(prompts), "--out", str(out), "--max-trace-tokens", "10"]) == 2
    assert "--max-trace-tokens: applies to prompt/response files" in capsys.readouterr().err
    assert not out.exists()


def test_curate_drops_proof_prompts_from_prompt_files() -> None:
    records = [PromptRecord(id=f"p{i}", task="math", prompt=p, answer=str(i), metadata={"pass_rate": 0.5})
               for i, p in enumerate(PROOFS[:2] + NOT_PROOFS[:2])]
    result = curate(records)
    assert [r.id for r in result.kept] == ["p2", "p3"] and result.counts() == {"proof": 2}
    assert len(curate(records, drop_proofs=False).kept) == 4


def test_decontaminate_accepts_a_prompt_response_file(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    question = "Find the number of ordered pairs of positive integers a b with a plus b equal to one hundred"
    rows = [{"id": "clean", "task": "math", "prompt": "Compute 17 * 23", "response": r"\boxed{391}"},
            {"id": "leak", "task": "math", "prompt": f"{question}.", "response": r"\boxed{99}"}]
    src = write(tmp_path / "sft.jsonl", rows)
    bench = write(tmp_path / "aime.jsonl", [{"id": "aime-1", "prompt": question, "answer": "99"}])
    out = tmp_path / "clean.jsonl"
    assert main(["data", "decontaminate", str(src), "--against", str(bench), "--out", str(out)]) == 0
    assert read(out) == rows[:1]
    text = capsys.readouterr().out
    assert "kept 1, dropped 1" in text and "wrote 1 prompt/response rows" in text
