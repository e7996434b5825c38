"""`pipeline.schedule: interleaved`: one thread, a fixed interleaving, so a seed reproduces the run.

Reproducibility is checked on whole runs (fakes, then the real tiny model, trainer, verifiers and
evaluator), together with the PipelineRL properties the schedule must keep: the lag bound, in-flight
weight updates mid-sequence, the simulated trainer time, resume without consuming a prompt twice.
"""

from __future__ import annotations

import copy
import json
import logging
import random
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from scalerl.assembly.build import build_training
from scalerl.assembly.sections import driver_settings, run_generation, stream_seed
from scalerl.config import PipelineConfig
from scalerl.data.records import PromptRecord
from scalerl.pipeline import Driver, GroupScorer
from scalerl.pipeline.modes import InterleavedBatches
from scalerl.rollout.protocol import Completion

from .fakes import FakeEngine, FakeScorer, FakeSource, FakeTrainer, Rows, decode
from .test_assemble import tiny_config
from .test_modes import build, check_accounting, make_config

# Row fields that measure wall-clock time (the pipeline's and the trainer's); everything else in a
# row of an interleaved run is a function of the seed.
WALL_CLOCK = frozenset(
    {"step_wall_s", "gen_tokens_per_s", "gen_samples_per_s", "gen_busy_frac", "step_time_s", "tokens_per_s",
     "val_time_s"}
)


def canonical(
    rows: Sequence[tuple[int, Mapping[str, Any]]], exclude: frozenset[str] = WALL_CLOCK
) -> list[str]:
    # JSON text compares NaN equal to NaN (e.g. `kl` without a reference model) and floats exactly.
    return [
        json.dumps({"step": step, **{k: v for k, v in row.items() if k not in exclude}}, sort_keys=True)
        for step, row in rows
    ]


def samples(trainer: FakeTrainer) -> list[tuple[int, str, int, list[int], list[int]]]:
    """What each step trained: (train version, prompt, sample index, tokens, token versions)."""
    return [
        (u, g.record.id, c.sample_index, list(c.token_ids), list(c.versions))
        for u, groups in trainer.batches for g in groups for c in g.completions
    ]


class JitteryScorer(FakeScorer):
    """Verdicts take a random time, so verifier threads finish groups in a random order."""

    def score(self, record: PromptRecord, completion_text: str) -> float:
        time.sleep(random.uniform(0.0, 0.001))
        return super().score(record, completion_text)


def run_fakes(
    k: int, b: int, train_ticks: int, steps: int = 25, **algo: object
) -> tuple[Driver, Rows, FakeTrainer]:
    cfg = make_config("pipeline", k, b, steps=steps, schedule="interleaved", train_ticks=train_ticks, **algo)
    cfg.rewards.max_workers = 4
    # Random engine, trainer and verifier times: timing must not matter any more.
    engine = FakeEngine(max_batch_size=8, step_sleep=(0.0, 0.0005), long_tail=0.15, max_len=60)
    trainer = FakeTrainer(engine, step_time=(0.0, 0.001))
    source = FakeSource()
    comps, rows = build(cfg, engine=engine, trainer=trainer, source=source, scorer=JitteryScorer())
    driver = Driver(driver_settings(cfg), comps)
    result = driver.run()
    assert result.steps == steps and result.stop_reason == "max_steps"
    check_accounting(driver, source, trainer)
    return driver, rows, trainer


@pytest.mark.parametrize("k,b,train_ticks", [(1, 2, 0), (4, 4, 0), (8, 2, 0), (2, 3, 10), (8, 2, 30)])
def test_same_seed_same_run_and_pipeline_semantics(k: int, b: int, train_ticks: int) -> None:
    driver, rows, trainer = run_fakes(k, b, train_ticks, dynamic_sampling=True)
    _, rows2, trainer2 = run_fakes(k, b, train_ticks, dynamic_sampling=True)
    assert canonical(rows.steps) == canonical(rows2.steps)
    assert samples(trainer) == samples(trainer2)

    lags = [u - c.start_version for u, gs in trainer.batches for g in gs for c in g.completions]
    # The controller counts from admission, a lower bound of each sample's start_version.
    assert max(lags) <= driver.controller.max_observed_lag <= k
    # In flight: sequences kept generating across weight updates, their later tokens newer.
    spanning = [c for _, gs in trainer.batches for g in gs for c in g.completions if len(set(c.versions)) > 1]
    assert spanning and all(c.versions == sorted(c.versions) for c in spanning)
    engine = trainer.engine
    assert engine is not None and engine.updates == list(range(1, len(engine.updates) + 1))
    idle = [row["gen_idle_frac"] for _, row in rows.steps]
    if train_ticks == 0:
        # An infinitely fast trainer never leaves the generator without work while prompts last.
        assert idle == [0.0] * len(idle)
    assert sum(row["gen_engine_steps"] for _, row in rows.steps) > 0


def test_trainer_time_delays_weights_and_raises_lag() -> None:
    """A step occupies the trainer for `train_ticks` generator ticks; its weights land at the end."""
    events: list[tuple[str, int, int]] = []

    class Recorder(FakeTrainer):
        def step(self, groups: Sequence[Any]) -> dict[str, float]:
            events.append(("step", source_ref.ticks, self.version))
            return super().step(groups)

    class Channel:
        def publish(self, state: Mapping[str, torch.Tensor], version: int) -> None:
            events.append(("publish", source_ref.ticks, version))
            engine.update_weights(state, version)

    ticks = 7
    cfg = make_config("pipeline", 2, 2, steps=12, schedule="interleaved", train_ticks=ticks)
    engine = FakeEngine(max_batch_size=8, long_tail=0.15, max_len=60)
    comps, _ = build(cfg, engine=engine, trainer=Recorder(engine))
    comps.channel = Channel()
    driver = Driver(driver_settings(cfg), comps)
    assert isinstance(driver.batches, InterleavedBatches)
    source_ref = driver.batches
    driver.run()
    steps = [(t, v) for kind, t, v in events if kind == "step"]
    publishes = [(t, v) for kind, t, v in events if kind == "publish"]
    assert len(steps) == 12 and len(publishes) == 11  # the last step's weights are not due yet
    for (t_step, v), (t_pub, v_pub) in zip(steps, publishes, strict=False):
        assert (t_pub - t_step, v_pub) == (ticks, v + 1)
    # The trainer takes no batch while busy: the next step starts after the previous publication.
    assert all(t_next >= t_pub for (t_next, _), (t_pub, _) in zip(steps[1:], publishes, strict=True))

    def mean_lag(rows: Rows) -> float:
        return sum(row["version_lag_mean"] for _, row in rows.steps) / len(rows.steps)

    _, fast, _ = run_fakes(8, 2, 0)
    _, slow, _ = run_fakes(8, 2, 30)
    # A slow trainer lets the queue fill: older groups, and a throttled (idle) generator.
    assert mean_lag(slow) > mean_lag(fast)
    assert max(row["gen_idle_frac"] for _, row in slow.steps) > 0


class ParityScorer:
    """Correct iff the completion text has even length: a verdict that turns on every sampled token,
    so the tiny untrained model gets a learning signal and a non-trivial pass rate."""

    def score(self, record: PromptRecord, completion_text: str) -> float:
        return 1.0 if len(completion_text) % 2 == 0 else 0.0


class JitteredParityScorer(ParityScorer):
    """The same verdicts after a random delay, so verifier threads finish in a random order."""

    def score(self, record: PromptRecord, completion_text: str) -> float:
        time.sleep(random.random() * 0.01)
        return super().score(record, completion_text)


def run_tiny(
    tmp: Path, steps: int = 6, off_policy: str = "pipeline", scorer: ParityScorer | None = None,
    seed: int = 0,
) -> tuple[Rows, Any, dict[str, torch.Tensor]]:
    cfg = tiny_config(steps)
    cfg.seed = seed
    cfg.pipeline.off_policy = off_policy
    cfg.pipeline.k = 2
    cfg.pipeline.schedule = "interleaved"
    # A learning rate that moves the tiny policy within a few steps, and enough held-out samples
    # (6 x 4) for the evaluations to show it.
    cfg.optim.lr, cfg.optim.warmup_steps = 1e-2, 0
    cfg.data.heldout_size, cfg.eval.k = 6, 4
    with build_training(cfg, tmp, device="cpu", log=False, checkpoints=False) as run:
        rows = Rows()
        run.driver.c.metrics = rows
        run.driver.group_scorer.scorer = scorer or ParityScorer()  # rewards.max_workers=2: threaded
        assert run.driver.c.evaluator is not None
        run.driver.c.evaluator.scorer.scorer = ParityScorer()
        result = run.driver.run()
        assert run.engine.version == run.trainer.version == steps
        weights = {k: v.detach().clone() for k, v in run.trainer.policy.model.state_dict().items()}
    return rows, result, weights


def test_tiny_model_same_seed_same_metrics_and_eval(tmp_path: Path) -> None:
    rows, result, weights = run_tiny(tmp_path / "a")
    rows2, _, weights2 = run_tiny(tmp_path / "b")
    assert canonical(rows.steps) == canonical(rows2.steps)
    assert canonical(rows.evals) == canonical(rows2.evals)
    assert weights.keys() == weights2.keys()
    assert all(torch.equal(weights[k], weights2[k]) for k in weights), "trained weights differ"
    assert [s for s, _ in rows.evals] == [0, 2, 4, 6]
    passes = [row["val_pass_rate"] for _, row in rows.evals]
    # Evaluations follow the moving policy (so equal rows are not equal by insensitivity).
    assert min(passes) > 0.0 and max(passes) < 1.0 and len(set(passes)) > 1
    # The weights moved, so identical rows mean identical training, not a frozen model.
    assert sum(row["grad_norm"] > 0 for _, row in rows.steps) >= 3
    assert result.max_version_lag <= 2
    # In flight: some samples' tokens are newer than their start (token lag below sequence lag).
    assert any(row["token_lag_mean"] < row["version_lag_mean"] for _, row in rows.steps)


def test_another_run_seed_trains_another_run(tmp_path: Path) -> None:
    # `seed` moves the rollouts and the prompt order (`assembly.sections.stream_seed`), not only the
    # held-out draws: two seeds of one config trained identically before.
    rows, _, weights = run_tiny(tmp_path / "a", 3)
    rows1, _, weights1 = run_tiny(tmp_path / "b", 3, seed=1)
    rewards = [row["reward_mean"] for _, row in rows.steps]
    rewards1 = [row["reward_mean"] for _, row in rows1.steps]
    assert rewards != rewards1
    assert not all(torch.equal(weights[k], weights1[k]) for k in weights), "seed 1 trained seed 0's run"


def test_the_run_seed_offsets_the_rl_streams_and_leaves_seed_0_alone() -> None:
    cfg = tiny_config(2)
    assert run_generation(cfg).seed == cfg.generation.seed  # seed 0: runs as before
    cfg.seed, cfg.generation.seed = 2, 5
    assert run_generation(cfg).seed == driver_settings(cfg).generation.seed == 5 + 2 * 1_000_003
    assert cfg.generation.seed == 5  # the config itself is not rewritten (config.yaml, resume)
    # A study's seed index (generation.seed + i at a fixed `seed`) never lands on another run seed.
    assert len({stream_seed(s, g) for s in range(4) for g in range(200)}) == 800


@pytest.mark.parametrize("off_policy", ["sync", "ppo_offpolicy"])
def test_round_modes_same_seed_same_training(tmp_path: Path, off_policy: str) -> None:
    # Round modes wait for the (threaded) verifier after every engine step, so which groups fill a
    # round depends on the token stream only.
    rows, _, weights = run_tiny(tmp_path / "a", 4, off_policy, JitteredParityScorer())
    rows2, _, weights2 = run_tiny(tmp_path / "b", 4, off_policy, JitteredParityScorer())
    # Round modes measure the generator's idle share in wall-clock time (the engine waits while the
    # trainer works), unlike the interleaved schedule's tick count.
    timed = WALL_CLOCK | {"gen_idle_frac"}
    assert canonical(rows.steps, timed) == canonical(rows2.steps, timed)
    assert all(torch.equal(weights[k], weights2[k]) for k in weights), "trained weights differ"
    assert sum(row["grad_norm"] > 0 for _, row in rows.steps) >= 2


@pytest.mark.parametrize("admission", ["bounded", "partial"])
def test_resume_interleaved_consumes_no_prompt_twice_and_is_reproducible(admission: str) -> None:
    cfg = make_config(
        "pipeline", 2, 3, steps=10, schedule="interleaved", train_ticks=3, dynamic_sampling=True
    )
    cfg.pipeline.admission = admission  # type: ignore[assignment]
    cfg.checkpoint.every = 4
    saved: dict[int, dict[str, Any]] = {}

    def checkpoint(step: int, state: dict[str, Any]) -> None:
        saved[step] = copy.deepcopy(json.loads(json.dumps(state)))

    engine1 = FakeEngine(max_batch_size=8, long_tail=0.2)
    trainer1 = FakeTrainer(engine1)
    comps, _ = build(cfg, engine=engine1, trainer=trainer1)
    comps.checkpoint = checkpoint
    first = Driver(driver_settings(cfg), comps)
    first.run()
    # The partial run re-admits groups; its resume must keep the same guarantees and the count.
    assert (first.generator.counters.groups_renewed > 0) == (admission == "partial")
    state = saved[4]
    outstanding = [o["record"]["id"] for o in state["generator"]["outstanding"]]
    assert outstanding, "groups were in flight at the checkpoint"
    trained1 = [g.record.id for _, gs in trainer1.batches[:4] for g in gs]

    def resume() -> tuple[Driver, FakeTrainer, FakeSource, Rows]:
        engine = FakeEngine(max_batch_size=8, long_tail=0.2, version=4)
        trainer = FakeTrainer(engine)
        trainer.load_version(trainer1.batches[3][0] + 1)
        source = FakeSource()
        comps, rows = build(cfg, engine=engine, trainer=trainer, source=source)
        driver = Driver(driver_settings(cfg), comps, resume_state=state)
        assert driver.run().steps == 10
        return driver, trainer, source, rows

    driver2, trainer2, source2, rows2 = resume()
    trained2 = [g.record.id for _, gs in trainer2.batches for g in gs]
    assert len(trained2) == len(set(trained2)) == 6 * 3
    assert not set(trained1) & set(trained2), "a prompt was consumed before and after the resume"
    assert driver2.generator.counters.prompts_reissued == len(outstanding)
    assert driver2.generator.counters.groups_renewed >= state["generator"]["counters"]["groups_renewed"]
    # The re-issued prompts were admitted first: each is trained, dropped, or still outstanding.
    end = {o["record"]["id"] for o in driver2.generator.state_dict()["outstanding"]}
    reported = {o["record"]["id"] for o in state["generator"]["outstanding"] if o["reported"]}
    assert set(outstanding) <= set(trained2) | end | set(source2.reports) | reported
    assert [s for s, _ in rows2.steps] == [5, 6, 7, 8, 9, 10]
    # A resume is reproducible too.
    _, trainer3, _, rows3 = resume()
    assert canonical(rows2.steps) == canonical(rows3.steps)
    assert samples(trainer2) == samples(trainer3)


def test_a_lost_weight_update_stalls_loudly() -> None:
    """If the weights never reach the engine, admission control blocks for good; the interleaved
    loop reports it instead of spinning forever."""

    class Dropping:
        def publish(self, state: Mapping[str, torch.Tensor], version: int) -> None:
            """Loses every update (a broken transport)."""

    cfg = make_config("pipeline", 1, 2, steps=20, schedule="interleaved")
    comps, _ = build(cfg)
    comps.channel = Dropping()
    with pytest.raises(RuntimeError, match="interleaved schedule stalled"):
        Driver(driver_settings(cfg), comps).run()


def test_drain_waits_for_every_threaded_verdict() -> None:
    release = threading.Event()

    class Slow(FakeScorer):
        def score(self, record: PromptRecord, completion_text: str) -> float:
            release.wait(5.0)
            return super().score(record, completion_text)

    scorer = GroupScorer(Slow(), decode, max_workers=3)
    try:
        record = PromptRecord(id="p1", task="fake", prompt="q")
        group = [Completion(request_id="r", sample_index=i, prompt_ids=[1], token_ids=[i], logprobs=[0.0],
                            versions=[0], loss_mask=[True], finish_reason="stop", start_version=0)
                 for i in range(4)]
        scorer.submit("a", record, group)
        scorer.submit("b", record, group)
        assert not scorer.drain(timeout=0.05)
        release.set()
        start = time.monotonic()
        assert scorer.drain(timeout=5.0) and time.monotonic() - start < 5.0
        assert [b.key for b in scorer.collect()] in (["a", "b"], ["b", "a"])
        assert scorer.pending == 0 and scorer.drain(timeout=0)
    finally:
        release.set()
        scorer.close()


def test_close_with_samples_still_queued_raises_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """A run that stops while a slow verifier still has samples queued: `close()` cancels them; the
    pool's done-callbacks must not raise CancelledError (it printed a traceback per sample)."""
    started, release = threading.Event(), threading.Event()

    class Slow(FakeScorer):
        def score(self, record: PromptRecord, completion_text: str) -> float:
            started.set()
            release.wait(5.0)
            return super().score(record, completion_text)

    scorer = GroupScorer(Slow(), decode, max_workers=1)
    record = PromptRecord(id="p1", task="fake", prompt="q")
    group = [Completion(request_id="r", sample_index=i, prompt_ids=[1], token_ids=[i], logprobs=[0.0],
                        versions=[0], loss_mask=[True], finish_reason="stop", start_version=0)
             for i in range(4)]
    scorer.submit("a", record, group)
    assert started.wait(5.0)  # one sample is being scored, three wait in the queue
    threading.Timer(0.2, release.set).start()
    with caplog.at_level(logging.ERROR, logger="concurrent.futures"):
        scorer.close()
    assert not [r for r in caplog.records if r.name == "concurrent.futures"]
    assert scorer.samples_cancelled == 3 and scorer.collect() == []


def test_simulated_trainer_time_needs_the_interleaved_schedule() -> None:
    simulated = PipelineConfig(schedule="interleaved", decode_steps_per_train_step=4)
    assert simulated.decode_steps_per_train_step == 4
    assert PipelineConfig().schedule == "threaded"
    with pytest.raises(ValidationError, match="decode_steps_per_train_step: needs schedule: interleaved"):
        PipelineConfig(decode_steps_per_train_step=4)
