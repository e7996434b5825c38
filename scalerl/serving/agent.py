"""Agent programs as environments: an async `(client, record) -> reward` trained through the endpoint.

`agentic.environment: "agent:pkg.module:fn"` names an async function that takes an
`openai.AsyncOpenAI` client and the task's `PromptRecord`, talks to the model only through the
client (any number of chat or text calls, tools of its own, anything in between) and returns the
episode's reward: a number in [0, 1], a `VerifierResult`, or None to let the task's verifier judge
the text of the last response.

`AgentEngine` implements the `Engine` protocol like `scalerl.agentic.rollout.TrajectoryEngine`, so
every pipeline mode, the evaluator, checkpoints and in-flight weight updates work unchanged: each
sample of a submitted request is an episode, run on an event loop of its own with a client whose
API key is the episode's session on an `Endpoint` served on localhost (an ephemeral port). The
pipeline's `step()` is what steps the run's engine for the endpoint (`Endpoint.pump`), so a weight
update lands between two decode steps as for every rollout, and each token keeps the version that
sampled it. When the agent returns, its session's last call is the trajectory
(`scalerl.serving.trace`): model tokens with loss, behaviour log-probs and versions; what the
program inserted masked. Sampling follows the run's `generation` settings (the request's
temperature/top_p are ignored), `agentic.max_total_tokens` bounds the trajectory (a call past it is
refused with a 400; an episode that ends on that refusal ends as `token_budget`).

`metadata["agentic"]` holds what a `TrajectoryEngine` episode holds (turns = calls, tool calls
parsed from responses, untrained tokens of calls outside the final chain, windows), so
`agentic_*` metrics and `TrajectoryScorer` apply as they are. Ends: `answer` (the agent returned),
`env_error` (it raised, returned something that is not a reward, made no call, or ran past
`agentic.agent_timeout_s`; the kind is counted in `tool_errors` as `agent_<kind>`), `token_budget`.
An episode without a call has no model token: its completion is the EOS id, masked (nothing is
trained on it). Episodes run concurrently, so what the engine batches depends on timing: the
reproducible schedules are not reproducible with an agent environment.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

import torch

from scalerl.config import AgenticConfig, ConfigError
from scalerl.data.records import PromptRecord
from scalerl.rewards.registry import VerifierResult, import_object
from scalerl.rollout.base import Finished, SteppingEngine
from scalerl.rollout.protocol import Completion, Engine, GenerationRequest
from scalerl.serving.endpoint import Endpoint, SessionPolicy
from scalerl.serving.http import ServerHandle, start_server
from scalerl.serving.limits import ServeLimits
from scalerl.serving.trace import Session

AgentFn = Callable[[Any, PromptRecord], Awaitable[Any]]
_SEED_MIX = 0x9E3779B97F4A7C15


def load_agent(path: str) -> AgentFn:
    """The async function at `pkg.module:fn`; errors name `agentic.environment`."""
    try:
        fn = import_object(path, "agentic.environment")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    call = fn.__call__ if callable(fn) and not inspect.isfunction(fn) else None
    if not inspect.iscoroutinefunction(fn) and not inspect.iscoroutinefunction(call):
        raise ConfigError(f"agentic.environment: 'agent:{path}' is not an async function "
                          "(expected `async def fn(client, record) -> reward`)")
    return fn  # type: ignore[no-any-return]


def check_openai() -> None:
    try:
        import openai  # noqa: F401
    except ImportError as err:
        raise ConfigError("agentic.environment: 'agent:'/'verifiers:' environments need the openai "
                          "client and the endpoint: pip install 'scalerl[serve]'") from err


def reward_of(value: Any) -> float | VerifierResult | None:
    """The agent's return value as an environment verdict; ValueError for anything else."""
    if value is None or isinstance(value, VerifierResult):
        return value
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        v = float(value)
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"reward {v} is outside [0, 1]")
        return v
    raise ValueError(f"returned {type(value).__name__}, not a reward")


@dataclass
class _Episode:
    serial: int
    sample_index: int
    request: GenerationRequest
    record: PromptRecord
    key: str
    future: Future[Any]
    started: float


class _Loop:
    """An asyncio event loop in a daemon thread (the agents' coroutines run there)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="scalerl-agents", daemon=True)
        self.thread.start()

    def submit(self, coro: Awaitable[Any]) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class AgentEngine(SteppingEngine):
    """Episodes of `agent(client, record)` over the `inner` engine (module docstring).

    `run_episode(client, record, key)` may replace the plain `agent(client, record)` call (the
    verifiers adapter runs its environment's rollout and scoring there)."""

    def __init__(
        self, inner: Engine, tokenizer: Any, agent: AgentFn | None, settings: AgenticConfig | None = None,
        *, run_episode: Callable[[Any, PromptRecord], Awaitable[Any]] | None = None,
        aclose: Callable[[], Awaitable[None]] | None = None, model_name: str = "scalerl",
    ) -> None:
        super().__init__(inner.version)
        if agent is None and run_episode is None:
            raise ValueError("AgentEngine: needs an agent function or run_episode")
        check_openai()
        import httpx
        import openai

        self.inner = inner
        self.tokenizer = tokenizer
        self.settings = settings or AgenticConfig()
        self.run_episode = run_episode or agent
        self._aclose = aclose  # run on the agents' loop at close (a verifiers env's servers)
        self.eos_id = int(tokenizer.eos_token_id)
        self._policies: dict[str, SessionPolicy] = {}
        # The clients are the run's own episodes on localhost: the request caps are the policy's
        # (its SamplingParams and token budget), concurrency is the number of episodes in flight.
        limits = ServeLimits(max_tokens=1 << 30, max_logprobs=20, max_concurrent=1 << 16,
                             max_connections=1 << 17, read_timeout_s=300.0)
        self.endpoint = Endpoint(inner, tokenizer, model_name=model_name, policy_for=self._policies.get,
                                 limits=limits)
        self.server: ServerHandle = start_server(self.endpoint)
        self._loop = _Loop()
        self._openai = openai
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(self.settings.agent_timeout_s))
        self._episodes: dict[str, _Episode] = {}
        self.totals: Counter[str] = Counter()

    # ------------------------------------------------------------------------------ protocol
    @property
    def version(self) -> int:
        return self.inner.version

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        self.inner.update_weights(state, version)  # served between two of its steps (in flight)
        self._version = version

    def _load_weights_locked(self, state: Mapping[str, torch.Tensor]) -> None:  # pragma: no cover
        raise AssertionError("update_weights is delegated to the inner engine")

    def _num_unfinished_locked(self) -> int:
        return len(self._episodes)

    def client(self, key: str) -> Any:
        """An `AsyncOpenAI` client whose calls are session `key` on the endpoint."""
        return self._openai.AsyncOpenAI(base_url=self.server.url, api_key=key, max_retries=0,
                                        http_client=self._http)

    def close(self) -> None:
        self.endpoint.fail_pending(RuntimeError("the agent engine is closing"))
        for ep in self._episodes.values():
            ep.future.cancel()
        if self._aclose is not None:
            self._loop.submit(self._aclose()).result(timeout=60)
        self._loop.submit(self._http.aclose()).result(timeout=10)
        self._loop.close()
        self.server.close()

    # ------------------------------------------------------------------------------ submission
    def _submit_locked(self, requests: Sequence[GenerationRequest], serials: list[int]) -> None:
        for request in requests:
            if not isinstance(request.metadata.get("record"), PromptRecord):
                raise ValueError(f"request {request.request_id!r}: an agent episode needs the task record "
                                 "in metadata['record']")
            if request.params.return_support:
                raise ValueError("agent environments do not record the sampling support "
                                 "(keep-sampling-mask with top-k/top-p): turn one of them off")
        for serial, request in zip(serials, requests, strict=True):
            record: PromptRecord = request.metadata["record"]
            for i in range(request.params.n):
                key = f"ep-{uuid.uuid4().hex}"
                seed = request.params.seed
                if seed is not None:
                    seed = (seed * _SEED_MIX + i * 1_000_003) % (1 << 63)
                self._policies[key] = SessionPolicy(
                    replace(request.params, n=1), max_total_tokens=self.settings.max_total_tokens, seed=seed)
                future = self._loop.submit(self._guarded(key, record))
                future.add_done_callback(lambda _f: self.endpoint.notify())
                self._episodes[key] = _Episode(serial, i, request, record, key, future, time.perf_counter())

    async def _guarded(self, key: str, record: PromptRecord) -> Any:
        assert self.run_episode is not None
        return await asyncio.wait_for(self.run_episode(self.client(key), record),
                                      timeout=self.settings.agent_timeout_s)

    # ------------------------------------------------------------------------------ the step
    def _step_locked(self) -> list[Finished]:
        done = [ep for ep in self._episodes.values() if ep.future.done()]
        if not done:
            # Nothing to step while every agent is busy elsewhere: wait (briefly) for a call.
            self.endpoint.pump(wait_s=0.0 if self.endpoint.pending() else 0.01)
            done = [ep for ep in self._episodes.values() if ep.future.done()]
        finished: list[Finished] = []
        for ep in done:
            del self._episodes[ep.key]
            finished.append((ep.serial, ep.sample_index, self._finish(ep)))
        return finished

    def _finish(self, ep: _Episode) -> Completion:
        self._policies.pop(ep.key, None)
        session = self.endpoint.sessions.pop(ep.key, None) or Session(ep.key)
        errors: Counter[str] = Counter()
        verdict: float | VerifierResult | None = None
        end = "answer"
        try:
            verdict = reward_of(ep.future.result())
        except (asyncio.TimeoutError, TimeoutError):
            errors["agent_timeout"] += 1
            end = "env_error"
        except ValueError as err:
            # Not a reward, or the agent's own ValueError: either way the episode has no verdict.
            kind = "bad_reward" if str(err).startswith(("reward ", "returned ")) else type(err).__name__
            errors[f"agent_{kind}"] += 1
            end = "env_error"
        except Exception as err:  # the agent's bug ends its episode, counted, never the run
            errors[f"agent_{type(err).__name__}"] += 1
            end = "token_budget" if session.budget_refused else "env_error"
        final = session.final()
        if final is None:
            errors["agent_no_calls"] += 1
            end = "env_error"
            prompt = self.endpoint.encode(self.endpoint.render_chat(ep.record.chat(), None))
            token_ids, logprobs, versions, mask = [self.eos_id], [0.0], [self.inner.version], [False]
            segments: list[tuple[str, int, int]] = []
            reason = "length"
        else:
            t = final.trace
            prompt, token_ids, logprobs = t.prompt_ids, t.token_ids, t.logprobs
            versions, mask, segments = t.versions, t.loss_mask, t.segments
            reason = final.finish_reason if end == "answer" else "length"
        model_versions = [versions[s] for kind, s, _ in segments if kind == "model"]
        wall = time.perf_counter() - ep.started
        info: dict[str, Any] = {
            "turns": len(session.calls),
            "tool_calls": session.tool_calls,
            "tool_errors": dict(errors),
            "context_events": {},
            "end": end,
            "windows": session.windows(),
            "untrained_tokens": session.untrained_tokens(),
            "env_tokens": sum(e - s for kind, s, e in segments if kind == "env"),
            "env_time_s": max(0.0, wall - session.gen_time_s),
            "gen_time_s": session.gen_time_s,
            "segments": list(segments),
            "answer_text": self._answer_text(final) if end == "answer" and final is not None else "",
            "env_score": verdict if end == "answer" else None,
        }
        self.totals["episodes"] += 1
        self.totals[f"end_{end}"] += 1
        metadata = {k: v for k, v in ep.request.metadata.items() if k != "record"}
        metadata["agentic"] = info
        return Completion(
            request_id=ep.request.request_id, sample_index=ep.sample_index, prompt_ids=list(prompt),
            token_ids=list(token_ids), logprobs=list(logprobs), versions=list(versions),
            loss_mask=list(mask), finish_reason=reason,  # type: ignore[arg-type]
            start_version=model_versions[0] if model_versions else self.inner.version, metadata=metadata)

    @staticmethod
    def _answer_text(call: Any) -> str:
        if call.kind == "chat":
            return str(call.response.get("content") or "")
        return str(call.response)
