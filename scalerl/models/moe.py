"""Mixture-of-experts routing: find a model's routers, record their choices, replay recorded ones.

Keep Routing (DeepSeek-V3.2, arXiv 2512.02556, §3.1 "Keep Routing"; also "routing replay", R3,
arXiv 2510.11370): the experts an inference engine chose for a token can differ from the ones the
trainer's router picks for the same token (other kernels, other precision, weights that moved in
between), which switches the active parameter subspace under the policy gradient. The engine records
the selected experts of every token at every MoE layer; the trainer then uses exactly those experts.

The replay rule (`replay_routing_weights`), for a router with logits `z [E]` and recorded experts
`i_1..i_k`:

    p = softmax(z)                    (over all E experts, float32, as the model's own router)
    w_j = p[i_j]                      (gathered at the recorded experts, in the recorded order)
    w_j = w_j / sum_j w_j             iff the model's `norm_topk_prob`

so the selection is the engine's while the gate weights are the current router's: their gradient
reaches the router's weight (through the softmax over all experts), and the router keeps learning.
This is what the model's own router computes when its top-k happens to equal the recorded experts
(Qwen2-MoE / Qwen3-MoE `TopKRouter.forward`: softmax, top-k, optional renormalisation), so with a
recorded routing equal to the free one, replay changes nothing, bit for bit.

Layout: a routing record is an int16 tensor `[tokens, layers, k]` (layers: the MoE layers in model
order, `moe_routers`), -1 where a token has no record (padding, the last sampled token, which is
never fed back); such a token is routed freely.

Supported routers: modules with `weight [E, H]`, `top_k`, `num_experts`, `norm_topk_prob` and a
`forward(hidden) -> (logits, weights, indices)` (transformers 5 `Qwen2MoeTopKRouter`,
`Qwen3MoeTopKRouter` and the routers built on them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.nn import functional

#: dtype of a routing record (expert ids < 32768; -1 = no record).
ROUTING_DTYPE = torch.int16
NO_ROUTE = -1


def _is_router(module: nn.Module) -> bool:
    return (
        type(module).__name__.endswith("TopKRouter")
        and isinstance(getattr(module, "weight", None), Tensor)
        and isinstance(getattr(module, "top_k", None), int)
        and isinstance(getattr(module, "num_experts", None), int)
    )


def moe_routers(model: nn.Module) -> list[nn.Module]:
    """The top-k routers of `model` in module order (= layer order for HF decoders); [] if dense."""
    return [m for m in model.modules() if _is_router(m)]


def routing_shape(model: nn.Module) -> tuple[int, int] | None:
    """`(MoE layers, experts per token)` of `model`, or None for a dense model."""
    routers = moe_routers(model)
    if not routers:
        return None
    ks = {int(r.top_k) for r in routers}
    if len(ks) != 1:
        raise ValueError(f"MoE routers with different top_k {sorted(ks)}: not supported")
    return len(routers), ks.pop()


def replay_routing_weights(logits: Tensor, indices: Tensor, norm_topk_prob: bool) -> Tensor:
    """Gate weights `[N, k]` of recorded experts `indices [N, k]` under router logits `[N, E]`.

    `w = softmax(z)[indices]`, renormalised to sum 1 iff `norm_topk_prob` (module docstring; the
    Qwen2-MoE/Qwen3-MoE router's arithmetic with its top-k replaced by the record). Returned in the
    logits' dtype, as the model's router returns them.
    """
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    weights = probs.gather(-1, indices.long())
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype)


def free_topk(logits: Tensor, k: int) -> Tensor:
    """The experts the router itself selects: top-k of softmax(logits) `[N, k]` (its order)."""
    probs = torch.softmax(logits.detach(), dim=-1, dtype=torch.float)
    return torch.topk(probs, k, dim=-1).indices


def routing_disagreements(free: Tensor, recorded: Tensor) -> Tensor:
    """`[N]` bool: the expert *sets* of `free [N, k]` and `recorded [N, k]` differ (order ignored:
    the MoE output sums over the set, so a permutation computes the same)."""
    a = torch.sort(free.long(), dim=-1).values
    b = torch.sort(recorded.long(), dim=-1).values
    return (a != b).any(dim=-1)


@dataclass
class RoutingTally:
    """(token, layer) pairs with a record seen by a forward, and how many of them the router's own
    top-k chose differently from the record (the routing mismatch)."""

    pairs: int = 0
    mismatched: int = 0
    # Pairs routed freely although replay was asked for: tokens without a record.
    unrecorded: int = 0
    # With `capture`: per MoE layer the router's probabilities `[N, E]` (differentiable) and the
    # experts used `[N, k]`, for the load-balancing loss.
    probs: list[Tensor] = field(default_factory=list)
    indices: list[Tensor] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.mismatched / self.pairs if self.pairs else 0.0


@contextmanager
def replay_routing(
    model: nn.Module, recorded: Tensor | None, *, replay: bool, counted: Tensor | None = None,
    capture: bool = False,
) -> Iterator[RoutingTally]:
    """Within the block, every router of `model` reads its layer's slice of `recorded [N, layers, k]`
    (N = the tokens of the forward, flattened in the decoder's order): with `replay`, the recorded
    experts replace its top-k (`replay_routing_weights`; tokens with -1 are routed freely); either
    way the disagreements between its own top-k and the record are tallied, over the tokens
    `counted [N]` selects (default all; padding is routed but not counted). Without a record
    (`recorded=None`) every token is routed freely and nothing is tallied. `capture` keeps each
    layer's router probabilities and experts in the tally (`load_balancing_loss`).

    One forward per block: a router called twice (gradient checkpointing's recomputation) would
    read the record twice, so callers refuse that combination (`algorithm.keep_routing`).
    """
    routers = moe_routers(model)
    if recorded is not None and (recorded.dim() != 3 or recorded.shape[1] != len(routers)):
        raise ValueError(
            f"routing record of shape {tuple(recorded.shape)} for a model with {len(routers)} MoE layers"
        )
    tally = RoutingTally()
    originals: list[tuple[nn.Module, object]] = []

    def patched(router: nn.Module, layer: int) -> Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]:
        def forward(hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            hidden = hidden_states.reshape(-1, router.weight.shape[1])
            logits = functional.linear(hidden, router.weight)
            free = free_topk(logits, int(router.top_k))
            indices = free
            if recorded is not None:
                record = recorded[:, layer].to(logits.device)
                if record.shape[0] != logits.shape[0]:
                    raise ValueError(
                        f"routing record has {record.shape[0]} tokens, the forward {logits.shape[0]}"
                    )
                has = (record >= 0).all(dim=-1)
                counts = (torch.ones_like(has) if counted is None else counted.to(has.device).bool())
                tally.pairs += int((has & counts).sum())
                tally.mismatched += int((routing_disagreements(free, record) & has & counts).sum())
                if replay:
                    tally.unrecorded += int((~has & counts).sum())
                    indices = torch.where(has[:, None], record.long(), free)
            weights = replay_routing_weights(logits, indices, bool(router.norm_topk_prob))
            if capture:
                tally.probs.append(torch.softmax(logits, dim=-1, dtype=torch.float))
                tally.indices.append(indices)
            return logits, weights, indices

        return forward

    try:
        for layer, router in enumerate(routers):
            originals.append((router, router.__dict__.get("forward")))
            router.forward = patched(router, layer)  # type: ignore[method-assign]
        yield tally
    finally:
        for router, original in originals:
            if original is None:
                del router.forward
            else:
                router.forward = original  # type: ignore[method-assign]


@contextmanager
def record_routing(model: nn.Module) -> Iterator[list[list[Tensor]]]:
    """Within the block, collect every router's selected experts: `out[call][layer]` is the
    `[tokens, k]` indices of one forward (int16, CPU). For the engine's recording."""
    routers = moe_routers(model)
    calls: list[list[Tensor]] = []
    current: dict[int, Tensor] = {}

    def hook(layer: int) -> Callable[..., None]:
        def fn(_module: nn.Module, _args: object, output: tuple[Tensor, Tensor, Tensor]) -> None:
            current[layer] = output[2].detach().to("cpu", ROUTING_DTYPE)
            if len(current) == len(routers):
                calls.append([current[i] for i in range(len(routers))])
                current.clear()

        return fn

    handles = [r.register_forward_hook(hook(i)) for i, r in enumerate(routers)]
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def load_balancing_loss(probs: list[Tensor], indices: list[Tensor], num_experts: int,
                        mask: Tensor | None = None) -> Tensor:
    """The Switch Transformer load-balancing loss (Fedus et al. 2022, JMLR, eq. 4-6) as transformers'
    `load_balancing_loss_func` computes it for Qwen2-MoE: over every (token, layer) pair of the
    tokens `mask [N]` selects,

        L_aux = E * sum_e f_e * P_e,   f_e = share of the pairs' k expert slots that chose e (per
                                        slot j: [k, E]), P_e = mean router probability of e,

    summed over the k slots: k at a perfectly balanced routing (each slot's f_e summing to 1 with
    P_e = 1/E), larger the more the load concentrates. Its gradient reaches the router through P."""
    p = torch.cat(probs)  # [layers * N, E]
    idx = torch.cat(indices)  # [layers * N, k]
    if mask is None:
        m = torch.ones(p.shape[0], device=p.device)
    else:
        m = mask.float().to(p.device).repeat(len(probs))
    total = m.sum().clamp(min=1.0)
    hits = functional.one_hot(idx.long(), num_experts).float()  # [layers * N, k, E]
    f = (hits * m[:, None, None]).sum(0) / total  # [k, E]
    mean_p = (p * m[:, None]).sum(0) / total  # [E]
    return num_experts * (f * mean_p[None]).sum()


def active_expert_fraction(model: nn.Module) -> dict[int, float]:
    """`id(parameter) -> k / E` for the routed experts' weights of every MoE block of `model`: the
    share of them a token runs through (for FLOPs, `telemetry.compute.flop_params`). The router and
    a shared expert run for every token and are not listed."""
    out: dict[int, float] = {}
    for module in model.modules():
        gate, experts = getattr(module, "gate", None), getattr(module, "experts", None)
        if gate is None or experts is None or not _is_router(gate):
            continue
        frac = int(gate.top_k) / int(gate.num_experts)
        for p in experts.parameters():
            out[id(p)] = frac
    return out
