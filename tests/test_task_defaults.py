"""Every built-in task and template runs with the rest of the config at its defaults, or the error
names the key to set, before any work (issue 25): a task brings the difficulty range and the
environment it needs; a template whose prompts do not fit is an error before the warm start."""

from __future__ import annotations

from pathlib import Path

import pytest

import scalerl.assembly.warm_start as ws_mod
from scalerl.assembly.inputs import check_run_inputs
from scalerl.cli import main
from scalerl.config import TASK_LEVELS, TOOL_TASKS, ConfigError, load_config
from scalerl.data.synthetic import SYNTHETIC_TASKS
from scalerl.data.synthetic.arithmetic import MATH_LEVELS
from scalerl.data.synthetic.functions import CODE_LEVELS
from scalerl.data.synthetic.tool_math import TOOL_MATH_LEVELS
from scalerl.data.tokenize import TEMPLATES


def test_the_config_knows_each_tasks_levels() -> None:
    assert set(TASK_LEVELS) == set(SYNTHETIC_TASKS)
    assert {"math": len(MATH_LEVELS), "code": CODE_LEVELS, "math+code": len(MATH_LEVELS),
                           "tool_math": len(TOOL_MATH_LEVELS), "tool_code": CODE_LEVELS} == TASK_LEVELS


@pytest.mark.parametrize("task", SYNTHETIC_TASKS)
def test_every_task_runs_with_the_defaults(task: str, tmp_path: Path) -> None:
    cfg = load_config(overrides=[f"data.synthetic.task={task}", f"output_dir={tmp_path / 'run'}"])
    lo, hi = cfg.data.synthetic.difficulty
    assert 1 <= lo <= hi <= TASK_LEVELS[task]
    if task in TOOL_TASKS:  # a tool task brings its environment and tools
        assert cfg.agentic.environment == "tools" and cfg.agentic.tools == TOOL_TASKS[task]
    else:
        assert cfg.agentic.environment is None
    check_run_inputs(cfg)  # loads the task's prompts and checks their lengths, as the run will


def test_a_tool_task_without_its_environment_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"agentic\.environment: task 'tool_math' is a tool-use task"):
        load_config(overrides=["data.synthetic.task=tool_math", "agentic.environment=null"])
    cfg = load_config(overrides=["data.synthetic.task=tool_math", "agentic.tools=[calculator, python]"])
    assert cfg.agentic.tools == ["calculator", "python"]  # the user's tools are kept


def test_a_range_beyond_the_tasks_levels_names_the_keys() -> None:
    with pytest.raises(ConfigError, match=r"data\.synthetic\.difficulty: task 'code' has levels 1\.\.5"):
        load_config(overrides=["data.synthetic.task=code", "data.synthetic.difficulty=[1,6]"])
    assert load_config().data.synthetic.difficulty == (1, 6)  # the default task is unchanged


@pytest.mark.parametrize("template", TEMPLATES)
def test_every_template_runs_or_names_the_key_before_the_warm_start(
    template: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the warm start began before the prompts were checked")

    monkeypatch.setattr(ws_mod, "warm_start_default", refuse)
    cfg = load_config(overrides=[f"data.template={template}", f"output_dir={tmp_path / 'run'}"])
    try:
        check_run_inputs(cfg)
    except ValueError as err:
        keys = f"data.max_prompt_tokens={cfg.data.max_prompt_tokens} with data.template={template}"
        assert keys in str(err)
        assert "prompt too long" in str(err)
        status = main(["train", "--output-dir", str(tmp_path / "run"), f"data.template={template}"])
        assert status == 2 and "raise data.max_prompt_tokens" in capsys.readouterr().err
        assert not (tmp_path / "run").exists()
