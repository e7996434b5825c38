"""The LLM judge served by vLLM (`rewards.reward_models.<task>.engine: vllm`): on the same model,
template and prompts, the vLLM judge's greedy verdicts are token for token those of Hugging Face
`generate` (the `hf` engine), and its malformed verdicts and FLOPs are counted the same way.

Why token-identical and not only verdict-identical: both engines run float32 weights with a float32
LM head and decode greedily (the argmax token) from the same token ids, stopping at eos; they differ
only in kernels (vLLM's CPU attention and repacked linears against torch's), a few 1e-6 in the
logits, which flips an argmax only where two logits lie that close. The model below is a random-init
tiny Qwen2 with weights spread wide (std 0.1, `vllm_helpers.save_tiny`): over the 135 greedy steps
of these 12 prompts its smallest top-two logit gap is 1.2e-4 (measured with HF), the rest far wider,
so a difference would be a real one (a wrong prompt, stop or length rule). One output stops at eos
after two tokens, the others at `max_new_tokens`: both endings are compared.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm)")

from vllm_helpers import save_tiny

from scalerl.data.records import PromptRecord
from scalerl.rewards.router import RewardRouter

# A random model writes random characters: about one in ten is a digit, so the first digit it writes
# (the verdict, out of 9) parses for some responses and is missing, malformed, for others.
TEMPLATE = "Question: {prompt}\nAnswer: {response}\nGrade 0-9:"
RESPONSES = ["42", "the answer is 7", "I do not know", "x = 3 + 4 = 7", "abc", "1 2 3 4 5 6 7 8 9 0",
             "no", "\\boxed{12}", "seven", "3.14159", "", "The sum is 10."]


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("judge"), seed=3, std=0.1)


def router(path: Path, engine: str, **kw: object) -> RewardRouter:
    rm = {"path": str(path), "kind": "judge", "template": TEMPLATE, "verdict": "score",
          "verdict_regex": r"(\d)", "score_max": 9, "max_new_tokens": 12, "max_length": 200,
          "engine": engine, **kw}
    out = RewardRouter({"reward_models": {"chat": rm}, "failure_reward": -1.0})
    out.check_tasks({"chat"})
    return out


def test_the_vllm_judge_gives_the_hf_judges_verdicts_token_for_token(judge_dir: Path) -> None:
    record = PromptRecord(id="q", task="chat", prompt="What is 3 + 4?")
    hf, vllm = router(judge_dir, "hf", batch_size=5), router(judge_dir, "vllm", batch_size=4)
    charged: list[tuple[int, int]] = []
    vllm.attach_compute(lambda tokens, n: charged.append((tokens, n)))
    try:
        a_rm, b_rm = hf.reward_models["chat"], vllm.reward_models["chat"]
        prompts = [a_rm.judge_prompt(record, r) for r in RESPONSES]
        assert prompts == [b_rm.judge_prompt(record, r) for r in RESPONSES]
        a_texts, b_texts = a_rm.judge_texts(prompts), b_rm.judge_texts(prompts)
        assert b_texts == a_texts
        assert len(set(a_texts)) > len(a_texts) // 2  # the judge's outputs depend on its input
        a_stats, b_stats = a_rm.stats(), b_rm.stats()
        encoded = b_rm._tokenizer(prompts, add_special_tokens=False)["input_ids"]
        prompt_tokens = sum(len(ids) for ids in encoded)
        assert b_stats["tokens"] == a_stats["tokens"] > prompt_tokens  # prompts + verdicts

        # Through the router: the same outcomes, some verdicts parsed, some malformed (counted).
        a, b = hf.score_group(record, RESPONSES), vllm.score_group(record, RESPONSES)
        assert [(o.status, o.reward) for o in b] == [(o.status, o.reward) for o in a]
        errors = sum(o.status == "error" for o in b)
        assert 0 < errors < len(RESPONSES), [o.status for o in b]
        assert all(o.reward == -1.0 for o in b if o.status == "error")
        assert b_rm.stats()["malformed"] == a_rm.stats()["malformed"] == errors
        assert vllm.stats()["chat"]["error"] == errors
        # FLOPs: every token charged to the hook, at the HF model's parameter count.
        assert sum(t for t, _ in charged) == b_rm.stats()["tokens"]
        assert {n for _, n in charged} == {a_rm.n_params}
    finally:
        hf.close()
        vllm.close()
