"""Keep Routing across SIGKILLs: the engine's recorded MoE routing is in the checkpoint's pipeline
snapshot (sequences in flight, groups queued for the trainer), so a killed and resumed run on the
tiny MoE with `algorithm.keep_routing=true` trains on the very routing the uninterrupted run did.

Were any recorded routing lost on resume, the trainer would route those tokens freely (counted in
`routing_unrecorded_pairs`) and the step rows and final weights would differ from the reference.
`make test-kill-cycles` (marker kill_cycles).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from scalerl.assembly.warm_start import warm_start_default
from scalerl.config import RunConfig
from scalerl.training.sft import SFTConfig

from .helpers import TINY, deterministic, final_weights, finish, launch, run_config, step_rows, write_config
from .test_kill_cycles import MAX_STEPS, kill_cycles

MOE = {**TINY, "num_layers": 2, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
       "shared_expert_intermediate_size": 16}


@pytest.fixture(scope="module")
def tiny_moe_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    cache = tmp_path_factory.mktemp("warm-moe")
    base = RunConfig.model_validate({"model": {"tiny": MOE}, "data": {"synthetic": {"num_prompts": 60}}})
    return str(warm_start_default(base, SFTConfig(steps=2, batch_size=4), cache_dir=Path(cache)))


@pytest.mark.kill_cycles
@pytest.mark.timeout(900)
def test_recorded_routing_survives_sigkills(tmp_path: Path, tiny_moe_model: str) -> None:
    seed = int(os.environ.get("SCALERL_KILL_SEED", random.randrange(1 << 30)))
    print(f"kill-point seed {seed} (SCALERL_KILL_SEED={seed} repeats it)")

    def config(name: str) -> tuple[Path, Path]:
        run_dir = tmp_path / name
        cfg = run_config(tiny_moe_model, run_dir, "pipeline", "interleaved",
                         **{"algorithm.keep_routing": True})
        return run_dir, write_config(cfg, tmp_path / f"{name}.yaml")

    ref_dir, ref_cfg = config("ref")
    code, err = finish(launch(ref_cfg))
    assert code == 0, err[-3000:]
    run_dir, cfg = config("killed")
    targets = kill_cycles(cfg, run_dir, random.Random(seed), 3)

    rows, ref_rows = step_rows(run_dir), step_rows(ref_dir)
    assert [r["step"] for r in rows] == list(range(1, MAX_STEPS + 1)), f"kills after steps {targets}"
    # Steps with no signal (every group zero-variance) run no training pass and log no routing.
    assert sum(r.get("routing_pairs", 0) > 0 for r in rows) >= MAX_STEPS // 2
    for row, ref in zip(rows, ref_rows, strict=True):
        assert row.get("routing_unrecorded_pairs", 0) == 0, row["step"]
        assert deterministic(row) == deterministic(ref), f"step {row['step']} (kills after {targets})"
    w, w_ref = final_weights(run_dir, MAX_STEPS), final_weights(ref_dir, MAX_STEPS)
    assert all(torch.equal(w[k], w_ref[k]) for k in w_ref)
