"""Model-level behaviour of the vLLM engine: unsupported head sizes, an untied LM head, bfloat16
with and without the FP32 head. Each test builds (and closes) its own engine: vLLM holds one
in-process engine at a time."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm)")

from transformers import AutoModelForCausalLM
from vllm_helpers import save_tiny, vllm_device

from scalerl.cli import main
from scalerl.models.lm_head import sequence_logprobs
from scalerl.models.tiny import TinyModelSpec, build_tiny_model, build_tiny_tokenizer
from scalerl.rollout import GenerationRequest, SamplingParams
from scalerl.rollout.vllm_engine import UnsupportedModelError, VLLMEngine

PROMPTS = [[10, 11, 12, 13], [20, 21], [30, 31, 32, 33, 34, 35], [40]]


@contextmanager
def engine_at(path: Path, **kw: object) -> Iterator[VLLMEngine]:
    eng = VLLMEngine(str(path), seed=0, max_batch_size=8, max_model_len=128, eos_token_ids=(1,), **kw)
    try:
        yield eng
    finally:
        eng.close()


# vLLM's CUDA selector falls back to another attention backend for an odd head size; its CPU build
# has one backend, with a fixed list of sizes.
cpu_only = pytest.mark.skipif(vllm_device() != "cpu", reason="head size 8 runs on some CUDA backend")


@pytest.fixture(scope="module")
def head8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Hidden 32 over 4 heads: head size 8, which vLLM's attention backends do not have."""
    path = tmp_path_factory.mktemp("head8")
    tok = build_tiny_tokenizer()
    build_tiny_model(TinyModelSpec(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
                                   intermediate_size=64), vocab_size=len(tok)).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@cpu_only
def test_unsupported_head_size_is_a_clear_error(head8: Path) -> None:
    with pytest.raises(UnsupportedModelError, match="head size 8 is not supported"):
        VLLMEngine(str(head8), max_batch_size=2, max_model_len=64)
    # The failed build shut its engine down: the next one works.
    with engine_at(save_tiny(head8.parent / "ok", seed=0)) as eng:
        (c,) = eng.generate([GenerationRequest("a", [10, 11], SamplingParams(max_new_tokens=4))])
        assert c.num_tokens == 4


@cpu_only
def test_unsupported_head_size_fails_scalerl_train_before_training(head8: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", "--model", str(head8), "--output-dir", str(tmp_path / "run"), "--max-steps", "1",
                 "--device", vllm_device(), "generation.engine=vllm", "logging.progress=false"])
    err = capsys.readouterr().err
    assert code == 2 and "head size 8" in err and "model.tiny.num_heads" in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_untied_head_updates(tmp_path: Path) -> None:
    a = save_tiny(tmp_path / "a", seed=0, tied=False)
    b = AutoModelForCausalLM.from_pretrained(save_tiny(tmp_path / "b", seed=1, tied=False))
    assert not b.config.tie_word_embeddings
    params = SamplingParams(temperature=0.0, max_new_tokens=10)
    with engine_at(a) as eng:
        eng.update_weights({k: v.detach().clone() for k, v in b.state_dict().items()}, 1)
        outs = eng.generate([GenerationRequest(f"p{i}", p, params) for i, p in enumerate(PROMPTS)])
    b = b.to(vllm_device())
    for c in outs:
        ids = torch.tensor([c.prompt_ids + c.token_ids], device=vllm_device())
        with torch.no_grad():
            ref = sequence_logprobs(b, ids, fp32_lm_head=True, temperature=1.0,
                                    response_start=len(c.prompt_ids))[0].cpu()
        assert torch.allclose(torch.tensor(c.logprobs), ref.float(), atol=1e-4, rtol=0)


def bf16_mismatch(path: Path, fp32_head: bool) -> tuple[float, float]:
    """Mean and max |log p_vLLM - log p_trainer| over sampled tokens, vLLM in bfloat16 and the
    trainer's forward under bf16 autocast (float32 master weights), the FP32 head on both or neither."""
    trainer = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(vllm_device()).eval()
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=24, seed=2)
    with engine_at(path, dtype="bfloat16", fp32_lm_head=fp32_head) as eng:
        head_dtype = eng._engine.model_config.head_dtype
        outs = eng.generate([GenerationRequest(f"p{i}", p, params) for i, p in enumerate(PROMPTS)])
    assert head_dtype == (torch.float32 if fp32_head else torch.bfloat16)
    gaps = []
    for c in outs:
        ids = torch.tensor([c.prompt_ids + c.token_ids], device=vllm_device())
        with torch.no_grad(), torch.autocast(device_type=vllm_device(), dtype=torch.bfloat16):
            ref = sequence_logprobs(trainer, ids, fp32_lm_head=fp32_head, temperature=1.0,
                                    response_start=len(c.prompt_ids))[0].float().cpu()
        gaps.append((torch.tensor(c.logprobs) - ref).abs())
    gap = torch.cat(gaps)
    return float(gap.mean()), float(gap.max())


def test_bfloat16_engine_with_and_without_fp32_head(tiny_dirs: tuple[Path, Path]) -> None:
    with_head = bf16_mismatch(tiny_dirs[0], fp32_head=True)
    without = bf16_mismatch(tiny_dirs[0], fp32_head=False)
    # Both run and stay near the trainer (bf16 kernels differ; a float32 run agrees to 1e-6).
    for mean, worst in (with_head, without):
        assert 0 < mean < 0.05 and worst < 0.5
