"""The trainer's forward pass: response-token log-probs (and entropies) of a `TrainBatch`.

Built from the same pieces as `scalerl.models.lm_head.sequence_logprobs` (the decoder, then the
LM-head projection and `token_logprobs` on the response positions only), so trainer and generator
log-probs come from one implementation; the additions are the entropy, which needs the logits that
function keeps to itself, and chunking.

Chunking (`logit_chunk_tokens`): at a real vocabulary the float32 logits of every response token,
`[samples, tokens, vocab]`, are the largest tensor of the step (one 8k-token sample at vocabulary
151,936 is 4.9 GB, before the log-softmax temporaries and the gradient). `ChunkedHeadLogprobs`
takes the response tokens (padding dropped) `logit_chunk_tokens` at a time through the head, keeps
only their log-probs and entropies, and in backward recomputes each chunk's logits and
differentiates that chunk alone; so at most one chunk's `[tokens, vocab]` block (and its
temporaries) is alive at any time, forward or backward. Every chunk runs the very operations the
unchunked path runs on its rows (same head projection, same `token_logprobs`, same
`entropy_from_logits`), so the results equal the unchunked path's up to float rounding of the
matrix products; `logit_chunk_tokens=None` is the unchunked path (kept as the reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from scalerl.algorithms.entropy import entropy_from_logits
from scalerl.models.lm_head import (
    decoder_of,
    final_logit_softcap,
    head_parameters,
    project_logits,
    token_logprobs,
)

EntropyMode = Literal["none", "metric", "grad"]

#: Response tokens per LM-head chunk by default: at vocabulary 151,936 a 512-token float32 block is
#: 311 MB, and a [512, hidden] x [hidden, vocab] product is still large enough to run at full speed.
DEFAULT_LOGIT_CHUNK_TOKENS = 512


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


def _chunk_terms(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    support: Tensor | None,
    *,
    fp32: bool,
    softcap: float | None,
    temperature: float,
    entropy: EntropyMode,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs `[M]` of `targets` (and entropies `[M]`) at the `M` positions of `hidden [M, H]`:
    the unchunked path's arithmetic on these rows only."""
    logits = project_logits(hidden, weight, bias, fp32=fp32, softcap=softcap)
    logprobs = token_logprobs(logits, targets, temperature, support)
    ent = None
    if entropy != "none":
        scaled = logits.float() / temperature
        if support is not None:
            scaled = scaled.masked_fill(~support, float("-inf"))
        if entropy == "metric":
            scaled = scaled.detach()
        with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):
            ent = entropy_from_logits(scaled)
    return logprobs, ent


class ChunkedHeadLogprobs(torch.autograd.Function):
    """`(logprobs [M], entropy [M])` of `M` response positions, `chunk` positions at a time.

    Forward keeps no logits; backward recomputes each chunk's logits (under the autocast state of
    the forward) and back-propagates through that chunk before the next one, accumulating the
    gradient of the head weight (and bias) and writing the chunk's rows of the hidden gradient.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        support: Tensor | None,
        options: dict[str, Any],
    ) -> tuple[Tensor, Tensor]:
        chunk = options["chunk"]
        n = hidden.shape[0]
        logprobs = torch.empty(n, dtype=torch.float32, device=hidden.device)
        ent = torch.zeros(n, dtype=torch.float32, device=hidden.device)
        kw = {k: options[k] for k in ("fp32", "softcap", "temperature", "entropy")}
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            sup = support[lo:hi] if support is not None else None
            lp, h = _chunk_terms(hidden[lo:hi], weight, bias, targets[lo:hi], sup, **kw)
            logprobs[lo:hi] = lp
            if h is not None:
                ent[lo:hi] = h
        ctx.options = options
        device_type = hidden.device.type
        ctx.autocast = (device_type, torch.is_autocast_enabled(device_type),
                        torch.get_autocast_dtype(device_type))
        ctx.save_for_backward(hidden, weight, bias, targets, support)
        if options["entropy"] != "grad":
            ctx.mark_non_differentiable(ent)
        return logprobs, ent

    @staticmethod
    def backward(ctx: Any, grad_logprobs: Tensor, grad_entropy: Tensor | None) -> tuple[Any, ...]:  # type: ignore[override]
        hidden, weight, bias, targets, support = ctx.saved_tensors
        options = ctx.options
        chunk = options["chunk"]
        want_h, want_w, want_b = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden) if want_h else None
        grad_weight = torch.zeros_like(weight) if want_w else None
        grad_bias = torch.zeros_like(bias) if want_b and bias is not None else None
        with_entropy = options["entropy"] == "grad" and grad_entropy is not None
        # A metric entropy has no gradient: the recomputation skips it.
        kw = {k: options[k] for k in ("fp32", "softcap", "temperature")}
        kw["entropy"] = "grad" if with_entropy else "none"
        device_type, autocast_on, autocast_dtype = ctx.autocast
        w = weight.detach().requires_grad_(want_w)
        b = bias.detach().requires_grad_(want_b) if bias is not None else None
        for lo in range(0, hidden.shape[0], chunk):
            hi = min(hidden.shape[0], lo + chunk)
            h = hidden[lo:hi].detach().requires_grad_(want_h)
            sup = support[lo:hi] if support is not None else None
            with torch.enable_grad(), torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_on):
                lp, ent = _chunk_terms(h, w, b, targets[lo:hi], sup, **kw)
            outputs, grads = [lp], [grad_logprobs[lo:hi]]
            if with_entropy and ent is not None:
                outputs.append(ent)
                grads.append(grad_entropy[lo:hi])
            inputs = [t for t, want in ((h, want_h), (w, want_w), (b, want_b)) if want and t is not None]
            got = list(torch.autograd.grad(outputs, inputs, grads, allow_unused=True))
            if want_h:
                g = got.pop(0)
                if g is not None:
                    grad_hidden[lo:hi] = g  # type: ignore[index]
            if want_w:
                g = got.pop(0)
                if g is not None:
                    grad_weight += g  # type: ignore[operator]
            if grad_bias is not None:
                g = got.pop(0)
                if g is not None:
                    grad_bias += g
        return grad_hidden, grad_weight, grad_bias, None, None, None


def response_forward(
    model: torch.nn.Module,
    batch: TokenLayout,
    *,
    temperature: float,
    fp32_lm_head: bool,
    entropy: EntropyMode = "none",
    support: Tensor | None = None,
    logit_chunk_tokens: int | None = DEFAULT_LOGIT_CHUNK_TOKENS,
) -> ResponseForward:
    """Log-probs of `batch`'s response tokens under `model` at the sampling `temperature`.

    `support` (`[N, T, V]` bool, True = the sampler could draw it) renormalises over the top-k/top-p
    support recorded by the sampler (keep-sampling-mask). `logit_chunk_tokens` response tokens go
    through the head at a time (module docstring); None materialises every position's logits at
    once. Chunked, padding positions are not projected and get log-prob 0; unchunked, they hold
    meaningless values. Mask them either way.
    """
    if logit_chunk_tokens is not None and logit_chunk_tokens < 1:
        raise ValueError(f"optim.logit_chunk_tokens: must be >= 1 or null, got {logit_chunk_tokens}")
    p = batch.prompt_width
    out = decoder_of(model)(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    )
    hidden = out.last_hidden_state[:, p - 1 : -1]
    weight, bias = head_parameters(model, fp32_lm_head)
    softcap = final_logit_softcap(model)
    if logit_chunk_tokens is None:
        return _unchunked(hidden, weight, bias, batch, support, fp32_lm_head, softcap, temperature, entropy)

    mask = batch.token_mask.bool()
    options = {"chunk": int(logit_chunk_tokens), "fp32": fp32_lm_head, "softcap": softcap,
               "temperature": float(temperature), "entropy": entropy}
    picked_support = support[mask] if support is not None else None
    lp, ent = ChunkedHeadLogprobs.apply(
        hidden[mask], weight, bias, batch.response_ids[mask], picked_support, options
    )
    logprobs = torch.zeros(mask.shape, dtype=torch.float32, device=lp.device).masked_scatter(mask, lp)
    entropies = None
    if entropy != "none":
        entropies = torch.zeros(mask.shape, dtype=torch.float32, device=ent.device).masked_scatter(mask, ent)
    return ResponseForward(logprobs=logprobs, entropy=entropies)


def _unchunked(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    batch: TokenLayout,
    support: Tensor | None,
    fp32: bool,
    softcap: float | None,
    temperature: float,
    entropy: EntropyMode,
) -> ResponseForward:
    """Every response position's `[N, T, V]` logits at once (the reference path)."""
    logits = project_logits(hidden, weight, bias, fp32=fp32, softcap=softcap)
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
