"""`rewards.functions` (scalerl/rewards/functions.py through the RewardRouter): TRL-, verl- and
verifier-style functions, async ones, combined by weight (reference arithmetic written out here),
failures counted and named, never a silent 0; a bad `fn` is a ConfigError naming its key."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from scalerl.config import ConfigError
from scalerl.data.records import PromptRecord
from scalerl.rewards.router import RewardRouter
from tests.rewards import reward_fns

MOD = "tests.rewards.reward_fns"


def _router(*functions: dict[str, Any], **rewards: Any) -> RewardRouter:
    return RewardRouter({"functions": list(functions), "max_workers": 1, **rewards})


def _record(**kw: Any) -> PromptRecord:
    base = {"id": "r1", "task": "math", "prompt": "What is 6*7?", "answer": "42",
            "metadata": {"level": 3}}
    return PromptRecord(**{**base, **kw})


def test_weights_combine_exactly() -> None:
    router = _router({"fn": f"{MOD}:half_or_none", "weight": 0.5},
                     {"fn": f"{MOD}:compute_score", "weight": 2.0, "name": "verl"},
                     {"fn": f"{MOD}:contains_answer", "weight": -1.0})
    texts = ["x 42", "xxx", "?42 xx"]
    out = router.score_group(_record(), texts)
    # half_or_none: 0.5 per 'x', None for '?...'; compute_score: 0.25 if '42' in it; contains_answer: 1/0.
    expected = [0.5 * (0.5 * 1) + 2.0 * 0.25 + (-1.0) * 1.0,   # 0.25 + 0.5 - 1.0 = -0.25
                0.5 * (0.5 * 3) + 2.0 * 0.0 + (-1.0) * 0.0,    # 0.75
                2.0 * 0.25 + (-1.0) * 1.0]                     # None left out: 0.5 - 1.0 = -0.5
    assert [o.reward for o in out] == pytest.approx([-0.25, 0.75, -0.5])
    assert [o.reward for o in out] == pytest.approx(expected)
    assert [o.correct for o in out] == [False, True, False]  # above 0.5, midway of the 0/1 rewards
    figs = router.reward_function_figures()
    assert figs["reward_fn/half_or_none"] == pytest.approx((0.5 + 1.5) / 2)  # the None not averaged in
    assert figs["reward_fn/half_or_none/math"] == pytest.approx(1.0)
    assert figs["reward_fn/verl"] == pytest.approx((0.25 + 0 + 0.25) / 3)
    assert figs["reward_fn/contains_answer"] == pytest.approx(2 / 3)
    assert figs["reward_fn_none_total/half_or_none"] == 1.0
    assert "reward_fn/verl" not in router.reward_function_figures()  # means are per step row
    router.close()


def test_trl_function_gets_prompts_completions_and_columns() -> None:
    reward_fns.CALLS.clear()
    router = _router({"fn": f"{MOD}:contains_answer"})
    router.score_group(_record(), ["a", "b"])
    call = reward_fns.CALLS[-1]
    assert call["prompts"] == ["What is 6*7?"] * 2 and call["completions"] == ["a", "b"]
    assert call["answer"] == ["42", "42"] and call["level"] == [3, 3] and call["task"] == ["math"] * 2
    chat = _record(prompt=None, messages=[{"role": "user", "content": "6*7?"}])
    router.score_group(chat, ["42"])
    call = reward_fns.CALLS[-1]  # a conversational record: TRL's message lists on both sides
    assert call["prompts"] == [[{"role": "user", "content": "6*7?"}]]
    assert call["completions"] == [[{"role": "assistant", "content": "42"}]]
    router.close()


@pytest.mark.parametrize(("fn", "why"), [("short_list", "returned 1 scores for 2 completions"),
                                         ("raises", "RuntimeError: reward server down")])
def test_a_failing_function_is_counted_and_named_never_a_silent_zero(
    fn: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    router = _router({"fn": f"{MOD}:{fn}", "name": "broken"}, {"fn": f"{MOD}:half_or_none"},
                     failure_reward=-3.0)
    with caplog.at_level(logging.WARNING):
        out = router.score_group(_record(), ["x", "xx"])
    assert [o.status for o in out] == ["error", "error"]
    assert [o.reward for o in out] == [-3.0, -3.0]  # failure_reward, not the other function's 0.5
    assert why in out[0].detail and "'broken'" in out[0].detail
    assert "reward function 'broken' (rewards.functions.0) " in caplog.text and why in caplog.text
    figs = router.reward_function_figures()
    assert figs["reward_fn_errors_total/broken"] == 2.0 and figs["reward_fn_errors_total/half_or_none"] == 0
    assert router.stats()["math"]["error"] == 2
    router.close()


def test_no_score_from_any_function_is_a_counted_failure() -> None:
    router = _router({"fn": f"{MOD}:half_or_none"})
    (out,) = router.score_group(_record(), ["?"])
    assert out.status == "error" and "all None" in out.detail
    router.close()


def test_async_file_and_builtin_verifier_functions(tmp_path: Path) -> None:
    path = tmp_path / "my_reward.py"
    path.write_text("def format_ok(prompts, completions, **kw):\n"
                    "    return [1.0 if c.endswith('.') else 0.0 for c in completions]\n")
    router = _router({"fn": f"{MOD}:async_len", "weight": 0.1},
                     {"fn": f"{path}:format_ok"},
                     {"fn": "math", "weight": 10.0})  # the built-in math verifier, by name
    out = router.score_group(_record(), ["\\boxed{42}.", "\\boxed{41}"])
    assert [o.reward for o in out] == pytest.approx([0.1 * 11 + 1.0 + 10.0, 0.1 * 10 + 0.0 + 0.0])
    assert set(router.reward_function_figures()) >= {"reward_fn/async_len", "reward_fn/format_ok",
                                                     "reward_fn/math"}
    router.close()


def test_tasks_limit_a_function_and_other_tasks_keep_their_verifier() -> None:
    router = _router({"fn": f"{MOD}:half_or_none", "tasks": ["chat"]})
    assert router.knows("chat") and router.batches("chat") and not router.batches("math")
    assert router.score(_record(task="chat"), "xx").reward == 1.0
    assert router.score(_record(), "\\boxed{42}").reward == 1.0  # math: the built-in verifier
    router.close()


@pytest.mark.parametrize(("fn", "message"), [
    ("nope.module:fn", r"rewards\.functions\.0\.fn: .*cannot import module 'nope\.module'"),
    (f"{MOD}:missing", r"rewards\.functions\.0\.fn: .*has no attribute 'missing'"),
    ("/no/such/file.py:f", r"rewards\.functions\.0\.fn: .*no such file"),
    ("unknown_name", r"rewards\.functions\.0\.fn: 'unknown_name': not a verifier name"),
    (f"{MOD}:ambiguous", r"rewards\.functions\.0\.fn=.*cannot tell its call style .*set style"),
])
def test_bad_fn_is_a_config_error_naming_the_key(fn: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _router({"fn": fn})


def test_explicit_style_overrides_detection() -> None:
    # f(text) called as a verifier, (completion, record): a TypeError per sample, each counted.
    router = _router({"fn": f"{MOD}:ambiguous", "style": "verifier"})
    (out,) = router.score_group(_record(), ["a"])
    assert out.status == "error" and "TypeError" in out.detail
    assert router.reward_function_figures()["reward_fn_errors_total/ambiguous"] == 1.0
    router.close()


def test_rows_of_tasks_only_trl_functions_score_need_no_gold(tmp_path: Path) -> None:
    """A TRL function reads the columns it wants (here `solution`, kept under its own name); a verl
    or verifier function reads the gold, so its task's rows still need an answer."""
    from scalerl.config import RewardConfig
    from scalerl.data.loaders import load_prompts
    from scalerl.data.rejects import DataError
    from scalerl.rewards.registry import gold_free_tasks

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "p", "solution": "s"}\n')

    def load(functions: list[dict[str, Any]]) -> Any:
        free = gold_free_tasks(RewardConfig(functions=functions))
        return load_prompts(rows, default_task="math", gold_free_tasks=free).records

    (record,) = load([{"fn": f"{MOD}:contains_answer"}])
    assert record.answer is None and record.metadata == {"solution": "s"}
    for functions in ([{"fn": f"{MOD}:compute_score"}],                       # verl: ground_truth
                      [{"fn": f"{MOD}:contains_answer"}, {"fn": "math", "tasks": ["math"]}],
                      [{"fn": f"{MOD}:contains_answer", "tasks": ["chat"]}]):  # math keeps its verifier
        with pytest.raises(DataError, match="missing answer"):
            load(functions)
    free = gold_free_tasks(RewardConfig(functions=[{"fn": f"{MOD}:contains_answer", "tasks": ["chat"]}]))
    assert "chat" in free and "math" not in free


@pytest.mark.parametrize(("overrides", "message"), [
    (["rewards.functions=[{fn: 'a.b:c', name: x}, {fn: 'a.b:d', name: x}]"], r"\['x'\] used twice"),
    (["rewards.functions=[{fn: 'a.b:c'}]", "rewards.reward_models={math: {path: m, kind: classifier}}"],
     r"rewards\.functions: functions\[0\] \(a\.b:c\) scores task\(s\) \['math'\], which have a reward"),
])
def test_config_rules_of_functions(overrides: list[str], message: str) -> None:
    from scalerl.config import load_config

    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides)
