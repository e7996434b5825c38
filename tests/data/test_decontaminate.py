"""Decontamination (scalerl/data/decontaminate.py, `scalerl data decontaminate`): GPT-3's 13-gram
rule, PaLM's fraction rule, short items found whole, the report, and the refusals (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import scalerl.cli
from scalerl.data import load_prompts
from scalerl.data.decontaminate import decontaminate, ngrams, words
from scalerl.data.records import PromptRecord
from scalerl.data.synthetic import make_synthetic
from tests.data.test_benchmarks import GSM8K

EVAL = "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins."


def rec(i: str, text: str) -> PromptRecord:
    return PromptRecord(id=i, task="math", prompt=text, answer="1", source=f"p.jsonl:{i}")


def test_words_and_ngrams() -> None:
    assert words("Janet’s DUCKS, lay 16-eggs!") == ["janet", "s", "ducks", "lay", "16", "eggs"]
    assert ngrams(["a", "b", "c", "d"], 3) == {("a", "b", "c"), ("b", "c", "d")}
    assert ngrams(["a", "b"], 3) == set()


def test_13_gram_rule_any_overlap() -> None:
    tail = " ".join(EVAL.split()[3:16])  # exactly 13 words of the item
    prompts = [
        rec("copy", "Solve: " + EVAL.upper()),  # case and punctuation do not hide it
        rec("tail", f"Something else entirely. {tail} and then more."),
        rec("short", " ".join(EVAL.split()[3:15])),  # 12 words: no 13-gram to share
        rec("other", "What is 2 + 2?"),
    ]
    res = decontaminate(prompts, {"gsm8k": [rec("e1", EVAL)]})
    assert [r.id for r in res.dropped] == ["copy", "tail"]
    assert [r.id for r in res.kept] == ["short", "other"]
    n_item = len(words(EVAL)) - 12
    copy, tail_m = res.matches
    assert (copy.shared, copy.item_ngrams, copy.item_source) == (n_item, n_item, "p.jsonl:e1")
    assert tail_m.shared == 1 and tail_m.example == " ".join(words(tail))
    assert res.dropped_by_set() == {"gsm8k": 2}


def test_short_item_found_whole_and_palm_threshold() -> None:
    short = rec("s", "What is the capital of France?")  # 6 words < 13: matched whole
    res = decontaminate([rec("a", "Quiz: what is the capital of france? Answer briefly."),
                         rec("b", "What is the capital of Spain?")], {"quiz": [short]})
    assert [r.id for r in res.dropped] == ["a"] and res.matches[0].item_ngrams == 1
    # PaLM: >= 70% of the item's 8-grams. Half of the item's words: some 8-grams, under 70%.
    item = rec("e", EVAL)
    half = " ".join(EVAL.split()[:10])
    loose = decontaminate([rec("h", half)], {"g": [item]}, n=8)
    strict = decontaminate([rec("h", half)], {"g": [item]}, n=8, threshold=0.7)
    assert len(loose.dropped) == 1 and len(strict.dropped) == 0
    assert loose.matches[0].fraction < 0.7
    assert len(decontaminate([rec("f", EVAL)], {"g": [item]}, n=8, threshold=0.7).dropped) == 1
    with pytest.raises(ValueError, match="threshold"):
        decontaminate([], {}, threshold=0.0)


def test_cli_writes_clean_file_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    heldout = tmp_path / "gsm8k_test.jsonl"
    heldout.write_text(json.dumps(GSM8K) + "\n")
    # The demo's synthetic prompts with one GSM8K question slipped in (a contaminated train set).
    train = make_synthetic("math", 20, 0)
    leaked = PromptRecord(id="leak", task="math", prompt="Q: " + GSM8K["question"], answer="18")
    prompts = tmp_path / "train.jsonl"
    from scalerl.data import write_jsonl

    write_jsonl([*train, leaked], prompts)
    out, report = tmp_path / "clean.jsonl", tmp_path / "matches.jsonl"
    argv = ["data", "decontaminate", str(prompts), "--against", f"gsm8k:{heldout}", "--out", str(out),
            "--report", str(report)]
    assert scalerl.cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "21 prompts against 1 items of 1 set(s) (13-grams, any shared)" in text
    assert "kept 20, dropped 1" in text and f"{prompts}:21 (leak) ~ {heldout}:1" in text
    assert [r.id for r in load_prompts(out).records] == [r.id for r in train]
    (row,) = [json.loads(line) for line in report.read_text().splitlines()]
    assert row["prompt_id"] == "leak" and row["set"] == "gsm8k_test" and row["fraction"] == 1.0
    # Never over an existing file; bad arguments and bad sets are input errors (exit 2).
    before = out.read_text()
    assert scalerl.cli.main(argv) == 2
    assert out.read_text() == before
    assert "exists; decontaminate never replaces a file" in capsys.readouterr().err
    assert scalerl.cli.main([*argv[:5], "--out", str(tmp_path / "x.jsonl"), "--threshold", "2"]) == 2
    assert scalerl.cli.main([*argv[:3], "--against", str(heldout), "--out", str(tmp_path / "y.jsonl")]) == 2
    assert "gsm8k_test.jsonl:1: no 'prompt' or 'messages' field" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists() and not (tmp_path / "y.jsonl").exists()


def test_symbols_break_words_so_arithmetic_stays_apart() -> None:
    assert words("Compute 5+33") != words("Compute 53+3")
    res = decontaminate([rec("a", "Compute 5+33"), rec("b", "compute 53 + 3")],
                        {"h": [rec("e", "Compute 53+3")]})
    assert [r.id for r in res.dropped] == ["b"]
