"""Multi-task runs: the default `math+code` synthetic mix builds and trains, and every step and eval row
carries per-task reward / pass rate / length that the scaling reader fits without hand-made files."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerl.assembly.build import build_training, load_records
from scalerl.assembly.warm_start import default_sft_records
from scalerl.config import RunConfig
from scalerl.data.records import PromptRecord
from scalerl.pipeline.interfaces import ReadyGroup
from scalerl.pipeline.stats import batch_metrics
from scalerl.rollout.protocol import Completion
from scalerl.scaling.io import read_run_dir
from scalerl.telemetry import read_rows
from scalerl.training.batch import ScoredGroup


def _completion(n_tokens: int) -> Completion:
    return Completion(request_id="r", sample_index=0, prompt_ids=[1], token_ids=[2] * n_tokens,
                      logprobs=[0.0] * n_tokens, versions=[0] * n_tokens, loss_mask=[True] * n_tokens,
                      finish_reason="stop", start_version=0)


def _group(task: str, rewards: list[float], lengths: list[int]) -> ReadyGroup:
    record = PromptRecord(id=f"{task}-{len(rewards)}-{sum(lengths)}", task=task, prompt="q", answer="1")
    group = ScoredGroup(record, [_completion(n) for n in lengths], rewards)
    return ReadyGroup(ticket=0, admit_version=0, group=group)


def test_batch_metrics_per_task_by_hand() -> None:
    items = [_group("math", [1.0, 0.0], [4, 6]), _group("code", [0.0, 0.0, 1.0], [3, 3, 9]),
             _group("math", [1.0, 1.0], [2, 2])]
    m = batch_metrics(items, train_version=0)
    assert m["pass_rate/math"] == pytest.approx(3 / 4) and m["reward_mean/math"] == pytest.approx(3 / 4)
    assert m["pass_rate/code"] == pytest.approx(1 / 3)
    assert m["response_length_mean/math"] == pytest.approx(14 / 4)
    assert m["response_length_mean/code"] == pytest.approx(15 / 3)
    assert m["batch_samples/math"] == 4 and m["batch_samples/code"] == 3
    # The per-task rates are the overall one split by task.
    total = sum(m[f"pass_rate/{t}"] * m[f"batch_samples/{t}"] for t in ("math", "code"))
    assert total == pytest.approx(m["pass_rate"] * m["batch_samples"])


def test_default_math_code_prompt_set_builds() -> None:
    cfg = RunConfig.model_validate({"data": {"synthetic": {"task": "math+code", "num_prompts": 200}}})
    assert tuple(cfg.data.synthetic.difficulty) == (1, 6)  # the default range, beyond code's 5 levels
    records = load_records(cfg)
    levels = {t: {r.metadata["difficulty"] for r in records if r.task == t} for t in ("math", "code")}
    assert levels["math"] == {1, 2, 3, 4, 5, 6} and levels["code"] == {1, 2, 3, 4, 5}
    assert len(records) == 200 and len({r.id for r in records}) == 200
    # The warm start's traces come from the same mix, never from a prompt of the RL set.
    sft = default_sft_records(cfg)
    assert {r.task for r in sft} == {"math", "code"}
    assert not {r.prompt for r in sft} & {r.prompt for r in records}


def tiny_multitask(steps: int) -> RunConfig:
    return RunConfig.model_validate({
        "max_steps": steps,
        "model": {"tiny": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
                           "intermediate_size": 64, "max_position_embeddings": 256}},
        "data": {"synthetic": {"task": "math+code", "num_prompts": 60}, "heldout_size": 8},
        "generation": {"n": 2, "max_new_tokens": 16, "max_batch_size": 8, "length_control": {"kind": "none"}},
        "pipeline": {"off_policy": "sync", "prompts_per_step": 4},
        "algorithm": {"zero_variance_filter": False},
        "eval": {"every": 2, "k": 2},
        "logging": {"progress": False},
        "rewards": {"max_workers": 2},
    })


def test_math_code_run_logs_per_task_curves(tmp_path: Path) -> None:
    with build_training(tiny_multitask(2), tmp_path, device="cpu", checkpoints=False) as run:
        assert {r.task for r in run.heldout} == {"math", "code"}
        n_held = {t: sum(r.task == t for r in run.heldout) for t in ("math", "code")}
        result = run.driver.run()
    assert result.steps == 2
    rows = read_rows(tmp_path / "metrics.jsonl")
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2]
    for row in evals:
        assert row["val_num_prompts/math"] == n_held["math"] and row["val_num_prompts/code"] == n_held["code"]
        split = sum(row[f"val_pass_rate/{t}"] * n_held[t] for t in n_held) / sum(n_held.values())
        assert split == pytest.approx(row["val_pass_rate"])
        assert 0 <= row["val_pass_rate/code"] <= 1 and row["val_response_length/code"] > 0
    for row in (r for r in rows if r["kind"] == "step"):
        tasks = [t for t in ("math", "code") if f"pass_rate/{t}" in row]
        assert tasks and sum(row[f"batch_samples/{t}"] for t in tasks) == row["batch_samples"]
    # Per-domain curves fit straight from the run directory.
    curve = read_run_dir(tmp_path, x="flops", y="val_pass_rate/code")
    assert curve.y.tolist() == [r["val_pass_rate/code"] for r in evals]


def test_eval_render_lists_each_task() -> None:
    from scalerl.cli.eval import render

    metrics = {"k": 4.0, "pass_rate": 0.5, "pass_at_k": 0.7, "reward_mean": 0.5, "response_length": 20.0,
               "truncation_rate": 0.0, "interruption_rate": 0.0, "verifier_failures": 0.0, "time_s": 1.0,
               "pass_rate/code": 0.25, "num_prompts/code": 4.0,
               "pass_rate/math": 0.75, "num_prompts/math": 4.0}
    text = render(metrics, "eval")
    assert "mean@4 code" in text and "0.2500 (4 prompts)" in text and "mean@4 math" in text
    one = {k: v for k, v in metrics.items() if "code" not in k}
    assert "mean@4 math" not in render(one, "eval")  # a single task adds nothing to the overall line
