"""`scalerl data curate`: the easy-to-guess rule, the pass-rate range, the easy/hard split, the outputs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from scalerl.cli import main
from scalerl.data import DataError, PromptRecord, load_prompts, write_jsonl
from scalerl.data.curate import curate, guess_reason, normalize_answer, pass_rate_of


def rec(pid: str, prompt: str, answer: str | None, rate: float | None, **kw: Any) -> PromptRecord:
    meta = {} if rate is None else {"model_difficulty": {"pass_rate": rate, "correct": 0, "k": 10}}
    task = "code" if answer is None else "math"
    tests = [{"assert": "assert f(1) == 2"}] if answer is None else None
    return PromptRecord(id=pid, task=task, prompt=prompt, answer=answer, tests=tests, metadata=meta,
                        source=f"r.jsonl:{pid}", **kw)


def test_normalize_answer() -> None:
    assert normalize_answer(" \\boxed{\\text{Yes}}. ") == "yes"
    assert normalize_answer("$ (B) $") == "(b)"
    assert normalize_answer("\\frac{1}{2}") == "\\frac{1}{2}"


def test_guess_rule() -> None:
    mc = "Which is prime?\n(A) 4\n(B) 7\n(C) 9"
    none: Counter[str] = Counter()
    assert guess_reason(rec("1", mc, "(B)", 0.5), none, 10) == "multiple choice"
    assert guess_reason(rec("2", "Pick one: A. 4 B. 7 C. 9", "B", 0.5), none, 10) == "multiple choice"
    # A letter answer without labelled options is a variable, not a choice.
    assert guess_reason(rec("3", "Solve for the constant: 2e = x", "e", 0.5), none, 10) is None
    # A letter that is not among the options is not a choice either.
    assert guess_reason(rec("4", mc, "D", 0.5), none, 10) is None
    assert guess_reason(rec("5", "Is 7 prime?", "Yes", 0.5), none, 10) == "yes/no"
    assert guess_reason(rec("6", "True or false: 1 > 2", "\\text{False}", 0.5), none, 10) == "yes/no"
    # Common answers: share >= max_answer_share and at least three prompts.
    counts = Counter({"2": 3, "5": 2})
    assert guess_reason(rec("7", "q", "2", 0.5), counts, 60) == "common answer"  # 3/60 = 5%
    assert guess_reason(rec("8", "q", "2", 0.5), counts, 61) is None  # 3/61 < 5%
    assert guess_reason(rec("9", "q", "5", 0.5), counts, 20) is None  # two colliding answers
    assert guess_reason(rec("10", "Write f", None, 0.5), counts, 60) is None  # code: no answer


def test_curate_by_hand() -> None:
    records = [
        rec("a", "Compute 1+1", "2", 0.0),       # never solved
        rec("b", "Compute 1+2", "3", 0.3),       # hard
        rec("c", "Compute 2+2", "4", 0.5),       # easy (at the split)
        rec("d", "Compute 2+3", "5", 1.0),       # always solved
        rec("e", "Is 3 odd?", "yes", 0.7),       # yes/no
        rec("f", "Compute 9+9", "18", 0.9),      # easy
        rec("g", "Write f(x) returning x+1", None, 0.2),  # code, hard
    ]
    out = curate(records, max_answer_share=0.5)
    assert [r.id for r in out.kept] == ["b", "c", "f", "g"]
    assert [r.id for r in out.easy] == ["c", "f"] and [r.id for r in out.hard] == ["b", "g"]
    assert dict(out.counts()) == {"pass rate below range": 1, "pass rate above range": 1, "yes/no": 1}
    assert [r.id for r, _ in out.dropped] == ["a", "d", "e"]
    keep_all = curate(records, min_pass_rate=0.0, max_pass_rate=1.0, drop_guessable=False)
    assert len(keep_all.kept) == 7 and not keep_all.dropped
    assert len(keep_all.easy) + len(keep_all.hard) == 7
    # A tiny answer set: every prompt's answer is one of two values.
    binary = [rec(str(i), f"Parity of {i}?", "even" if i % 2 else "odd", 0.5) for i in range(10)]
    assert dict(curate(binary).counts()) == {"common answer": 10}
    with pytest.raises(ValueError, match="--pass-rate"):
        curate(records, min_pass_rate=0.6, max_pass_rate=0.4)


def test_pass_rate_sources_and_errors() -> None:
    assert pass_rate_of(rec("a", "q", "1", 0.25)) == 0.25
    flat = PromptRecord(id="x", task="math", prompt="q", answer="1", metadata={"pass_rate": 0.4})
    assert pass_rate_of(flat) == 0.4
    with pytest.raises(DataError, match=r"r.jsonl:n: no pass rate.*scalerl data difficulty"):
        pass_rate_of(rec("n", "q", "1", None))
    with pytest.raises(DataError, match=r"r.jsonl:z: pass rate 1.5 is not a number in \[0, 1\]"):
        pass_rate_of(rec("z", "q", "1", 1.5))


def write(path: Path, records: list[PromptRecord]) -> Path:
    write_jsonl(records, path)
    return path


def test_curate_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = [rec(str(i), f"Compute {i}+{i}", str(2 * i), i / 10) for i in range(11)]
    src = write(tmp_path / "rated.jsonl", records)
    outs = {name: tmp_path / f"{name}.jsonl" for name in ("out", "easy", "hard", "dropped")}
    args = ["data", "curate", str(src), *[a for n, p in outs.items() for a in (f"--{n}", str(p))]]
    assert main(args) == 0
    ids = {n: [r.id for r in load_prompts(p).records] for n, p in outs.items()}
    assert ids["out"] == [str(i) for i in range(1, 10)]
    assert ids["easy"] == ["5", "6", "7", "8", "9"] and ids["hard"] == ["1", "2", "3", "4"]
    dropped = {r.id: r.metadata["curate_dropped"] for r in load_prompts(outs["dropped"]).records}
    assert dropped == {"0": "pass rate below range", "10": "pass rate above range"}
    # Metadata survives (the pass rate travels with the kept records).
    assert load_prompts(outs["easy"]).records[0].metadata["model_difficulty"]["pass_rate"] == 0.5
    text = capsys.readouterr().out
    assert "kept 9, dropped 2" in text and "easy 5, hard 4" in text
    # A rerun refuses to replace outputs unless asked; the same command with --overwrite gives the
    # same files (curation is a pure function of the input).
    before = {n: p.read_text() for n, p in outs.items()}
    assert main(args) == 2
    assert main([*args, "--overwrite"]) == 0
    assert {n: p.read_text() for n, p in outs.items()} == before


def test_curate_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write(tmp_path / "r.jsonl", [rec("a", "q", "1", 0.5), rec("b", "q2", "2", None)])
    out = tmp_path / "o.jsonl"
    assert main(["data", "curate", str(src), "--out", str(out)]) == 2
    assert f"{src}:2: no pass rate" in capsys.readouterr().err and not out.exists()
    broken = tmp_path / "broken.jsonl"
    broken.write_text(src.read_text().splitlines()[0] + "\n{oops\n")
    assert main(["data", "curate", str(broken), "--out", str(out)]) == 2
    assert f"{broken}:2" in capsys.readouterr().err and not out.exists()
    assert main(["data", "curate", str(src)]) == 2
    assert "name at least one output" in capsys.readouterr().err
    assert main(["data", "curate", str(src), "--out", str(src)]) == 2


def test_killed_curate_leaves_no_half_file(tmp_path: Path) -> None:
    """A curate killed while writing leaves either no output or a whole one (written by a rename);
    a rerun then writes the complete file."""
    records = [rec(str(i), f"Compute {i}+1", str(i + 1), 0.5) for i in range(20000)]
    src = write(tmp_path / "big.jsonl", records)
    out = tmp_path / "o.jsonl"
    cmd = [sys.executable, "-m", "scalerl.cli", "data", "curate", str(src), "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while proc.poll() is None and not any(p.name.startswith(".o.jsonl.") for p in tmp_path.iterdir()):
        time.sleep(0.002)  # wait for the temporary file: it is writing now
    proc.kill()
    proc.wait()
    if out.exists():  # it finished before the kill landed: then the file is whole
        assert len(out.read_text().splitlines()) == 20000
    assert main(["data", "curate", str(src), "--out", str(out), "--overwrite"]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 20000 and json.loads(lines[-1])["id"] == "19999"
