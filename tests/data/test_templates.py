"""Base-model prompt templates (`data.template`: r1, qwen_math, raw); tokenizers without a chat template."""

from __future__ import annotations

from typing import Any

import pytest

from scalerl.config import ConfigError, load_config
from scalerl.data import DataError, PromptRecord, encode_prompt, encode_prompts, render_prompt
from scalerl.data.tokenize import QWEN_MATH_SYSTEM, R1_TEMPLATE
from scalerl.models.tiny import build_tiny_tokenizer
from scalerl.rewards.answer import extract_code, extract_final_answer
from scalerl.rewards.math_verifier import MathVerifier


@pytest.fixture(scope="module")
def plain_tok() -> Any:
    """The tiny tokenizer with its chat template removed: what a base model's tokenizer looks like."""
    tok = build_tiny_tokenizer()
    tok.chat_template = None
    return tok


def _rec(prompt: str = "Compute 57+68", **kw: Any) -> PromptRecord:
    return PromptRecord(id=kw.pop("id", "p1"), task="math", prompt=prompt, answer="125", source="f.jsonl:3",
                        **kw)


def test_r1_template_is_the_papers_text() -> None:
    # DeepSeek-R1 (arXiv 2501.12948) Table 1, with "prompt" replaced by the question.
    text = render_prompt(_rec(), "r1")
    assert text == R1_TEMPLATE.replace("{prompt}", "Compute 57+68")
    assert text.startswith("A conversation between User and Assistant. The user asks a question, and the "
                           "Assistant solves it.")
    assert "<think> reasoning process here </think> <answer> answer here </answer>." in text
    assert text.endswith("User: Compute 57+68. Assistant:")


def test_qwen_math_and_raw_texts() -> None:
    assert render_prompt(_rec(), "qwen_math") == (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}."
        "<|im_end|>\n"
        "<|im_start|>user\nCompute 57+68<|im_end|>\n<|im_start|>assistant\n"
    )
    assert QWEN_MATH_SYSTEM.endswith("\\boxed{}.")
    assert render_prompt(_rec(), "raw") == "Compute 57+68"
    assert render_prompt(_rec(), "raw", "Be brief.") == "Be brief.\n\nCompute 57+68"


def test_text_templates_work_without_a_chat_template(plain_tok: Any) -> None:
    rec = _rec()
    with pytest.raises(DataError, match=r"no chat template.*data.template: r1, qwen_math or raw"):
        encode_prompt(rec, plain_tok)
    for template in ("r1", "qwen_math", "raw"):
        ids = encode_prompt(rec, plain_tok, template=template)
        assert plain_tok.decode(ids) == render_prompt(rec, template)
    # The chat tokenizer gives the same text-template ids: the template, not the tokenizer, decides.
    chat_tok = build_tiny_tokenizer()
    assert encode_prompt(rec, chat_tok, template="r1") == encode_prompt(rec, plain_tok, template="r1")


def test_a_single_user_turn_is_a_question_a_longer_chat_is_a_bad_row(plain_tok: Any) -> None:
    one = PromptRecord(id="a", task="math", messages=[{"role": "user", "content": "Compute 1+2"}], answer="3",
                       source="f.jsonl:1")
    chat = PromptRecord(id="b", task="math", answer="3", source="f.jsonl:2", messages=[
        {"role": "system", "content": "s"}, {"role": "user", "content": "Compute 1+2"}])
    assert render_prompt(one, "raw") == "Compute 1+2"
    with pytest.raises(DataError, match=r"(?s)template error: 1.*f.jsonl:2: data.template=raw takes one"):
        encode_prompts([one, chat], plain_tok, max_prompt_tokens=64, template="raw")
    enc = encode_prompts([one, chat], plain_tok, max_prompt_tokens=64, template="raw", on_error="skip")
    assert [r.id for r in enc.records] == ["a"] and enc.rejects.to_dict() == {"template error": 1}


def test_length_check_counts_the_template(plain_tok: Any) -> None:
    rec = _rec()
    # One token per character, `<think>` and `</think>` one token each (tiny tokenizer).
    text = R1_TEMPLATE.replace("{prompt}", "Compute 57+68")
    n = len(text) - 2 * (len("<think>") - 1) - 2 * (len("</think>") - 1)
    assert len(encode_prompt(rec, plain_tok, template="r1")) == n
    assert len(encode_prompts([rec], plain_tok, max_prompt_tokens=n, template="r1")) == 1
    with pytest.raises(DataError, match=f"{n} tokens > max_prompt_tokens={n - 1}"):
        encode_prompts([rec], plain_tok, max_prompt_tokens=n - 1, template="r1")


def test_instruction_templates_refuse_a_system_prompt(plain_tok: Any) -> None:
    with pytest.raises(DataError, match="carries its own instruction"):
        encode_prompt(_rec(), plain_tok, "Think.", template="r1")
    with pytest.raises(DataError, match="must be one of"):
        encode_prompt(_rec(), plain_tok, template="alpaca")
    with pytest.raises(ConfigError, match=r"data.template: qwen_math carries its own instruction"):
        load_config(overrides=["data.template=qwen_math", "data.think_system_prompt=true"])
    assert load_config(overrides=["data.template=raw", "data.system_prompt=Be brief."]).data.template == "raw"
    with pytest.raises(ConfigError, match=r"data\.template"):
        load_config(overrides=["data.template=alpaca"])


@pytest.mark.parametrize(("template", "completion"), [
    ("chat", "<think>7+8=15>5;5+6+1=12>125</think>\\boxed{125}"),
    ("r1", " <think> 7+8=15, 5+6+1=12 </think> <answer> 125 </answer>"),
    ("qwen_math", "7+8=15, carry 1; 5+6+1=12. The answer is \\boxed{125}."),
    ("raw", " = 125, so \\boxed{125}"),
])
def test_answers_are_read_under_every_template(template: str, completion: str) -> None:
    assert extract_final_answer(completion) == "125"
    verdict = MathVerifier(timeout_s=None).check(completion, "125")
    assert verdict.correct and verdict.status == "ok"
    wrong = completion.replace("125", "126")
    assert not MathVerifier(timeout_s=None).check(wrong, "125").correct


def test_answer_tag_rules() -> None:
    # A box wins over the tag; the last complete tag counts; an empty or unclosed one is none.
    assert extract_final_answer("<answer>3</answer> \\boxed{4}") == "4"
    assert extract_final_answer("<answer>3</answer> <answer>5</answer>") == "5"
    assert extract_final_answer("<answer>3</answer> <answer>5") == "3"
    assert extract_final_answer("<answer> </answer>") is None
    assert extract_final_answer("<think>x <answer>3</answer>") is None  # thinking never closed
    assert extract_final_answer("<answer>3</answer></think> no tag after the thinking") is None
    assert MathVerifier(timeout_s=None).check("<answer>5", "5").status == "no_answer"
    # Code inside the answer tags is still found by its fence.
    code = "<think>f</think> <answer>\n```python\ndef f(x):\n    return x+7\n```\n</answer>"
    assert extract_code(code) == "def f(x):\n    return x+7\n"
