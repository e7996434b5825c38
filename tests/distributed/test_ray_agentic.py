"""Agentic runs on the Ray engine pool: the pool has no `extend`, so `TrajectoryEngine` in the
controller re-submits each turn with its whole context (placed by the pool like any group). Over 2
engine actors it builds the same greedy trajectories as over one local embedded engine that
continues each episode in its KV cache, and `build_training` with `distributed.backend: ray` trains
tool_math on trajectories: environment tokens loss-masked in every trained sample, turn metrics
logged per step and evaluation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from scalerl.agentic.rollout import TrajectoryEngine
from scalerl.agentic.setup import build_agentic
from scalerl.assembly.build import build_training, load_records
from scalerl.assembly.sections import engine_spec
from scalerl.config import DistributedConfig, RunConfig, load_config
from scalerl.distributed.engine_actor import EngineFactory
from scalerl.distributed.pool import EnginePool
from scalerl.rollout.factory import build_engine
from scalerl.rollout.protocol import Completion, GenerationRequest, SamplingParams
from scalerl.telemetry import read_rows
from scalerl.training.policy import load_tokenizer
from tests.agentic.tool_run import OVERRIDES, warm_start_tool_model

pytestmark = pytest.mark.distributed

DIST = {"backend": "ray", "num_engines": 2, "trainer_world_size": 1, "engine_num_cpus": 0.5,
        "trainer_num_cpus": 0.5, "timeout_s": 60, "startup_timeout_s": 180}


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The agentic warm start (tool-use traces): it calls the calculator in most episodes."""
    return warm_start_tool_model(tmp_path_factory.mktemp("sft"))


def run_config(model: str, ray: Any, *more: str) -> RunConfig:
    cfg = load_config(overrides=[*OVERRIDES, f"model.name_or_path={model}", "agentic.max_turns=2",
                                       "algorithm.zero_variance_filter=false", *more])
    data = cfg.model_dump(mode="json")
    data["distributed"] = {**DIST, "address": ray.get_runtime_context().gcs_address}
    return RunConfig.model_validate(data)


def trajectories(cfg: RunConfig, inner: Any) -> list[Completion]:
    tokenizer = load_tokenizer(cfg.model)
    agentic = build_agentic(cfg.agentic, tokenizer, inner, None,
                            lambda ids: str(tokenizer.decode(ids, skip_special_tokens=True)))
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=cfg.generation.max_new_tokens)
    records = load_records(cfg)[:6]
    try:
        out = agentic.engine.generate([GenerationRequest(f"r{i}", agentic.encode(r), greedy, {"record": r})
                                       for i, r in enumerate(records)])
    finally:
        agentic.close()
    return sorted(out, key=lambda c: c.request_id)


@pytest.fixture
def pool(ray_cluster: Any, tool_model: str) -> Iterator[tuple[RunConfig, EnginePool]]:
    cfg = run_config(tool_model, ray_cluster)
    tok = load_tokenizer(cfg.model)
    spec = engine_spec(cfg, model_path=tool_model, eos_token_ids=(int(tok.eos_token_id),),
                            pad_token_id=int(tok.pad_token_id))
    engines = EnginePool.launch([EngineFactory(spec), EngineFactory(spec)],
                                DistributedConfig.model_validate(cfg.distributed.model_dump()))
    try:
        yield cfg, engines
    finally:
        engines.close()


def test_pool_builds_the_trajectories_a_local_engine_builds(pool: tuple[RunConfig, EnginePool]) -> None:
    cfg, engines = pool
    tok = load_tokenizer(cfg.model)
    spec = engine_spec(cfg, model_path=cfg.model.name_or_path, eos_token_ids=(int(tok.eos_token_id),),
                            pad_token_id=int(tok.pad_token_id))
    remote = trajectories(cfg, engines)
    local = trajectories(cfg, build_engine(spec))  # the embedded engine: extend, one held sequence
    assert all(m.samples > 0 for m in engines.members)  # both actors ran turns
    assert [c.token_ids for c in remote] == [c.token_ids for c in local]
    assert [c.loss_mask for c in remote] == [c.loss_mask for c in local]
    assert [c.metadata["agentic"]["segments"] for c in remote] == [c.metadata["agentic"]["segments"]
                                                                   for c in local]
    assert max(c.metadata["agentic"]["turns"] for c in remote) == 2  # a tool result was continued
    for a, b in zip(remote, local, strict=True):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)


def check_masks(c: Completion) -> int:
    """Environment segments: loss mask False, log-prob 0; model segments: trained. Env tokens."""
    segments = c.metadata["agentic"]["segments"]
    assert segments and segments[0][0] == "model" and segments[-1][2] == len(c.token_ids)
    env = 0
    for kind, start, end in segments:
        mask = c.loss_mask[start:end]
        if kind == "env":
            env += end - start
            assert not any(mask) and all(lp == 0.0 for lp in c.logprobs[start:end])
        else:
            assert all(mask)
    return env


@pytest.mark.parametrize("mode", ["sync", "pipeline"])
def test_train_tool_math_on_two_engine_actors(ray_cluster: Any, tool_model: str, tmp_path: Path,
                                              mode: str) -> None:
    cfg = run_config(tool_model, ray_cluster, f"pipeline.off_policy={mode}", "max_steps=3")
    trained: list[tuple[int, Completion]] = []  # (trainer version at the step, sample)
    max_lag = 0 if mode == "sync" else cfg.pipeline.max_lag
    with build_training(cfg, tmp_path, device="cpu") as run:
        assert isinstance(run.engine, TrajectoryEngine) and isinstance(run.engine.inner, EnginePool)
        step = run.trainer.step

        def recording_step(groups: Any, *args: Any, **kwargs: Any) -> Any:
            trained.extend((run.trainer.version, c) for g in groups for c in g.completions)
            return step(groups, *args, **kwargs)

        run.trainer.step = recording_step  # type: ignore[method-assign]
        assert run.driver.run().steps == 3
    assert len(trained) == 3 * 2 * 2  # 3 steps x 2 prompts x 2 samples, no filter drops a group here
    assert sum(check_masks(c) for _, c in trained) > 0  # some tool results went into trained samples
    # Turns of one episode may run on different engines (re-submitted): every token, model or
    # environment, still carries a version within the lag bound of the step that trains it.
    assert all(0 <= u - v <= max_lag for u, c in trained for v in [c.start_version, *c.versions])
    rows = read_rows(tmp_path / "metrics.jsonl")
    steps = [r for r in rows if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert 1 <= r["agentic_turns_mean"] <= r["agentic_turns_max"] <= 2
        assert r["pool_engines_alive"] == 2.0 and r["agentic_gen_time_s"] > 0
        assert sum(r[f"agentic_end_{e}"] for e in ("answer", "turn_limit", "token_budget", "length",
                                                  "context_limit", "env_error")) == pytest.approx(1.0)
    assert max(r["agentic_turns_max"] for r in steps) == 2
    assert sum(r["agentic_tool_calls_mean"] for r in steps) > 0
    assert all("val_agentic_turns_mean" in r for r in rows if r["kind"] == "eval")
