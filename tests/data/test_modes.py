"""Thinking and non-thinking modes per row (scalerl/data/modes.py): a row's `thinking` column picks
its system prompt and the chat template's `enable_thinking`, and training rows and evaluations
split reward, pass rate and length by mode (figures counted by hand here)."""

from __future__ import annotations

import pytest

from scalerl.data.records import PromptRecord
from scalerl.data.rejects import DataError
from scalerl.data.tokenize import THINK_SYSTEM_PROMPT, encode_prompt
from scalerl.evaluation.evaluator import _task_metrics
from scalerl.models.tiny import build_tiny_tokenizer
from scalerl.pipeline.interfaces import ReadyGroup
from scalerl.pipeline.stats import batch_metrics
from scalerl.rewards.groups import ScoredBatch
from scalerl.rollout.protocol import Completion
from scalerl.training.batch import ScoredGroup
from tests.data.test_chat_template_kwargs import TEMPLATE


def _tok():
    tok = build_tiny_tokenizer()
    tok.chat_template = TEMPLATE  # prints each message, then T: (thinking) or A: (enable_thinking false)
    return tok


def _row(thinking: object = None, i: int = 0) -> PromptRecord:
    meta = {} if thinking is None else {"thinking": thinking}
    return PromptRecord(id=f"r{i}", task="math", prompt="1+1", answer="2", metadata=meta,
                        source=f"rows.jsonl:{i + 1}")


def _text(record: PromptRecord, system: str | None, template: str = "chat") -> str:
    tok = _tok()
    return str(tok.decode(encode_prompt(record, tok, system, template)))


def test_each_row_s_mode_picks_its_system_prompt_and_enable_thinking() -> None:
    think = _text(_row(True), None)
    assert THINK_SYSTEM_PROMPT in think and think.endswith("T:")
    plain = _text(_row(False), THINK_SYSTEM_PROMPT)  # the run asks for <think>; this row does not
    assert THINK_SYSTEM_PROMPT not in plain and plain.endswith("A:")
    assert _text(_row(False), "Be brief.").startswith("Be brief.")  # a custom system prompt stays
    assert _text(_row(True), "Be brief.").startswith("Be brief.")
    assert _text(_row(), THINK_SYSTEM_PROMPT) == think  # no column: the run's setting
    raw = _text(_row(True), None, template="raw")
    assert raw.startswith(THINK_SYSTEM_PROMPT)


def test_a_bad_mode_names_the_row() -> None:
    with pytest.raises(DataError, match=r"rows\.jsonl:3: column 'thinking' must be true or false, got 'yes'"):
        _text(_row("yes", 2), None)
    with pytest.raises(DataError, match=r"rows\.jsonl:1: column 'thinking' needs data\.template chat or raw"):
        _text(_row(True), None, template="r1")


def _completion(n: int) -> Completion:
    return Completion(request_id="r", sample_index=0, prompt_ids=[1], token_ids=[2] * n,
                      logprobs=[0.0] * n, versions=[0] * n, loss_mask=[True] * n,
                      finish_reason="stop", start_version=0)


def test_training_rows_split_by_mode() -> None:
    groups = [(_row(True, 0), [1.0, 0.0], [4, 6]), (_row(False, 1), [0.0, 0.0, 1.0], [3, 3, 9]),
              (_row(True, 2), [1.0, 1.0], [2, 2]), (_row(None, 3), [0.0, 1.0], [5, 5])]
    items = [ReadyGroup(ticket=0, admit_version=0,
                        group=ScoredGroup(r, [_completion(n) for n in lengths], rewards))
             for r, rewards, lengths in groups]
    m = batch_metrics(items, train_version=0)
    assert m["pass_rate/mode=think"] == pytest.approx(3 / 4)
    assert m["pass_rate/mode=nothink"] == pytest.approx(1 / 3)
    assert m["response_length_mean/mode=think"] == pytest.approx(14 / 4)
    assert m["batch_samples/mode=think"] == 4 and m["batch_samples/mode=nothink"] == 3
    assert m["batch_samples/math"] == 2 + 3 + 2 + 2  # the row without a column: its task, no mode


def test_evaluations_split_by_mode() -> None:
    records = [_row(True, 0), _row(False, 1), _row(True, 2)]
    correct = [[True, False], [False, False], [True, True]]
    scored = [ScoredBatch(key=i, record=r, completions=[_completion(3), _completion(5)],
                          rewards=[float(c) for c in ok], correct=ok, failures=0)
              for i, (r, ok) in enumerate(zip(records, correct, strict=True))]
    m = _task_metrics(records, scored, k=2)
    assert m["pass_rate/mode=think"] == pytest.approx((1 / 2 + 2 / 2) / 2)
    assert m["pass_rate/mode=nothink"] == 0.0 and m["num_prompts/mode=think"] == 2
    assert m["pass_rate/math"] == pytest.approx((1 / 2 + 0 + 1) / 3)


def test_the_column_comes_from_the_prompt_file(tmp_path) -> None:
    from scalerl.data.loaders import load_prompts

    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "1+1", "answer": "2", "thinking": true}\n'
                    '{"prompt": "2+2", "answer": "4", "thinking": false}\n')
    think, plain = load_prompts(str(path), default_task="math").records
    assert _text(think, None).endswith("T:") and _text(plain, THINK_SYSTEM_PROMPT).endswith("A:")


def test_a_run_on_a_file_with_the_column_logs_per_mode_rows(tmp_path) -> None:
    """`scalerl train` on a prompt file whose rows alternate modes: step rows and evaluation rows
    carry the per-mode keys beside the per-task ones."""
    import json

    import yaml

    from scalerl.assembly.build import load_records
    from scalerl.assembly.warm_start import warm_start_default
    from scalerl.cli import main
    from scalerl.config import RunConfig
    from scalerl.training.sft import SFTConfig
    from tests.pipeline.test_kill_resume import tiny_run_config

    tiny = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64,
            "max_position_embeddings": 512}
    base = RunConfig.model_validate({"model": {"tiny": tiny}, "data": {"synthetic": {"num_prompts": 40}}})
    model = warm_start_default(base, SFTConfig(steps=2, batch_size=4), cache_dir=tmp_path / "sft")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": r.prompt, "answer": r.answer,
                                        "thinking": i % 2 == 0}) + "\n"
                            for i, r in enumerate(load_records(base))))
    cfg = tiny_run_config(str(model), tmp_path / "run")
    cfg.max_steps = 2
    raw = cfg.model_dump(mode="json")
    raw["data"]["train_path"] = str(rows)
    raw["data"]["max_prompt_tokens"] = 384
    raw["pipeline"]["prompts_per_step"] = 4
    raw["eval"]["every"] = 2
    raw["checkpoint"] = {"every": 0}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert main(["train", "--recipe", "base", "-c", str(config)]) == 0
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in logged if r["kind"] == "step"]
    evals = [r for r in logged if r["kind"] == "eval"]
    assert steps and evals
    for row in steps:
        modes = [m for m in ("think", "nothink") if f"batch_samples/mode={m}" in row]
        assert modes and sum(row[f"batch_samples/mode={m}"] for m in modes) == row["batch_samples"]
    assert any(k.startswith("val_pass_rate/mode=") for k in evals[-1])
