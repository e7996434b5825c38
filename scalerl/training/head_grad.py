"""Log-probs and entropies of one chunk of float32 logits, and their gradient in closed form.

The chunked LM head (`training.forward.ChunkedHeadLogprobs`) recomputes each chunk's logits in
backward. Differentiating that recomputation with autograd replays every elementwise step of the
forward (temperature division, log-sum-exp, entropy) and then each step's gradient, each a pass
over a freshly allocated `[tokens, vocab]` block. At Qwen's vocabulary 151,936 and hidden 896 those
passes took longer than the head's matrix products (`torch.profiler` of `Trainer.step`, 1,193
response tokens, one thread: 12.3 s in `aten::mm` against 16 s in `div`, `exp`, `sub`, `fill_`,
`where`, ...), and on a CPU much of it is the page faults of each new block. The gradient has a closed
form, so here each chunk's logits are written into one reused block and turned into the gradient of
the logits in place:

    z = logits / T,   m = max_j z_j,   s = sum_j exp(z_j - m),   lse = m + log s
    log p_t = z_t - lse                  d log p_t / d z_j = [j = t] - p_j
    H = -sum_j p_j log p_j               dH / d z_j = -p_j (log p_j + H)
      = log s - sum_j exp(z_j - m) (z_j - m) / s
    dL/d logits = (dL/dz) / T

(the softmax's Jacobian d p_i / d z_j = p_i ([i = j] - p_j), e.g. Bishop, PRML (4.106); the
entropy's follows from it and sum_j p_j = 1). The head's products then give dL/dh = G W,
dL/dW = G^T h and dL/db = sum over rows of G, for G = dL/d logits.

`log p_t` is `torch.logsumexp`'s arithmetic (max, shifted exp-sum, log, + max) and so equals
`models.lm_head.token_logprobs` on the same logits. Only float32 logits without soft-capping or a
support mask take this path (the FP32 LM head, the ScaleRL default); the others keep autograd's
recomputation. Tests compare it with the formulas above written out and with the unchunked
full-logit path (tests/training/test_head_grad.py, tests/training/test_chunked_head.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from scalerl.models.lm_head import temperature_divisor


def row_dot(a: Tensor, b: Tensor) -> Tensor:
    """`sum_j a_ij b_ij` per row of two `[M, V]` blocks, without an `[M, V]` temporary."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).reshape(a.shape[0])


def chunk_logprobs(z: Tensor, targets: Tensor, temperature: float,
                   spare: Tensor | None = None) -> tuple[Tensor, Tensor | None, Tensor]:
    """`(log p_t [M], H [M] or None, lse [M])` of float32 logits `z [M, V]` at temperature T.

    `z` is consumed (overwritten). The entropy is computed when `spare` (a float32 block of at
    least `M` rows of `V`) is given to hold `exp(z - m)`.
    """
    t = float(temperature_divisor(temperature, z))  # T = 0 (greedy) scores under T = 1
    if t != 1.0:
        z.div_(t)
    picked = z.gather(-1, targets.unsqueeze(-1).long()).squeeze(-1)
    m = z.amax(dim=-1)
    m = torch.where(m.isinf(), torch.zeros_like(m), m)  # as torch.logsumexp: an all -inf row stays -inf
    shifted = z.sub_(m.unsqueeze(-1))
    if spare is None:
        s = shifted.exp_().sum(dim=-1)
        ent = None
    else:
        e = torch.exp(shifted, out=spare[: z.shape[0]])
        s = e.sum(dim=-1)
        ent = s.log() - row_dot(e, shifted) / s
    lse = s.log().add_(m)
    return picked - lse, ent, lse


def chunk_logit_grad(z: Tensor, targets: Tensor, lse: Tensor, temperature: float,
                     grad_logprobs: Tensor, grad_entropy: Tensor | None = None,
                     spare: Tensor | None = None) -> Tensor:
    """`dL/d logits [M, V]` from the recomputed float32 logits `z [M, V]` (consumed: the result is
    written into it), the forward's `lse [M]`, and the upstream gradients of `log p_t` and `H`
    (`grad_entropy` needs `spare`, a float32 block of at least `M` rows, to hold `p`).

    `dL/dz_j = g_lp ([j = t] - p_j) - g_H p_j (log p_j + H)`, then divided by T (module docstring).
    """
    t = float(temperature_divisor(temperature, z))  # T = 0 (greedy) scores under T = 1
    if t != 1.0:
        z.div_(t)
    logp = z.sub_(lse.unsqueeze(-1))
    g_lp = grad_logprobs.unsqueeze(-1)
    if grad_entropy is None:
        grad = logp.exp_().mul_(-g_lp)  # -g_lp p
    else:
        if spare is None:
            raise ValueError("chunk_logit_grad: grad_entropy needs a spare block for p")
        p = torch.exp(logp, out=spare[: z.shape[0]])
        h = -row_dot(p, logp)
        grad = logp.add_(h.unsqueeze(-1)).mul_(p).mul_(-grad_entropy.unsqueeze(-1))  # -g_H p (log p + H)
        grad.sub_(p.mul_(g_lp))  # - g_lp p
    rows = torch.arange(grad.shape[0], device=grad.device)
    grad[rows, targets.long()] += grad_logprobs  # + g_lp [j = t]
    return grad if t == 1.0 else grad.div_(t)
