"""Multi-task reward routing: each prompt's `task` picks its verifier; failures are contained.

`RewardRouter(config).score(record, completion)` runs the verifier for `record.task` ("math",
"code", or a registered/configured custom one) and maps its score to a reward:

* judged (status "ok"): score 1 -> `correct_reward`; below 1 -> `incorrect_reward`, or, with
  `partial_credit`, `incorrect + score * (correct - incorrect)` (code: fraction of tests passed);
* no answer (unclosed thinking, no box, no code block): `incorrect_reward`, the model's fault;
* verifier error, exception, or over `verifier_timeout_s`: `failure_reward` (default 0), never
  an exception into the trainer. Every outcome is counted per task and status (`stats()`).

A task with a reward model (`rewards.reward_models.<task>`, scalerl/rewards/reward_model.py) is
scored by it, a group at a time (`score_group`, batched): its score s in [0, 1] is always graded,
`incorrect + s * (correct - incorrect)`, and counts as correct when `s >= correct_threshold`;
with `normalize: group` the reward is the logit's z-score within the group instead. A malformed
judge verdict or a non-finite logit is status "error": `failure_reward`, counted.

The paper's multi-task run scores math and code prompts in one batch with ±1 rewards
(ScaleRL, arXiv 2510.13786): `RewardConfig(correct_reward=1.0, incorrect_reward=-1.0)`.
`RewardConfig` is the run config's `rewards` section (`scalerl.config`), the only schema of these keys.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from scalerl.config import ConfigError, RewardConfig, build_config
from scalerl.data.records import PromptRecord
from scalerl.rewards.code_verifier import CodeVerifier
from scalerl.rewards.functions import RewardFunctions, load_functions
from scalerl.rewards.math_verifier import MathVerifier
from scalerl.rewards.registry import (
    STATUSES,
    VERIFIERS,
    Status,
    Verifier,
    VerifierResult,
    check_verifier,
    load_callable,
)
from scalerl.rewards.reward_model import ModelScore, RewardModel, group_zscores
from scalerl.rewards.sandbox import Sandbox

logger = logging.getLogger(__name__)


def _validated(data: Mapping[str, Any]) -> RewardConfig:
    """A `rewards` mapping checked by the run config's own schema; errors name `rewards.key`."""
    return build_config([({"rewards": dict(data)}, {})]).rewards


@dataclass(frozen=True)
class RewardOutcome:
    """A scored completion. `correct` is True only for a fully correct, judged answer."""

    reward: float
    correct: bool
    status: Status
    detail: str
    task: str = ""
    # rewards.functions: each function's unweighted score of this sample (None: not scored by functions)
    parts: Mapping[str, float] | None = None


class RewardRouter:
    """Scores completions with the verifier of each record's task (see module doc). Thread-safe."""

    def __init__(self, config: RewardConfig | Mapping[str, Any] | None = None) -> None:
        """`config`: a run config's `rewards` section (`scalerl.config.RewardConfig`), or a mapping
        of its keys, checked against it. The router reads every key but `max_consecutive_failures`,
        which the generator applies (scalerl/pipeline/faults.py)."""
        if config is None:
            config = RewardConfig()
        elif isinstance(config, Mapping):
            config = _validated(config)
        self.config: RewardConfig = config
        self.math = MathVerifier(timeout_s=config.math_timeout_s, workers=config.math_workers)
        self.sandbox = Sandbox(config.sandbox)
        self.code = CodeVerifier(self.sandbox, timeout_s=config.code_timeout_s)
        self._verifiers: dict[str, Verifier] = {"math": self._verify_math, "code": self._verify_code}
        self._verifiers.update(VERIFIERS.items())
        # Built now, loaded by `check_tasks` (a bad path fails the run at start, exit 2).
        self.reward_models: dict[str, RewardModel] = {
            task: RewardModel(task, rm) for task, rm in config.reward_models.items()}
        for task, path in config.verifiers.items():
            try:
                self._verifiers[task] = load_callable(path)
            except ValueError as exc:  # the user's path: bad input (exit 2), not a failure of ours
                raise ConfigError(f"rewards.verifiers.{task}: {exc}") from None
        # rewards.functions: the tasks they score take their weighted sum (scalerl/rewards/functions.py).
        self.functions: RewardFunctions | None = None
        if config.functions:
            try:
                loaded = load_functions(config.functions, self.verifier_for)
            except ValueError as exc:  # the user's function: bad input (exit 2), naming its key
                raise ConfigError(str(exc)) from None
            self.functions = RewardFunctions(loaded, config.verifier_timeout_s)
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str, int]] = {}
        self._abandoned = 0
        self._warned_tasks: set[str] = set()

    @property
    def tasks(self) -> list[str]:
        return sorted(set(self._verifiers) | set(self.reward_models))

    def attach_compute(self, hook: Callable[[int, int], None]) -> None:
        """Charge every reward model's tokens to the run's FLOPs: `hook(tokens, n_params)` (the
        compute meter's `add_reward_model`)."""
        for rm in self.reward_models.values():
            rm.compute_hook = hook

    def batches(self, task: str) -> bool:
        """Whether `task` is scored a group at a time (`score_group`): a reward model's task, or one
        that reward functions score (a TRL function takes the whole group)."""
        return task in self.reward_models or self._by_functions(task)

    def _by_functions(self, task: str) -> bool:
        return self.functions is not None and self.functions.scores_task(task)

    def verifier_for(self, task: str) -> Verifier | None:
        """The verifier of `task`: its own (configured, registered, built-in), else a family's:
        `rg_<name>` is reasoning-gym's generator `name` (`scalerl.rewards.rgym`)."""
        fn = self._verifiers.get(task)
        if fn is None and task.startswith("rg_") and len(task) > 3:
            from scalerl.rewards.rgym import verify_reasoning_gym

            fn = verify_reasoning_gym
        return fn

    def knows(self, task: str) -> bool:
        return (task in self.reward_models or self.verifier_for(task) is not None
                or self._by_functions(task))

    def register(self, task: str, fn: Verifier) -> None:
        """Use `fn` for `task` in this router only (overrides built-ins and the global registry)."""
        self._verifiers[task] = check_verifier(fn, task)

    def check_tasks(self, tasks: Iterable[str]) -> None:
        """Fail fast before training: a `ConfigError` if any task has no verifier; with "code" among
        them (and the built-in code verifier), detect (and log) the sandbox's protections now: a
        `ConfigError` naming `rewards.sandbox.isolation` if the configured isolation cannot be had
        (the sandbox fails closed, `Sandbox.require_isolation`)."""
        wanted = set(tasks)
        missing = sorted(t for t in wanted if not self.knows(t))
        if missing:
            raise ConfigError(f"no verifier for task(s) {missing} (known: {self.tasks}); set "
                              f"rewards.verifiers.{missing[0]}=package.module:function")
        builtin_code = self._verifiers["code"] == self._verify_code and "code" not in self.reward_models
        if "code" in wanted and builtin_code:
            self.sandbox.require_isolation("the code task")
        for task in sorted(wanted & set(self.reward_models)):
            self.reward_models[task].load()

    # -- built-in verifiers ----------------------------------------------------------------
    def _verify_math(self, completion: str, record: PromptRecord) -> VerifierResult:
        if record.answer is None:
            return VerifierResult(0.0, "error", f"prompt {record.id!r} ({record.source}) has no answer")
        result = self.math.check(completion, record.answer)
        return VerifierResult(1.0 if result.correct else 0.0, result.status, result.detail)

    def _verify_code(self, completion: str, record: PromptRecord) -> VerifierResult:
        try:
            result = self.code.check(completion, record.tests)  # type: ignore[arg-type]
        except ValueError as exc:
            return VerifierResult(0.0, "error", f"prompt {record.id!r} ({record.source}): {exc}")
        return VerifierResult(result.fraction, result.status, result.detail)

    # -- scoring ---------------------------------------------------------------------------
    def score(self, record: PromptRecord, completion_text: str) -> RewardOutcome:
        """The reward for one completion; never raises for anything a verifier does."""
        if record.task in self.reward_models or self._by_functions(record.task):
            return self.score_group(record, [completion_text])[0]
        fn = self.verifier_for(record.task)
        if fn is None:
            with self._lock:
                first = record.task not in self._warned_tasks
                self._warned_tasks.add(record.task)
            if first:
                logger.warning("no verifier for task %r (prompt %r, %s); known: %s",
                               record.task, record.id, record.source, self.tasks)
            result = VerifierResult(0.0, "error", f"no verifier for task {record.task!r}")
        else:
            result = self._call(fn, completion_text, record)
        outcome = self._to_outcome(result, record.task)
        with self._lock:
            counts = self._counts.setdefault(record.task, dict.fromkeys((*STATUSES, "correct", "total"), 0))
            counts[outcome.status] += 1
            counts["correct"] += outcome.correct
            counts["total"] += 1
        return outcome

    def _call(self, fn: Verifier, completion: str, record: PromptRecord) -> VerifierResult:
        """Run `fn` in its own daemon thread so a hang costs a thread, not the trainer."""
        box: list[Any] = []

        def target() -> None:
            try:
                box.append(fn(completion, record))
            except BaseException as exc:
                box.append(exc)

        thread = threading.Thread(target=target, name=f"verifier-{record.task}", daemon=True)
        thread.start()
        thread.join(self.config.verifier_timeout_s)
        if thread.is_alive():
            with self._lock:
                self._abandoned += 1
            return VerifierResult(0.0, "timeout", f"verifier exceeded {self.config.verifier_timeout_s}s")
        value = box[0]
        if isinstance(value, BaseException):
            return VerifierResult(0.0, "error", f"verifier raised {type(value).__name__}: {value}"[:500])
        return _coerce(value)

    def score_group(self, record: PromptRecord, completion_texts: Sequence[str],
                    tally: bool = True) -> list[RewardOutcome]:
        """The rewards of one group of completions to `record`, in order: by its task's reward
        model, in batches, or by its reward functions (`tally=False`: not in their per-step means,
        for held-out evaluation); a task with neither is scored sample by sample (`score`)."""
        rm = self.reward_models.get(record.task)
        if rm is None and self._by_functions(record.task):
            outcomes = self._function_outcomes(record, completion_texts, tally)
        elif rm is None:
            return [self.score(record, text) for text in completion_texts]
        else:
            outcomes = self._model_group(rm, record, completion_texts)
        with self._lock:
            counts = self._counts.setdefault(record.task, dict.fromkeys((*STATUSES, "correct", "total"), 0))
            for outcome in outcomes:
                counts[outcome.status] += 1
                counts["correct"] += outcome.correct
                counts["total"] += 1
        return outcomes

    def _function_outcomes(self, record: PromptRecord, texts: Sequence[str],
                           tally: bool = True) -> list[RewardOutcome]:
        """The reward functions' weighted sums; correct above the midpoint of incorrect and correct
        reward; a failed sample is status "error" at `failure_reward` (counted as a verifier failure)."""
        assert self.functions is not None
        cfg = self.config
        threshold = 0.5 * (cfg.correct_reward + cfg.incorrect_reward)
        return [RewardOutcome(cfg.failure_reward, False, "error", s.detail, record.task, s.parts) if s.failed
                else RewardOutcome(s.reward, s.reward > threshold, "ok", "", record.task, s.parts)
                for s in self.functions.score_group(record, texts, tally)]

    def _model_group(self, rm: RewardModel, record: PromptRecord,
                     completion_texts: Sequence[str]) -> list[RewardOutcome]:
        try:
            scores = rm.score_group(record, completion_texts)
        except Exception as exc:  # a model crash is a counted failure of every sample, not the run's
            detail = f"{rm.key} raised {type(exc).__name__}: {exc}"[:500]
            scores = [ModelScore(0.0, math.nan, "error", detail)] * len(completion_texts)
        return self._model_outcomes(rm, scores)

    def _model_outcomes(self, rm: RewardModel, scores: Sequence[ModelScore]) -> list[RewardOutcome]:
        cfg, rcfg = self.config, rm.config
        ok = [i for i, s in enumerate(scores) if s.status == "ok"]
        rewards: dict[int, float] = {}
        if rcfg.normalize == "group":
            # The failed samples are left out of the group's statistics (they score failure_reward).
            rewards = dict(zip(ok, group_zscores([scores[i].raw for i in ok]), strict=True))
        else:
            span = cfg.correct_reward - cfg.incorrect_reward
            rewards = {i: cfg.incorrect_reward + scores[i].score * span for i in ok}
        out = []
        for i, s in enumerate(scores):
            if s.status != "ok":
                out.append(RewardOutcome(cfg.failure_reward, False, "error", s.detail, rm.task))
            else:
                passed = s.score >= rcfg.correct_threshold
                out.append(RewardOutcome(rewards[i], passed, "ok", s.detail, rm.task))
        return out

    def reward_model_figures(self) -> dict[str, float]:
        """Cumulative figures of each reward model for the step rows: samples scored, tokens through
        it, inputs truncated to `max_length`, malformed judge verdicts (`reward_model_*/<task>`)."""
        out: dict[str, float] = {}
        for task, rm in self.reward_models.items():
            for key, value in rm.stats().items():
                if key != "calls":
                    out[f"reward_model_{key}_total/{task}"] = float(value)
        return out

    def untallied(self) -> UntalliedScoring:
        """This router for held-out evaluation: the same rewards, kept out of the reward
        functions' per-step means (`reward_fn/<name>` is what training saw)."""
        return UntalliedScoring(self)

    def reward_function_figures(self) -> dict[str, float]:
        """Each reward function's mean score since the previous step row and its running failure
        and None counts (`RewardFunctions.figures`: `reward_fn/<name>`, ...); {} without any."""
        return self.functions.figures() if self.functions is not None else {}

    def outcome(self, value: Any, task: str) -> RewardOutcome:
        """The reward for a verdict computed elsewhere (an environment's own score): a number in
        [0, 1], a bool or a `VerifierResult`, mapped like a verifier's; counted under `task`."""
        outcome = self._to_outcome(_coerce(value), task)
        with self._lock:
            counts = self._counts.setdefault(task, dict.fromkeys((*STATUSES, "correct", "total"), 0))
            counts[outcome.status] += 1
            counts["correct"] += outcome.correct
            counts["total"] += 1
        return outcome

    def _to_outcome(self, result: VerifierResult, task: str) -> RewardOutcome:
        cfg = self.config
        if result.status in ("error", "timeout"):
            return RewardOutcome(cfg.failure_reward, False, result.status, result.detail, task)
        if result.status == "no_answer":
            return RewardOutcome(cfg.incorrect_reward, False, "no_answer", result.detail, task)
        correct = result.score >= 1.0
        if correct:
            reward = cfg.correct_reward
        elif cfg.partial_credit:
            reward = cfg.incorrect_reward + result.score * (cfg.correct_reward - cfg.incorrect_reward)
        else:
            reward = cfg.incorrect_reward
        return RewardOutcome(reward, correct, "ok", result.detail, task)

    def score_batch(self, pairs: Iterable[tuple[PromptRecord, str]],
                    max_workers: int | None = None) -> list[RewardOutcome]:
        """Score (record, completion) pairs concurrently, results in input order.

        At most `max_workers` (default `config.max_workers`) verifiers run at once; code runs are
        further bounded by the sandbox's `max_parallel`, math-verify calls by `math_workers`.
        """
        items = list(pairs)
        workers = max_workers or self.config.max_workers
        if workers < 1:
            raise ValueError(f"max_workers: must be >= 1, got {workers}")
        if len(items) <= 1 or workers == 1:
            return [self.score(r, c) for r, c in items]
        with ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="reward") as pool:
            return list(pool.map(lambda pair: self.score(*pair), items))

    def stats(self) -> dict[str, dict[str, int]]:
        """Counts per task (each status, "correct", "total") and for the machinery: "_abandoned"
        (verifier threads left running after a timeout), "_sandbox" (`Sandbox.stats()`: program
        runs, runs where the sandbox itself failed, runs stopped at the tree's memory or task bound,
        cgroup use), "_math" (math-verify workers killed after a timeout or crash)."""
        with self._lock:
            out = {task: dict(counts) for task, counts in self._counts.items()}
            out["_abandoned"] = {"threads": self._abandoned}
        out["_sandbox"] = self.sandbox.stats()
        out["_math"] = {"restarts": self.math.restarts}
        out["_reward_models"] = {task: rm.stats() for task, rm in self.reward_models.items()}
        return out

    def reset_stats(self) -> None:
        with self._lock:
            self._counts.clear()

    def close(self) -> None:
        """Stop the math worker processes and the judges' engines."""
        self.math.close()
        for rm in self.reward_models.values():
            rm.close()


class UntalliedScoring:
    """A `RewardRouter` whose groups scored by reward functions stay out of their per-step means
    (`RewardRouter.untallied`); everything else is the router's."""

    def __init__(self, router: RewardRouter) -> None:
        self.router = router

    def batches(self, task: str) -> bool:
        return self.router.batches(task)

    def score(self, record: PromptRecord, completion_text: str) -> RewardOutcome:
        if self.router._by_functions(record.task):
            return self.router.score_group(record, [completion_text], tally=False)[0]
        return self.router.score(record, completion_text)

    def score_group(self, record: PromptRecord, completion_texts: Sequence[str]) -> list[RewardOutcome]:
        return self.router.score_group(record, completion_texts, tally=False)


def _coerce(value: Any) -> VerifierResult:
    """A custom verifier's return value as a VerifierResult; anything odd is an error."""
    if isinstance(value, VerifierResult):
        if value.status not in STATUSES:
            return VerifierResult(0.0, "error", f"verifier returned unknown status {value.status!r}")
        score = value.score
    elif isinstance(value, bool):
        return VerifierResult(1.0 if value else 0.0)
    elif isinstance(value, (int, float)):
        score = float(value)
    else:
        return VerifierResult(0.0, "error", f"verifier returned {type(value).__name__}, expected float/bool")
    if not (math.isfinite(score) and 0.0 <= score <= 1.0):
        return VerifierResult(0.0, "error", f"verifier score {score!r} is outside [0, 1]")
    if isinstance(value, VerifierResult):
        return value
    return VerifierResult(score)
