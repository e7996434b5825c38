"""`scalerl data difficulty --engine vllm`: every prompt rated once, through an interruption and a rerun."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from scalerl.cli import main
from scalerl.data import write_jsonl
from scalerl.data.difficulty import partial_path
from scalerl.data.synthetic import make_math_task
from scalerl.evaluation import difficulty as difficulty_module


def test_difficulty_on_vllm_resumes_without_duplicates(tiny_dirs: tuple[Path, Path], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    prompts = tmp_path / "p.jsonl"
    write_jsonl(make_math_task(6, seed=2, difficulty=(1, 2)), prompts)
    out = tmp_path / "rated.jsonl"
    args = ["data", "difficulty", str(prompts), "--model", str(tiny_dirs[0]), "--out", str(out),
            "--engine", "vllm", "--template", "raw", "--k", "3", "--max-new-tokens", "16", "--chunk", "2",
            "--no-progress"]
    real = difficulty_module.score_chunk
    seen: list[str] = []

    def interrupted(chunk: Any, *rest: Any, **kw: Any) -> Any:
        if len(seen) >= 2:
            raise KeyboardInterrupt  # the first session dies after one chunk
        seen.extend(r.id for r in chunk)
        return real(chunk, *rest, **kw)

    monkeypatch.setattr(difficulty_module, "score_chunk", interrupted)
    assert main(args) == 130
    saved = [json.loads(line)["id"] for line in partial_path(out).read_text().splitlines()[1:]]
    assert saved == seen and not out.exists()
    # Another engine draws differently: its results may not join this file.
    embedded = [a if a != "vllm" else "embedded" for a in args]
    monkeypatch.setattr(difficulty_module, "score_chunk", real)
    assert main(embedded) == 2
    rest: list[str] = []

    def counting(chunk: Any, *more: Any, **kw: Any) -> Any:
        rest.extend(r.id for r in chunk)
        return real(chunk, *more, **kw)

    monkeypatch.setattr(difficulty_module, "score_chunk", counting)
    assert main(args) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and sorted(seen + rest) == sorted(r["id"] for r in rows)
    assert not set(seen) & set(rest)
    for row in rows:
        md = row["metadata"]["model_difficulty"]
        assert md["k"] == 3 and md["pass_rate"] == md["correct"] / 3 and 0 < md["mean_length"] <= 16
