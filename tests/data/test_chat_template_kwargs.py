"""`data.chat_template_kwargs` reaches every `apply_chat_template` of a run: bound once on the run's
tokenizer by the composition root (training, evaluation, tool turns, serve), and checked here on a
template that renders Qwen3's `enable_thinking` switch."""

from __future__ import annotations

from pathlib import Path

from scalerl.assembly.inputs import check_prompt_lengths
from scalerl.config import DataConfig, RunConfig
from scalerl.data.records import PromptRecord
from scalerl.data.tokenize import bind_chat_template_kwargs
from scalerl.models.tiny import build_tiny_tokenizer

# A template in the shape of Qwen3's: thinking on unless enable_thinking is false.
TEMPLATE = ("{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
            "{% if enable_thinking is defined and enable_thinking is false %}A:{% else %}T:{% endif %}")


def _tokenizer():
    tok = build_tiny_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def _render(tok, **kw) -> str:
    return tok.apply_chat_template([{"role": "user", "content": "1+1"}], tokenize=False, **kw)


def test_bound_keywords_reach_every_call_and_a_call_s_own_win() -> None:
    tok = _tokenizer()
    assert _render(tok).endswith("T:")
    bind_chat_template_kwargs(tok, {"enable_thinking": False})
    assert _render(tok).endswith("A:")
    assert _render(tok, enable_thinking=True).endswith("T:")  # the call's own keyword wins
    bind_chat_template_kwargs(tok, {"enable_thinking": True})  # binding again replaces
    assert _render(tok).endswith("T:")
    plain = _tokenizer()
    assert bind_chat_template_kwargs(plain, {}) is plain and _render(plain).endswith("T:")


def test_the_run_s_prompts_are_encoded_with_them() -> None:
    record = PromptRecord(id="a", task="math", prompt="1+1", answer="2")
    data = DataConfig(chat_template_kwargs={"enable_thinking": False}, max_prompt_tokens=64)
    ids = check_prompt_lengths([record], data, _tokenizer()).token_ids["a"]
    tok = _tokenizer()
    assert tok.decode(ids).endswith("A:")
    default = check_prompt_lengths([record], DataConfig(max_prompt_tokens=64), _tokenizer()).token_ids["a"]
    assert tok.decode(default).endswith("T:")


def test_the_key_is_in_the_schema_and_every_backend_binds_it() -> None:
    assert RunConfig.model_validate({"data": {"chat_template_kwargs": {"enable_thinking": False}}})
    # The composition root's sites that load or receive the run's tokenizer all bind the key.
    root = Path(__file__).resolve().parents[2] / "scalerl" / "assembly"
    for name in ("local.py", "ray.py", "evaluate.py", "serve.py", "curation.py", "sft.py", "inputs.py"):
        text = (root / name).read_text()
        assert "bind_chat_template_kwargs(" in text and "chat_template_kwargs)" in text, name
