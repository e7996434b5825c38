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
matrix products.

The FP32 head without soft-capping, support mask or teacher (ScaleRL's setting, and the tiny
default's) goes further, on any number of tokens, one chunk or many: each chunk's logits are written
into one reused block, and backward turns the recomputed logits into their gradient in closed form
instead of differentiating the recomputation (`training.head_grad`: the same log-probs; the
gradient and entropy to float rounding). Otherwise a micro-batch that fits in one chunk runs the
unchunked path, every position's logits at once through plain autograd. `CLOSED_FORM = False` gives
the reference paths (plain autograd within a chunk, autograd's recomputation beyond) that the
closed form is tested against.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from scalerl.algorithms.distill import full_reverse_kl
from scalerl.algorithms.entropy import entropy_from_logits
from scalerl.models.lm_head import (
    Fp32HeadWeight,
    decoder_of,
    final_logit_softcap,
    head_parameters,
    project_logits,
    token_logprobs,
)
from scalerl.models.moe import RoutingTally, load_balancing_loss, moe_routers, replay_routing
from scalerl.rollout.sampling import support_from_record
from scalerl.training.head_grad import chunk_logit_grad, chunk_logprobs
from scalerl.training.packing import decoder_order_real, decoder_order_routing, response_states

EntropyMode = Literal["none", "metric", "grad"]

#: Whether the FP32 head takes its closed-form gradient where it applies (training.head_grad).
#: False gives the reference paths it is tested against: plain autograd over every position's
#: logits within one chunk, autograd through each chunk's recomputation beyond.
CLOSED_FORM = True

#: Float32 logits per LM-head chunk when `optim.logit_chunk_tokens` is null (2^27: 512 MB; 883 tokens
#: at vocabulary 151,936, where a [883, hidden] x [hidden, vocab] product still runs at full speed).
LOGIT_CHUNK_ELEMENTS = 2**27


def logit_chunk_size(logit_chunk_tokens: int | None, vocab_size: int) -> int:
    """Response tokens per LM-head chunk: `logit_chunk_tokens`, or for None as many as fit
    `LOGIT_CHUNK_ELEMENTS` float32 logits (at least 1)."""
    if logit_chunk_tokens is None:
        return max(1, LOGIT_CHUNK_ELEMENTS // vocab_size)
    if logit_chunk_tokens < 1:
        raise ValueError(f"optim.logit_chunk_tokens: must be >= 1 or null, got {logit_chunk_tokens}")
    return int(logit_chunk_tokens)


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
    # Keep-sampling-mask only, [n, T] bool: the sampler's recorded set differs from this pass's own
    # top-|S| set (or misses the drawn token), and positions whose set was not recorded whole and
    # was completed from these logits (`rollout.sampling.support_from_record`).
    support_mismatch: Tensor | None = None
    support_incomplete: Tensor | None = None
    # MoE with a routing record: this pass's (token, layer) pairs and the router's disagreements.
    routing: RoutingTally | None = None
    # MoE with `router_aux=True`: the load-balancing loss of this pass's real tokens (differentiable).
    router_aux_loss: Tensor | None = None
    # With a `teacher`: KL(pi_s || pi_t) over the vocabulary at each response position, [n, T]
    # float32, differentiable in the student (0 at padding; `algorithms.distill.full_reverse_kl`).
    distill_kl: Tensor | None = None


@dataclass
class RoutingRecord:
    """The engine's recorded experts `[n, P + T, layers, k]` of a batch (`TrainBatch.routing`) and
    whether the pass replays them (`algorithm.keep_routing`) or only measures the disagreement."""

    experts: Tensor
    replay: bool


@dataclass
class SupportRecord:
    """The sampler's recorded support (keep-sampling-mask) of `[n, T]` response tokens:
    `Completion.support` codes `[n, T]`, the recorded ids `[n, T, S]` (`TrainBatch.support_ids`)
    and each row's `(top_k [n], top_p [n])`."""

    codes: Tensor
    ids: Tensor
    top_k: Tensor
    top_p: Tensor

    def per_token(self, mask: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Codes `[M]`, ids `[M, S]`, top-k `[M]` and top-p `[M]` of the positions `mask [n, T]`
        selects."""
        width = mask.shape[1]
        codes = self.codes[:, :width]
        return (codes[mask], self.ids[:, :width][mask], self.top_k.unsqueeze(1).expand_as(codes)[mask],
                self.top_p.unsqueeze(1).expand_as(codes)[mask])


def _support_block(
    scaled: Tensor, targets: Tensor, codes: Tensor, ids: Tensor, top_k: Tensor, top_p: Tensor,
    size: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`(mask [M, V], size [M], mismatch [M], incomplete [M])` of `M` positions' scaled logits
    (`rollout.sampling.support_from_record`).

    Positions with no recorded support and an untruncated cut keep the whole vocabulary. `size`
    (from an earlier call on the same logits) skips the cut search: the backward recomputation
    rebuilds exactly the forward's mask.
    """
    m, vocab = scaled.shape
    active = (codes >= 0) | (top_k > 0) | (top_p < 1.0)
    mask = torch.ones((m, vocab), dtype=torch.bool, device=scaled.device)
    mismatch = torch.zeros(m, dtype=torch.bool, device=scaled.device)
    incomplete = torch.zeros(m, dtype=torch.bool, device=scaled.device)
    out_size = torch.full((m,), vocab, dtype=torch.long, device=scaled.device)
    rows = active.nonzero().flatten()
    if rows.numel():
        z = scaled.detach()[rows]
        mask[rows], kept, mm, inc = support_from_record(
            z, targets[rows], codes[rows], ids[rows], top_k[rows], top_p[rows],
            size[rows] if size is not None else None,
        )
        out_size[rows], mismatch[rows], incomplete[rows] = kept, mm, inc
    return mask, out_size, mismatch, incomplete


def _chunk_terms(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    support: tuple[Tensor, Tensor, Tensor, Tensor] | None,
    *,
    fp32: bool,
    softcap: float | None,
    temperature: float,
    entropy: EntropyMode,
    size: Tensor | None = None,
    teacher: TeacherHead | None = None,
) -> tuple[Tensor, Tensor | None, tuple[Tensor, Tensor, Tensor] | None, Tensor | None]:
    """Log-probs `[M]` of `targets`, entropies `[M]` (or None), with `support` (codes, ids, top-k,
    top-p per position) `(size, mismatch, incomplete)`, and with `teacher` (its states at these rows) the
    full reverse KL `[M]`, at the `M` positions of `hidden [M, H]`: the unchunked path's arithmetic
    on these rows only."""
    logits = project_logits(hidden, weight, bias, fp32=fp32, softcap=softcap)
    mask, cut = None, None
    if support is not None:
        # The sampler's scaled logits were `logits.float() / T`; the cut is found on the same.
        mask, kept, mismatch, incomplete = _support_block(
            logits.detach().float() / temperature, targets, *support, size
        )
        cut = (kept, mismatch, incomplete)
    logprobs = token_logprobs(logits, targets, temperature, mask)
    ent = None
    if entropy != "none":
        scaled = logits.float() / temperature
        if mask is not None:
            scaled = scaled.masked_fill(~mask, float("-inf"))
        if entropy == "metric":
            scaled = scaled.detach()
        with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):
            ent = entropy_from_logits(scaled)
    return logprobs, ent, cut, _teacher_kl(logits, teacher, temperature)


@dataclass
class TeacherHead:
    """A distillation teacher's final hidden states at the student's response positions (the same
    layout as the student's: `[n, T, H]` unchunked, `[M, H]` chunked) and its LM head."""

    states: Tensor
    weight: Tensor
    bias: Tensor | None
    fp32: bool
    softcap: float | None

    def rows(self, lo: int, hi: int) -> TeacherHead:
        return TeacherHead(self.states[lo:hi], self.weight, self.bias, self.fp32, self.softcap)


def _teacher_kl(logits: Tensor, teacher: TeacherHead | None, temperature: float) -> Tensor | None:
    """`full_reverse_kl` of the student's `logits [..., V]` against the teacher's at the same
    positions, both at the sampling temperature; the teacher's side carries no gradient."""
    if teacher is None:
        return None
    with torch.no_grad():
        t_logits = project_logits(teacher.states, teacher.weight, teacher.bias, fp32=teacher.fp32,
                                  softcap=teacher.softcap).float() / temperature
    return full_reverse_kl(logits.float() / temperature, t_logits)


class ChunkedHeadLogprobs(torch.autograd.Function):
    """`(logprobs [M], entropy [M], support mismatch [M], support incomplete [M])` of `M` response
    positions, `chunk` positions at a time.

    Forward keeps no logits; backward recomputes each chunk's logits (under the autocast state of
    the forward) and back-propagates through that chunk before the next one, accumulating the
    gradient of the head weight (and bias) and writing the chunk's rows of the hidden gradient.
    With keep-sampling-mask, the support sizes found in forward are kept (`[M]` long) so that the
    recomputation rebuilds the very same masks.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        codes: Tensor | None,
        ids: Tensor | None,
        top_k: Tensor | None,
        top_p: Tensor | None,
        teacher_states: Tensor | None,
        teacher_weight: Tensor | None,
        teacher_bias: Tensor | None,
        options: dict[str, Any],
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        chunk = options["chunk"]
        n = hidden.shape[0]
        device = hidden.device
        logprobs = torch.empty(n, dtype=torch.float32, device=device)
        ent = torch.zeros(n, dtype=torch.float32, device=device)
        mismatch = torch.zeros(n, dtype=torch.bool, device=device)
        incomplete = torch.zeros(n, dtype=torch.bool, device=device)
        sizes = torch.zeros(n, dtype=torch.long, device=device) if codes is not None else None
        kl = torch.zeros(n, dtype=torch.float32, device=device)
        teacher = _teacher_of(teacher_states, teacher_weight, teacher_bias, options)
        kw = {k: options[k] for k in ("fp32", "softcap", "temperature", "entropy")}
        closed = options["closed_form"]
        lse = torch.empty(n, dtype=torch.float32, device=device) if closed else None
        block, spare = (_blocks(min(n, chunk), weight, 2 if options["entropy"] != "none" else 1) if closed
                        else (None, None))
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            if closed:
                z = project_logits(hidden[lo:hi], weight, bias, fp32=True, softcap=None,
                                   out=block[: hi - lo])  # type: ignore[index]
                lp, h, lse[lo:hi] = chunk_logprobs(z, targets[lo:hi], options["temperature"],  # type: ignore[index]
                                                   spare)
                logprobs[lo:hi] = lp
                if h is not None:
                    ent[lo:hi] = h
                continue
            sup = ((codes[lo:hi], ids[lo:hi], top_k[lo:hi], top_p[lo:hi])  # type: ignore[index]
                   if codes is not None else None)
            t_rows = teacher.rows(lo, hi) if teacher is not None else None
            lp, h, cut, d = _chunk_terms(hidden[lo:hi], weight, bias, targets[lo:hi], sup, teacher=t_rows,
                                         **kw)
            logprobs[lo:hi] = lp
            if h is not None:
                ent[lo:hi] = h
            if d is not None:
                kl[lo:hi] = d
            if cut is not None:
                sizes[lo:hi], mismatch[lo:hi], incomplete[lo:hi] = cut  # type: ignore[index]
        ctx.options = options
        # The backward recomputation reuses the forward's blocks: no second set of fresh pages.
        ctx.blocks = (block, spare) if closed else None
        device_type = device.type
        ctx.autocast = (device_type, torch.is_autocast_enabled(device_type),
                        torch.get_autocast_dtype(device_type))
        ctx.save_for_backward(hidden, weight, bias, targets, codes, ids, top_k, top_p, sizes,
                              teacher_states, teacher_weight, teacher_bias, lse)
        ctx.mark_non_differentiable(mismatch, incomplete)
        if options["entropy"] != "grad":
            ctx.mark_non_differentiable(ent)
        if teacher is None:
            ctx.mark_non_differentiable(kl)
        return logprobs, ent, mismatch, incomplete, kl

    @staticmethod
    def backward(ctx: Any, grad_logprobs: Tensor, grad_entropy: Tensor | None, _mismatch: Any,  # type: ignore[override]
                 _incomplete: Any, grad_kl: Tensor | None) -> tuple[Any, ...]:
        (hidden, weight, bias, targets, codes, ids, top_k, top_p, sizes,
         teacher_states, teacher_weight, teacher_bias, lse) = ctx.saved_tensors
        options = ctx.options
        chunk = options["chunk"]
        want_h, want_w, want_b = ctx.needs_input_grad[:3]
        if lse is not None:
            grads = _closed_form_backward(hidden, weight, bias, targets, lse, grad_logprobs,
                                          grad_entropy if options["entropy"] == "grad" else None,
                                          chunk, options["temperature"], (want_h, want_w, want_b),
                                          ctx.blocks or _blocks(min(hidden.shape[0], chunk), weight,
                                                                2 if options["entropy"] == "grad" else 1))
            ctx.blocks = None  # freed now, not when the graph goes (after the decoder's backward)
            return (*grads, None, None, None, None, None, None, None, None, None)
        grad_hidden = torch.zeros_like(hidden) if want_h else None
        # The head's gradients start as the first chunk's own (a zeros buffer beside the per-chunk
        # gradient would hold one more [vocab, hidden] copy at the peak).
        grad_weight: Tensor | None = None
        grad_bias: Tensor | None = None
        with_entropy = options["entropy"] == "grad" and grad_entropy is not None
        # A metric entropy has no gradient: the recomputation skips it.
        kw = {k: options[k] for k in ("fp32", "softcap", "temperature")}
        kw["entropy"] = "grad" if with_entropy else "none"
        # The recomputation skips the teacher when nothing downstream used the KL.
        teacher = (_teacher_of(teacher_states, teacher_weight, teacher_bias, options)
                   if grad_kl is not None else None)
        device_type, autocast_on, autocast_dtype = ctx.autocast
        w = weight.detach().requires_grad_(want_w)
        b = bias.detach().requires_grad_(want_b) if bias is not None else None
        for lo in range(0, hidden.shape[0], chunk):
            hi = min(hidden.shape[0], lo + chunk)
            h = hidden[lo:hi].detach().requires_grad_(want_h)
            sup = (codes[lo:hi], ids[lo:hi], top_k[lo:hi], top_p[lo:hi]) if codes is not None else None
            size = sizes[lo:hi] if sizes is not None else None
            t_rows = teacher.rows(lo, hi) if teacher is not None else None
            with torch.enable_grad(), torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_on):
                lp, ent, _, d = _chunk_terms(h, w, b, targets[lo:hi], sup, size=size, teacher=t_rows, **kw)
            outputs, grads = [lp], [grad_logprobs[lo:hi]]
            if with_entropy and ent is not None:
                outputs.append(ent)
                grads.append(grad_entropy[lo:hi])  # type: ignore[index]
            if d is not None:
                outputs.append(d)
                grads.append(grad_kl[lo:hi])  # type: ignore[index]
            inputs = [t for t, want in ((h, want_h), (w, want_w), (b, want_b)) if want and t is not None]
            got = list(torch.autograd.grad(outputs, inputs, grads, allow_unused=True))
            if want_h:
                g = got.pop(0)
                if g is not None:
                    grad_hidden[lo:hi] = g  # type: ignore[index]
            if want_w:
                g = got.pop(0)
                if g is not None:
                    grad_weight = g if grad_weight is None else grad_weight.add_(g)
                del g
            if want_b and b is not None:
                g = got.pop(0)
                if g is not None:
                    grad_bias = g if grad_bias is None else grad_bias.add_(g)
        if want_w and grad_weight is None:
            grad_weight = torch.zeros_like(weight)
        if want_b and bias is not None and grad_bias is None:
            grad_bias = torch.zeros_like(bias)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None, None, None, None, None


def _closed_form_backward(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, lse: Tensor,
    grad_logprobs: Tensor, grad_entropy: Tensor | None, chunk: int, temperature: float,
    want: tuple[bool, bool, bool],
    blocks: tuple[Tensor, Tensor | None],
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """`(dL/dhidden, dL/dW, dL/db)` of the float32 head, chunk by chunk: each chunk's logits are
    recomputed once and turned into `G = dL/dlogits` in place (`training.head_grad`), then
    `dL/dh = G W`, `dL/dW += G^T h`, `dL/db += sum_rows G`."""
    want_h, want_w, want_b = want
    n = hidden.shape[0]
    grad_hidden = torch.zeros_like(hidden) if want_h else None
    grad_weight = torch.zeros_like(weight) if want_w else None
    grad_bias = torch.zeros_like(bias) if want_b and bias is not None else None
    block, spare = blocks
    # Float32 products, as the forward's projection (autocast off there too).
    with torch.no_grad(), torch.autocast(device_type=hidden.device.type, enabled=False):
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            h = hidden[lo:hi].float()
            z = project_logits(h, weight, bias, fp32=True, softcap=None, out=block[: hi - lo])
            g = chunk_logit_grad(z, targets[lo:hi], lse[lo:hi], temperature, grad_logprobs[lo:hi],
                                 grad_entropy[lo:hi] if grad_entropy is not None else None, spare)
            if grad_hidden is not None:
                grad_hidden[lo:hi] = g @ weight
            if grad_weight is not None:
                grad_weight.addmm_(g.t(), h)
            if grad_bias is not None:
                grad_bias.add_(g.sum(0))
    return grad_hidden, grad_weight, grad_bias


def _blocks(rows: int, weight: Tensor, count: int) -> tuple[Tensor, Tensor | None]:
    """One float32 `[rows, vocab]` block for the chunks' logits, and a second (`count` 2) for the
    entropy's `exp`: allocated once per pass and reused by every chunk (training.head_grad)."""
    shape = (rows, int(weight.shape[0]))
    block = torch.empty(shape, dtype=torch.float32, device=weight.device)
    spare = torch.empty(shape, dtype=torch.float32, device=weight.device) if count > 1 else None
    return block, spare


def _teacher_of(states: Tensor | None, weight: Tensor | None, bias: Tensor | None,
                options: dict[str, Any]) -> TeacherHead | None:
    if states is None or weight is None:
        return None
    return TeacherHead(states, weight, bias, options["fp32"], options["teacher_softcap"])


def response_forward(
    model: torch.nn.Module,
    batch: TokenLayout,
    *,
    temperature: float,
    fp32_lm_head: bool,
    entropy: EntropyMode = "none",
    support: SupportRecord | None = None,
    logit_chunk_tokens: int | None = None,
    packed: bool = False,
    routing: RoutingRecord | None = None,
    router_aux: bool = False,
    teacher: torch.nn.Module | None = None,
    teacher_head_cache: Fp32HeadWeight | None = None,
) -> ResponseForward:
    """Log-probs of `batch`'s response tokens under `model` at the sampling `temperature`.

    `support` (the sampler's recorded top-k/top-p set S_old, as token ids) renormalises each
    position over exactly that set (keep-sampling-mask; `rollout.sampling.support_from_record`).
    `logit_chunk_tokens` response tokens go through the head at a time (module docstring; None: as
    many as fit `LOGIT_CHUNK_ELEMENTS` logits). The FP32 head (no soft-cap, support or teacher) takes
    the chunked closed form on any number of tokens; otherwise a micro-batch whose response tokens
    fit in one chunk takes the unchunked path, every position's logits at once through plain
    autograd. Chunked, padding positions are not projected and get log-prob 0; unchunked, they
    hold meaningless values. Mask them either way. `packed` runs the
    decoder on the batch's real tokens packed into one sequence (`training.packing`); the results
    keep the padded `[n, T]` layout. `routing` (MoE) replays or measures the engine's recorded
    experts in the decoder pass (`scalerl.models.moe.replay_routing`); `router_aux` returns the
    MoE load-balancing loss of the pass (`scalerl.models.moe.load_balancing_loss`). `teacher` (a
    distillation teacher sharing the vocabulary) adds `distill_kl`, the full reverse KL at every
    response position (`algorithms.distill.full_reverse_kl`); its decoder runs without gradient on
    the same layout, and its logits are projected chunk by chunk beside the student's;
    `teacher_head_cache` keeps the frozen teacher's float32 head across passes (`fp32_lm_head`).
    """
    weight, bias = head_parameters(model, fp32_lm_head)
    chunk = logit_chunk_size(logit_chunk_tokens, int(weight.shape[0]))
    decoder = decoder_of(model)
    softcap = final_logit_softcap(model)
    mask = batch.token_mask.bool()
    replay: contextlib.AbstractContextManager[RoutingTally | None] = contextlib.nullcontext()
    if routing is not None:
        flat, needed = decoder_order_routing(batch, routing.experts, packed=packed)
        replay = replay_routing(decoder, flat, replay=routing.replay, counted=needed, capture=router_aux)
    elif router_aux:
        replay = replay_routing(decoder, None, replay=False, capture=True)

    def aux(tally: RoutingTally | None) -> Tensor | None:
        if not router_aux or tally is None:
            return None
        experts = int(moe_routers(decoder)[0].num_experts)
        real = decoder_order_real(batch, packed=packed)
        return load_balancing_loss(tally.probs, tally.indices, experts, real)

    # The FP32 head's closed-form gradient (training.head_grad) on any number of tokens, one chunk
    # or many, wherever it applies; otherwise a micro-batch within one chunk takes plain autograd.
    closed_form = CLOSED_FORM and fp32_lm_head and softcap is None and support is None and teacher is None
    chunked = closed_form or int(mask.sum()) > chunk
    teacher_head = None
    if teacher is not None:
        with torch.no_grad():
            t_weight, t_bias = head_parameters(teacher, fp32_lm_head, teacher_head_cache)
            t_states = response_states(decoder_of(teacher), batch, packed=packed,
                                       at=mask if chunked else None)
        teacher_head = TeacherHead(t_states, t_weight, t_bias, fp32_lm_head, final_logit_softcap(teacher))
    if not chunked:
        with replay as tally:
            hidden = response_states(decoder, batch, packed=packed)
        out = _unchunked(hidden, weight, bias, batch, support, fp32_lm_head, softcap, temperature, entropy,
                         teacher_head)
        out.routing = tally if routing is not None else None
        out.router_aux_loss = aux(tally)
        return out

    codes = ids = top_k = top_p = None
    if support is not None:
        codes, ids, top_k, top_p = support.per_token(mask)
    options = {"chunk": chunk, "fp32": fp32_lm_head, "softcap": softcap,
               "temperature": float(temperature), "entropy": entropy,
               "closed_form": closed_form,
               "teacher_softcap": teacher_head.softcap if teacher_head is not None else None}
    with replay as tally:
        states = response_states(decoder, batch, packed=packed, at=mask)
    t_args = ((teacher_head.states, teacher_head.weight, teacher_head.bias) if teacher_head is not None
              else (None, None, None))
    lp, ent, mismatch, incomplete, kl = ChunkedHeadLogprobs.apply(
        states, weight, bias, batch.response_ids[mask], codes, ids, top_k, top_p, *t_args, options,
    )

    def spread(values: Tensor) -> Tensor:
        return torch.zeros(mask.shape, dtype=values.dtype, device=values.device).masked_scatter(mask, values)

    return ResponseForward(
        logprobs=spread(lp),
        entropy=spread(ent) if entropy != "none" else None,
        support_mismatch=spread(mismatch) if support is not None else None,
        support_incomplete=spread(incomplete) if support is not None else None,
        routing=tally if routing is not None else None,
        router_aux_loss=aux(tally),
        distill_kl=spread(kl) if teacher_head is not None else None,
    )


def _unchunked(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    batch: TokenLayout,
    support: SupportRecord | None,
    fp32: bool,
    softcap: float | None,
    temperature: float,
    entropy: EntropyMode,
    teacher: TeacherHead | None = None,
) -> ResponseForward:
    """Every response position's `[N, T, V]` logits at once, through plain autograd (the reference
    path the chunked one is tested against)."""
    logits = project_logits(hidden, weight, bias, fp32=fp32, softcap=softcap)
    targets = batch.response_ids
    mask = batch.token_mask.bool()
    support_mask_ = mismatch = incomplete = None
    if support is not None:
        n, t, vocab = logits.shape
        everywhere = torch.ones_like(mask)
        codes, ids, top_k, top_p = support.per_token(everywhere)
        flat, _, mm, inc = _support_block(
            logits.detach().float().reshape(n * t, vocab) / temperature, targets.reshape(-1), codes, ids,
            top_k, top_p, None,
        )
        support_mask_ = flat.reshape(n, t, vocab)
        mismatch, incomplete = mm.reshape(n, t) & mask, inc.reshape(n, t) & mask
    logprobs = token_logprobs(logits, targets, temperature, support_mask_)
    ent = None
    if entropy != "none":
        scaled = logits.float() / temperature
        if support_mask_ is not None:
            scaled = scaled.masked_fill(~support_mask_, float("-inf"))
        if entropy == "metric":
            scaled = scaled.detach()
        with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):
            ent = entropy_from_logits(scaled, mask)
    kl = _teacher_kl(logits, teacher, temperature)
    return ResponseForward(logprobs=logprobs, entropy=ent, support_mismatch=mismatch,
                           support_incomplete=incomplete,
                           distill_kl=torch.where(mask, kl, 0.0) if kl is not None else None)
