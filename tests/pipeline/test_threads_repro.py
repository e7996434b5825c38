"""A seed reproduces a run whatever torch's thread count was before it started (the machine's
cores, `OMP_NUM_THREADS`): `train_run` decides the count from the model (scalerl/training/threads.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import scalerl.assembly.build as assemble
from scalerl.assembly.run import train_run
from scalerl.assembly.warm_start import warm_start_default
from scalerl.config import RunConfig
from scalerl.pipeline.driver import RunResult
from scalerl.training.sft import SFTConfig

# Row keys that measure time or machine speed rather than what was computed.
WALL_CLOCK = ("time", "hours", "per_s", "idle", "busy", "_s")


def _rows(run_dir: Path) -> list[dict[str, object]]:
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.append({k: v for k, v in row.items() if not any(w in k for w in WALL_CLOCK)})
    return rows


def test_training_runs_on_the_models_thread_count_not_the_callers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []

    def fake_train(cfg: RunConfig, run_dir: Path, **kwargs: Any) -> RunResult:
        seen.append(torch.get_num_threads())
        return RunResult(steps=0, stop_reason="max_steps")

    monkeypatch.setattr(assemble, "train", fake_train)
    before = torch.get_num_threads()
    try:
        for threads in (3, 2, 1):
            torch.set_num_threads(threads)  # what the machine / OMP_NUM_THREADS would have chosen
            cfg = RunConfig(output_dir=str(tmp_path / f"t{threads}"))  # the tiny default (width 128)
            assert train_run(cfg, Path(cfg.output_dir)) == 0
            assert torch.get_num_threads() == threads  # the caller's count is restored
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 1, 1]


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    base = RunConfig.model_validate({"data": {"synthetic": {"num_prompts": 200}}})
    cache = tmp_path_factory.mktemp("cache")
    return str(warm_start_default(base, SFTConfig(steps=3, batch_size=8), cache_dir=cache))


def test_same_seed_same_rows_on_one_or_two_threads(warm_model: str, tmp_path: Path) -> None:
    """Two runs of the embedded default's width, one started with 2 threads, one with 1: the same
    rows. Without the fix the generator's log-probs (so `logprob_diff_vs_gen`, the IS ratios and
    the loss) differ in the last bits from the first step: the engine's batched decode sums in a
    thread-dependent order."""
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (2, 1):
            torch.set_num_threads(threads)
            out = tmp_path / f"t{threads}"
            cfg = RunConfig.model_validate({
                "name": "repro", "max_steps": 2, "output_dir": str(out),
                "model": {"name_or_path": warm_model},
                "data": {"synthetic": {"num_prompts": 200}, "heldout_size": 8},
                "generation": {"max_new_tokens": 48},
                "pipeline": {"off_policy": "pipeline", "k": 2, "schedule": "interleaved"},
                # A 3-step warm start solves nothing: keep the all-zero groups so the rows carry the
                # trained samples' log-prob statistics.
                "algorithm": {"zero_variance_filter": False},
                "eval": {"every": 2, "k": 1}, "logging": {"progress": False}, "rewards": {"max_workers": 1},
            })
            assert train_run(cfg, out) == 0
            runs.append(_rows(out))
    finally:
        torch.set_num_threads(before)
    assert len(runs[0]) == len(runs[1]) >= 4
    assert "logprob_diff_vs_gen" in runs[0][1]
    for a, b in zip(*runs, strict=True):
        assert a == b


def test_background_threads_compute_with_the_callers_thread_count() -> None:
    """OpenMP's thread count is per OS thread: the generator and engine-pool threads set the count
    `run_threads` chose on the driver's thread explicitly (torch's own ops re-apply it lazily, but
    vLLM's CPU attention reads the thread's OpenMP setting and aborts when a step's count differs
    from the one its metadata was built with: tests/with_vllm/test_vllm_train.py, pipeline mode)."""
    import threading

    from scalerl.training.threads import same_threads_as_caller, torch_threads

    chosen = 1 if torch.get_num_threads() != 1 else 2
    seen: dict[str, int] = {}
    with torch_threads(chosen):
        set_threads = same_threads_as_caller()

        def inherit() -> None:
            set_threads()
            seen["inherit"] = torch.get_num_threads()

        inheriting = threading.Thread(target=inherit)
        inheriting.start()
        inheriting.join()
    assert seen["inherit"] == chosen


def test_generator_thread_takes_the_drivers_thread_count() -> None:
    import scalerl.pipeline.generator as generator

    seen: list[int] = []

    class Probe(generator.Generator):
        def __init__(self) -> None:  # only what start()/_run() touch
            import threading

            self._thread = None
            self._stop = threading.Event()
            self._wake = threading.Event()
            self.idle_poll_s = 0.0
            self._lock = threading.RLock()
            self._side_waiting, self._side_running = [], {}
            self.error = None

        def _iteration(self) -> bool:
            seen.append(torch.get_num_threads())
            self._stop.set()
            return True

        def _set_idle(self, idle: bool) -> None:
            pass

    from scalerl.training.threads import torch_threads

    chosen = 1 if torch.get_num_threads() != 1 else 2
    probe = Probe()
    with torch_threads(chosen):
        probe.start()
        probe._thread.join(10)
    assert probe.error is None and seen == [chosen]
