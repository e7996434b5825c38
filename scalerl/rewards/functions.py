"""Reward functions in the signatures the field writes, combined by weight (`rewards.functions`).

Each entry names a function (`fn`), its `weight`, its `name` (metrics `reward_fn/<name>`) and the
tasks it scores (`tasks`; None: every task). Three call styles, chosen by `style` or, with
`style: auto`, by the function's parameter names (`detect_style`, in this order):

* **verl**: parameters `data_source` and `solution_str` -> `compute_score(data_source,
  solution_str, ground_truth, extra_info)` per sample (verl `verl/utils/reward_score/__init__.py::
  default_compute_score`); it returns a float, or a dict whose `score` is the reward. Here
  `data_source` is the record's `data_source` column (else its task), `ground_truth` its answer,
  `extra_info` its `extra_info` column (else its other columns).
* **trl**: a parameter `completions` -> `f(prompts=..., completions=..., **columns)` once per group
  (TRL `GRPOTrainer` reward functions), returning one score per completion; None means "no score
  for this sample" (TRL: NaN, left out of the weighted sum). `prompts` is the record's text, or its
  chat turns (then each completion is `[{"role": "assistant", "content": text}]`, as TRL passes a
  conversational dataset's); `columns` are the record's columns (`answer`, `tests`, `task`, `id`, and
  every other column of the row) as lists, one entry per completion.
* **verifier**: `f(completion, record)` per sample, a score in [0, 1] (scalerl's own verifiers;
  `fn` may name one: "math", "code", a registered one).

`fn: language_consistency` (or `language_consistency:<script>`) is the built-in
language-consistency reward, TRL style (scalerl/rewards/language.py).

`async def` functions of any style are run to completion (`asyncio.run`) in the scoring thread.

A sample's reward is the weighted sum of the scores it got, `sum_i w_i * s_i` over the functions
that scored it (TRL `GRPOTrainer._calculate_rewards`: `nansum(rewards * reward_weights)`); it is
correct when that reward exceeds the run's success threshold (midway between `incorrect_reward`
and `correct_reward`). A function that raises, times out, returns the wrong number of scores or a
value that is not a number is counted (`reward_fn_errors_total/<name>`) and named on stderr
(the first time), and the samples it failed are verifier failures (`failure_reward`, counted as
such), never a silent 0. A sample no function scored (all None) is a failure too. Each function's
mean score per step row is `reward_fn/<name>` (and `reward_fn/<name>/<task>`), over the samples
scored for training since the previous row (held-out evaluations are not in them); None scores
are counted (`reward_fn_none_total/<name>`), not
averaged in.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import logging
import math
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from scalerl.config import RewardFunctionConfig
from scalerl.data.records import PromptRecord
from scalerl.rewards.language import language_consistency_fn
from scalerl.rewards.registry import VerifierResult, import_object

log = logging.getLogger(__name__)
Style = Literal["trl", "verl", "verifier"]

# Callables handed over in Python (`scalerl.train(reward_funcs=[...])`), by the name `fn` gives.
_CALLABLES: dict[str, Callable[..., Any]] = {}
_CALLABLES_LOCK = threading.Lock()


def register_reward_function(name: str, fn: Callable[..., Any]) -> None:
    """Make `fn` what `rewards.functions[].fn: <name>` calls in this process."""
    if not callable(fn):
        raise ValueError(f"reward function {name!r}: {fn!r} is not callable")
    with _CALLABLES_LOCK:
        _CALLABLES[name] = fn


def unregister_reward_function(name: str) -> None:
    with _CALLABLES_LOCK:
        _CALLABLES.pop(name, None)


def _import_file(path: Path, attr: str, spec: str) -> Any:
    if not path.is_file():
        raise ValueError(f"{spec!r}: no such file {path}")
    module_name = f"scalerl_reward_{abs(hash(str(path.resolve())))}"
    module = sys.modules.get(module_name)
    if module is None:
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ValueError(f"{spec!r}: cannot load {path} as a Python file")
        module = importlib.util.module_from_spec(loader_spec)
        try:
            loader_spec.loader.exec_module(module)
        except Exception as exc:  # the user's file: its error is bad input, named with the file
            raise ValueError(f"{spec!r}: importing {path} raised {type(exc).__name__}: {exc}") from None
        sys.modules[module_name] = module
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{spec!r}: {path} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def resolve_fn(spec: str, builtin: Callable[[str], Any]) -> tuple[Callable[..., Any], str, bool]:
    """(the callable, its default name, whether it is a verifier of the router) for a `fn` value: a
    callable registered in Python, `language_consistency[:script]`, a verifier name
    (`builtin(name)`), "path/file.py:name", or "package.module:name". ValueError naming `spec`
    when none fits."""
    with _CALLABLES_LOCK:
        registered = _CALLABLES.get(spec)
    if registered is not None:
        return registered, spec, False
    name, _, script = spec.partition(":")
    if name == "language_consistency":  # built in (scalerl/rewards/language.py)
        return language_consistency_fn(script or None), name, False
    verifier = builtin(spec)
    if verifier is not None:
        return verifier, spec, True
    head, sep, attr = spec.rpartition(":")
    if sep and head.endswith(".py"):
        return _import_file(Path(head).expanduser(), attr, spec), attr.rsplit(".", 1)[-1], False
    if ":" not in spec and "." not in spec:
        raise ValueError(f"{spec!r}: not a verifier name or a registered function; give "
                         "'package.module:name' or 'path/file.py:name'")
    obj = import_object(spec, "reward function")
    if not callable(obj):
        raise ValueError(f"{spec!r}: {obj!r} is not callable")
    return obj, spec.replace(":", ".").rsplit(".", 1)[-1], False


def detect_style(fn: Callable[..., Any], declared: str) -> Style:
    """`declared` unless "auto"; then: parameters `data_source` and `solution_str` -> verl, a
    parameter `completions` -> trl, two positional parameters -> verifier; ValueError otherwise
    (set `style`). The parameter names are TRL's and verl's documented ones."""
    if declared != "auto":
        return declared  # type: ignore[return-value]
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        raise ValueError("its signature cannot be read; set style: trl, verl or verifier") from None
    if "data_source" in params and "solution_str" in params:
        return "verl"
    if "completions" in params:
        return "trl"
    positional = [p for p in params.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    if len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in positional):
        return "verifier"
    names = list(params)
    raise ValueError(f"cannot tell its call style from its parameters {names}; set style: trl "
                     "(prompts, completions, **columns), verl (data_source, solution_str, ground_truth, "
                     "extra_info) or verifier (completion, record)")


@dataclass(frozen=True)
class RewardFunction:
    """A loaded `rewards.functions` entry."""

    name: str
    fn: Callable[..., Any]
    style: Style
    weight: float
    tasks: frozenset[str] | None
    key: str  # "rewards.functions[i]", for messages

    def scores(self, task: str) -> bool:
        return self.tasks is None or task in self.tasks


def load_functions(configs: Sequence[RewardFunctionConfig], builtin: Callable[[str], Any]
                   ) -> list[RewardFunction]:
    """Every entry loaded and its style known; a ValueError naming `rewards.functions.<i>.fn` (or
    `.style`, `.name`) when one cannot be."""
    out: list[RewardFunction] = []
    for i, cfg in enumerate(configs):
        key = f"rewards.functions.{i}"
        try:
            fn, default_name, is_verifier = resolve_fn(cfg.fn, builtin)
        except ValueError as exc:
            raise ValueError(f"{key}.fn: {exc}") from None
        try:
            style = "verifier" if is_verifier and cfg.style == "auto" else detect_style(fn, cfg.style)
        except ValueError as exc:
            raise ValueError(f"{key}.fn={cfg.fn!r}: {exc}") from None
        name = cfg.name or default_name
        if any(f.name == name for f in out):
            raise ValueError(f"{key}.name: {name!r} is another function's name too; set name")
        tasks = None if cfg.tasks is None else frozenset(cfg.tasks)
        out.append(RewardFunction(name, fn, style, cfg.weight, tasks, key))
    return out


def trl_only_tasks(functions: Sequence[RewardFunction]) -> tuple[frozenset[str], bool, frozenset[str]]:
    """Which tasks only TRL-style functions score, so their rows need no gold `answer` or `tests`
    (a TRL function reads the columns it wants; a verl or verifier one reads the gold): (the tasks
    named so, whether every task is so, the named tasks that are not when every task is)."""
    named = {t for f in functions if f.tasks is not None for t in f.tasks}
    not_trl = {t for f in functions if f.tasks is not None and f.style != "trl" for t in f.tasks}
    everywhere = [f for f in functions if f.tasks is None]
    every = bool(everywhere) and all(f.style == "trl" for f in everywhere)
    if everywhere and not every:
        return frozenset(), False, frozenset()  # a verl/verifier function scores every task
    return frozenset(named - not_trl), every, frozenset(not_trl)


def _run(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], timeout_s: float) -> Any:
    """`fn(*args, **kwargs)` (an awaitable result is awaited) in a daemon thread bounded by
    `timeout_s`: a hung function costs a thread, not the run. Raises what it raised, or TimeoutError."""
    box: list[Any] = []

    def target() -> None:
        try:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = asyncio.run(_awaited(value))
            box.append(("ok", value))
        except BaseException as exc:
            box.append(("raised", exc))

    thread = threading.Thread(target=target, name="reward-fn", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"no result after {timeout_s:g}s")
    kind, value = box[0]
    if kind == "raised":
        raise value
    return value


async def _awaited(value: Any) -> Any:
    return await value


def _number(value: Any) -> float | None:
    """A score as a float; None stays None (no score); anything else is a TypeError."""
    if value is None:
        return None
    if isinstance(value, Mapping):  # verl: {"score": ..., other figures}
        if "score" not in value:
            raise TypeError(f"returned a dict without 'score' (keys {sorted(value)})")
        value = value["score"]
    if isinstance(value, VerifierResult):
        if value.status in ("error", "timeout"):
            raise RuntimeError(f"verifier status {value.status}: {value.detail}")
        return 0.0 if value.status == "no_answer" else float(value.score)
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) or hasattr(value, "__float__"):
        score = float(value)
        if not math.isfinite(score):
            raise ValueError(f"returned a non-finite score {score!r}")
        return score
    raise TypeError(f"returned {type(value).__name__}, expected a number or None")


def _columns(record: PromptRecord) -> dict[str, Any]:
    """The record as its dataset row: metadata columns, then its own fields (not None)."""
    row: dict[str, Any] = dict(record.metadata)
    for name in ("id", "task", "answer", "tests"):
        value = getattr(record, name)
        if value is not None:
            row[name] = value
    return row


@dataclass(frozen=True)
class SampleScore:
    """One sample's combined verdict: `reward`, and `failed` with why (`detail`)."""

    reward: float
    failed: bool
    detail: str = ""
    parts: dict[str, float] = field(default_factory=dict)  # function name -> its unweighted score


class RewardFunctions:
    """The loaded functions of a run, their combination by weight and their per-step figures."""

    def __init__(self, functions: Sequence[RewardFunction], timeout_s: float) -> None:
        self.functions = list(functions)
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self.errors: dict[str, int] = {f.name: 0 for f in self.functions}
        self.nones: dict[str, int] = {f.name: 0 for f in self.functions}
        self._warned: set[str] = set()

    def scores_task(self, task: str) -> bool:
        return any(f.scores(task) for f in self.functions)

    def _call(self, f: RewardFunction, record: PromptRecord, texts: Sequence[str]
              ) -> list[float | Exception | None]:
        """One function's scores of a group, an exception in place of a sample it failed; a TRL
        function that fails (raises, or not one number or None per completion) raises for all."""
        if f.style == "trl":
            n = len(texts)
            chat = record.messages is not None
            prompt: Any = record.messages if chat else record.prompt
            completions: list[Any] = ([[{"role": "assistant", "content": t}] for t in texts] if chat
                                      else list(texts))
            columns = {k: [v] * n for k, v in _columns(record).items()
                       if k not in ("prompts", "completions")}
            got = _run(f.fn, (), {"prompts": [prompt] * n, "completions": completions, **columns},
                       self.timeout_s)
            if callable(getattr(got, "tolist", None)):  # a numpy array or a tensor of scores
                got = got.tolist()
            if isinstance(got, (str, bytes, Mapping)) or not isinstance(got, Sequence):
                raise TypeError(f"returned {type(got).__name__}, expected a list of {n} scores")
            if len(got) != n:
                raise ValueError(f"returned {len(got)} scores for {n} completions")
            return [_number(v) for v in got]  # one bad value fails the whole call: it is one call
        out: list[float | Exception | None] = []
        for text in texts:  # one call per sample: a failure is that sample's only
            if f.style == "verl":
                extra = record.metadata.get("extra_info")
                args: tuple[Any, ...] = (record.metadata.get("data_source", record.task), text,
                                         record.answer, extra if extra is not None else dict(record.metadata))
            else:
                args = (text, record)
            try:
                out.append(_number(_run(f.fn, args, {}, self.timeout_s)))
            except Exception as exc:
                out.append(exc)
        return out

    def _note_error(self, f: RewardFunction, record: PromptRecord, exc: BaseException) -> str:
        detail = f"reward function {f.name!r} ({f.key}) {type(exc).__name__}: {exc}"[:500]
        with self._lock:
            self.errors[f.name] += 1
            first = f.name not in self._warned
            self._warned.add(f.name)
        if first:  # on stderr once per function (logging's last-resort handler), counted always
            log.warning("%s (prompt %r); its samples are scored as failures", detail, record.id)
        return detail

    def score_group(self, record: PromptRecord, texts: Sequence[str],
                    tally: bool = True) -> list[SampleScore]:
        """The combined reward of each completion of `record` (module doc). `tally=False` (held-out
        evaluation) leaves the per-step means alone; failures and None scores are counted always."""
        n = len(texts)
        totals = [0.0] * n
        scored = [0] * n
        failed: list[str] = [""] * n
        parts: list[dict[str, float]] = [{} for _ in range(n)]
        for f in self.functions:
            if not f.scores(record.task):
                continue
            try:
                values = self._call(f, record, texts)
            except Exception as exc:
                values = [exc] * n
            got = [v for v in values if isinstance(v, float)]
            with self._lock:
                self.nones[f.name] += sum(v is None for v in values)
                for key in (f.name, f"{f.name}/{record.task}") if tally else ():
                    self._sums[key] = self._sums.get(key, 0.0) + sum(got)
                    self._counts[key] = self._counts.get(key, 0) + len(got)
            for i, v in enumerate(values):
                if isinstance(v, Exception):
                    failed[i] = failed[i] or self._note_error(f, record, v)
                elif v is not None:
                    totals[i] += f.weight * v
                    scored[i] += 1
                    parts[i][f.name] = v
        out = []
        for i in range(n):
            if failed[i]:
                out.append(SampleScore(0.0, True, failed[i], parts[i]))
            elif not scored[i]:
                out.append(SampleScore(0.0, True, "no reward function scored this sample (all None)"))
            else:
                out.append(SampleScore(totals[i], False, "", parts[i]))
        return out

    def figures(self) -> dict[str, float]:
        """For the next step row: each function's mean score since the previous row
        (`reward_fn/<name>`, `reward_fn/<name>/<task>`), and the running counts of its failures
        and None scores. Reading resets the means."""
        with self._lock:
            out = {f"reward_fn/{k}": self._sums[k] / c for k, c in self._counts.items() if c}
            self._sums.clear()
            self._counts.clear()
            for name in self.errors:
                out[f"reward_fn_errors_total/{name}"] = float(self.errors[name])
                out[f"reward_fn_none_total/{name}"] = float(self.nones[name])
        return out


__all__ = ["RewardFunction", "RewardFunctions", "SampleScore", "detect_style", "load_functions",
           "register_reward_function", "resolve_fn", "trl_only_tasks", "unregister_reward_function"]
