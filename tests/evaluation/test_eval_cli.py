"""`scalerl eval` on a real tiny run: a run directory and a checkpoint inside it evaluate on the
run's held-out split and reproduce its last logged evaluation; --data, --max-prompts, a bare model
directory (synthetic held-out split); and the errors for paths that are none of these."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

import scalerl.cli
from scalerl.assembly.run import train_run
from scalerl.assembly.warm_start import warm_start_default
from scalerl.cli import eval as eval_cli
from scalerl.config import load_config
from scalerl.data import write_jsonl
from scalerl.data.records import PromptRecord
from scalerl.training.sft import SFTConfig

TINY = [
    "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
    "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64", "model.tiny.max_position_embeddings=512",
    "data.synthetic.num_prompts=40", "data.heldout_size=5", "generation.n=2",
    "generation.max_new_tokens=12",
    "generation.max_batch_size=8", "generation.length_control.kind=none", "pipeline.prompts_per_step=2",
    "pipeline.off_policy=sync", "eval.every=1", "eval.k=3", "logging.progress=false", "rewards.max_workers=1",
    "max_steps=2", "seed=5",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = load_config(overrides=TINY)
    return warm_start_default(cfg, SFTConfig(steps=2, batch_size=4), cache_dir=tmp_path_factory.mktemp("sft"))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("run")
    cfg = load_config(overrides=[*TINY, f"model.name_or_path={model_dir}", f"output_dir={out}"])
    assert train_run(cfg, out, device="cpu") == 0
    return out


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="scalerl")
    eval_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["eval", *argv])
    code = args.func(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def last_eval(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "eval"][-1]


def test_a_run_dir_reproduces_its_last_evaluation(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([str(run_dir), "--json", "--device", "cpu"], capsys)
    assert code == 0
    result = json.loads(out)
    logged = last_eval(run_dir)
    assert result["model"].endswith("checkpoints/step_000002") and result["run_dir"] == str(run_dir)
    assert result["k"] == 3 and result["seed"] == 5 and result["temperature"] == 1.0
    m = result["metrics"]
    assert m["num_prompts"] == 5.0
    # Same weights, same held-out prompts, same per-request seeds: the same samples.
    for key in ("pass_rate", "pass_at_k", "reward_mean", "response_length", "truncation_rate"):
        assert m[key] == pytest.approx(logged[f"val_{key}"]), key


def test_a_checkpoint_inside_a_run_uses_the_runs_split(run_dir: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = run_dir / "checkpoints" / "step_000002"
    code, out, _ = run([str(ckpt), "--k", "2", "--max-prompts", "2", "--temperature", "0.5"], capsys)
    assert code == 0
    header = f"eval: {ckpt} on 2 prompts of the held-out split of {run_dir} (k=2, temperature 0.5, seed 5)"
    assert header in out
    assert "mean@2 (pass rate)" in out and "pass@2" in out


def test_data_and_a_bare_model_dir(run_dir: Path, model_dir: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "probs.jsonl"
    write_jsonl([PromptRecord(id=f"p{i}", task="math", prompt=f"What is {i} + {i}?", answer=str(2 * i))
                 for i in range(3)], data)
    code, out, _ = run([str(run_dir), "--data", str(data), "--json", "--k", "1"], capsys)
    assert code == 0 and json.loads(out)["metrics"]["num_prompts"] == 3.0
    code, out, _ = run([str(model_dir), "--json", "--k", "1", "--max-prompts", "4"], capsys)
    result = json.loads(out)
    assert code == 0 and result["run_dir"] is None and result["metrics"]["num_prompts"] == 4.0
    assert "synthetic task" in result["prompts"]


def test_paths_that_are_not_models_are_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert "scalerl.cli.eval" in scalerl.cli.COMMAND_MODULES
    assert scalerl.cli.main(["eval", str(tmp_path / "missing")]) == 2
    assert "missing: no such directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert scalerl.cli.main(["eval", str(tmp_path / "empty")]) == 2
    assert "neither a run directory" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("max_steps: 3\n")
    assert scalerl.cli.main(["eval", str(tmp_path / "run")]) == 2
    assert "a run directory without a checkpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        scalerl.cli.main(["eval", str(tmp_path / "run"), "--k", "0"])


def test_save_samples_writes_every_sample_with_the_reward_of_its_own_text(
        run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from scalerl.rewards import math_reward

    out = tmp_path / "samples.jsonl"
    code, stdout, _ = run([str(run_dir), "--json", "--save-samples", str(out)], capsys)
    assert code == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    metrics = json.loads(stdout)["metrics"]
    assert len(rows) == metrics["num_prompts"] * 3  # every prompt x k
    assert sum(r["correct"] for r in rows) / len(rows) == pytest.approx(metrics["pass_rate"])
    for r in rows:  # the saved reward is the verifier's on the saved response
        assert r["reward"] == math_reward(r["response"], r["answer"])
    before = out.read_text()
    assert scalerl.cli.main(["eval", str(run_dir), "--save-samples", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err and out.read_text() == before  # never overwritten
