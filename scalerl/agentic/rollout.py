"""Multi-turn rollouts in the existing loop: an `Engine` whose completions are whole trajectories.

`TrajectoryEngine(inner, make_env, chat, decode, settings)` implements the `Engine` protocol on top
of any generation engine, so the generator, the evaluator, every pipeline mode, checkpoints and
in-flight weight updates work on trajectories unchanged. Each sample of a submitted request is an
episode: an environment is reset from the request's task record (`metadata["record"]`), the model
generates a turn, a turn that ends in a tool call (`</tool_call>` is a stop sequence) goes to the
environment, its observations come back as an environment segment, and the model continues, until
the environment says the episode is over (an answer), the turn limit, the token budget, or the
context budget without a way to manage it.

The completion handed out at the end is one sequence of model segments and environment segments:
environment tokens have `loss_mask` False and log-prob 0 (no behaviour log-probs that count), so
every loss aggregation counts model tokens only; every model token carries the policy version that
sampled it; `start_version` is the version of the trajectory's first token, so the pipeline's
max-lag admission rule counts a trajectory from there. `metadata["agentic"]` holds its turns, tool
calls, tool errors by kind, context events, where it ended, environment and generation time, the
text of its answer turn and the environment's own score (see `TrajectoryScorer`).

Continuation: with a `ContinuableEngine` (the embedded engine) an episode stays one held sequence
and `extend` appends each environment segment to its KV cache. Other engines (vLLM, the Ray pool)
get a new request with the whole context as its prompt each turn, carrying the `cache_key` of the
episode's group, so vLLM's prefix caching serves the context already computed and the pool sends
the turn to the engine that holds it; the stitched trajectory is the same.

Context windows: when the thinking-retention rule changes earlier turns (a new user message drops
historical reasoning) or context management rewrites the history, the next turn starts from a
re-rendered context as a new sequence. The completion trained on is the last window (its prompt is
the rewritten context); model tokens of earlier windows are not trained and are counted as
`untrained_tokens`. (DeepSeek-V3.2 uses context management at test time.)

Environment time: with `overlap_env` False (the default, and what the reproducible schedules need)
each engine step runs the environment steps of the turns that ended in it, in parallel on a thread
pool, and waits for them, so what the engine does depends on the token stream only. With
`overlap_env` True environment steps run while the engine keeps decoding other sequences.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from scalerl.agentic.chat import ChatFormat
from scalerl.agentic.environment import Environment, StepResult, final_answer_text
from scalerl.agentic.messages import (
    Message,
    discard_tool_history,
    retain_thinking,
    summary_context,
    summary_request,
)
from scalerl.config import AgenticConfig
from scalerl.data.records import PromptRecord
from scalerl.rollout.base import Finished, SteppingEngine
from scalerl.rollout.protocol import (
    ENGINE_METADATA_KEY,
    Completion,
    ContinuableEngine,
    Engine,
    FinishReason,
    GenerationRequest,
    SamplingParams,
)
from scalerl.rollout.sampling import SUPPORT_FORCED
from scalerl.rollout.support import SupportIds

ENDS: tuple[str, ...] = ("answer", "turn_limit", "token_budget", "context_limit", "length", "env_error")
_SEED_MIX = 0x9E3779B97F4A7C15


@dataclass
class _Window:
    """One context window: its prompt and the trajectory tokens generated / appended after it."""

    inner_id: str
    prompt_ids: list[int]
    inner_index: int = 0  # the sample's index in its inner request
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)
    support: list[int] | None = None  # `Completion.support` codes
    support_ids: SupportIds | None = None  # `Completion.support_ids`
    segments: list[tuple[str, int, int]] = field(default_factory=list)  # (kind, start, end)
    start_version: int | None = None
    reported: int = 0  # tokens of this window the inner engine has already reported
    held: bool = False

    def add(self, kind: str, ids: Sequence[int], logprobs: Sequence[float], versions: Sequence[int],
            mask: Sequence[bool], support: Sequence[int] | None,
            support_ids: SupportIds | None = None) -> None:
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        self.logprobs.extend(logprobs)
        self.versions.extend(versions)
        self.loss_mask.extend(mask)
        if self.support is not None:
            # Environment tokens (and a model turn that recorded none) were not drawn: forced.
            self.support.extend(support if support is not None else [SUPPORT_FORCED] * len(ids))
        if self.support_ids is not None:
            if support is not None and support_ids is not None:
                self.support_ids.extend(support_ids)
            else:  # forced tokens record no id; a turn without ids is completed by the trainer
                self.support_ids.append_empty(len(ids))
        if ids:
            self.segments.append((kind, start, len(self.token_ids)))


@dataclass
class _Episode:
    serial: int
    sample_index: int
    request: GenerationRequest
    record: PromptRecord
    env: Environment
    messages: list[Message]
    window: _Window
    seed: int | None
    cache_key: str
    turn_texts: list[str] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    context_events: Counter[str] = field(default_factory=Counter)
    total_tokens: int = 0
    untrained_tokens: int = 0
    windows: int = 1
    env_time_s: float = 0.0
    gen_time_s: float = 0.0
    summarizing: bool = False
    first_version: int | None = None
    turn_engines: list[int | None] = field(default_factory=list)  # the pool engine of each model turn
    future: Future[tuple[StepResult, float]] | None = None
    last_reason: FinishReason = "stop"


class TrajectoryEngine(SteppingEngine):
    """Episodes of `make_env()` environments over the `inner` engine (module docstring).

    `decode(ids) -> str` gives the text of a model turn (special tokens dropped). `chat` renders
    contexts and environment segments. Requests must carry their task record in
    `metadata["record"]` (the generator and the evaluator put it there).
    """

    def __init__(
        self,
        inner: Engine,
        make_env: Callable[[], Environment],
        chat: ChatFormat,
        decode: Callable[[list[int]], str],
        settings: AgenticConfig | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        super().__init__(inner.version)
        self.inner = inner
        self.make_env = make_env
        self.chat = chat
        self.decode = decode
        self.settings = settings or AgenticConfig()
        self.clock = clock
        self.continuable = isinstance(inner, ContinuableEngine)
        self._pool = ThreadPoolExecutor(self.settings.env_workers, thread_name_prefix="scalerl-env")
        self._episodes: dict[tuple[str, int], _Episode] = {}  # (inner request id, inner index) -> episode
        self._in_env: list[_Episode] = []
        self._open = 0
        self._windows = 0  # inner request ids issued beyond the first window of each request
        # Cache keys `{engine}-{serial}`: unique per submitted group, across engines sharing `inner`.
        self._key_prefix = uuid.uuid4().hex[:12]
        self.totals: Counter[str] = Counter()  # cumulative counts over every episode that ended

    # ------------------------------------------------------------------------------ protocol
    @property
    def version(self) -> int:
        return self.inner.version

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        # The inner engine serves the update between two of its steps (in flight, mid-trajectory).
        self.inner.update_weights(state, version)
        self._version = version

    def _load_weights_locked(self, state: Mapping[str, torch.Tensor]) -> None:  # pragma: no cover
        raise AssertionError("update_weights is delegated to the inner engine")

    def _num_unfinished_locked(self) -> int:
        return self._open

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for ep in list(self._episodes.values()) + self._in_env:
            ep.env.close()  # the inner engine belongs to whoever built it

    # ------------------------------------------------------------------------------ submission
    def _submit_locked(self, requests: Sequence[GenerationRequest], serials: list[int]) -> None:
        records = []
        for request in requests:
            record = request.metadata.get("record")
            if not isinstance(record, PromptRecord):
                raise ValueError(f"request {request.request_id!r}: an agentic rollout needs the task record "
                                 "in metadata['record']")
            records.append(record)
        inner_requests = []
        for serial, request, record in zip(serials, requests, records, strict=True):
            prompt: list[int] | None = None
            key = f"{self._key_prefix}-{serial}"
            for i in range(request.params.n):
                env = self.make_env()
                messages = env.reset(record)
                ids = self.chat.render_ids(messages)
                if prompt is None:
                    prompt = ids
                elif ids != prompt:
                    raise ValueError(f"request {request.request_id!r}: the environment's reset is not "
                                     "deterministic (samples of one prompt got different contexts)")
                window = self._new_window(request, ids, first=True)
                window.inner_index = i
                ep = _Episode(serial, i, request, record, env, messages, window, request.params.seed, key)
                self._episodes[(window.inner_id, i)] = ep
                self._open += 1
            assert prompt is not None
            params = self._turn_params(request.params, budget=self.settings.max_total_tokens)
            inner_requests.append(GenerationRequest(f"{request.request_id}#0", prompt, params,
                                                    dict(request.metadata), hold=self.continuable,
                                                    cache_key=key))
        self.inner.submit(inner_requests)

    def _new_window(self, request: GenerationRequest, prompt: list[int], *, first: bool = False) -> _Window:
        inner_id = f"{request.request_id}#0" if first else self._fresh_id(request)
        support: list[int] | None = [] if request.params.return_support else None
        return _Window(inner_id=inner_id, prompt_ids=list(prompt), support=support,
                       support_ids=SupportIds() if support is not None else None)

    def _turn_params(self, params: SamplingParams, *, budget: int, n: int | None = None,
                     seed: int | None = None) -> SamplingParams:
        stops = params.stop_sequences
        if self.chat.stop_sequence and self.chat.stop_sequence not in stops:
            stops = (*stops, self.chat.stop_sequence)
        return replace(params, n=params.n if n is None else n, seed=params.seed if seed is None else seed,
                       max_new_tokens=max(1, min(params.max_new_tokens, budget)), stop_sequences=stops)

    # ------------------------------------------------------------------------------ the step
    def _step_locked(self) -> list[Finished]:
        finished: list[Finished] = []
        self._collect_env(finished, block=False)
        if self.inner.num_unfinished():
            start = self.clock()
            segments = self.inner.step()
            elapsed = self.clock() - start
            self.totals["gen_time_us"] += int(elapsed * 1e6)
            for c in segments:
                ep = self._episodes.get((c.request_id, c.sample_index))
                if ep is None:
                    raise RuntimeError(f"inner engine: unknown sample {c.request_id!r}/{c.sample_index}")
                ep.gen_time_s += elapsed
                self._after_segment(ep, c, finished)
            if not self.settings.overlap_env:
                self._collect_env(finished, block=True)
        elif self._in_env:
            self._collect_env(finished, block=True, first_only=self.settings.overlap_env)
        return finished

    def _after_segment(self, ep: _Episode, c: Completion, finished: list[Finished]) -> None:
        w = ep.window
        new = slice(w.reported, c.num_tokens)
        w.reported = c.num_tokens
        if w.start_version is None:
            w.start_version = c.start_version
        if ep.first_version is None:
            ep.first_version = c.start_version
        ids = c.token_ids[new]
        support = c.support[new] if c.support is not None else None
        support_ids = c.support_ids[new] if c.support_ids is not None else None
        w.add("model", ids, c.logprobs[new], c.versions[new], c.loss_mask[new], support, support_ids)
        w.held = self.continuable
        ep.total_tokens += len(ids)
        ep.last_reason = c.finish_reason
        ep.turns += 1
        ep.turn_engines.append(c.metadata.get(ENGINE_METADATA_KEY))
        text = self.decode(list(ids))
        if ep.summarizing:
            self._restart_from_summary(ep, text, finished)
            return
        ep.turn_texts.append(text)
        if c.finish_reason == "length":
            spent = ep.total_tokens >= self.settings.max_total_tokens
            self._finish(ep, "token_budget" if spent else "length", finished)
            return
        env = ep.env
        clock = self.clock

        def run() -> tuple[StepResult, float]:
            start = clock()
            return env.step(text), clock() - start

        ep.future = self._pool.submit(run)
        self._in_env.append(ep)

    def _collect_env(self, finished: list[Finished], *, block: bool, first_only: bool = False) -> None:
        if not self._in_env:
            return
        if block:
            futures = [ep.future for ep in self._in_env if ep.future is not None]
            wait(futures, return_when=FIRST_COMPLETED if first_only else "ALL_COMPLETED", timeout=None)
        done = [ep for ep in self._in_env if ep.future is not None and ep.future.done()]
        for ep in done:
            self._in_env.remove(ep)
            future, ep.future = ep.future, None
            assert future is not None
            try:
                result, elapsed = future.result()
            except Exception as err:  # an environment bug ends its episode, counted, never the run
                ep.errors[f"env_{type(err).__name__}"] += 1
                self._finish(ep, "env_error", finished)
                continue
            ep.env_time_s += elapsed
            self.totals["env_time_us"] += int(elapsed * 1e6)
            self._after_env(ep, result, finished)

    def _after_env(self, ep: _Episode, result: StepResult, finished: list[Finished]) -> None:
        s = self.settings
        ep.tool_calls += result.tool_calls
        ep.errors.update(result.errors)
        observations = [self._cut(m) for m in result.observations]
        ep.messages.append({"role": "assistant", "content": ep.turn_texts[-1]})
        ep.messages.extend(observations)
        if result.done:
            self._finish(ep, "answer", finished)
            return
        if ep.turns >= s.max_turns:
            self._finish(ep, "turn_limit", finished)
            return
        retained = retain_thinking(ep.messages, s.thinking_retention)
        env_ids = self.chat.segment_ids(observations)
        budget = s.max_total_tokens - ep.total_tokens - len(env_ids)
        if budget <= 0:
            self._finish(ep, "token_budget", finished)
            return
        w = ep.window
        context = len(w.prompt_ids) + len(w.token_ids) + len(env_ids)
        if s.context_budget is not None and context >= s.context_budget:
            self._manage_context(ep, retained, finished)
            return
        if retained != ep.messages:
            ep.context_events["thinking_dropped"] += 1
            ep.messages = retained
            self._restart(ep, self.chat.render_ids(retained), budget, finished)
            return
        self._continue(ep, env_ids, budget)

    def _cut(self, message: Message) -> Message:
        content = message.get("content")
        if isinstance(content, str):
            return {**message, "content": self.chat.truncate(content, self.settings.max_observation_tokens)}
        return dict(message)

    def _continue(self, ep: _Episode, env_ids: list[int], budget: int) -> None:
        w = ep.window
        version = self.inner.version
        params = self._turn_params(ep.request.params, budget=budget, n=1, seed=self._seed(ep))
        ep.total_tokens += len(env_ids)
        k = len(env_ids)
        w.add("env", env_ids, [0.0] * k, [version] * k, [False] * k, None)
        if self.continuable:
            w.reported += k  # the inner engine's next completion repeats them
            self.inner.extend(w.inner_id, w.inner_index, env_ids, params, hold=True)  # type: ignore[attr-defined]
            return
        self._resubmit(ep, [*w.prompt_ids, *w.token_ids], params, same_window=True)

    def _fresh_id(self, request: GenerationRequest) -> str:
        self._windows += 1
        return f"{request.request_id}#{self._windows}"

    def _resubmit(
        self, ep: _Episode, prompt: list[int], params: SamplingParams, *, same_window: bool
    ) -> None:
        """A one-sample request for the episode's next turn (engines without `extend`: the whole
        context as the prompt, same window; or a new window). Its seed is per episode and turn."""
        old = ep.window
        self._episodes.pop((old.inner_id, old.inner_index), None)
        if same_window:
            old.inner_id, old.reported = self._fresh_id(ep.request), 0
            window = old
        else:
            window = self._new_window(ep.request, prompt)
            ep.window = window
        window.inner_index = 0
        self._episodes[(window.inner_id, 0)] = ep
        request = GenerationRequest(window.inner_id, prompt, replace(params, n=1), dict(ep.request.metadata),
                                    hold=self.continuable, cache_key=ep.cache_key)
        self.inner.submit([request])

    def _seed(self, ep: _Episode) -> int | None:
        if ep.seed is None:
            return None
        return (ep.seed * _SEED_MIX + ep.sample_index * 1_000_003 + ep.turns) % (1 << 63)

    # ------------------------------------------------------------------------------ context
    def _manage_context(self, ep: _Episode, retained: list[Message], finished: list[Finished]) -> None:
        strategy = self.settings.context_strategy
        if strategy == "none":
            self._finish(ep, "context_limit", finished)
            return
        ep.context_events[strategy] += 1
        if strategy == "summary":
            ep.summarizing = True
            prompt = self.chat.render_ids(summary_request(retained))
        else:
            kept, _ = discard_tool_history(retained, 0.75 if strategy == "discard_75" else 1.0)
            ep.messages = kept
            prompt = self.chat.render_ids(kept)
        budget = self.settings.max_total_tokens - ep.total_tokens
        if budget <= 0:
            self._finish(ep, "token_budget", finished)
            return
        self._restart(ep, prompt, budget, finished)

    def _restart_from_summary(self, ep: _Episode, summary: str, finished: list[Finished]) -> None:
        ep.summarizing = False
        ep.messages = summary_context(ep.messages, summary)
        budget = self.settings.max_total_tokens - ep.total_tokens
        if budget <= 0 or ep.turns >= self.settings.max_turns:
            self._finish(ep, "token_budget" if budget <= 0 else "turn_limit", finished)
            return
        self._restart(ep, self.chat.render_ids(ep.messages), budget, finished)

    def _restart(self, ep: _Episode, prompt: list[int], budget: int, finished: list[Finished]) -> None:
        """Start a new window from `prompt`; the old window's model tokens are not trained."""
        s = self.settings
        # The budget triggers management; the summarizing turn reads the full trajectory past it.
        if s.context_budget is not None and len(prompt) >= s.context_budget and not ep.summarizing:
            self._finish(ep, "context_limit", finished)
            return
        old = ep.window
        ep.untrained_tokens += sum(old.loss_mask)
        self._release(ep)
        ep.windows += 1
        params = self._turn_params(ep.request.params, budget=budget, n=1, seed=self._seed(ep))
        self._resubmit(ep, prompt, params, same_window=False)

    # ------------------------------------------------------------------------------ the end
    def _release(self, ep: _Episode) -> None:
        w = ep.window
        if w.held:
            self.inner.release(w.inner_id, w.inner_index)  # type: ignore[attr-defined]
            w.held = False

    def _finish(self, ep: _Episode, end: str, finished: list[Finished]) -> None:
        self._release(ep)
        w = ep.window
        self._episodes.pop((w.inner_id, w.inner_index), None)
        self._open -= 1
        try:
            verdict = ep.env.score()
        except Exception as err:  # counted; the task's verifier still judges the answer
            ep.errors[f"score_{type(err).__name__}"] += 1
            verdict = None
        finally:
            ep.env.close()
        reason: FinishReason = ep.last_reason if end == "answer" else "length"
        info: dict[str, Any] = {
            "turns": ep.turns,
            "tool_calls": ep.tool_calls,
            "tool_errors": dict(ep.errors),
            "context_events": dict(ep.context_events),
            "end": end,
            "windows": ep.windows,
            "untrained_tokens": ep.untrained_tokens,
            "env_tokens": sum(e - s for kind, s, e in w.segments if kind == "env"),
            "env_time_s": ep.env_time_s,
            "gen_time_s": ep.gen_time_s,
            "segments": list(w.segments),
            "turn_engines": list(ep.turn_engines),
            "answer_text": final_answer_text(ep.turn_texts) if end == "answer" else "",
            "env_score": verdict,
        }
        self.totals["episodes"] += 1
        self.totals[f"end_{end}"] += 1
        metadata = {k: v for k, v in ep.request.metadata.items() if k != "record"}
        metadata["agentic"] = info
        completion = Completion(
            request_id=ep.request.request_id,
            sample_index=ep.sample_index,
            prompt_ids=list(w.prompt_ids),
            token_ids=list(w.token_ids),
            logprobs=list(w.logprobs),
            versions=list(w.versions),
            loss_mask=list(w.loss_mask),
            finish_reason=reason,
            start_version=ep.first_version if ep.first_version is not None else self.inner.version,
            support=None if w.support is None else list(w.support),
            support_cut=None if w.support is None else (ep.request.params.top_k, ep.request.params.top_p),
            support_ids=None if w.support_ids is None else w.support_ids.copy(),
            metadata=metadata,
        )
        finished.append((ep.serial, ep.sample_index, completion))
