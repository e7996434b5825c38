"""The README's "Your model on GSM8K" command, run for one step on a random-init Qwen2 saved
to a temporary folder and a GSM8K-format file, so the section cannot rot."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from scalerl.cli import main
from tests.data.test_benchmarks import GSM8K
from tests.test_readme import _code_lines, _section

FAST = ["--max-steps", "1", "data.heldout_size=2", "data.max_prompt_tokens=512", "generation.n=2",
        "generation.max_new_tokens=8", "generation.length_control.kind=none", "pipeline.prompts_per_step=2",
        "pipeline.off_policy=sync", "eval.k=1", "logging.progress=false", "rewards.max_workers=1",
        "model.dtype=float32"]


def _save_model(path: Path) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from scalerl.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    # As wide as a real small model (the advice for real models keys on width; 2 layers keep it fast).
    config = Qwen2Config(vocab_size=len(tok), hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id)
    Qwen2ForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)


def test_the_own_model_command_trains_one_step(tmp_path: Path, monkeypatch, capsys) -> None:
    section = _section("Your model on GSM8K")
    (line,) = [ln for ln in _code_lines(section) if ln.startswith("scalerl train --model ./my-model")]
    argv = shlex.split(line)[1:]
    _save_model(tmp_path / "my-model")
    (tmp_path / "gsm8k").mkdir()
    rows = [GSM8K] + [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}
                      for i in range(1, 8)]
    (tmp_path / "gsm8k" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(tmp_path)  # the command's ./my-model, ./gsm8k/train.jsonl and runs/mine
    assert main([*argv, *FAST, "--device", "cpu"]) == 0
    # A named model on the tiny model's defaults is warned about, key by key, before training.
    err = capsys.readouterr().err
    for key in ("optim.lr", "model.dtype", "checkpoint.every"):
        assert f"train: warning: {key} is " in err, key
    for key in ("data.max_prompt_tokens", "generation.max_new_tokens"):  # FAST sets them
        assert f"train: warning: {key}" not in err, key
    run = tmp_path / "runs" / "mine"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "step"] == [1]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert evals and all("val_entropy" in r and r["val_num_prompts"] == 2 for r in evals)
    assert len(json.loads((run / "heldout_ids.json").read_text())) == 2
