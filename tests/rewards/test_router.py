"""RewardRouter: per-task routing, reward scale, custom verifiers, contained failures, counters."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scalerl.data.records import PromptRecord
from scalerl.rewards import (
    RewardConfig,
    RewardRouter,
    VerifierResult,
    load_callable,
    register_verifier,
)
from scalerl.rewards.registry import VERIFIERS


def math_record(answer: str = "\\frac{1}{2}", rid: str = "m1") -> PromptRecord:
    return PromptRecord(id=rid, task="math", prompt="What is 1/2?", answer=answer, source="test.jsonl:1")


def code_record(rid: str = "c1") -> PromptRecord:
    return PromptRecord(id=rid, task="code", prompt="Double n.", source="test.jsonl:2",
                        tests=[{"stdin": "2", "stdout": "4"}, {"stdin": "5", "stdout": "10"}])


GOOD_CODE = "<think>ok</think>```python\nprint(int(input()) * 2)\n```"
HALF_CODE = "```python\nn = int(input())\nprint(4 if n == 2 else 0)\n```"


@pytest.fixture(scope="module")
def router() -> Iterator[RewardRouter]:
    r = RewardRouter(RewardConfig(correct_reward=1.0, incorrect_reward=-1.0, math_workers=2,
                                  sandbox={"max_parallel": 2, "memory_mb": 256}))
    yield r
    r.close()


def test_math_and_code_route_by_task_with_paper_scale(router: RewardRouter) -> None:
    router.reset_stats()
    cases = [
        (math_record(), "<think>half</think>\\boxed{0.5}", 1.0, True, "ok"),
        (math_record(), "\\boxed{0.25}", -1.0, False, "ok"),
        (math_record(), "<think>never closed \\boxed{0.5}", -1.0, False, "no_answer"),
        (math_record(), "one half", -1.0, False, "no_answer"),
        (code_record(), GOOD_CODE, 1.0, True, "ok"),
        (code_record(), HALF_CODE, -1.0, False, "ok"),  # binary by default: 1/2 tests is wrong
        (code_record(), "I cannot code", -1.0, False, "no_answer"),
    ]
    outcomes = router.score_batch([(rec, text) for rec, text, *_ in cases], max_workers=4)
    for outcome, (_, _, reward, correct, status) in zip(outcomes, cases, strict=True):
        assert (outcome.reward, outcome.correct, outcome.status) == (reward, correct, status), outcome
    stats = router.stats()
    assert stats["math"] == {"ok": 2, "error": 0, "timeout": 0, "no_answer": 2, "correct": 1, "total": 4}
    assert stats["code"]["total"] == 3 and stats["code"]["correct"] == 1


def test_partial_credit_interpolates_the_scale() -> None:
    r = RewardRouter({"correct_reward": 1.0, "incorrect_reward": -1.0, "partial_credit": True})
    try:
        outcome = r.score(code_record(), HALF_CODE)
        assert outcome.reward == pytest.approx(0.0) and not outcome.correct
    finally:
        r.close()


def test_records_missing_their_gold_data_are_counted_errors(router: RewardRouter) -> None:
    no_answer = PromptRecord(id="m9", task="math", prompt="?", source="x.jsonl:9")
    outcome = router.score(no_answer, "\\boxed{1}")
    assert outcome.status == "error" and "m9" in outcome.detail and "x.jsonl:9" in outcome.detail
    assert outcome.reward == 0.0  # failure_reward, not the -1 of a wrong answer
    bad_tests = PromptRecord(id="c9", task="code", prompt="?", tests=[{"stdin": "1"}], source="x.jsonl:10")
    outcome = router.score(bad_tests, GOOD_CODE)
    assert outcome.status == "error" and "tests[0]" in outcome.detail


def test_unknown_task_is_an_error_not_a_crash(router: RewardRouter) -> None:
    rec = PromptRecord(id="u1", task="chess", prompt="e4?")
    outcome = router.score(rec, "e5")
    assert outcome.status == "error" and "chess" in outcome.detail
    assert router.stats()["chess"]["error"] >= 1
    with pytest.raises(ValueError, match="chess"):
        router.check_tasks(["math", "chess"])
    router.check_tasks(["math", "code"])


def test_code_tasks_fail_closed_where_the_sandbox_cannot_isolate() -> None:
    """The check before training names the key; a custom code verifier needs no sandbox."""
    r = RewardRouter({"sandbox": {"unshare": "/nonexistent/unshare"}})
    try:
        r.check_tasks(["math"])  # no code: the sandbox is not needed, nothing is probed
        assert r.stats()["_sandbox"]["runs"] == 0
        with pytest.raises(ValueError, match=r"rewards\.sandbox\.isolation: 'auto' cannot be had here .*"
                                             r"needed for the code task"):
            r.check_tasks(["math", "code"])
        r.register("code", lambda completion, record: 1.0)
        r.check_tasks(["code"])
    finally:
        r.close()


def test_registered_verifier_by_decorator() -> None:
    @register_verifier("shout")
    def shout(completion: str, record: PromptRecord) -> bool:
        return completion.isupper()

    try:
        r = RewardRouter()
        rec = PromptRecord(id="s1", task="shout", prompt="say hi loudly")
        assert r.score(rec, "HI").correct
        assert not r.score(rec, "hi").correct
        with pytest.raises(ValueError, match="already registered"):
            register_verifier("shout", shout)
        with pytest.raises(ValueError, match="already registered"):
            register_verifier("math", shout)  # built-ins need overwrite=True
        with pytest.raises(ValueError, match="completion, record"):
            register_verifier("bad", lambda completion: 1.0)
    finally:
        VERIFIERS.unregister("shout")


@pytest.fixture
def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = "scalerl_test_plugin"
    (tmp_path / f"{name}.py").write_text(
        "from scalerl.rewards import VerifierResult\n"
        "def length_score(completion, record):\n"
        "    return min(1.0, len(completion) / 10)\n"
        "def judged(completion, record):\n"
        "    return VerifierResult(1.0 if 'yes' in completion else 0.0, detail='looked for yes')\n"
        "def explode(completion, record):\n"
        "    raise RuntimeError('verifier bug')\n"
        "def hang(completion, record):\n"
        "    import time\n"
        "    time.sleep(5)\n"
        "def nonsense(completion, record):\n"
        "    return 'great'\n"
        "def too_big(completion, record):\n"
        "    return 7.0\n"
        "NOT_CALLABLE = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_verifiers_by_dotted_path_in_config(plugin_module: str) -> None:
    r = RewardRouter({
        "correct_reward": 1.0, "incorrect_reward": -1.0, "partial_credit": True,
        "verifier_timeout_s": 0.5,
        "verifiers": {"len": f"{plugin_module}:length_score", "yes": f"{plugin_module}.judged",
                      "boom": f"{plugin_module}:explode", "slow": f"{plugin_module}:hang",
                      "odd": f"{plugin_module}:nonsense", "big": f"{plugin_module}:too_big"},
    })
    try:
        def rec(task: str) -> PromptRecord:
            return PromptRecord(id=task, task=task, prompt="p")

        assert r.score(rec("len"), "0123456789abc").reward == 1.0
        assert r.score(rec("len"), "01234").reward == pytest.approx(0.0)  # score 0.5 on a ±1 scale
        assert r.score(rec("yes"), "yes").detail == "looked for yes"
        boom = r.score(rec("boom"), "x")
        assert (boom.status, boom.reward) == ("error", 0.0) and "verifier bug" in boom.detail
        start = time.monotonic()
        slow = r.score(rec("slow"), "x")
        assert slow.status == "timeout" and time.monotonic() - start < 3
        assert r.score(rec("odd"), "x").status == "error"
        assert r.score(rec("big"), "x").status == "error"
        stats = r.stats()
        assert stats["boom"]["error"] == 1 and stats["slow"]["timeout"] == 1
        assert stats["_abandoned"]["threads"] == 1
    finally:
        r.close()


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_such_module_xyz:fn", "cannot import module 'no_such_module_xyz'"),
        ("scalerl_test_plugin:missing", "has no attribute 'missing'"),
        ("scalerl_test_plugin:NOT_CALLABLE", "not callable"),
        ("justaname", "expected 'package.module:function'"),
        ("", "expected 'package.module:function'"),
    ],
)
def test_bad_dotted_paths_name_the_path(plugin_module: str, path: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        load_callable(path)
    assert repr(path) in str(info.value) or path == ""


def test_bad_dotted_path_in_config_names_the_key() -> None:
    with pytest.raises(ValueError, match=r"rewards\.verifiers\.mine: verifier path 'nope\.nope:f'"):
        RewardRouter({"verifiers": {"mine": "nope.nope:f"}})


def test_bad_config_is_named() -> None:
    """A mapping is checked by the run config's own `rewards` schema: the key path is named."""
    with pytest.raises(ValueError, match=r"rewards\.corect_reward: unknown key \(did you mean 'correct_"):
        RewardRouter({"corect_reward": 1.0})
    with pytest.raises(ValueError, match=r"correct_reward: must exceed incorrect_reward \(0\.0 <= 0\.0\)"):
        RewardConfig(correct_reward=0.0, incorrect_reward=0.0)
    with pytest.raises(ValueError, match=r"rewards\.sandbox\.paralel: unknown key"):
        RewardRouter({"sandbox": {"paralel": 2}})
    with pytest.raises(ValueError, match=r"rewards\.failure_reward: Input should be a finite number"):
        RewardRouter({"failure_reward": float("nan")})


def test_score_batch_is_concurrent_bounded_and_ordered() -> None:
    in_flight = peak = 0
    lock = threading.Lock()

    def slow_echo(completion: str, record: PromptRecord) -> VerifierResult:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        time.sleep(0.1)
        with lock:
            in_flight -= 1
        return VerifierResult(1.0 if completion == record.id else 0.0)

    r = RewardRouter()
    r.register("echo", slow_echo)
    try:
        records = [PromptRecord(id=str(i), task="echo", prompt="p") for i in range(12)]
        pairs = [(rec, rec.id if i % 3 else "wrong") for i, rec in enumerate(records)]
        outcomes = r.score_batch(pairs, max_workers=3)
        assert [o.correct for o in outcomes] == [i % 3 != 0 for i in range(12)]
        assert peak == 3
    finally:
        r.close()


def test_the_router_takes_the_run_configs_rewards_section() -> None:
    """One schema: the router reads the run config's section itself, defaults included."""
    from scalerl.config import RewardConfig as ConfigSection
    from scalerl.config import RunConfig, SandboxConfig

    assert RewardConfig is ConfigSection
    tree = {"rewards": {"failure_reward": -1.0, "max_consecutive_failures": 3, "sandbox": {"memory_mb": 300}}}
    section = RunConfig.model_validate(tree).rewards
    r = RewardRouter(section)
    try:
        assert r.config is section and r.config.failure_reward == -1.0
        assert isinstance(r.sandbox.config, SandboxConfig) and r.sandbox.config.memory_mb == 300
    finally:
        r.close()
    # the defaults of a router built alone are those of `scalerl train`
    assert RewardRouter().config == RunConfig().rewards
    assert RunConfig().rewards.max_workers == 4
