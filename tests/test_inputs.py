"""Every input is checked before any work: exit 2, the config key and path named, nothing left behind."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import scalerl.assembly.warm_start as ws_mod
from scalerl.assembly.inputs import check_run_inputs
from scalerl.cli import main
from scalerl.inputs import InputError, check_model_source, could_be_hub_id


@pytest.fixture
def no_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hub must not be asked (a local path is never a repo id)."""
    import huggingface_hub

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the Hugging Face Hub was contacted")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", refuse)


@pytest.fixture
def no_warm_start(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the warm start ran before the inputs were checked")

    monkeypatch.setattr(ws_mod, "warm_start_default", refuse)


def test_which_names_can_be_hub_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert could_be_hub_id("gpt2") and could_be_hub_id("Qwen/Qwen3-0.6B")
    for local in ("/abs/model", "./model", "../m", "a/b/c", "runs/sft", "model/", "~/m"):
        assert not could_be_hub_id(local), local


@pytest.mark.usefixtures("no_hub")
def test_missing_local_model_is_an_error_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    start = time.monotonic()
    for name in (str(tmp_path / "nope"), "runs/sft-missing", "./nope"):
        with pytest.raises(InputError, match=r"^model\.name_or_path: .*no such directory"):
            check_model_source(name, "model.name_or_path")
    assert time.monotonic() - start < 2.0  # no network wait
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"no config\.json"):
        check_model_source(str(tmp_path / "empty"), "model.name_or_path")
    (tmp_path / "file.bin").write_text("x")
    with pytest.raises(InputError, match="is a file"):
        check_model_source(str(tmp_path / "file.bin"), "model.name_or_path")


def test_hub_ids_that_do_not_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InputError, match="offline mode"):
        check_model_source("someone/not-cached-model", "model.name_or_path")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)

    class NotFoundError(RepositoryNotFoundError):
        def __init__(self) -> None:  # the real one wants an HTTP response
            Exception.__init__(self, "404 Repository Not Found")

    def missing(*args: object, **kwargs: object) -> None:
        raise NotFoundError()

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", missing)
    with pytest.raises(InputError, match="neither a local folder nor a model on the Hugging Face Hub"):
        check_model_source("someone/not-cached-model", "model.name_or_path")

    def unreachable(*args: object, **kwargs: object) -> None:
        raise OSError("Name or service not known")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", unreachable)
    with pytest.raises(InputError, match="could not be reached"):
        check_model_source("someone/not-cached-model", "model.name_or_path")


def _train(tmp_path: Path, *extra: str) -> int:
    return main(["train", "--output-dir", str(tmp_path / "run"), "--max-steps", "1", *extra])


@pytest.mark.usefixtures("no_hub", "no_warm_start")
def test_train_with_a_missing_model_exits_2_and_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _train(tmp_path, "--model", str(tmp_path / "no-such-model")) == 2
    err = capsys.readouterr().err
    assert "model.name_or_path" in err and "no-such-model" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.usefixtures("no_warm_start")
def test_train_with_missing_or_bad_data_exits_2_before_the_warm_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _train(tmp_path, "--data", str(tmp_path / "missing.jsonl")) == 2
    err = capsys.readouterr().err
    assert "data.train_path" in err and "missing.jsonl" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n" + json.dumps({"prompt": ""}) + "\n")
    assert _train(tmp_path, "--data", str(bad)) == 2
    err = capsys.readouterr().err
    assert f"data.train_path: {bad}" in err and f"{bad}:2" in err
    assert "data.on_bad_row: skip" in err  # the hint names the config key, not the Python argument
    assert _train(tmp_path, "eval.extra_sets={hard: " + str(tmp_path / "hard.jsonl") + "}") == 2
    err = capsys.readouterr().err
    assert "eval.extra_sets.hard" in err and "hard.jsonl" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.usefixtures("no_warm_start")
def test_demo_with_a_missing_data_override_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--output-dir", str(out), f"data.train_path={tmp_path / 'nope.jsonl'}"]) == 2
    assert "data.train_path" in capsys.readouterr().err
    assert not out.exists()


def test_check_run_inputs_accepts_good_inputs(tmp_path: Path) -> None:
    from scalerl.config import RunConfig
    from scalerl.data.synthetic import write_synthetic_jsonl

    data = write_synthetic_jsonl(tmp_path / "d.jsonl", "math", 5, 0)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    cfg = RunConfig.model_validate({"model": {"name_or_path": str(model)},
                                    "data": {"train_path": str(data), "heldout_size": 2},
                                    "eval": {"extra_sets": {"x": str(data)}}})
    check_run_inputs(cfg)


def test_runs_that_execute_model_code_need_the_sandbox_isolation_first(tmp_path: Path) -> None:
    """The code sandbox fails closed before any work: code prompts (synthetic or in a file, training
    or evaluation) and the agentic python tool need the configured isolation; other runs probe nothing."""
    from scalerl.config import ConfigError, load_config
    from scalerl.data.synthetic import write_synthetic_jsonl

    broken = [f"output_dir={tmp_path / 'run'}", "rewards.sandbox.unshare=/nonexistent/unshare"]
    check_run_inputs(load_config(overrides=broken))  # math: the sandbox is not needed
    with pytest.raises(ConfigError, match=r"^rewards\.sandbox\.isolation: 'auto' cannot be had here .*needed "
                                          r"for the code task in data\.synthetic\.task=math\+code;"):
        check_run_inputs(load_config(overrides=[*broken, "data.synthetic.task=math+code"]))
    code = write_synthetic_jsonl(tmp_path / "code.jsonl", "code", 3, 0)
    with pytest.raises(ConfigError, match=r"needed for the code task in eval\.extra_sets\.c;"):
        check_run_inputs(load_config(overrides=[*broken, f"eval.extra_sets.c={code}"]))
    with pytest.raises(ConfigError, match=r"needed for the python tool \(agentic\.tools\[1\]\);"):
        check_run_inputs(load_config(overrides=[*broken, "agentic.environment=tools",
                                                "agentic.tools=[calculator, python]"]))
    # a custom code verifier runs no model code in our sandbox; `isolation: none` is a choice
    check_run_inputs(load_config(overrides=[*broken, f"data.train_path={code}", "data.heldout_size=1",
                                            "rewards.verifiers.code=operator:eq"]))
    if Path("/usr/bin/python3").exists():  # as root, the unisolated uid cannot read a venv under /root
        check_run_inputs(load_config(overrides=[*broken, "data.synthetic.task=code",
                                                "rewards.sandbox.isolation=none",
                                                "rewards.sandbox.python=/usr/bin/python3"]))


def test_the_synthetic_tasks_record_tasks_are_the_ones_they_make() -> None:
    from scalerl.assembly.inputs import SYNTHETIC_RECORD_TASKS
    from scalerl.data.synthetic import SYNTHETIC_TASKS, make_synthetic

    assert set(SYNTHETIC_RECORD_TASKS) == set(SYNTHETIC_TASKS)
    for task, made in SYNTHETIC_RECORD_TASKS.items():
        assert {r.task for r in make_synthetic(task, 200, 0, None, None)} == set(made), task
