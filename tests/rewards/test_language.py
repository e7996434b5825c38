"""The built-in language-consistency reward (scalerl/rewards/language.py): the share of the
response's prose letters in the target script, counted by hand here; by name in
`rewards.functions`, combined by weight."""

from __future__ import annotations

import pytest

from scalerl.config import ConfigError
from scalerl.data.records import PromptRecord
from scalerl.rewards.language import consistency, dominant_script, prose, script_of
from scalerl.rewards.router import RewardRouter


def _record(prompt: str, **metadata: object) -> PromptRecord:
    return PromptRecord(id="r", task="chat", prompt=prompt, answer=None, metadata=dict(metadata))


def test_scripts_of_letters() -> None:
    assert [script_of(c) for c in "aÉжλ中あア한1 ."] == [
        "latin", "latin", "cyrillic", "greek", "han", "hiragana", "katakana", "hangul",
        None, None, None]


def test_code_math_and_latex_are_not_prose() -> None:
    text = "Ответ: $x+y$ и $$\\frac{a}{b}$$ `code` ```py\nprint(x)\n``` \\(z\\) \\[w\\] \\alpha ok"
    assert prose(text).split() == ["Ответ:", "и", "ok"]


def test_share_against_letters_counted_by_hand() -> None:
    # "Ответ is 42, $x$": prose letters О т в е т (5 Cyrillic) + i s (2 Latin); the x is math.
    assert consistency("Ответ is 42, $x$", "cyrillic") == pytest.approx(5 / 7)
    assert consistency("Ответ is 42, $x$", "latin") == pytest.approx(2 / 7)
    assert consistency("42 = $6 \\times 7$", "han") == 1.0  # no prose letters: nothing foreign
    assert dominant_script("Сколько будет 6*7? answer") == "cyrillic"  # 11 Cyrillic, 6 Latin


def _router(fn: str, weight: float = 1.0) -> RewardRouter:
    return RewardRouter({"functions": [{"fn": fn, "weight": weight}], "max_workers": 1})


def test_by_name_in_reward_functions_with_weight_and_target() -> None:
    router = _router("language_consistency", weight=2.0)
    out = router.score_group(_record("Сколько будет шесть на семь?"), ["Сорок два", "forty два"])
    # Prompt's script: Cyrillic. "Сорок два": 8/8; "forty два": 3 of 8 letters -> 2.0 * 3/8.
    assert [o.reward for o in out] == pytest.approx([2.0, 2.0 * 3 / 8])
    assert router.reward_function_figures()["reward_fn/language_consistency"] == pytest.approx(
        (1.0 + 3 / 8) / 2)
    # The row's `language` column names the target over the prompt's script.
    (col,) = router.score_group(_record("Сколько?", language="latin"), ["forty два"])
    assert col.reward == pytest.approx(2.0 * 5 / 8)
    router.close()
    named = _router("language_consistency:han")
    (got,) = named.score_group(_record("What is 6*7?"), ["四十二 is"])
    assert got.reward == pytest.approx(3 / 5)
    named.close()


def test_prompt_without_letters_has_no_score_and_unknown_script_is_a_config_error() -> None:
    router = _router("language_consistency")
    (out,) = router.score_group(_record("6*7=?"), ["42"])
    assert out.status == "error" and "all None" in out.detail
    assert router.reward_function_figures()["reward_fn_none_total/language_consistency"] == 1.0
    router.close()
    with pytest.raises(ConfigError, match=r"rewards\.functions\.0\.fn: unknown script 'klingon'"):
        _router("language_consistency:klingon")


def test_chat_rows_and_no_gold_needed() -> None:
    from scalerl.config import RewardConfig
    from scalerl.rewards.registry import gold_free_tasks

    router = _router("language_consistency")
    chat = PromptRecord(id="c", task="chat", prompt=None, answer=None,
                        messages=[{"role": "system", "content": "Be brief. Answer."},
                                  {"role": "user", "content": "Сколько?"}])
    (out,) = router.score_group(chat, ["Сорок is"])  # the user turn's script: 5 of 7 letters
    assert out.reward == pytest.approx(5 / 7)
    router.close()
    free = gold_free_tasks(RewardConfig(functions=[{"fn": "language_consistency", "tasks": ["chat"]}]))
    assert "chat" in free  # TRL style: the rows need no gold answer
