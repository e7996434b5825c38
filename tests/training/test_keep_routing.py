"""Mixture-of-experts models and Keep Routing (scalerl/models/moe.py, docs/moe.md).

The reference for "the trainer's log-probs under the recorded routing" is an independent,
token-by-token evaluation of every Qwen2-MoE block with the recorded experts (`_reference_block`),
run on each sample alone and unpadded; the trainer's side is the production path (collate, padded
or packed micro-batches, the router patch).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from scalerl.config import AlgorithmConfig, ModelConfig, OptimConfig, RunConfig, TinyModelConfig
from scalerl.data.records import PromptRecord
from scalerl.models.moe import (
    free_topk,
    moe_routers,
    record_routing,
    replay_routing,
    replay_routing_weights,
    routing_disagreements,
    routing_shape,
)
from scalerl.models.tiny import TinyModelSpec, build_tiny_model
from scalerl.pipeline.snapshot import completion_from_plain, completion_to_plain
from scalerl.rollout.embedded import EmbeddedEngine
from scalerl.rollout.protocol import Completion, GenerationRequest, SamplingParams
from scalerl.telemetry.compute import flop_params
from scalerl.training.batch import ScoredGroup, collate
from scalerl.training.forward import RoutingRecord, response_forward
from scalerl.training.policy import Policy, load_policy
from scalerl.training.trainer import Trainer

TINY_MOE = TinyModelConfig(
    hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64,
    max_position_embeddings=128, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
    shared_expert_intermediate_size=16,
)
ATOL = 1e-5


def _policy(seed: int = 0, **tiny: object) -> Policy:
    return load_policy(ModelConfig(tiny=TINY_MOE.model_copy(update=tiny), init_seed=seed), device="cpu")


def _sample(model: nn.Module, *, n_groups: int = 3, n: int = 3, seed: int = 0, max_new: int = 7,
            batch: int = 4, prompt_len: tuple[int, int] = (2, 7)) -> list[ScoredGroup]:
    """Groups sampled by the embedded engine from a copy of `model` (behaviour log-probs and routing
    recorded), with rewards that differ inside every group."""
    engine = EmbeddedEngine(copy.deepcopy(model), max_batch_size=batch, fp32_lm_head=True, seed=seed)
    g = torch.Generator().manual_seed(seed)
    requests = []
    for i in range(n_groups):
        length = int(torch.randint(*prompt_len, (1,), generator=g))
        prompt = torch.randint(12, 100, (length,), generator=g).tolist()
        requests.append(GenerationRequest(f"p{i}", prompt, SamplingParams(n=n, max_new_tokens=max_new,
                                                                          seed=seed + i)))
    done = engine.generate(requests)
    groups = []
    for i in range(n_groups):
        cs = [c for c in done if c.request_id == f"p{i}"]
        rewards = [float(k % 2 == 0) for k in range(n)]
        groups.append(ScoredGroup(PromptRecord(id=f"p{i}", task="toy", prompt="x"), cs, rewards))
    return groups


def _perturb_routers(model: nn.Module, scale: float = 3.0, seed: int = 1) -> None:
    """Move every router's weight so that its own top-k disagrees with the recorded one often."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for r in moe_routers(model):
            r.weight.add_(torch.randn(r.weight.shape, generator=g) * scale * float(r.weight.std()))


# ------------------------------------------------------------------------------------ reference
def _reference_block(block: nn.Module, x: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """Qwen2-MoE block output `[N, H]` for `x [N, H]` with `experts [N, k]` (-1: the router's
    top-k), one token and one expert at a time."""
    gate, ex = block.gate, block.experts
    logits = x @ gate.weight.T
    probs = torch.softmax(logits.float(), dim=-1)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        idx = experts[t].long()
        if bool((idx < 0).any()):
            idx = torch.topk(probs[t], gate.top_k).indices
        w = probs[t, idx]
        if gate.norm_topk_prob:
            w = w / w.sum()
        for j, e in enumerate(idx.tolist()):
            g_, u = (ex.gate_up_proj[e] @ x[t]).chunk(2)
            out[t] += w[j] * (ex.down_proj[e] @ (ex.act_fn(g_) * u))
    shared = torch.sigmoid(block.shared_expert_gate(x)) * block.shared_expert(x)
    return out + shared


@torch.no_grad()
def _reference_logprobs(model: nn.Module, c: Completion) -> list[float]:
    """Log-probs of `c`'s tokens under `model`, alone and unpadded, with every MoE block evaluated
    on `c.routing` by `_reference_block`."""
    blocks = [m for m in model.modules() if hasattr(m, "gate") and hasattr(m, "shared_expert")]
    assert len(blocks) == c.routing.shape[1]
    saved = []
    for layer, block in enumerate(blocks):
        def forward(h: torch.Tensor, block: nn.Module = block, layer: int = layer) -> torch.Tensor:
            b, s, d = h.shape
            return _reference_block(block, h.reshape(-1, d), c.routing[:, layer]).reshape(b, s, d)

        saved.append(block)
        block.forward = forward
    try:
        ids = torch.tensor([*c.prompt_ids, *c.token_ids])[None]
        logits = model(input_ids=ids).logits[0].float()
    finally:
        for block in saved:
            del block.forward
    p = len(c.prompt_ids)
    logp = torch.log_softmax(logits[p - 1 : -1], dim=-1)
    return logp.gather(1, torch.tensor(c.token_ids)[:, None])[:, 0].tolist()


# ------------------------------------------------------------------------------------ the model
def test_tiny_moe_is_built_from_the_config_and_flops_count_active_experts():
    spec = TinyModelSpec(hidden_size=32, num_layers=3, num_heads=2, num_kv_heads=1, num_experts=8,
                         num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24)
    model = build_tiny_model(spec, seed=3)
    assert type(model).__name__ == "Qwen2MoeForCausalLM"
    assert routing_shape(model) == (3, 2)
    assert routing_shape(build_tiny_model(TinyModelSpec(hidden_size=32, num_heads=2, num_kv_heads=1))) is None
    # Closed form: every parameter but the input embedding, the LM head (tied) counted once, the
    # routed experts' weights 2/8 of theirs (3 layers x 8 experts x 3 x 32 x 16 weights).
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    experts = 3 * 8 * 3 * 32 * 16
    assert flop_params(model) == total - embed + embed - experts + experts * 2 // 8
    torch.testing.assert_close(build_tiny_model(spec, seed=3).state_dict(), model.state_dict())


def test_config_refuses_keep_routing_where_it_cannot_work():
    with pytest.raises(ValueError, match=r"model\.tiny\.num_experts"):
        RunConfig(algorithm={"keep_routing": True})
    moe = {"tiny": {"num_experts": 4}}
    with pytest.raises(ValueError, match=r"gradient_checkpointing"):
        RunConfig(algorithm={"keep_routing": True}, model={**moe, "gradient_checkpointing": True})
    with pytest.raises(ValueError, match=r"generation\.engine"):
        RunConfig(algorithm={"keep_routing": True}, model=moe, generation={"engine": "vllm"})
    with pytest.raises(ValueError, match=r"num_experts_per_tok"):
        RunConfig(model={"tiny": {"num_experts": 2, "num_experts_per_tok": 3}})
    assert RunConfig(algorithm={"keep_routing": True}, model=moe).algorithm.keep_routing


def test_replay_weights_closed_form_and_identity_under_the_free_routing():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 8, generator=g)
    idx = torch.tensor([[3, 1]] * 5)
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(replay_routing_weights(logits, idx, False), p[:, [3, 1]])
    norm = p[:, [3, 1]] / p[:, [3, 1]].sum(-1, keepdim=True)
    torch.testing.assert_close(replay_routing_weights(logits, idx, True), norm)
    assert not routing_disagreements(torch.tensor([[1, 3]]), torch.tensor([[3, 1]])).any()
    assert routing_disagreements(torch.tensor([[1, 2]]), torch.tensor([[3, 1]])).all()

    # Replaying the very routing the model chose changes nothing, bit for bit.
    model = _policy().model.eval()
    ids = torch.randint(12, 100, (2, 9), generator=g)
    with torch.no_grad():
        with record_routing(model) as calls:
            free = model(input_ids=ids).logits
        recorded = torch.stack(calls[0], dim=1)
        with replay_routing(model, recorded, replay=True) as tally:
            replayed = model(input_ids=ids).logits
    assert torch.equal(free, replayed)
    assert tally.pairs == 2 * 9 * 2 and tally.mismatched == 0


# ------------------------------------------------------------------------------------ engine -> trainer
def test_engine_records_routing_the_trainer_reproduces():
    policy = _policy()
    groups = _sample(policy.model, batch=3)  # fewer slots than samples: refills and mixed steps
    batch = collate(groups, policy.pad_token_id)
    assert batch.routing is not None and batch.routing.dtype == torch.int16
    for c in (c for grp in groups for c in grp.completions):
        assert c.routing.shape == (len(c.prompt_ids) + c.num_tokens, 2, 2)
        assert (c.routing[:-1] >= 0).all() and (c.routing[-1] == -1).all()  # the last token is never fed
    with torch.no_grad():
        out = response_forward(policy.model, batch, temperature=1.0, fp32_lm_head=True,
                               routing=RoutingRecord(batch.routing, replay=False))
    # Same weights, same precision: the trainer's routers choose what the engine's did.
    assert out.routing.pairs == 2 * sum(int(n) + int(p) - 1 for n, p in
                                        zip(batch.response_lengths, batch.prompt_lengths, strict=True))
    assert out.routing.mismatched == 0
    mask = batch.token_mask
    torch.testing.assert_close(out.logprobs[mask], batch.behavior_logprobs[mask], rtol=0, atol=ATOL)


@pytest.mark.parametrize("norm_topk_prob", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_replay_equals_the_recomputation_under_the_recorded_routing(packed, norm_topk_prob):
    engine_policy = _policy(norm_topk_prob=norm_topk_prob)
    groups = _sample(engine_policy.model)
    trainer_model = copy.deepcopy(engine_policy.model)
    _perturb_routers(trainer_model)  # the trainer's routers now choose differently
    batch = collate(groups, engine_policy.pad_token_id)
    completions = [c for grp in groups for c in grp.completions]
    want = [_reference_logprobs(trainer_model, c) for c in completions]
    mask = batch.token_mask
    with torch.no_grad():
        replayed = response_forward(trainer_model, batch, temperature=1.0, fp32_lm_head=True, packed=packed,
                                    routing=RoutingRecord(batch.routing, replay=True))
        free = response_forward(trainer_model, batch, temperature=1.0, fp32_lm_head=True, packed=packed,
                                routing=RoutingRecord(batch.routing, replay=False))
    assert free.routing.mismatched > 0.2 * free.routing.pairs  # the constructed disagreement
    assert replayed.routing.unrecorded == 0
    for row, (c, lp) in enumerate(zip(completions, want, strict=True)):
        got = replayed.logprobs[row, : c.num_tokens]
        torch.testing.assert_close(got, torch.tensor(lp), rtol=0, atol=ATOL)
    gap = (free.logprobs - replayed.logprobs)[mask].abs().max()
    assert gap > 1e-3  # free routing gives other log-probs: the comparison above can fail


def test_gradients_reach_only_the_recorded_experts():
    policy = _policy()
    groups = _sample(policy.model, n_groups=1, n=1, max_new=2, prompt_len=(2, 3))
    c = groups[0].completions[0]
    assert len(c.prompt_ids) + c.num_tokens <= 4  # <= 3 routed positions x 2 experts < 8 experts
    model = copy.deepcopy(policy.model)
    _perturb_routers(model, seed=5)
    batch = collate(groups, policy.pad_token_id)
    used_by_free = []
    for replay in (True, False):
        model.zero_grad()
        out = response_forward(model, batch, temperature=1.0, fp32_lm_head=True,
                               routing=RoutingRecord(batch.routing, replay=replay))
        out.logprobs[batch.token_mask].sum().backward()
        blocks = [m for m in model.modules() if hasattr(m, "gate") and hasattr(m, "shared_expert")]
        for layer, block in enumerate(blocks):
            grad = block.experts.gate_up_proj.grad.abs().sum(dim=(1, 2))
            touched = {int(e) for e in torch.nonzero(grad).flatten()}
            if replay:
                # The last layer's output at a position reaches only that position's prediction, so
                # there only the positions predicting response tokens (P - 1 ..) pass gradient.
                first = len(c.prompt_ids) - 1 if layer == len(blocks) - 1 else 0
                assert touched == {int(e) for e in c.routing[first:-1, layer].flatten()}, layer
                assert float(block.gate.weight.grad.abs().sum()) > 0  # the router keeps learning
            else:
                used_by_free.append(touched)
    recorded = [{int(e) for e in c.routing[:-1, layer].flatten()} for layer in range(2)]
    assert used_by_free != recorded  # the perturbed routers' own choice is another set


def test_trainer_step_logs_the_routing_mismatch_with_and_without_replay():
    policy = _policy()
    groups = _sample(policy.model)
    # Training under other router weights than the sampler's (a lagging pipeline in miniature).
    _perturb_routers(policy.model, scale=2.0)
    optim = OptimConfig(lr=1e-3, micro_batch_size=4, micro_batch_tokens=40)
    metrics = {}
    for keep in (False, True):
        trainer = Trainer(copy.deepcopy(policy), AlgorithmConfig(keep_routing=keep,
                                                                 recompute_old_logprobs=True), optim)
        metrics[keep] = trainer.step(copy.deepcopy(groups))
    for m in metrics.values():
        assert m["routing_pairs"] > 0 and m["routing_unrecorded_pairs"] == 0
        assert 0.05 < m["routing_mismatch"] < 1
    # Replay puts the trainer back on the engine's experts: its log-probs move closer to the sampler's.
    assert metrics[True]["logprob_diff_vs_gen"] < metrics[False]["logprob_diff_vs_gen"]

    dense = load_policy(ModelConfig(tiny=TINY_MOE.model_copy(update={"num_experts": 0})), device="cpu")
    with pytest.raises(ValueError, match=r"algorithm\.keep_routing"):
        Trainer(dense, AlgorithmConfig(keep_routing=True), optim)


def test_routing_survives_engine_snapshot_and_completion_checkpoint(tmp_path):
    policy = _policy()
    requests = [GenerationRequest("a", [20, 21, 22], SamplingParams(n=3, max_new_tokens=8, seed=4)),
                GenerationRequest("b", [30, 31], SamplingParams(n=2, max_new_tokens=6, seed=5))]

    def engine() -> EmbeddedEngine:
        return EmbeddedEngine(copy.deepcopy(policy.model), max_batch_size=3, fp32_lm_head=True, seed=1)

    straight = engine().generate(requests)
    first = engine()
    first.submit(requests)
    done = []
    for _ in range(3):
        done += first.step()
    path = tmp_path / "engine.pt"
    torch.save(first.snapshot(), path)
    second = engine()
    second.restore(torch.load(path, weights_only=True))
    while second.num_unfinished():
        done += second.step()
    key = lambda c: (c.request_id, c.sample_index)  # noqa: E731
    resumed = sorted(done, key=key)
    for a, b in zip(sorted(straight, key=key), resumed, strict=True):
        assert a == b and torch.equal(a.routing, b.routing)
        torch.save(completion_to_plain(b), tmp_path / "c.pt")
        back = completion_from_plain(torch.load(tmp_path / "c.pt", weights_only=True))
        assert back == b and torch.equal(back.routing, b.routing)


def test_free_topk_is_the_routers_own_choice():
    model = _policy().model.eval()
    router = moe_routers(model)[0]
    x = torch.randn(6, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, _, idx = router(x)
        assert torch.equal(free_topk(x @ router.weight.T, 2), idx)


def test_load_balancing_loss_is_the_models_own_and_reaches_the_router():
    from transformers.models.qwen2_moe.modeling_qwen2_moe import load_balancing_loss_func

    from scalerl.models.moe import load_balancing_loss

    g = torch.Generator().manual_seed(3)
    logits = [torch.randn(2 * 5, 8, generator=g) for _ in range(3)]  # 3 layers, batch 2 x 5 tokens
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, 3:] = 0
    probs = [torch.softmax(z, -1) for z in logits]
    idx = [torch.topk(p, 2, -1).indices for p in probs]
    want = load_balancing_loss_func(tuple(logits), 8, 2, mask)
    torch.testing.assert_close(load_balancing_loss(probs, idx, 8, mask.reshape(-1).bool()), want)
    uniform = [torch.full((4, 8), 1 / 8)]
    balanced = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7]])
    assert float(load_balancing_loss(uniform, [balanced], 8)) == 2.0  # k, at a balanced routing

    policy = _policy()
    groups = _sample(policy.model)
    optim = OptimConfig(lr=1e-3, micro_batch_size=4)
    grads, metrics = {}, {}
    for coef in (0.0, 0.5):
        trainer = Trainer(copy.deepcopy(policy), AlgorithmConfig(router_aux_loss_coef=coef), optim)
        metrics[coef] = trainer.compute_gradients(copy.deepcopy(groups))
        grads[coef] = moe_routers(trainer.policy.model)[0].weight.grad.clone()
    assert 0 < metrics[0.5]["router_aux_loss"] < 8  # 0 < L_aux <= E (all load on one expert)
    assert metrics[0.0]["router_aux_loss"] != metrics[0.0]["router_aux_loss"]  # NaN: off
    assert metrics[0.5]["loss"] == pytest.approx(metrics[0.0]["loss"], abs=1e-6)  # `loss` is the policy's
    assert not torch.allclose(grads[0.5], grads[0.0])


def test_an_moe_checkpoint_loads_back_into_the_model(tmp_path):
    from scalerl.training.checkpoint import load_model_weights

    policy = _policy()
    policy.model.save_pretrained(str(tmp_path))  # transformers 5: per-expert tensors on disk
    other = _policy(seed=4).model
    load_model_weights(other, tmp_path)
    torch.testing.assert_close(other.state_dict(), policy.model.state_dict(), rtol=0, atol=0)
