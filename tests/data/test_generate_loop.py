"""The rejection-sampling loop end to end on tiny models: `scalerl sft` makes a checkpoint from gold
traces, `scalerl data generate` samples and verifies it, `scalerl sft` trains a fresh model on the
generated rows, and `scalerl data difficulty` shows the fresh model's pass rate on those prompts
moving from its before-SFT value toward the checkpoint's. Fixed seeds throughout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalerl.cli import main
from scalerl.data import write_jsonl
from scalerl.data.synthetic import make_math_task

TINY = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
        "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=128",
        "model.tiny.max_position_embeddings=256"]


def sft(data: Path, out: Path, steps: int, seed: int = 0) -> None:
    assert main(["sft", *TINY, f"model.init_seed={seed}", "--data", str(data), "--output", str(out),
                 "--steps", str(steps), "--batch-size", "8", "--lr", "3e-3", "--warmup-steps", "5",
                 "--device", "cpu"]) == 0


def pass_rate(model: Path, prompts: Path, out: Path) -> float:
    assert main(["data", "difficulty", str(prompts), "--model", str(model), "--out", str(out), "--k", "4",
                 "--max-new-tokens", "32", "--no-progress", "--device", "cpu"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return sum(r["metadata"]["model_difficulty"]["pass_rate"] for r in rows) / len(rows)


@pytest.mark.slow
def test_generate_then_sft_moves_a_fresh_model_toward_the_checkpoint(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    write_jsonl(make_math_task(16, seed=3, difficulty=(1, 1)), prompts)
    ckpt, fresh, student = tmp_path / "ckpt", tmp_path / "fresh", tmp_path / "student"
    sft(prompts, ckpt, steps=200)  # the checkpoint: trained on the gold traces
    sft(prompts, fresh, steps=1, seed=1)  # the weaker model: one step from another init
    teacher_rate = pass_rate(ckpt, prompts, tmp_path / "r_ckpt.jsonl")
    before = pass_rate(fresh, prompts, tmp_path / "r_fresh.jsonl")
    gen = tmp_path / "gen.jsonl"
    assert main(["data", "generate", str(ckpt), "--prompts", str(prompts), "--k", "4", "--select",
                 "one_per_prompt", "--max-new-tokens", "32", "--out", str(gen), "--no-progress",
                 "--device", "cpu"]) == 0
    stats = json.loads((tmp_path / "gen.jsonl.stats.json").read_text())
    rows = [json.loads(line) for line in gen.read_text().splitlines()]
    assert stats["kept"] == len(rows) == stats["prompts_kept"] > 0
    sft(gen, student, steps=200, seed=1)  # the weaker model's init, trained on generated rows only
    after = pass_rate(student, prompts, tmp_path / "r_student.jsonl")
    print(f"pass rates: checkpoint {teacher_rate:.3f}, fresh {before:.3f}, fresh after SFT {after:.3f}")
    assert teacher_rate >= 0.5 and before <= 0.1
    assert after >= before + 0.5 * (teacher_rate - before)
