"""User reward functions: registered by name, or loaded from a dotted path given in config.

A verifier is any callable `fn(completion: str, record: PromptRecord) -> float | bool | VerifierResult`:
a float is a score in [0, 1] (1 = fully correct), a bool means correct or not, and a
`VerifierResult` can also say why it could not judge (status "error", "timeout", "no_answer").
The router maps scores to rewards and contains any exception the function raises.

    @register_verifier("json_format")
    def json_format(completion, record):
        ...

or in config: `verifiers: {json_format: "my_pkg.rewards:json_format"}` (`my_pkg.rewards.json_format`
works too).

A verifier that reads no gold answer (a format check, a length rule) says so with `@gold_free` (it
sets `fn.needs_gold = False`): its task's rows then load without `answer` or `tests`, as the rows
of a task scored by a reward model do (`gold_free_tasks`).
"""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["ok", "error", "timeout", "no_answer"]
STATUSES: tuple[Status, ...] = ("ok", "error", "timeout", "no_answer")
BUILTIN_TASKS = ("math", "code")


@dataclass(frozen=True)
class VerifierResult:
    """A verifier's judgement: `score` in [0, 1]; `status` other than "ok" means not judged."""

    score: float
    status: Status = "ok"
    detail: str = ""


Verifier = Callable[[str, Any], "float | bool | VerifierResult"]


def check_verifier(fn: Any, name: str) -> Verifier:
    """`fn` if it can be called as `fn(completion, record)`; ValueError naming `name` otherwise."""
    if not callable(fn):
        raise ValueError(f"verifier {name!r}: {fn!r} is not callable")
    try:
        inspect.signature(fn).bind("completion", None)
    except TypeError as exc:
        raise ValueError(f"verifier {name!r}: must accept (completion, record): {exc}") from None
    except ValueError:
        pass  # builtins without a signature: trust them
    return fn


def load_callable(path: str) -> Verifier:
    """Import `package.module:function` (or `package.module.function`); ValueError naming `path`."""
    return check_verifier(import_object(path, "verifier"), path)


def import_object(path: str, what: str = "object") -> Any:
    """Import `package.module:attr` (or `package.module.attr`, dotted attributes allowed); a
    ValueError naming `what` and `path` when it cannot. Custom verifiers, environments and tools
    are all loaded this way."""
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"{what} path: expected 'package.module:function', got {path!r}")
    if ":" in path:
        module_name, _, attr_path = path.partition(":")
    else:
        module_name, _, attr_path = path.rpartition(".")
    if not module_name or not attr_path:
        raise ValueError(f"{what} path {path!r}: expected 'package.module:function'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{what} path {path!r}: cannot import module {module_name!r}: {exc}") from exc
    for attr in attr_path.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            raise ValueError(
                f"{what} path {path!r}: {module_name!r} has no attribute {attr_path!r}") from None
    return obj


def gold_free(fn: Verifier) -> Verifier:
    """Mark `fn` as a verifier that reads neither `record.answer` nor `record.tests`."""
    fn.needs_gold = False  # type: ignore[attr-defined]
    return fn


def needs_gold(fn: Any) -> bool:
    """Whether a verifier reads the gold answer or tests (True unless marked `@gold_free`)."""
    return bool(getattr(fn, "needs_gold", True))


class VerifierRegistry:
    """Name -> verifier. Thread-safe; "math" and "code" are built in and need `overwrite=True`."""

    def __init__(self) -> None:
        self._fns: dict[str, Verifier] = {}
        self._lock = threading.Lock()

    def register(self, name: str, fn: Verifier | None = None, *, overwrite: bool = False) -> Any:
        """Register `fn` under `name`; without `fn`, a decorator that does so."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"verifier name: expected a non-empty string, got {name!r}")

        def add(f: Verifier) -> Verifier:
            check_verifier(f, name)
            with self._lock:
                if not overwrite and (name in self._fns or name in BUILTIN_TASKS):
                    raise ValueError(f"verifier {name!r} is already registered (pass overwrite=True)")
                self._fns[name] = f
            return f

        return add if fn is None else add(fn)

    def unregister(self, name: str) -> None:
        with self._lock:
            self._fns.pop(name, None)

    def get(self, name: str) -> Verifier | None:
        with self._lock:
            return self._fns.get(name)

    def items(self) -> list[tuple[str, Verifier]]:
        with self._lock:
            return list(self._fns.items())


VERIFIERS = VerifierRegistry()


def register_verifier(name: str, fn: Verifier | None = None, *, overwrite: bool = False) -> Any:
    """Register in the process-wide registry that every `RewardRouter` reads (decorator form too)."""
    return VERIFIERS.register(name, fn, overwrite=overwrite)


class GoldFreeTasks(frozenset):  # type: ignore[type-arg]
    """A set of tasks that may also hold every task but `excluded` (`every`): reward functions
    that score every task (`rewards.functions` without `tasks`) make every task gold-free."""

    every: bool = False
    excluded: frozenset[str] = frozenset()

    def __contains__(self, task: object) -> bool:
        return frozenset.__contains__(self, task) or (self.every and task not in self.excluded)


def gold_free_tasks(config: Any) -> frozenset[str]:
    """Tasks whose rows need no gold `answer` or `tests` under a `rewards` section (`RewardConfig`):
    those with a reward model, those whose verifier (configured in `verifiers`, or registered)
    is marked `@gold_free`, and those that only TRL-style `rewards.functions` score
    (`functions.trl_only_tasks`). A configured path that does not import raises ValueError naming
    its key (`rewards.verifiers.<task>: ...`, `rewards.functions.<i>.fn: ...`)."""
    tasks = set(config.reward_models)
    every, excluded = False, frozenset[str]()
    if config.functions:
        from scalerl.rewards.functions import load_functions, trl_only_tasks

        def builtin(name: str) -> Any:
            return VERIFIERS.get(name) or (name if name in BUILTIN_TASKS else None)

        named, every, excluded = trl_only_tasks(load_functions(config.functions, builtin))
        tasks |= named
    for task, path in config.verifiers.items():
        try:
            fn = load_callable(path)
        except ValueError as exc:
            raise ValueError(f"rewards.verifiers.{task}: {exc}") from None
        if not needs_gold(fn):
            tasks.add(task)
    for task, fn in VERIFIERS.items():
        if task not in config.verifiers and not needs_gold(fn):
            tasks.add(task)
    out = GoldFreeTasks(tasks)
    out.every, out.excluded = every, excluded
    return out
