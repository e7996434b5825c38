from __future__ import annotations

from typing import Any

import pytest

from scalerl.data import THINK_SYSTEM_PROMPT, DataError, PromptRecord, encode_prompt, encode_prompts
from scalerl.models.tiny import build_tiny_tokenizer


@pytest.fixture(scope="module")
def tok() -> Any:
    return build_tiny_tokenizer()


def _rec(pid: str, prompt: str) -> PromptRecord:
    return PromptRecord(id=pid, task="math", prompt=prompt, answer="1", source=f"f.jsonl:{pid}")


def test_encode_prompt_applies_template_and_system_prompt(tok: Any) -> None:
    rec = _rec("1", "Compute 3+4")
    ids = encode_prompt(rec, tok)
    assert tok.decode(ids) == "<|user|>Compute 3+4<|assistant|>"
    with_sys = encode_prompt(rec, tok, THINK_SYSTEM_PROMPT)
    text = tok.decode(with_sys)
    assert text.startswith("<|system|>" + THINK_SYSTEM_PROMPT)
    assert text.endswith("<|user|>Compute 3+4<|assistant|>")
    assert "<think>" in THINK_SYSTEM_PROMPT and "\\boxed{}" in THINK_SYSTEM_PROMPT


class _ListTokenizer:
    """Stands in for tokenizers whose apply_chat_template returns a plain id list (or a batch)."""

    chat_template = "x"

    def __init__(self, out: Any) -> None:
        self.out = out

    def apply_chat_template(self, chat: list[dict[str, str]], **kwargs: Any) -> Any:
        assert kwargs == {"add_generation_prompt": True, "tokenize": True}
        return self.out


def test_encode_prompt_handles_list_and_nested_returns() -> None:
    rec = _rec("1", "p")
    assert encode_prompt(rec, _ListTokenizer([5, 6])) == [5, 6]
    assert encode_prompt(rec, _ListTokenizer([[5, 6]])) == [5, 6]
    assert encode_prompt(rec, _ListTokenizer({"input_ids": [7]})) == [7]
    with pytest.raises(DataError, match="2 sequences"):
        encode_prompt(rec, _ListTokenizer([[1], [2]]))


def test_no_chat_template_is_a_clear_error(tok: Any) -> None:
    bare = build_tiny_tokenizer()
    bare.chat_template = None
    with pytest.raises(DataError, match="no chat template"):
        encode_prompt(_rec("1", "p"), bare)


def test_too_long_prompts_rejected_or_skipped(tok: Any) -> None:
    short, long_ = _rec("1", "Compute 1+1"), _rec("2", "Compute " + "9+" * 30 + "1")
    n_short = len(encode_prompt(short, tok))
    with pytest.raises(DataError) as err:
        encode_prompts([short, long_], tok, max_prompt_tokens=n_short)
    assert "f.jsonl:2" in str(err.value) and "prompt too long" in str(err.value)
    assert f"> max_prompt_tokens={n_short}" in str(err.value)

    enc = encode_prompts([short, long_], tok, max_prompt_tokens=n_short, on_error="skip")
    assert [r.id for r in enc.records] == ["1"]
    assert enc.token_ids["1"] == encode_prompt(short, tok)
    assert enc.ids_for(enc.records) == [enc.token_ids["1"]]
    assert enc.rejects.to_dict() == {"prompt too long": 1}
    with pytest.raises(DataError, match="no prompt fits"):
        encode_prompts([long_], tok, max_prompt_tokens=n_short, on_error="skip")


def test_system_prompt_counts_toward_the_limit(tok: Any) -> None:
    rec = _rec("1", "Compute 1+1")
    budget = len(encode_prompt(rec, tok))
    assert len(encode_prompts([rec], tok, max_prompt_tokens=budget)) == 1
    with pytest.raises(DataError, match="prompt too long"):
        encode_prompts([rec], tok, max_prompt_tokens=budget, system_prompt=THINK_SYSTEM_PROMPT)


class _PickyTokenizer(_ListTokenizer):
    def apply_chat_template(self, chat: list[dict[str, str]], **kwargs: Any) -> Any:
        if chat[0]["content"] == "bad":
            raise ValueError("Conversation roles must alternate")
        return [1, 2]


def test_template_errors_are_row_rejections() -> None:
    recs = [_rec("1", "good"), _rec("2", "bad")]
    enc = encode_prompts(recs, _PickyTokenizer(None), max_prompt_tokens=8, on_error="skip")
    assert [r.id for r in enc.records] == ["1"]
    assert enc.rejects.to_dict() == {"chat template error": 1}
    assert "f.jsonl:2: ValueError: Conversation roles must alternate" in enc.rejects.examples[
        "chat template error"]


def test_resolve_system_prompt() -> None:
    from scalerl.data import resolve_system_prompt

    assert resolve_system_prompt() is None
    assert resolve_system_prompt(think_system_prompt=True) == THINK_SYSTEM_PROMPT
    assert resolve_system_prompt(True, "Be brief.") == "Be brief."
    with pytest.raises(ValueError, match="system_prompt: empty"):
        resolve_system_prompt(False, "  ")
