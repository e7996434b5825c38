"""`agentic.context_fraction`: context management triggered at a share of the model's context
window (DeepSeek-V3.2 acts past 80% of it), in training and in `scalerl eval`, counted in
`agentic_context_<strategy>` (scalerl/agentic/setup.py `context_trigger`, wired in
scalerl/assembly/build.py and scalerl/assembly/evaluate.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from scalerl.agentic.setup import context_trigger, with_context_window
from scalerl.assembly.run import train_run
from scalerl.cli import eval as eval_cli
from scalerl.config import AgenticConfig, ConfigError, load_config
from tests.agentic.tool_run import OVERRIDES, warm_start_tool_model

AGENTIC = [*OVERRIDES, "max_steps=1", "seed=3"]


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The warm start that calls the calculator in most episodes (tests/agentic/tool_run.py)."""
    return warm_start_tool_model(tmp_path_factory.mktemp("sft"))


def test_trigger_is_the_fraction_of_the_window_and_the_smaller_with_a_budget() -> None:
    assert context_trigger(None, 0.8, 1000) == 800  # V3.2: 80% of the window
    assert context_trigger(None, 0.8, 1001) == 800  # floor(800.8)
    assert context_trigger(700, 0.8, 1000) == 700 and context_trigger(900, 0.8, 1000) == 800
    assert context_trigger(300, None, None) == 300
    with pytest.raises(ConfigError, match=r"agentic\.context_fraction: the model.s context window"):
        context_trigger(None, 0.5, None)
    a = AgenticConfig(context_strategy="summary", context_fraction=0.5)  # no context_budget needed
    assert with_context_window(a, 512).context_budget == 256


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [None, 0.02])
def test_training_and_eval_manage_the_context_at_the_fraction(tmp_path: Path, fraction: float | None,
                                                              tool_model: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # A 512-token window: 2% is 10 tokens, so every tool turn's context passes it and
    # discard_all acts (then the restarted window still passes it: context_limit).
    extra = ["agentic.context_strategy=discard_all", f"agentic.context_fraction={fraction}"]
    if fraction is None:
        extra = ["agentic.context_strategy=none"]
    out = tmp_path / "run"
    cfg = load_config(overrides=[*AGENTIC, *extra, f"model.name_or_path={tool_model}", f"output_dir={out}"])
    assert train_run(cfg, out, device="cpu") == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "step"][-1]
    parser = argparse.ArgumentParser(prog="scalerl")
    eval_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["eval", str(out), "--json", "--device", "cpu"])
    assert args.func(args) == 0
    m = json.loads(capsys.readouterr().out)["metrics"]
    if fraction is None:
        assert train.get("agentic_context_discard_all", 0) == 0
        assert m.get("agentic_context_discard_all", 0) == 0
    else:
        shown = {k: v for k, v in train.items() if "agentic" in k}
        assert train.get("agentic_context_discard_all", 0) > 0, shown
        assert m["agentic_context_discard_all"] > 0 and m["agentic_end_context_limit"] > 0, m
