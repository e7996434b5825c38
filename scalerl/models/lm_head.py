"""The LM head: the single place that turns final hidden states into logits and log-probs.

The generation engines and the trainer both call these functions, so the behaviour log-probs
(pi_gen) and the training log-probs (pi_train) of ScaleRL's importance ratio come from the same
LM-head arithmetic. With `fp32=True` the hidden states and the head weight are cast to float32
before the projection: the FP32 LM-head fix of MiniMax-M1 (arXiv 2506.13585, Sec. 3.2) that ScaleRL
(arXiv 2510.13786, Sec. 3.2 "FP32 precision for LLM logits") adopts, because the bf16 head is where
generator/trainer probability mismatches concentrate.

Works for any Hugging Face causal LM whose logits are `lm_head(decoder(...).last_hidden_state)`
(optionally soft-capped, as in Gemma 2/3): the decoder comes from `model.get_decoder()` and the head
from `model.get_output_embeddings()`. `check_head_matches_model` verifies that on a given model.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn


def output_head(model: nn.Module) -> nn.Module:
    """The model's LM head (`get_output_embeddings()`), which must carry a 2-D `weight`."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    weight = getattr(head, "weight", None)
    if head is None or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise TypeError(
            f"{type(model).__name__}: get_output_embeddings() must return a module with a 2-D weight "
            "(a causal LM head)"
        )
    return head


def decoder_of(model: nn.Module) -> nn.Module:
    """The backbone whose `last_hidden_state` feeds the LM head (`model.get_decoder()`)."""
    getter = getattr(model, "get_decoder", None)
    decoder = getter() if callable(getter) else None
    if decoder is None or decoder is model:
        raise TypeError(f"{type(model).__name__}: get_decoder() must return the backbone of a causal LM")
    return decoder


def cache_kwarg_name(decoder: nn.Module) -> str:
    """Name of the KV-cache argument of `decoder.forward`: `cache` (transformers >= 5.2x) or
    `past_key_values` (earlier); passing the deprecated name would warn on every step."""
    params = inspect.signature(decoder.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def softcap_logits(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Final-logit soft-capping, `cap * tanh(logits / cap)` (Gemma 2, arXiv 2408.00118); identity
    when `cap` is None."""
    if cap is None:
        return logits
    return torch.tanh(logits / cap) * cap


def final_logit_softcap(model: nn.Module) -> float | None:
    """The model's `final_logit_softcapping` (Gemma 2/3 configs), or None."""
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    cap = getattr(text_config, "final_logit_softcapping", None)
    return float(cap) if cap else None


class Fp32HeadWeight:
    """A float32 copy of the LM-head weight (and bias) for inference, rebuilt when the weight changes.

    Casting a bf16 vocabulary projection to float32 on every decode step would copy the whole head
    each step; the engine keeps this copy instead and calls `invalidate()` after a weight update.
    The tensor version counter catches in-place updates made without `invalidate()`.
    Not for training: gradients do not flow through the cached copy.
    """

    def __init__(self) -> None:
        self._key: tuple[int, int, int] | None = None
        self._weight: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None

    def invalidate(self) -> None:
        self._key = None
        self._weight = self._bias = None

    def get(self, head: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        weight: torch.Tensor = head.weight
        bias: torch.Tensor | None = getattr(head, "bias", None)
        key = (id(weight), weight._version, weight.data_ptr())
        if self._key != key or self._weight is None:
            with torch.no_grad():
                self._weight = weight.detach().float()
                self._bias = bias.detach().float() if bias is not None else None
            self._key = key
        return self._weight, self._bias


def head_parameters(
    model: nn.Module, fp32: bool, weight_cache: Fp32HeadWeight | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The LM head's `(W, b)` as `project_logits` takes them: cast to float32 with `fp32` (from
    `weight_cache` if given, inference only), the module's own tensors otherwise. Differentiable
    (the cast's gradient flows back to the parameter) unless they come from the cache."""
    head = output_head(model)
    bias = getattr(head, "bias", None)
    if not fp32:
        return head.weight, bias
    if weight_cache is not None:
        return weight_cache.get(head)
    return head.weight.float(), bias.float() if bias is not None else None


def project_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    fp32: bool,
    softcap: float | None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`softcap(hidden @ W^T (+ b))` for `(W, b)` from `head_parameters(model, fp32)`.

    With `fp32` the projection runs in float32 with autocast off (the FP32 LM-head fix); otherwise
    it is the head's own `F.linear`, in whatever dtype autocast gives it. `out` (float32 head,
    `hidden [M, H]`, a contiguous float32 `[M, V]`) receives the logits: the same product
    (`F.linear` is `addmm`/`mm` on 2-D inputs) without a fresh `[M, V]` allocation, whose page
    faults cost as much as the product at a real vocabulary on a CPU (training.head_grad).
    """
    if out is not None and not (fp32 and softcap is None and hidden.dim() == 2):
        raise ValueError("project_logits: out= needs the float32 head, no soft-cap and 2-D hidden states")
    if fp32:
        # Under bf16 autocast F.linear would silently run in bf16 again; the fix needs it off here.
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            if out is None:
                logits = torch.nn.functional.linear(hidden.float(), weight, bias)
            elif bias is None:
                logits = torch.mm(hidden.float(), weight.t(), out=out)
            else:
                logits = torch.addmm(bias, hidden.float(), weight.t(), out=out)
    else:
        logits = torch.nn.functional.linear(hidden, weight, bias)
    return softcap_logits(logits, softcap)


def lm_head_logits(
    model: nn.Module,
    hidden: torch.Tensor,
    fp32: bool,
    weight_cache: Fp32HeadWeight | None = None,
) -> torch.Tensor:
    """Logits `hidden @ W^T (+ b)` of the model's LM head, soft-capped if the model does so.

    With `fp32`, `hidden`, `W` and `b` are cast to float32 first and the logits are float32 (the
    FP32 LM-head fix); otherwise the projection runs in the model dtype. `weight_cache` (inference
    only) reuses a float32 copy of the weight across calls.
    """
    head = output_head(model)
    if not fp32:
        return softcap_logits(head(hidden), final_logit_softcap(model))
    weight, bias = head_parameters(model, fp32, weight_cache)
    return project_logits(hidden, weight, bias, fp32=True, softcap=final_logit_softcap(model))


def temperature_divisor(temperature: float | torch.Tensor, like: torch.Tensor) -> float | torch.Tensor:
    """Temperature 0 (greedy) scores tokens under T = 1; a tensor must broadcast against `like`."""
    if isinstance(temperature, torch.Tensor):
        t = temperature.to(device=like.device, dtype=torch.float32)
        return torch.where(t > 0, t, torch.ones_like(t))
    return float(temperature) if temperature > 0 else 1.0


def token_logprobs(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    support_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """log softmax(logits / T)[token] in float32, shape `logits.shape[:-1]`.

    `log p(x) = z_x / T - logsumexp(z / T)` (computed without materialising the full log-softmax).
    Temperature 0 means greedy decoding and scores under T = 1. `support_mask` (bool, same shape as
    `logits`, True = kept) restricts the softmax to the top-k/top-p support the sampler used, i.e.
    the distribution renormalised over the support (keep-sampling-mask); a token outside it gets -inf.
    """
    scaled = logits.float() / temperature_divisor(temperature, logits)
    if support_mask is not None:
        scaled = scaled.masked_fill(~support_mask, float("-inf"))
    picked = scaled.gather(-1, token_ids.unsqueeze(-1).long()).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions 0, 1, ... counted over the real (mask = 1) tokens of each row, 0 on padding.

    `cumsum(mask) - 1`, clamped at 0: a left-padded prompt starts at position 0 exactly as it does
    in the engine, which places every sequence at position 0 of its own cache row.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def sequence_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    fp32_lm_head: bool,
    temperature: float | torch.Tensor = 1.0,
    response_start: int = 1,
    support_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token log-probs of `input_ids[:, response_start:]` under `model`, shape `[B, L - start]`.

    Column j is `log p(input_ids[:, response_start + j] | input_ids[:, :response_start + j])`; only
    those positions go through the LM head, so pass the first response column (e.g. the padded prompt
    length) to save the vocabulary projection over the prompt. Differentiable (call under no_grad for
    reference log-probs). `temperature` is a float or a `[B, 1]` tensor; `support_mask` is
    `[B, L - start, V]` bool (see `token_logprobs`). Padding positions get meaningless values: mask
    them. `position_ids` default to `position_ids_from_mask(attention_mask)` so left padding is handled.
    """
    if not 1 <= response_start < input_ids.shape[1] + 1:
        raise ValueError(f"response_start: must be in [1, {input_ids.shape[1]}], got {response_start}")
    if position_ids is None and attention_mask is not None:
        position_ids = position_ids_from_mask(attention_mask)
    decoder = decoder_of(model)
    out = decoder(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    )
    hidden = out.last_hidden_state[:, response_start - 1 : -1]
    logits = lm_head_logits(model, hidden, fp32=fp32_lm_head)
    return token_logprobs(logits, input_ids[:, response_start:], temperature, support_mask)


@torch.no_grad()
def check_head_matches_model(model: nn.Module, atol: float = 1e-4) -> None:
    """Raise if `lm_head_logits(decoder(x))` differs from the model's own `forward(x).logits`.

    Guards against causal LMs whose forward transforms the logits in a way this module does not
    reproduce (e.g. a logit scale), which would silently bias every log-prob.
    """
    head = output_head(model)
    vocab = head.weight.shape[0]
    device = head.weight.device
    ids = torch.arange(1, 5, device=device).remainder(vocab).unsqueeze(0)
    reference = model(input_ids=ids, use_cache=False).logits.float()
    hidden = decoder_of(model)(input_ids=ids, use_cache=False).last_hidden_state
    ours = lm_head_logits(model, hidden, fp32=False).float()
    err = (reference - ours).abs().max().item()
    scale = max(1.0, reference.abs().max().item())
    if err > atol * scale:
        raise ValueError(
            f"{type(model).__name__}: its forward transforms the LM-head logits in a way "
            f"scalerl.models.lm_head does not reproduce (max |diff| {err:.3g}); unsupported model"
        )
