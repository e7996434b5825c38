"""`verifiers` environments (prime-rl's Environments Hub, `verifiers` 0.4) through the endpoint.

`agentic.environment: "verifiers:<taskset id>"` loads the taskset the way verifiers' own entrypoints
do (`verifiers.v1.utils.loaders.load_environment` on an `EnvConfig` naming it: the taskset's own
`Env` subclass if its package exports one, else `SingleAgentEnv`), with `agentic.environment_args`
as the taskset config's fields. Two keys there are ours: `harness` (the verifiers harness that plays
each agent role; default `"null"`, verifiers' plain chat program) and `env` (fields merged into the
`EnvConfig`, e.g. `{"timeout": {"episode": 60}}`). Every agent role runs in verifiers'
`subprocess` runtime: on this machine, no container and no tunnel.

Each scalerl episode is one `Env.run_episode(task, ModelContext)` whose model client is the
endpoint (`EvalClientConfig(base_url=...)`, the episode's session named in the
`X-Scalerl-Session` header), so every model call of the harness program is recorded and the
trajectory is built from the recorded ids (`scalerl.serving.agent`). The reward is the episode's
trace reward as verifiers computes it (`Trace.reward`: the weighted sum of the task's `@vf.reward`
functions, judges included); it must lie in [0, 1]. An episode verifiers reports an error for (a
harness failure, a timeout) ends as `env_error`, the error kind counted.

Prompts: with no `data.train_path`, the taskset supplies them (`taskset_records`: one record per
task, up to `max_tasks` of `environment_args`, default 10,000, its `idx` in `metadata["vf_idx"]`).
A record from elsewhere is made into the taskset's task type from its prompt and metadata.

What it needs: `pip install 'scalerl[envs]'` (verifiers, and uv: verifiers runs each harness
program as a uv script, whose few dependencies uv installs from PyPI once and caches).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scalerl.config import ConfigError
from scalerl.data.records import PromptRecord
from scalerl.serving.http import SESSION_HEADER

INSTALL_HINT = "pip install 'scalerl[envs]'"
KEY_VAR = "SCALERL_ENDPOINT_KEY"
_OURS = ("harness", "env", "max_tasks")


class VerifiersEpisodeError(RuntimeError):
    """verifiers reported an error for the episode (its type and message)."""


def _import_vf() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError as err:
        raise ConfigError(f"agentic.environment: 'verifiers:...' needs verifiers>=0.4: "
                          f"{INSTALL_HINT}") from err
    return vf


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


@dataclass
class VerifiersSpec:
    taskset_id: str
    env: Any
    tasks: list[Any]
    args: dict[str, Any] = field(default_factory=dict)


def load_verifiers_env(taskset_id: str, args: Mapping[str, Any]) -> VerifiersSpec:
    """The environment of `taskset_id` and its tasks; a `ConfigError` naming the key otherwise."""
    vf = _import_vf()
    from verifiers.v1.configs.agent import agent_config_fields
    from verifiers.v1.utils.generic import concrete_type
    from verifiers.v1.utils.loaders import environment_class, load_environment

    if not taskset_id:
        raise ConfigError("agentic.environment: 'verifiers:' needs a taskset id (verifiers:<module>)")
    args = dict(args)
    harness = str(args.get("harness", "null"))
    max_tasks = int(args.get("max_tasks", 10_000))
    taskset_args = {k: v for k, v in args.items() if k not in _OURS}
    try:
        env_cls = environment_class(taskset_id)
        config_cls = concrete_type(env_cls, vf.EnvConfig, origin=vf.Env) or vf.EnvConfig
        data: dict[str, Any] = {"taskset": {"id": taskset_id, **taskset_args}}
        probe = config_cls.model_validate(data)
        for name in agent_config_fields(probe):
            data[name] = {"harness": {"id": harness}, "runtime": {"type": "subprocess"}}
        data = _merge(data, args.get("env") or {})
        env = load_environment(config_cls.model_validate(data))
        tasks = list(itertools.islice(iter(env.taskset), max_tasks))
    except ConfigError:
        raise
    except Exception as err:  # the user's module, id or arguments: bad input, named
        raise ConfigError(f"agentic.environment: verifiers:{taskset_id} with agentic.environment_args "
                          f"{taskset_args}: {type(err).__name__}: {err}") from None
    if not tasks:
        raise ConfigError(f"agentic.environment: verifiers:{taskset_id} has no tasks")
    return VerifiersSpec(taskset_id, env, tasks, args)


def taskset_records(spec: VerifiersSpec, default_task: str) -> list[PromptRecord]:
    """One prompt record per task (its idx in `metadata["vf_idx"]`); `task` is `default_task`, whose
    verifier judges nothing here (the environment's reward is the verdict) but names the task."""
    out = []
    for i, t in enumerate(spec.tasks):
        d = t.data
        prompt = d.prompt
        text = d.prompt_text if prompt is not None else (d.name or f"task {i}")
        answer = getattr(d, "answer", None)
        out.append(PromptRecord(id=f"vf-{spec.taskset_id}-{i}", task=default_task, prompt=text or f"task {i}",
                                answer=None if answer is None else str(answer),
                                metadata={"vf_idx": i}, source=f"verifiers:{spec.taskset_id}#{i}"))
    return out


class VerifiersEpisodes:
    """`run(client, record)`: one verifiers episode against the endpoint `client` points at."""

    def __init__(self, spec: VerifiersSpec) -> None:
        self.spec = spec
        self._stack: contextlib.AsyncExitStack | None = None
        self.recent: dict[str, Any] = {}  # session key -> verifiers Episode, the last 64 (inspection)
        os.environ.setdefault(KEY_VAR, "scalerl")  # verifiers reads the API key from a variable

    def task_for(self, record: PromptRecord) -> Any:
        idx = record.metadata.get("vf_idx")
        if isinstance(idx, int) and 0 <= idx < len(self.spec.tasks):
            return self.spec.tasks[idx]
        task_cls = type(self.spec.tasks[0])
        data_cls = task_cls.data_type()
        fields = {k: v for k, v in record.metadata.items() if k in data_cls.model_fields}
        if record.answer is not None and "answer" in data_cls.model_fields:
            fields.setdefault("answer", record.answer)
        data = data_cls(prompt=record.chat() if record.messages is not None else record.prompt, **fields)
        return task_cls(data, self.spec.tasks[0].config)

    async def _started(self) -> None:
        if self._stack is None:
            stack = contextlib.AsyncExitStack()
            await stack.enter_async_context(self.spec.env.serving())  # verifiers' interception server
            self._stack = stack

    async def run(self, client: Any, record: PromptRecord) -> float:
        vf = _import_vf()
        await self._started()
        ctx = vf.ModelContext(model="policy", client=vf.EvalClientConfig(
            base_url=str(client.base_url).rstrip("/"), api_key_var=KEY_VAR,
            headers={SESSION_HEADER: str(client.api_key)}))
        episode = await self.spec.env.run_episode(self.task_for(record), ctx)
        self.recent[str(client.api_key)] = episode
        while len(self.recent) > 64:
            self.recent.pop(next(iter(self.recent)))
        errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
        if errors:
            raise VerifiersEpisodeError(f"{errors[-1].type}: {errors[-1].message}"[:500])
        return float(sum(t.reward for t in episode.traces))

    async def aclose(self) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            await stack.aclose()
