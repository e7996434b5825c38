"""FSDP2 (`torch.distributed.fsdp.fully_shard`) applied to a Hugging Face causal LM.

Each decoder layer is its own FSDP unit (its parameters are all-gathered just before its forward
and its gradients reduce-scattered right after its backward), and the model itself is the root
unit holding the rest (embeddings, final norm, LM head, tied or not). Parameters become `DTensor`s
sharded along dim 0 over the mesh; names do not change, so state dicts keep Hugging Face names.

Two things differ from FSDP's defaults, both for exactness:

- Gradients are SUMMED over ranks, not averaged: each rank's loss is its share of the global loss
  (the aggregation weights carry global denominators), so the full-batch gradient is the sum.
- The trainer does not call `model.forward` (which would project every position through the LM
  head in the model dtype); it calls `training.forward.response_forward`. That function is
  registered as an FSDP forward method (`RESPONSE_FORWARD`), so the root unit's parameters are
  gathered around it exactly as around `forward`; calling the decoder or the head directly on a
  sharded model would otherwise see the root's parameters still sharded.
"""

from __future__ import annotations

import types
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method

from scalerl.models.lm_head import decoder_of
from scalerl.training.forward import ResponseForward, response_forward

RESPONSE_FORWARD = "scalerl_response_forward"


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of `model`: modules of the classes its `_no_split_modules` names
    (the Hugging Face convention for "shard/offload no finer than this"), else `decoder.layers`."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        layers = list(getattr(decoder_of(model), "layers", None) or ())
    if not layers:
        raise TypeError(
            f"{type(model).__name__}: no decoder layers found to shard (no _no_split_modules match "
            "and no get_decoder().layers)"
        )
    return layers


def _response_forward(self: nn.Module, batch: Any, **kwargs: Any) -> ResponseForward:
    return response_forward(self, batch, **kwargs)


def shard_causal_lm(model: nn.Module, mesh: DeviceMesh, *, reshard_after_forward: bool = True) -> nn.Module:
    """Apply `fully_shard` per decoder layer and at the root, in place; return `model`.

    Parameters move to the mesh's device shard by shard, so a model loaded on the CPU ends up
    holding only its shard on the accelerator. Gradient checkpointing, if enabled on the model,
    must be enabled before this call (it wraps the layers' forward).
    """
    if isinstance(model, FSDPModule):
        raise ValueError(f"{type(model).__name__}: already sharded")
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # Divide by 1 and reduce with a plain SUM (gloo has no pre-multiplied sum).
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    setattr(model, RESPONSE_FORWARD, types.MethodType(_response_forward, model))
    register_fsdp_forward_method(model, RESPONSE_FORWARD)
    return model


def sharded_response_forward(model: nn.Module, batch: Any, **kwargs: Any) -> ResponseForward:
    """`response_forward` on a model prepared by `shard_causal_lm`."""
    method = getattr(model, RESPONSE_FORWARD, None)
    if method is None:
        raise TypeError(f"{type(model).__name__}: not prepared by shard_causal_lm")
    return method(batch, **kwargs)
