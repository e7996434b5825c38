"""Agentic (multi-turn) rollouts on 2 vLLM engine actors behind the Ray engine pool, on this CPU.

The pool has no `extend`: `TrajectoryEngine` in the controller re-submits each turn with the whole
context, carrying the episode group's `cache_key`; the pool sends the turn to the engine that ran
the key last, and there vLLM's prefix cache (scoped by that key as its `cache_salt`) serves the
context already computed.

- Direct: 4 episodes of an environment that always answers (3 observations, so 2-4 turns each)
  over the pool build the same greedy trajectories as over the embedded engine; every turn of an
  episode ran on one engine (the engine ids each episode records per turn), both engines ran
  episodes, every turn was one vLLM request, and each engine read prompt tokens from its prefix
  cache. With one sample per request and a salt per episode, a first turn can read nothing from
  the cache, so every cached token is a later turn reading its own episode's context, on the
  engine that computed it.
- A run: `scalerl train generation.engine=vllm distributed.backend=ray distributed.num_engines=2`
  on tool_math with the calculator environment (the agentic warm start, which calls the tool):
  two-turn episodes, no turn on another engine than its episode's previous one
  (`agentic_engine_switches` 0), later turns placed on their episode's engine
  (`pool_sticky_requests`), and the engines' prefix-cache hits in the step rows.

Needs vLLM and Ray; slow (two vLLM start-ups per test on a loaded 2-core machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm)")
ray = pytest.importorskip("ray", reason="Ray is not installed (the distributed extra)")

import torch  # noqa: E402
from test_vllm_agentic import EOS, trajectories  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from vllm_helpers import local_ray, vllm_device  # noqa: E402

from scalerl.config import DistributedConfig  # noqa: E402
from scalerl.distributed.engine_actor import EngineFactory  # noqa: E402
from scalerl.distributed.pool import EnginePool  # noqa: E402
from scalerl.rollout.embedded import EmbeddedEngine  # noqa: E402
from scalerl.rollout.factory import EngineSpec  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow
KEYS = ("vllm_requests", "vllm_prompt_tokens", "vllm_cached_prompt_tokens")
DIST = DistributedConfig(backend="ray", num_engines=2, engine_num_cpus=1, timeout_s=60, startup_timeout_s=300)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_ray(ROOT, HERE, ROOT / "tests") as r:
        yield r


@pytest.mark.timeout(600)
def test_episodes_stay_on_one_vllm_engine_and_read_its_prefix_cache(cluster: Any,
                                                                     tiny_dirs: tuple[Path, Path]) -> None:
    # 32-token blocks: the ~50-token contexts of these episodes fill some (only full blocks are cached).
    spec = EngineSpec(kind="vllm", model_path=str(tiny_dirs[0]), fp32_lm_head=True, seed=0, max_batch_size=8,
                      eos_token_ids=(EOS,), max_model_len=512, options={"block_size": 32})
    pool = EnginePool.launch([EngineFactory(spec), EngineFactory(spec)], DIST)
    try:
        remote = trajectories(pool)
        stats = pool.stats()
        per_engine = [m.figures for m in pool.members]
    finally:
        pool.close()
    model = AutoModelForCausalLM.from_pretrained(tiny_dirs[0], dtype=torch.float32).to(vllm_device()).eval()
    local = trajectories(EmbeddedEngine(model, max_batch_size=8, fp32_lm_head=True, eos_token_ids=(EOS,)))
    assert [c.token_ids for c in remote] == [c.token_ids for c in local]
    assert [c.loss_mask for c in remote] == [c.loss_mask for c in local]
    assert [c.metadata["agentic"]["segments"] for c in remote] == [c.metadata["agentic"]["segments"]
                                                                   for c in local]
    for x, y in zip(remote, local, strict=True):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)

    infos = [c.metadata["agentic"] for c in remote]
    turns = [i["turns"] for i in infos]
    print(f"pool: turns {turns}, engines {[i['turn_engines'] for i in infos]}, per engine (requests, "
          f"prompt, cached tokens) {[tuple(int(f[k]) for k in KEYS) for f in per_engine]}")
    assert max(turns) >= 2, turns  # later turns exist
    engines = [i["turn_engines"] for i in infos]
    # Every turn of an episode on one engine, recorded once per model turn; both engines used.
    assert all(len(e) == t and len(set(e)) == 1 and e[0] in (0, 1)
               for e, t in zip(engines, turns, strict=True))
    assert {e[0] for e in engines} == {0, 1}, engines
    assert all(i["turn_engines"] == [None] * i["turns"] for i in (c.metadata["agentic"] for c in local))
    # Every turn is one vLLM request (n=1, no interruption): the pool's summed figures say so.
    assert stats["vllm_requests"] == sum(turns)
    assert stats["pool_sticky_requests"] == sum(turns) - len(turns)  # every later turn, none else
    # Each engine read its episodes' later-turn contexts from its prefix cache.
    assert all(f["vllm_cached_prompt_tokens"] > 0 for f in per_engine), per_engine
    assert stats["vllm_cached_prompt_tokens"] == sum(f["vllm_cached_prompt_tokens"] for f in per_engine)
    assert stats["vllm_prefix_hit_rate"] == pytest.approx(
        stats["vllm_cached_prompt_tokens"] / stats["vllm_prompt_tokens"])
    assert stats["vllm_cached_prompt_tokens"] >= 0.1 * stats["vllm_prompt_tokens"], stats


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tests.agentic.tool_run import warm_start_tool_model

    return warm_start_tool_model(tmp_path_factory.mktemp("sft"))


@pytest.mark.timeout(900)
def test_an_agentic_train_run_on_two_vllm_engine_actors(cluster: Any, tool_model: str,
                                                        tmp_path: Path) -> None:
    from tests.agentic.tool_run import OVERRIDES

    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])}
    overrides = [o for o in OVERRIDES if not o.startswith(("max_steps=", "eval."))]
    cmd = [
        sys.executable, "-m", "scalerl.cli", "train", "--model", tool_model, "--output-dir", str(run),
        "--max-steps", "2", "--off-policy", "sync", *overrides, "eval.every=10", "eval.k=1",
        "generation.engine=vllm", "generation.vllm.block_size=32", "agentic.max_turns=2",
        "algorithm.zero_variance_filter=false",
        "distributed.backend=ray", f"distributed.address={cluster.get_runtime_context().gcs_address}",
        "distributed.num_engines=2", "distributed.trainer_world_size=1", "distributed.engine_num_cpus=1",
        "distributed.trainer_num_cpus=0.5", "distributed.timeout_s=60", "distributed.startup_timeout_s=300",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, timeout=800)
    assert proc.returncode == 0, proc.stderr.decode()[-4000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2]
    assert max(r["agentic_turns_max"] for r in steps) == 2  # the warm start calls the calculator
    assert sum(r["agentic_tool_calls_mean"] for r in steps) > 0
    for r in steps:
        assert r["pool_engines_alive"] == 2.0 and r["pool_engine_deaths"] == 0.0
        assert r["agentic_engine_switches"] == 0.0  # every turn on its episode's engine
    last = steps[-1]
    print("run:", [{k: r[k] for k in ("agentic_turns_mean", "agentic_engine_switches", "pool_sticky_requests",
                                      *KEYS, "vllm_prefix_hit_rate")} for r in steps])
    assert last["pool_sticky_requests"] > 0  # later turns were placed on their episode's engine
    assert last["vllm_requests"] > 0 and last["vllm_cached_prompt_tokens"] > 0, last
    hits = [r["vllm_cached_prompt_tokens"] for r in steps]
    assert hits == sorted(hits)  # cumulative over the engines
