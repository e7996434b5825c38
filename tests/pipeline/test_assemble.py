"""`build_training` with the real pieces (tiny model, embedded engine, trainer, pool, rewards
router, telemetry, checkpoints): a short pipeline run, then a resume from its checkpoint."""

from __future__ import annotations

from pathlib import Path

from scalerl.assembly.build import build_training, sampling_params
from scalerl.config import RunConfig
from scalerl.telemetry import read_rows
from scalerl.training.policy import load_tokenizer


def tiny_config(steps: int, mode: str = "pipeline") -> RunConfig:
    return RunConfig.model_validate(
        {
            "max_steps": steps,
            "model": {"tiny": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
                               "intermediate_size": 64, "max_position_embeddings": 256}},
            "data": {"synthetic": {"num_prompts": 40}, "heldout_size": 3},
            "generation": {"n": 2, "max_new_tokens": 12, "max_batch_size": 8,
                           "length_control": {"kind": "none"}},
            "pipeline": {"off_policy": mode, "k": 2, "prompts_per_step": 2},
            "algorithm": {"zero_variance_filter": False},
            "eval": {"every": 2, "k": 2},
            "checkpoint": {"every": 3},
            "logging": {"progress": False},
            "rewards": {"max_workers": 2},
        }
    )


def test_train_then_resume(tmp_path: Path) -> None:
    with build_training(tiny_config(3), tmp_path, device="cpu") as run:
        result = run.driver.run()
        assert result.steps == 3 and result.stop_reason == "max_steps"
        assert run.trainer.version == 3 and run.engine.version == 3
        assert result.max_version_lag <= 2
    rows = read_rows(tmp_path / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in rows] == [
        ("eval", 0), ("step", 1), ("step", 2), ("eval", 2), ("step", 3), ("eval", 3)
    ]
    assert all(r["version_lag_max"] <= 2 for r in rows if r["kind"] == "step")
    assert rows[-1]["val_version_min"] == rows[-1]["val_version_max"] == 3
    last_step = rows[-2]
    assert last_step["generator_device_hours"] > 0 and last_step["trainer_device_hours"] > 0
    assert last_step["tokens"] > 0  # the meter's generated tokens, added by the driver each step
    assert (tmp_path / "checkpoints" / "step_000003").is_dir()

    with build_training(tiny_config(5), tmp_path, device="cpu",
                        resume=tmp_path / "checkpoints" / "step_000003") as run:
        assert run.trainer.version == 3
        result = run.driver.run()
        assert result.steps == 5 and run.trainer.version == 5
        assert result.counters["prompts_reissued"] > 0
    rows = read_rows(tmp_path / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in rows if r["step"] > 3] == [("step", 4), ("eval", 4), ("step", 5),
                                                                      ("eval", 5)]

    # Resuming a finished run (its last checkpoint is at max_steps) trains nothing and must not log
    # that step's evaluation a second time (the scaling reader rejects duplicate steps).
    with build_training(tiny_config(5), tmp_path, device="cpu",
                        resume=tmp_path / "checkpoints" / "step_000005") as run:
        result = run.driver.run()
        assert result.steps == 5
    again = read_rows(tmp_path / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in again] == [(r["kind"], r["step"]) for r in rows]


def test_sampling_params_follow_the_config() -> None:
    cfg = tiny_config(1)
    cfg.generation.length_control.kind = "interruption"
    cfg.generation.top_k = 5
    cfg.algorithm.keep_sampling_mask = True
    tok = load_tokenizer(cfg.model)
    p = sampling_params(cfg, tok)
    assert p.n == 2 and p.max_new_tokens == 12 and p.top_k == 5 and p.return_support
    assert p.support_max_ids == 64
    cfg.algorithm.keep_sampling_mask_max_ids = 7
    assert sampling_params(cfg, tok).support_max_ids == 7  # algorithm.keep_sampling_mask_max_ids
    assert p.stop_token_ids == (tok.eos_token_id,)
    assert p.interruption is not None
    assert tok.decode(list(p.interruption.think_end_ids)) == "</think>"
    assert p.interruption.think_budget_lo == 48
