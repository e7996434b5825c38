"""LoRA adapters through peft: wrapping a causal LM, and its merged weights for the engines.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", arXiv 2106.09685,
eq. 3) replaces a frozen linear layer's `h = W x` by

    h = W x + (alpha / r) B A x,    A: r x d_in,  B: d_out x r,  B = 0 at the start,

and trains only A and B. The generation engines never see the adapter: they are sent the merged
weights `W' = W + (alpha / r) B A` (`merged_state_dict`), keyed by the base model's own parameter
names, computed from the training model without changing it (peft's `merge_adapter` would merge
into the training weights in place, and an optimizer step between merge and unmerge would be
lost). The sync verification (`scalerl.rollout.fingerprint`) then compares the engine's tensors
with these merged ones where the engine can read them back, and the probe (`scalerl.rollout.probe`)
its log-probs with the trainer's everywhere, so an adapter that never reached the engine (verl#7495)
is a `WeightSyncError`, not "staleness".
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

ADAPTER_NAME = "default"


def is_lora(model: nn.Module) -> bool:
    """Whether `model` is a peft model (a LoRA-wrapped policy)."""
    try:
        from peft import PeftModel
    except ImportError:  # peft not installed: nothing can be wrapped
        return False
    return isinstance(model, PeftModel)


def wrap_lora(model: nn.Module, r: int, alpha: float, dropout: float,
              target_modules: list[str] | str) -> nn.Module:
    """`model` with LoRA adapters of rank `r` on `target_modules` ("all-linear": every linear layer
    but the output head), every base weight frozen. The base module is modified in place (peft
    swaps its linear layers); B starts at zero, so the wrapped model computes what `model` did."""
    if r <= 0:
        raise ValueError(f"model.lora.r: expected > 0 to wrap, got {r}")
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ImportError("model.lora.r > 0 needs peft: pip install 'scalerl[lora]'") from None
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules,
                        bias="none", task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, config, adapter_name=ADAPTER_NAME)
    except ValueError as err:  # peft: target modules not found in the model
        raise ValueError(f"model.lora.target_modules={target_modules!r}: {err}") from None


def lora_delta(lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float) -> torch.Tensor:
    """`scaling * B @ A`, the update LoRA adds to a linear layer's `W` (Hu et al. 2021, eq. 3;
    `scaling` = alpha / r), in float32 (`[d_out, d_in]`)."""
    return scaling * (lora_b.detach().float() @ lora_a.detach().float())


def _lora_layers(base: nn.Module) -> Iterator[tuple[str, Any]]:
    from peft.tuners.lora import LoraLayer

    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            yield name, module


class MergedWeight:
    """`W + scaling * B A` of one adapted linear layer, computed only when asked (`full_tensor`).

    Holds the three tensors as the caller has them: plain tensors (one process) or FSDP2
    `DTensor` shards (each is all-gathered in `full_tensor`: a collective, so every rank must ask
    for the same merged weights in the same order). `shape`, `dtype`, `numel()`, `element_size()`
    are those of the base weight (what the engine receives), so a bucket plan
    (`scalerl.distributed.weights.plan_buckets`) can be made without gathering anything.
    """

    def __init__(self, base: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                 scaling: float) -> None:
        self.base = base
        self.lora_a = lora_a
        self.lora_b = lora_b
        self.scaling = float(scaling)

    @property
    def shape(self) -> torch.Size:
        return self.base.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.base.dtype

    def numel(self) -> int:
        return self.base.numel()

    def element_size(self) -> int:
        return self.base.element_size()

    def full_tensor(self) -> torch.Tensor:
        """The merged weight, whole, in the base weight's dtype on its device (float32 arithmetic:
        `(W.float() + scaling * B.float() @ A.float()).to(W.dtype)`)."""
        weight, lora_a, lora_b = (_whole(t) for t in (self.base, self.lora_a, self.lora_b))
        delta = lora_delta(lora_a, lora_b, self.scaling)
        return (weight.detach().float() + delta.to(weight.device)).to(weight.dtype)


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered whole (a collective), a plain tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def merged_tensors(model: nn.Module, state: Mapping[str, torch.Tensor] | None = None
                   ) -> dict[str, torch.Tensor | MergedWeight]:
    """The weights the engines get from `model` (a LoRA peft model), keyed by the base model's
    names (`model.layers.0.self_attn.q_proj.weight`, ...), nothing copied or gathered: every
    adapted linear layer's weight as a `MergedWeight`, every other tensor as `state` holds it.

    `state` is the base model's state dict (`model.get_base_model().state_dict()` by default; on
    FSDP2 ranks, its sharded state dict: `DTensor`s, merged per layer when gathered)."""
    base = model.get_base_model()
    if state is None:
        state = base.state_dict()
    out: dict[str, torch.Tensor | MergedWeight] = {}
    for key, value in state.items():
        if ".lora_" in key:
            continue
        out[key.replace(".base_layer.", ".")] = value
    for name, layer in _lora_layers(base):
        if layer.merged:
            raise RuntimeError(f"{name}: adapter merged into the training weights in place; "
                               "the merged weights need the unmerged layer")
        if layer.use_dora.get(ADAPTER_NAME) or getattr(layer, "fan_in_fan_out", False):
            raise NotImplementedError(f"{name}: DoRA / fan-in-fan-out LoRA layers are not supported")
        if ADAPTER_NAME not in layer.lora_A:
            continue
        out[f"{name}.weight"] = MergedWeight(
            state[f"{name}.base_layer.weight"], state[f"{name}.lora_A.{ADAPTER_NAME}.weight"],
            state[f"{name}.lora_B.{ADAPTER_NAME}.weight"], float(layer.scaling[ADAPTER_NAME]))
    tied = _tied_head_key(base)
    if tied is not None:
        # A tied head shares the embedding's tensor: keep it one tensor for the engine too.
        head_key, embed_key = tied
        if head_key in out and embed_key in out:
            out[head_key] = out[embed_key]
    return out


def merged_state_dict(model: nn.Module, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The weights of the model that `model` (a LoRA peft model) computes, as a plain state dict
    keyed by the base model's names (`merged_tensors`, materialised): `W + scaling * B A` for every
    adapted linear layer, every other tensor as it is. Copies on `device`; the training model is
    not changed."""
    out: dict[str, torch.Tensor] = {}
    made: dict[int, torch.Tensor] = {}  # a tied tensor stays one tensor
    for key, value in merged_tensors(model).items():
        if id(value) not in made:
            whole = value.full_tensor() if isinstance(value, MergedWeight) else value.detach()
            made[id(value)] = whole.to(device, copy=True)
        out[key] = made[id(value)]
    return out


def _tied_head_key(base: nn.Module) -> tuple[str, str] | None:
    head, embed = base.get_output_embeddings(), base.get_input_embeddings()
    if head is None or embed is None or head.weight is not embed.weight:
        return None
    names = {id(m): n for n, m in base.named_modules()}
    return f"{names[id(head)]}.weight", f"{names[id(embed)]}.weight"


def base_copy(model: nn.Module) -> nn.Module:
    """A plain (peft-free) copy of the base of `model` (a LoRA peft model), its adapter left out
    (`unload`: the layers given back unmerged); `model` is unchanged."""
    return copy.deepcopy(model).unload()


def own_adapter_like(model: nn.Module, lm: nn.Module, seed: int) -> nn.Module:
    """`lm` wrapped in a LoRA adapter of its own with `model`'s adapter settings (rank, alpha,
    dropout, target modules), A drawn from `seed` on a forked RNG (the caller's RNG untouched)."""
    cfg = model.peft_config[ADAPTER_NAME]
    targets = cfg.target_modules
    targets = sorted(targets) if isinstance(targets, set) else targets
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return wrap_lora(lm, int(cfg.r), float(cfg.lora_alpha), float(cfg.lora_dropout), targets)


def merged_copy(model: nn.Module) -> nn.Module:
    """A plain (peft-free) copy of `model` with the adapter merged in; `model` is unchanged."""
    return copy.deepcopy(model).merge_and_unload()


@contextmanager
def adapter_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """`model` computing its base weights only (the KL reference: the policy without its adapter,
    no second copy of the base)."""
    with model.disable_adapter():
        yield model


def trainable_share(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts of `model` (tied tensors once)."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total
