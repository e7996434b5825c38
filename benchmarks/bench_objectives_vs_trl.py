"""Objectives vs TRL, side by side: scalerl's losses and advantages against TRL's on identical tensors.

For every objective both libraries define the same way, the script feeds the same log-probs, old
log-probs, advantages (or rewards) and masks to both and prints the largest absolute difference
of the loss and of its gradient w.r.t. the log-probs (and, for advantages, of the advantages):

    GRPO sample-level (TRL "grpo")        <-> policy_loss(loss_type="grpo", aggregation="sample")
    DAPO token-level (TRL "dapo")         <-> policy_loss(loss_type="grpo", aggregation="token")
    BNPO token-level (TRL "bnpo")         <-> policy_loss(loss_type="grpo", aggregation="token")
    Dr. GRPO constant (TRL "dr_grpo")     <-> policy_loss(loss_type="grpo", aggregation="constant")
    CISPO token-level (TRL "cispo")       <-> policy_loss(loss_type="cispo", aggregation="token")
    GSPO (TRL "grpo", sequence IS level)  <-> policy_loss(loss_type="gspo", aggregation="sample")
    GRPO + KL, beta 0.04 (TRL beta; use_bias_correction_kl False / True, TRL's default)
        <-> policy_loss(...) + beta * weighted_token_sum(kl_penalty("k3" / "unbiased_k3"), weights)
    advantages, TRL scale_rewards group / none / batch <-> compute_advantages(adv_norm=...)

ScaleRL's prompt-level aggregation has no TRL counterpart and is not compared.

How TRL is invoked (its real code, not a re-derivation). TRL has no standalone loss function, so
the script builds a real `trl.GRPOTrainer` per case (the tiny local Qwen2 and character tokenizer
of `scalerl.models.tiny`: nothing is downloaded; TRL's `GRPOConfig` carries the case's loss type,
clip range, importance-sampling level, beta) and calls:
  * losses: `GRPOTrainer._compute_loss(model, inputs)`, with only the model forward
    (`_get_per_token_logps_and_entropies`) replaced by a function returning the shared log-prob
    tensor, so the loss math, masking and normalisation are TRL's own;
  * advantages: `GRPOTrainer._generate_and_score_completions(batch)`, the whole generation and
    scoring path, with a reward function that returns the shared rewards; the advantages it
    returns are compared.
The TRL version is printed; written against trl 1.16.0 (with transformers 5.x, torch 2.13).

Known definitional difference (reported, not an error): for batch-level scaling TRL divides the
group-centred advantage by the std of the *rewards* over the batch, ScaleRL (and scalerl) by the
std of the *centred advantages* over the batch. The two differ by one factor for the whole batch,
which the script prints.

    .venv/bin/python benchmarks/bench_objectives_vs_trl.py               # float64 and float32
    .venv/bin/python benchmarks/bench_objectives_vs_trl.py --dtype float64

Exit status 1 if a case that should agree differs by more than the dtype's tolerance, 2 if TRL is
not installed (`pip install trl`; it needs no other torch or transformers than scalerl's).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from scalerl.algorithms import (
    compute_advantages,
    kl_penalty,
    policy_loss,
    token_weights,
    weighted_token_sum,
)
from scalerl.models.tiny import build_tiny_model, build_tiny_tokenizer

PROMPTS = 4
GENERATIONS = 4
T = 12  # padded response width
MAX_TOKENS = 16  # the generation budget (Dr. GRPO's constant divisor); larger than T on purpose
LENGTHS = [12, 3, 7, 1, 9, 12, 5, 2, 11, 4, 6, 8, 10, 12, 1, 7]
# Mixed rewards: a zero-variance group (prompt 2), fractional scores, ties.
REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 1.0, 0.0, 0.25]
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-6}
TRL_ADV_EPS = 1e-4  # TRL's fixed epsilon in the advantage denominator


@dataclass(frozen=True)
class Batch:
    logprobs: Tensor
    old_logprobs: Tensor
    ref_logprobs: Tensor
    advantages: Tensor
    mask: Tensor
    group_ids: Tensor


@dataclass(frozen=True)
class LossCase:
    name: str
    trl: dict[str, Any]  # GRPOConfig fields
    scalerl: dict[str, Any]  # policy_loss keyword arguments
    drift: float = 0.3  # std of log pi - log pi_old: large enough to reach the clip branches
    beta: float = 0.0
    kl_estimator: str = "k3"


@dataclass
class Row:
    name: str
    scalerl_value: float
    trl_value: float
    value_diff: float
    grad_diff: float | None
    note: str = ""
    must_agree: bool = True
    extra: dict[str, float] = field(default_factory=dict)


LOSS_CASES = (
    LossCase(
        "GRPO sample-level, clip 0.2/0.28",
        {"loss_type": "grpo", "epsilon": 0.2, "epsilon_high": 0.28},
        {"loss_type": "grpo", "aggregation": "sample", "eps_low": 0.2, "eps_high": 0.28},
    ),
    LossCase(
        "DAPO token-level, clip 0.2/0.28",
        {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28},
        {"loss_type": "grpo", "aggregation": "token", "eps_low": 0.2, "eps_high": 0.28},
    ),
    LossCase(
        "BNPO token-level, clip 0.2",
        {"loss_type": "bnpo", "epsilon": 0.2},
        {"loss_type": "grpo", "aggregation": "token", "eps_low": 0.2, "eps_high": 0.2},
    ),
    LossCase(
        "Dr. GRPO constant (budget 16)",
        {"loss_type": "dr_grpo", "epsilon": 0.2, "max_completion_length": MAX_TOKENS},
        {
            "loss_type": "grpo",
            "aggregation": "constant",
            "eps_low": 0.2,
            "eps_high": 0.2,
            "max_tokens": MAX_TOKENS,
        },
    ),
    LossCase(
        "CISPO token-level, eps_max 1.2",
        # TRL's CISPO reads epsilon_high as the absolute cap on the ratio (ScaleRL's eps_max).
        {"loss_type": "cispo", "epsilon_high": 1.2},
        {"loss_type": "cispo", "aggregation": "token", "eps_max": 1.2},
    ),
    LossCase(
        "GSPO sample-level, clip 3e-4/4e-4",
        {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
        {"loss_type": "gspo", "aggregation": "sample", "eps_low": 3e-4, "eps_high": 4e-4},
        drift=1e-3,  # sequence ratios near 1, so that some fall inside the narrow GSPO clip
    ),
    LossCase(
        "GRPO + k3 KL (beta 0.04)",
        {"loss_type": "grpo", "epsilon": 0.2, "beta": 0.04, "use_bias_correction_kl": False},
        {"loss_type": "grpo", "aggregation": "sample", "eps_low": 0.2, "eps_high": 0.2},
        beta=0.04,
    ),
    LossCase(
        # TRL's default: the KL term times the (differentiable) ratio pi / pi_old (DeepSeek-V3.2).
        "GRPO + unbiased k3 KL (beta 0.04)",
        {"loss_type": "grpo", "epsilon": 0.2, "beta": 0.04, "use_bias_correction_kl": True},
        {"loss_type": "grpo", "aggregation": "sample", "eps_low": 0.2, "eps_high": 0.2},
        beta=0.04,
        kl_estimator="unbiased_k3",
    ),
)


def make_batch(dtype: torch.dtype, drift: float, seed: int) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    n = PROMPTS * GENERATIONS
    mask = torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]
    logprobs = -torch.rand(n, T, generator=gen, dtype=torch.float64) * 3.0
    old = logprobs + drift * torch.randn(n, T, generator=gen, dtype=torch.float64)
    ref = logprobs + 0.2 * torch.randn(n, T, generator=gen, dtype=torch.float64)
    group_ids = torch.arange(PROMPTS).repeat_interleave(GENERATIONS)
    advantages = compute_advantages(torch.tensor(REWARDS, dtype=torch.float64), group_ids, "group", 1e-4)
    return Batch(
        logprobs.to(dtype),
        old.clamp(max=0.0).to(dtype),
        ref.clamp(max=0.0).to(dtype),
        advantages.to(dtype),
        mask,
        group_ids,
    )


# ---------------------------------------------------------------------------------------------
# TRL side


def _quiet() -> None:
    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore")
    hf_logging.disable_progress_bar()
    for name in ("transformers", "trl", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)


def save_tiny_model(workdir: str) -> str:
    """The tiny local model and tokenizer saved as a directory: with a KL term TRL loads its
    reference model from the policy's path, so the policy must have one (nothing is downloaded)."""
    path = os.path.join(workdir, "tiny")
    tokenizer = build_tiny_tokenizer()
    build_tiny_model(vocab_size=len(tokenizer)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def make_trainer(workdir: str, trl_args: dict[str, Any], rewards: list[float] | None = None) -> Any:
    """A real `GRPOTrainer` on the tiny local model (CPU)."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    model_path = os.path.join(workdir, "tiny")
    fixed = list(rewards or [0.0] * (PROMPTS * GENERATIONS))

    def reward_fn(prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        # The generation batch arrives prompt-major, as the trainer's sampler repeats each prompt.
        assert len(completions) == len(fixed), (len(completions), len(fixed))
        return fixed

    args = {
        "output_dir": os.path.join(workdir, "out"),
        "per_device_train_batch_size": PROMPTS * GENERATIONS,
        "num_generations": GENERATIONS,
        "max_completion_length": T,
        "beta": 0.0,
        "report_to": "none",
        "use_cpu": True,
        "bf16": False,
        "shuffle_dataset": False,
        "seed": 0,
        **trl_args,
    }
    dataset = Dataset.from_dict({"prompt": [f"{i}+{i}=" for i in range(PROMPTS)]})
    trainer = GRPOTrainer(
        model=model_path,
        processing_class=AutoTokenizer.from_pretrained(model_path),
        reward_funcs=reward_fn,
        args=GRPOConfig(**args),
        train_dataset=dataset,
    )
    trainer.model.train()
    # Set by the training loop in a real run; one accumulation step here.
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def trl_loss(trainer: Any, batch: Batch) -> tuple[Tensor, Tensor]:
    """TRL's `_compute_loss` on `batch`; returns (loss, d loss / d logprobs)."""
    logprobs = batch.logprobs.detach().clone().requires_grad_(True)

    def forward(*_: Any, **__: Any) -> tuple[Tensor, Tensor, None]:
        # Stands in for the model forward only: TRL computes everything after it.
        return logprobs, torch.zeros_like(logprobs).detach(), None

    trainer._get_per_token_logps_and_entropies = forward
    n = batch.mask.shape[0]
    mask = batch.mask.long()
    inputs = {
        "prompt_ids": torch.zeros(n, 2, dtype=torch.long),
        "prompt_mask": torch.ones(n, 2, dtype=torch.long),
        "completion_ids": torch.zeros(n, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": batch.advantages,
        "old_per_token_logps": batch.old_logprobs,
        "ref_per_token_logps": batch.ref_logprobs,
        "num_items_in_batch": mask.sum(),
    }
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), logprobs.grad


def trl_advantages(trainer: Any) -> tuple[Tensor, Tensor]:
    """TRL's advantages from its generation-and-scoring path, and the group of each row."""
    raw = next(iter(trainer.get_train_dataloader()))
    out = trainer._generate_and_score_completions(raw)
    prompts = [row["prompt"] for row in raw]
    order = {p: i for i, p in enumerate(dict.fromkeys(prompts))}
    group_ids = torch.tensor([order[p] for p in prompts])
    return out["advantages"].detach(), group_ids


# ---------------------------------------------------------------------------------------------
# scalerl side


def scalerl_loss(case: LossCase, batch: Batch) -> tuple[Tensor, Tensor, dict[str, float]]:
    logprobs = batch.logprobs.detach().clone().requires_grad_(True)
    loss, stats = policy_loss(
        logprobs, batch.old_logprobs, batch.advantages, batch.mask, batch.group_ids, **case.scalerl
    )
    if case.beta:
        weights = token_weights(
            batch.mask,
            batch.group_ids,
            case.scalerl["aggregation"],
            case.scalerl.get("max_tokens"),
            dtype=logprobs.dtype,
        )
        old = batch.old_logprobs if case.kl_estimator == "unbiased_k3" else None
        kl = kl_penalty(logprobs, batch.ref_logprobs, case.kl_estimator, old, mask=batch.mask)
        loss = loss + case.beta * weighted_token_sum(kl, weights)
    loss.backward()
    return loss.detach(), logprobs.grad, stats


# ---------------------------------------------------------------------------------------------


def _max_abs(a: Tensor, b: Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def compare_losses(workdir: str, dtype: torch.dtype, seed: int) -> list[Row]:
    rows = []
    for case in LOSS_CASES:
        batch = make_batch(dtype, case.drift, seed)
        trainer = make_trainer(workdir, case.trl)
        t_loss, t_grad = trl_loss(trainer, batch)
        s_loss, s_grad, stats = scalerl_loss(case, batch)
        branches = {k: stats[k] for k in ("clip_frac_low", "clip_frac_high", "is_truncated_frac") if stats[k]}
        rows.append(
            Row(
                case.name,
                float(s_loss),
                float(t_loss),
                abs(float(s_loss) - float(t_loss)),
                _max_abs(s_grad, t_grad),
                extra=branches,
            )
        )
    return rows


def compare_advantages(workdir: str) -> list[Row]:
    # TRL scores in float32; scalerl gets the same float32 rewards.
    rewards = torch.tensor(REWARDS, dtype=torch.float32)
    rows = []
    for scale, adv_norm in (("group", "group"), ("none", "none"), ("batch", "batch")):
        trainer = make_trainer(workdir, {"scale_rewards": scale}, rewards=REWARDS)
        t_adv, group_ids = trl_advantages(trainer)
        s_adv = compute_advantages(rewards, group_ids, adv_norm, eps=TRL_ADV_EPS)
        row = Row(
            f"advantages, {scale} scaling",
            float(s_adv.abs().sum()),
            float(t_adv.abs().sum()),
            _max_abs(s_adv, t_adv),
            None,
        )
        if scale == "batch":
            nonzero = t_adv.abs() > 1e-12
            factor = s_adv[nonzero] / t_adv[nonzero]
            row.must_agree = False
            row.note = (
                "TRL divides r - mean_g by the batch std of the rewards, ScaleRL by the batch std of the "
                f"centred advantages: scalerl = {float(factor.mean()):.6f} x TRL on every sample "
                f"(spread {float(factor.max() - factor.min()):.1e})"
            )
        rows.append(row)
    return rows


def render(rows: list[Row], dtype: torch.dtype) -> tuple[str, bool]:
    tol = TOLERANCE[dtype]
    lines = [
        f"{'case':<40} {'scalerl':>12} {'TRL':>12} {'max|d value|':>13} {'max|d grad|':>12}  ok",
    ]
    ok_all = True
    for r in rows:
        grad = "" if r.grad_diff is None else f"{r.grad_diff:.2e}"
        worst = max(r.value_diff, r.grad_diff or 0.0)
        ok = worst <= tol * max(1.0, abs(r.trl_value))
        if r.must_agree:
            ok_all &= ok
        mark = ("yes" if ok else "NO") if r.must_agree else "differs by definition"
        values = f"{r.scalerl_value:>12.6f} {r.trl_value:>12.6f} {r.value_diff:>13.2e} {grad:>12}"
        lines.append(f"{r.name:<40} {values}  {mark}")
        if r.extra:
            lines.append(
                f"{'':<40} branches hit (scalerl stats): "
                + ", ".join(f"{k}={v:.3f}" for k, v in r.extra.items())
            )
        if r.note:
            lines.append(f"{'':<40} {r.note}")
    return "\n".join(lines), ok_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--dtype", choices=("float64", "float32", "both"), default="both")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        import trl
    except ImportError:
        print("TRL is not installed (pip install trl); nothing compared.", file=sys.stderr)
        return 2
    import transformers

    _quiet()
    torch.set_num_threads(1)
    dtypes = [torch.float64, torch.float32] if args.dtype == "both" else [getattr(torch, args.dtype)]
    print(
        f"TRL {trl.__version__} (transformers {transformers.__version__}, torch {torch.__version__}): "
        "losses via GRPOTrainer._compute_loss with the model forward replaced by the shared log-probs; "
        "advantages via GRPOTrainer._generate_and_score_completions with fixed rewards."
    )
    print(
        f"Batch: {PROMPTS} prompts x {GENERATIONS} samples, response lengths {LENGTHS} (padded to {T}), "
        f"rewards {REWARDS}."
    )
    ok = True
    with tempfile.TemporaryDirectory() as workdir:
        save_tiny_model(workdir)
        advantages = compare_advantages(workdir)
        for dtype in dtypes:
            table, fine = render(compare_losses(workdir, dtype, args.seed), dtype)
            ok &= fine
            name = str(dtype).removeprefix("torch.")
            print(f"\nLosses, {name} (tolerance {TOLERANCE[dtype]:.0e} x max(1, |loss|)):")
            print(table)
        table, fine = render(advantages, torch.float32)
        ok &= fine
        print(
            f"\nAdvantages, float32 as TRL scores them (tolerance {TOLERANCE[torch.float32]:.0e}; "
            "scalerl eps = TRL's 1e-4; columns 2-3: sum of |A|):"
        )
        print(table)
    print("\nall agreeing cases within tolerance" if ok else "\nMISMATCH: see the rows marked NO")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
