"""The trainer's forward pass: response-token log-probs (and entropies) of a `TrainBatch`.

Built from the same pieces as `scalerl.models.lm_head.sequence_logprobs` (the decoder, then
`lm_head_logits` and `token_logprobs` on the response positions only), so trainer and generator
log-probs come from one implementation; the only addition is the entropy, which needs the logits
that function keeps to itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor

from scalerl.algorithms.entropy import entropy_from_logits
from scalerl.models.lm_head import decoder_of, lm_head_logits, token_logprobs

EntropyMode = Literal["none", "metric", "grad"]


class TokenLayout(Protocol):
    """`[left-padded prompt | right-padded response]` tensors (`TrainBatch`, `PaddedTokens`)."""

    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor
    prompt_width: int
    token_mask: Tensor

    @property
    def response_ids(self) -> Tensor: ...


@dataclass
class ResponseForward:
    logprobs: Tensor  # [n, T] float32, differentiable unless run under no_grad
    entropy: Tensor | None  # [n, T] float32 (detached in "metric" mode), 0 at padding


def response_forward(
    model: torch.nn.Module,
    batch: TokenLayout,
    *,
    temperature: float,
    fp32_lm_head: bool,
    entropy: EntropyMode = "none",
    support: Tensor | None = None,
) -> ResponseForward:
    """Log-probs of `batch`'s response tokens under `model` at the sampling `temperature`.

    `support` (`[N, T, V]` bool, True = the sampler could draw it) renormalises over the top-k/top-p
    support recorded by the sampler (keep-sampling-mask).
    """
    p = batch.prompt_width
    out = decoder_of(model)(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    )
    hidden = out.last_hidden_state[:, p - 1 : -1]
    logits = lm_head_logits(model, hidden, fp32=fp32_lm_head)
    logprobs = token_logprobs(logits, batch.response_ids, temperature, support)

    ent = None
    if entropy != "none":
        scaled = logits.float() / temperature
        if support is not None:
            scaled = scaled.masked_fill(~support, float("-inf"))
        if entropy == "metric":
            scaled = scaled.detach()
        with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):
            ent = entropy_from_logits(scaled, batch.token_mask)
    return ResponseForward(logprobs=logprobs, entropy=ent)
