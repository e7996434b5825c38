"""The shipped real-model configs (examples/): each validates against the schema with the command
its header gives, and (marker real_shape, `make test-real-shape`) trains one step at a reduced real
shape: a random-init Qwen2 with Qwen2.5-0.5B's layer shape, 2 layers and the real vocabulary
151,936, on CPU with the embedded engine and the local backend (vLLM, Ray and GPUs are not here)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from scalerl.assembly.run import resolve_run_config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

# The tiny model's defaults that a real model must not keep (scalerl/config.py).
TINY = {"optim.lr": 1e-4, "model.dtype": "float32", "generation.max_new_tokens": 160,
        "data.max_prompt_tokens": 256, "checkpoint.every": 0}


def _get(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _header_command(path: Path) -> list[str]:
    text = "\n".join(ln[1:].strip().rstrip("\\").strip() for ln in path.read_text().splitlines()
                     if ln.startswith("#"))
    match = re.search(r"scalerl train (-c \S+.*?--output-dir \S+)", text, re.S)
    assert match, f"{path.name}: no `scalerl train -c ...` command in the header"
    return shlex.split(match.group(1).replace("\n", " "))


def test_there_are_examples_for_one_gpu_a_ray_node_and_a_base_model() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"qwen2.5-0.5b-instruct-gsm8k.yaml", "qwen2.5-1.5b-instruct-gsm8k.yaml",
            "qwen2.5-7b-instruct-gsm8k-ray.yaml", "qwen2.5-1.5b-base-gsm8k-r1.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_example_validates_and_leaves_no_tiny_default(path: Path) -> None:
    argv = _header_command(path)
    assert argv[1] == f"examples/{path.name}", "the header's command names another file"
    cfg = resolve_run_config(None, [str(path)], [])
    for key, tiny in TINY.items():
        assert _get(cfg, key) != tiny, f"{path.name}: {key} is still the tiny model's {tiny!r}"
    assert cfg.data.format == "gsm8k" and cfg.eval.every > 0
    _lo, hi = cfg.generation.length_control.think_budget
    assert hi + cfg.generation.length_control.answer_budget <= cfg.generation.max_new_tokens
    if "ray" in path.name:
        d = cfg.distributed
        assert d.backend == "ray"
        assert d.num_engines * d.engine_num_gpus + d.trainer_world_size * d.trainer_num_gpus == 8
    if "base" in path.name:
        assert cfg.data.template == "r1"


@pytest.fixture(scope="module")
def real_shape_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.with_vllm.vllm_helpers import save_real_shape

    return save_real_shape(tmp_path_factory.mktemp("real-shape") / "model", layers=2)


@pytest.mark.real_shape
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_example_trains_one_step_at_a_reduced_real_shape(path: Path, tmp_path: Path, monkeypatch,
                                                               real_shape_model: Path) -> None:
    from scalerl.cli import main
    from tests.data.test_benchmarks import GSM8K

    rows = [GSM8K] + [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}
                      for i in range(1, 8)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(tmp_path)
    reduced = ["--max-steps", "1", "data.heldout_size=2", "generation.n=2", "generation.max_new_tokens=16",
               "generation.length_control.kind=none", "generation.max_batch_size=4",
               "pipeline.prompts_per_step=2", "pipeline.off_policy=sync", "eval.k=1",
               "logging.progress=false",
               "logging.tensorboard=false", "rewards.max_workers=1", "generation.engine=embedded",
               "distributed.backend=local", "model.gradient_checkpointing=false",
               # the reduced model has the tiny char tokenizer (a token per character, not Qwen's merges):
               # the GSM8K row under the r1 template is 672 of them, over the examples' 512
               "data.max_prompt_tokens=1024"]
    argv = ["train", "-c", str(path), "--model", str(real_shape_model), "--data", "train.jsonl",
            "--output-dir", "runs/example", *reduced, "--device", "cpu"]
    assert main(argv) == 0
    run = tmp_path / "runs" / "example"
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics if r["kind"] == "step"] == [1]
    saved = (run / "config.yaml").read_text()
    assert "lr: 1.0e-06" in saved and "bfloat16" in saved  # the example's values, not the tiny ones
