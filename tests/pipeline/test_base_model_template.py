"""Training a base model whose tokenizer has no chat template: a text template (`data.template`) runs,
the chat template fails up front naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerl.assembly.build import build_training
from scalerl.config import RunConfig
from scalerl.data import DataError
from scalerl.data.tokenize import QWEN_MATH_SYSTEM
from scalerl.models.tiny import TinyModelSpec, build_tiny_model, build_tiny_tokenizer
from scalerl.telemetry import read_rows


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("base")
    tok = build_tiny_tokenizer()
    tok.chat_template = None
    spec = TinyModelSpec(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64,
                         max_position_embeddings=512)
    build_tiny_model(spec, vocab_size=len(tok)).save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return str(path)


def config(model: str, template: str) -> RunConfig:
    return RunConfig.model_validate({
        "max_steps": 2,
        "model": {"name_or_path": model},
        "data": {"template": template, "synthetic": {"num_prompts": 30}, "heldout_size": 3},
        "generation": {"n": 2, "max_new_tokens": 12, "max_batch_size": 8, "length_control": {"kind": "none"}},
        "pipeline": {"off_policy": "sync", "prompts_per_step": 2},
        "algorithm": {"zero_variance_filter": False},
        "eval": {"every": 2, "k": 2},
        "logging": {"progress": False},
        "rewards": {"max_workers": 1},
    })


def test_a_text_template_trains_a_tokenizer_without_chat_template(tmp_path: Path, base_model: str) -> None:
    with build_training(config(base_model, "qwen_math"), tmp_path, device="cpu", checkpoints=False) as run:
        record = run.heldout[0]
        prompt = run.driver.c.encode(record)
        assert run.driver.c.decode(prompt).startswith("<|im_start|>system\n" + QWEN_MATH_SYSTEM)
        assert run.driver.run().steps == 2
    rows = read_rows(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [0, 2]
    with pytest.raises(DataError, match=r"no chat template.*data.template: r1, qwen_math or raw"):
        build_training(config(base_model, "chat"), tmp_path / "chat", device="cpu")
