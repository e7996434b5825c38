"""Model-based difficulty (`scalerl data difficulty`): exact pass rates, resume without duplicates,
kill-and-rerun equal to an uninterrupted run, bad input named."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from scalerl.cli import main
from scalerl.data import DataError, PromptRecord, load_prompts, write_jsonl
from scalerl.data.difficulty import (
    DifficultySettings,
    PartialFile,
    PassRate,
    estimate_pass_rates,
    histogram,
    partial_path,
    prompt_seed,
)
from scalerl.data.synthetic import make_math_task
from scalerl.evaluation.difficulty import score_chunk
from scalerl.models.tiny import TinyModelSpec, build_tiny_model, build_tiny_tokenizer
from scalerl.rewards import RewardConfig, RewardRouter
from scalerl.rewards.groups import GroupScorer
from scalerl.rollout.protocol import Completion, GenerationRequest, SamplingParams


def settings(**kw: Any) -> DifficultySettings:
    base: dict[str, Any] = dict(model={"name_or_path": "m", "sha256": "abc"}, engine="embedded", k=4,
                                temperature=1.0, seed=0, max_new_tokens=16, template="chat",
                                system_prompt=None, length_control="none")
    return DifficultySettings(**{**base, **kw})


def fake_rate(record: PromptRecord, k: int = 4) -> PassRate:
    """A deterministic stand-in for an engine + verifier: the rate is a function of the id alone."""
    c = prompt_seed(7, record.id) % (k + 1)
    return PassRate(id=record.id, correct=c, k=k, mean_length=float(c + 1), truncated=0, verifier_failures=0)


RECORDS = make_math_task(23, seed=3, difficulty=(1, 4))


class Counting:
    def __init__(self, fail_after: int | None = None) -> None:
        self.seen: list[str] = []
        self.calls = 0
        self.fail_after = fail_after

    def __call__(self, chunk: Sequence[PromptRecord]) -> list[PassRate]:
        if self.fail_after is not None and self.calls == self.fail_after:
            raise KeyboardInterrupt  # the session dies here
        self.calls += 1
        self.seen += [r.id for r in chunk]
        return [fake_rate(r) for r in chunk]


def test_prompt_seed_depends_on_seed_and_id_only() -> None:
    assert prompt_seed(0, "a") == prompt_seed(0, "a")
    assert len({prompt_seed(0, "a"), prompt_seed(1, "a"), prompt_seed(0, "b")}) == 3
    assert 0 <= prompt_seed(5, "x") < 2**63


def test_interrupted_then_resumed_equals_uninterrupted(tmp_path: Path) -> None:
    whole = estimate_pass_rates(RECORDS, PartialFile.open(tmp_path / "a.partial", settings()), Counting(),
                                chunk_size=5)
    first = Counting(fail_after=2)
    with pytest.raises(KeyboardInterrupt):
        estimate_pass_rates(RECORDS, PartialFile.open(tmp_path / "b.partial", settings()), first,
                            chunk_size=5)
    assert len(first.seen) == 10
    progress: list[tuple[int, int]] = []
    second = Counting()
    resumed = estimate_pass_rates(RECORDS, PartialFile.open(tmp_path / "b.partial", settings()), second,
                                  chunk_size=5, on_chunk=lambda d, t: progress.append((d, t)))
    assert resumed == whole
    # Each prompt rated exactly once over both sessions; the work file holds each once.
    assert sorted(first.seen + second.seen) == sorted(r.id for r in RECORDS)
    lines = (tmp_path / "b.partial").read_text().splitlines()
    ids = [json.loads(line)["id"] for line in lines[1:]]
    assert len(ids) == len(set(ids)) == len(RECORDS)
    assert progress == [(10, 23), (15, 23), (20, 23), (23, 23)]
    assert histogram(resumed.values(), 4) == [sum(r.correct == c for r in whole.values()) for c in range(5)]


def test_a_line_cut_by_a_kill_is_redone(tmp_path: Path) -> None:
    path = tmp_path / "w.partial"
    estimate_pass_rates(RECORDS[:6], PartialFile.open(path, settings()), Counting(), chunk_size=3)
    cut = json.dumps(fake_rate(RECORDS[6]).to_dict())
    with path.open("a") as f:
        f.write(cut[: len(cut) // 2])  # killed mid-write: no newline
    again = Counting()
    pf = PartialFile.open(path, settings())
    assert pf.torn_lines == 1 and len(pf.done) == 6
    out = estimate_pass_rates(RECORDS[:9], pf, again, chunk_size=3)
    assert again.seen == [r.id for r in RECORDS[6:9]]
    assert out == {r.id: fake_rate(r) for r in RECORDS[:9]}
    # Killed while writing the header: nothing to resume, a fresh start.
    fresh = tmp_path / "h.partial"
    fresh.write_text('{"scalerl_diff')
    assert PartialFile.open(fresh, settings()).done == {}
    assert json.loads(fresh.read_text().splitlines()[0])["settings"]["k"] == 4


def test_resume_refuses_other_settings_other_inputs_and_damage(tmp_path: Path) -> None:
    path = tmp_path / "w.partial"
    estimate_pass_rates(RECORDS[:4], PartialFile.open(path, settings()), Counting(), chunk_size=2)
    with pytest.raises(DataError, match=r"other settings: temperature \(1.0 then, 1.2 now\).*--restart"):
        PartialFile.open(path, settings(temperature=1.2))
    with pytest.raises(DataError, match=r"other settings: model.sha256 \('abc' then, 'def' now\)"):
        PartialFile.open(path, settings(model={"name_or_path": "m", "sha256": "def"}))
    with pytest.raises(DataError, match=r"2 prompt\(s\) not in the input.*the input changed"):
        estimate_pass_rates(RECORDS[2:8], PartialFile.open(path, settings()), Counting())
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines, lines[1]]) + "\n")
    with pytest.raises(DataError, match=rf"{path}:6: prompt .* appears twice"):
        PartialFile.open(path, settings())
    path.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    with pytest.raises(DataError, match=rf"{path}:2: unreadable result line"):
        PartialFile.open(path, settings())
    with pytest.raises(ValueError, match="--k"):
        settings(k=0)
    with pytest.raises(ValueError, match="--temperature"):
        settings(temperature=0.0)


# ---------------------------------------------------------------------------------------------
# score_chunk: the real verifier behind a scripted engine


def test_score_chunk_counts_verified_samples_exactly() -> None:
    tok = build_tiny_tokenizer()
    records = make_math_task(5, seed=1, difficulty=(1, 2))
    # Prompt i gets i correct answers among k = 4 (the last ones), the rest wrong.
    want = {r.id: i % 5 for i, r in enumerate(records)}
    seeds: dict[str, int | None] = {}

    def generate(requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = []
        for q in requests:
            record = next(r for r in records if r.id == q.metadata["prompt_id"])
            seeds[record.id] = q.params.seed
            assert q.params.n == 4 and q.params.temperature == 1.3
            for j in range(q.params.n):
                right = j >= q.params.n - want[record.id]
                text = f"<think>x</think>\\boxed{{{record.answer if right else 'nope'}}}"
                ids = tok.encode(text)
                out.append(Completion(q.request_id, j, q.prompt_ids, ids, [0.0] * len(ids), [0] * len(ids),
                                      [True] * len(ids), "length" if j == 0 else "stop", 0))
        return out[::-1]  # any order: matched by request id and sample index

    router = RewardRouter(RewardConfig(math_workers=1))
    scorer = GroupScorer(router, lambda ids: tok.decode(ids), max_workers=2, success_threshold=0.5)
    try:
        rates = score_chunk(records, lambda r: [5], generate, scorer, SamplingParams(max_new_tokens=8),
                            settings(temperature=1.3))
    finally:
        scorer.close()
        router.close()
    assert [r.id for r in rates] == [r.id for r in records]
    assert {r.id: r.correct for r in rates} == {k: min(v, 4) for k, v in want.items()}
    assert all(r.truncated == 1 and r.k == 4 for r in rates)
    assert seeds == {r.id: prompt_seed(0, r.id) for r in records}


# ---------------------------------------------------------------------------------------------
# The command, on a saved tiny model whose tokenizer has no chat template (a base model)


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("base-model")
    spec = TinyModelSpec(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64,
                         max_position_embeddings=256)
    tok = build_tiny_tokenizer()
    tok.chat_template = None
    build_tiny_model(spec, vocab_size=len(tok), seed=0).save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    write_jsonl(make_math_task(12, seed=2, difficulty=(1, 3)), path)
    return path


def difficulty_args(prompts: Path, model: Path, out: Path, *extra: str) -> list[str]:
    return ["data", "difficulty", str(prompts), "--model", str(model), "--out", str(out), "--k", "3",
            "--template", "raw", "--max-new-tokens", "24", "--chunk", "2", "--no-progress", *extra]


def rated(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_difficulty_command_writes_every_prompt_once(tmp_path: Path, prompts: Path, base_model: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rated.jsonl"
    assert main(difficulty_args(prompts, base_model, out)) == 0
    rows = rated(out)
    source = [r.id for r in load_prompts(prompts).records]
    assert [r["id"] for r in rows] == source
    for row in rows:
        md = row["metadata"]["model_difficulty"]
        assert md["k"] == 3 and md["pass_rate"] == pytest.approx(md["correct"] / 3)
        assert 0 < md["mean_length"] <= 24 and md["temperature"] == 1.0
    assert not partial_path(out).exists()
    # The output reads back as a prompt file (what `scalerl data curate` and training read).
    assert [r.id for r in load_prompts(out).records] == source
    assert "12 prompts x 3 samples" in capsys.readouterr().out
    # An existing output is not replaced silently.
    assert main(difficulty_args(prompts, base_model, out)) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err
    # The tokenizer has no chat template: the chat template is refused, naming the text templates.
    args = difficulty_args(prompts, base_model, tmp_path / "chat.jsonl")
    args[args.index("raw")] = "chat"
    assert main(args) == 2
    assert "data.template: r1, qwen_math or raw" in capsys.readouterr().err


def test_bad_rows_exit_2_naming_file_and_line(tmp_path: Path, base_model: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "task": "math", "prompt": "Compute 1+2", "answer": "3"}\n'
                   '{"id": "b", "task": "math", "prompt": "Compute 2+2"}\n')
    out = tmp_path / "o.jsonl"
    assert main(difficulty_args(bad, base_model, out)) == 2
    assert f"{bad}:2" in capsys.readouterr().err and not out.exists() and not partial_path(out).exists()


def test_killed_and_rerun_equals_an_uninterrupted_run(tmp_path: Path, prompts: Path,
                                                      base_model: Path) -> None:
    whole = tmp_path / "whole.jsonl"
    assert main(difficulty_args(prompts, base_model, whole)) == 0
    # The samples differ from prompt to prompt, so equal files below mean equal samples.
    assert len({row["metadata"]["model_difficulty"]["mean_length"] for row in rated(whole)}) > 3
    out = tmp_path / "killed.jsonl"
    work = partial_path(out)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "scalerl.cli", *difficulty_args(prompts, base_model, out)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    try:
        # Kill it once two chunks (4 prompts) are saved and before it is done.
        while time.monotonic() < deadline and proc.poll() is None:
            if work.exists() and len(work.read_text().splitlines()) >= 5:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not out.exists()
    saved = len(work.read_text().splitlines()) - 1
    assert 4 <= saved < 12
    assert main(difficulty_args(prompts, base_model, out)) == 0
    # Same records, same pass rates and lengths: the resumed run is indistinguishable.
    assert rated(out) == rated(whole)
    assert not work.exists()
