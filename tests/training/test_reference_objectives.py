"""One real `Trainer.step` on a stale batch against each objective written out from its paper.

The batch is off-policy: the importance ratios `pi_theta / pi_old` are set token by token to values
spread over 0.3..3 (plus a per-sequence offset, so GSPO's sequence ratios spread too), and the
behaviour log-probs (the engine's) differ from `pi_old` by another spread of ratios, so tokens lie
beyond every clip boundary: below `1 - eps_low`, above `1 + eps_high`, above CISPO's `eps_max`,
above the dual-clip `c` with a negative advantage, above the TIS cap. At ratio 1 the objectives'
gradients coincide; here they do not, and each case asserts it (`_assert_distinct`).

The reference is computed here with torch autograd from each paper's formula, with its own
arithmetic: its own forward (unpadded, one sample at a time, `log_softmax(logits / T)`), its own
advantages (`r - mean_group r`), its own aggregation weights, and its own objective. Nothing from
`scalerl.algorithms` is called. The trainer runs one `step` (AdamW with `eps = 1`, no weight decay,
no warm-up, no clipping), whose first update is exactly `-lr * g / (|g| + eps)` per parameter
element; the test compares that with the reference gradient's image.

Precision: the model is float64, but the trainer's forward takes the LM head and log-softmax to
float32 (`scalerl.models.lm_head`, the FP32-head design), so the trainer's log-probs and objective
arithmetic carry float32 rounding. The tolerance (`RTOL`, `ATOL_FRAC`) is set from that, and every
case asserts that the reference of the nearest wrong objective (the key's code path bypassed) is
more than `SEPARATION` tolerances away, so the comparison can fail for each key.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace

import pytest
import torch

from scalerl.config import AlgorithmConfig, OptimConfig, TisConfig
from scalerl.data.records import PromptRecord
from scalerl.rollout.protocol import Completion
from scalerl.training.batch import ScoredGroup
from scalerl.training.policy import load_policy
from scalerl.training.trainer import Trainer
from tests.training.conftest import tiny_model_config

TEMPERATURE = 0.9
MAX_NEW_TOKENS = 12
LR = 1e-3
ADAM_EPS = 1.0
# Rewards are multiples of 1/4 and groups have 4 or 2 samples, so the group means (and the
# advantages) are exact in the trainer's float32 reward tensor.
REWARDS = [[1.0, 0.0, 0.5, 0.25], [0.0, 0.75, 1.0, 0.25], [1.0, 0.0]]
LENGTHS = [[3, 9, 5, 7], [6, 4, 10, 2], [8, 5]]
TASKS = ["math", "code", "toy"]  # each group's prompt task
MASKED = {(0, 1): (2, 4)}  # sample (group, k): response positions [2, 4) outside the loss (an interruption)
# The importance ratios pi_theta / pi_old of the batch's tokens: one on each side of every bound
# the cases use (0.8, 1.2, 1.28, 1.4, 1.6, 2.0; none within rounding of one).
RATIOS = [0.3, 0.5, 0.7, 0.9, 1.1, 1.24, 1.35, 1.5, 1.8, 2.4, 3.0]
RTOL = 2e-5
ATOL_FRAC = 2e-6  # of the largest update element
SEPARATION = 50.0


@dataclass(frozen=True)
class Objective:
    """The keys of one reference computation (the trainer's `AlgorithmConfig` is built from it)."""

    loss_type: str = "grpo"
    aggregation: str = "sample"
    eps_low: float = 0.2
    eps_high: float = 0.2
    eps_max: float = 1.6
    dual_clip_c: float | None = None
    kimi_tau: float = 0.3
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    tis_cap: float | None = None
    tis_level: str = "token"
    offpolicy_delta: float | None = None
    kl_by_task: tuple[tuple[str, float], ...] = ()  # algorithm.kl_coef_by_task

    def kl_of(self, group: int) -> float:
        """The KL weight of a sample of `group`: its task's, else kl_coef."""
        return dict(self.kl_by_task).get(TASKS[group], self.kl_coef)

    def algorithm(self) -> AlgorithmConfig:
        tis = self.tis_cap is not None
        return AlgorithmConfig(
            loss_type=self.loss_type, aggregation=self.aggregation, baseline="group_mean", adv_norm="none",
            eps_low=self.eps_low, eps_high=self.eps_high, eps_max=self.eps_max, dual_clip_c=self.dual_clip_c,
            kimi_tau=self.kimi_tau, entropy_coef=self.entropy_coef, kl_coef=self.kl_coef,
            kl_estimator=self.kl_estimator,
            tis=TisConfig(enabled=tis, cap=self.tis_cap if tis else 2.0, level=self.tis_level),
            recompute_old_logprobs=tis, offpolicy_mask_delta=self.offpolicy_delta,
            kl_coef_by_task=dict(self.kl_by_task),
        )


@dataclass
class Sample:
    group: int
    prompt: list[int]
    response: list[int]
    mask: list[bool]
    reward: float
    old: list[float] = field(default_factory=list)  # log pi_old, float32 values
    behaviour: list[float] = field(default_factory=list)  # log pi_gen, float32 values


def _f32(values: torch.Tensor) -> list[float]:
    return values.float().double().tolist()


def own_logprobs(model: torch.nn.Module, s: Sample) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of the response tokens and the next-token entropies, `log_softmax(z / T)`, from one
    unpadded forward of `prompt + response` (logits at position p-1+t predict response token t)."""
    ids = torch.tensor([s.prompt + s.response])
    p, n = len(s.prompt), len(s.response)
    logits = model(input_ids=ids).logits[0, p - 1 : p - 1 + n].double() / TEMPERATURE
    logp = torch.log_softmax(logits, dim=-1)
    tokens = torch.tensor(s.response)
    chosen = logp[torch.arange(n), tokens]
    entropy = -(logp.exp() * logp).sum(dim=-1)
    return chosen, entropy


def _perturbed(model: torch.nn.Module, seed: int, scale: float) -> torch.nn.Module:
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
    return other


@dataclass
class Stale:
    policy: object
    reference: torch.nn.Module  # the KL reference model (other weights than the policy's)
    samples: list[Sample]

    def groups(self, tis: bool) -> list[ScoredGroup]:
        """Without TIS pi_old is the behaviour policy (the trainer reads the completion's log-probs);
        with TIS pi_old is the groups' `old_logprobs` and the completions carry pi_gen."""
        out = []
        for gi, rewards in enumerate(REWARDS):
            members = [s for s in self.samples if s.group == gi]
            completions = [
                Completion(
                    request_id=f"p{gi}", sample_index=k, prompt_ids=s.prompt, token_ids=s.response,
                    logprobs=s.behaviour if tis else s.old, versions=[0] * len(s.response),
                    loss_mask=s.mask, finish_reason="stop", start_version=0,
                )
                for k, s in enumerate(members)
            ]
            out.append(ScoredGroup(
                record=PromptRecord(id=f"p{gi}", task=TASKS[gi], prompt="x"), completions=completions,
                rewards=list(rewards), old_logprobs=[s.old for s in members] if tis else None,
            ))
        return out


@pytest.fixture(scope="module")
def stale() -> Stale:
    policy = load_policy(tiny_model_config(seed=3), device="cpu")
    policy.model.double()
    reference = _perturbed(policy.model, seed=11, scale=0.05)
    policy.reference_factory = lambda: copy.deepcopy(reference)
    g = torch.Generator().manual_seed(5)
    vocab = policy.model.get_input_embeddings().weight.shape[0]
    samples = []
    for gi, lengths in enumerate(LENGTHS):
        prompt = torch.randint(8, vocab, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
        for k, n in enumerate(lengths):
            mask = [True] * n
            if (gi, k) in MASKED:
                a, b = MASKED[(gi, k)]
                mask[a:b] = [False] * (b - a)
            response = torch.randint(8, vocab, (n,), generator=g).tolist()
            samples.append(Sample(gi, prompt, response, mask, REWARDS[gi][k]))
    lo, hi = math.log(0.3), math.log(3.0)
    spread = torch.log(torch.tensor(RATIOS, dtype=torch.float64))
    with torch.no_grad():
        for s in samples:
            lp, _ = own_logprobs(policy.model, s)
            n = len(s.response)
            # log pi_theta / pi_old: drawn from RATIOS, so every clip region holds tokens and the
            # sequences' geometric means spread too
            log_ratio = spread[torch.randint(0, len(RATIOS), (n,), generator=g)]
            s.old = _f32(lp - log_ratio)
            # log pi_old / pi_gen: the TIS weight before its cap, also over 0.3..3
            log_w = torch.empty(n, dtype=torch.float64).uniform_(lo, hi, generator=g)
            s.behaviour = _f32(torch.tensor(s.old, dtype=torch.float64) - log_w)
    return Stale(policy, reference, samples)


# -- the reference -------------------------------------------------------------------------------


def advantages(samples: list[Sample]) -> list[float]:
    """GRPO's group-relative advantage with no scaling: `A_i = r_i - mean_{j in g(i)} r_j`."""
    out = []
    for s in samples:
        group = [t.reward for t in samples if t.group == s.group]
        out.append(s.reward - sum(group) / len(group))
    return out


def sample_weights(samples: list[Sample], aggregation: str) -> list[float]:
    """The weight every loss token of sample i gets, so that the loss is `sum_i w_i sum_t l_{i,t}`.

    sample (GRPO, arXiv 2402.03300 eq. 3): `1 / (N |o_i|)`; prompt (ScaleRL's prompt-level average,
    DAPO's `1 / sum_i |o_i|` inside the expectation over prompts, arXiv 2503.14476 eq. 8):
    `1 / (P sum_{j in g(i)} |o_j|)`; token (batch token mean): `1 / sum_j |o_j|`; constant
    (Dr. GRPO, arXiv 2503.20783): `1 / (N * max_new_tokens)`. `|o_i|` counts loss tokens only.
    """
    lengths = [sum(s.mask) for s in samples]
    n = len(samples)
    n_prompts = len({s.group for s in samples})
    if aggregation == "sample":
        return [1.0 / (n * L) for L in lengths]
    if aggregation == "prompt":
        per_prompt = {g: sum(L for s, L in zip(samples, lengths, strict=True) if s.group == g)
                      for g in {s.group for s in samples}}
        return [1.0 / (n_prompts * per_prompt[s.group]) for s in samples]
    if aggregation == "token":
        return [1.0 / sum(lengths)] * n
    assert aggregation == "constant"
    return [1.0 / (n * MAX_NEW_TOKENS)] * n


def ppo_clip(
    ratio: torch.Tensor, adv: float, eps_low: float, eps_high: float, dual_c: float | None
) -> torch.Tensor:
    """PPO's clipped surrogate objective (to maximise), asymmetric range (DAPO clip-higher), and for
    A < 0 the dual clip `max(., c A)` (Ye et al. 2020, arXiv 1912.09729, eq. 5)."""
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv)
    if dual_c is not None and adv < 0:
        surrogate = torch.max(surrogate, torch.full_like(surrogate, dual_c * adv))
    return surrogate


def reference_loss(model: torch.nn.Module, stale: Stale, o: Objective) -> torch.Tensor:
    """The objective `o` written out per sample (a loss to minimise) on the policy `model`."""
    samples = stale.samples
    adv = advantages(samples)
    weights = sample_weights(samples, o.aggregation)
    total = torch.zeros((), dtype=torch.float64)
    for s, a, w in zip(samples, adv, weights, strict=True):
        lp, entropy = own_logprobs(model, s)
        m = torch.tensor(s.mask)
        old = torch.tensor(s.old, dtype=torch.float64)
        behaviour = torch.tensor(s.behaviour if o.tis_cap is not None else s.old, dtype=torch.float64)
        # TIS (Yao et al. 2025): sg(min(pi_old / pi_gen, C)), per token or for the whole sequence.
        if o.tis_cap is None:
            tis = torch.ones_like(old)
        elif o.tis_level == "token":
            tis = torch.exp(old - behaviour).clamp(max=o.tis_cap)
        else:
            tis = torch.exp(((old - behaviour) * m).sum()).clamp(max=o.tis_cap).expand_as(old)
        # DeepSeek-V3.2 off-policy sequence mask: drop A < 0 samples whose
        # (1/|o|) sum_t log(pi_gen / pi_theta) exceeds delta (pi_gen: the sampling policy).
        keep = 1.0
        if o.offpolicy_delta is not None:
            drift = float(((behaviour - lp.detach()) * m).sum() / m.sum())
            keep = 0.0 if (a < 0 and drift > o.offpolicy_delta) else 1.0
        log_ratio = lp - old
        if o.loss_type == "grpo":
            token_loss = -ppo_clip(torch.exp(log_ratio), a, o.eps_low, o.eps_high, o.dual_clip_c)
            policy = (token_loss * tis * m).sum() * w
        elif o.loss_type == "cispo":
            # MiniMax-M1 / ScaleRL eq. 4: REINFORCE with the truncated, detached IS weight.
            weight = torch.exp(log_ratio.detach()).clamp(max=o.eps_max)
            policy = -(weight * a * lp * tis * m).sum() * w
        elif o.loss_type == "gspo":
            # GSPO (arXiv 2507.18071 eq. 5-7): s_i = (pi(y_i) / pi_old(y_i))^(1/|y_i|), clipped per
            # sequence; the sample's share of the batch is its tokens' summed weight.
            s_i = torch.exp((log_ratio * m).sum() / m.sum())
            policy = -ppo_clip(s_i, a, o.eps_low, o.eps_high, o.dual_clip_c) * w * m.sum()
        else:
            # Kimi k1.5 (arXiv 2501.12599 §2.3.2, eq. 3): the gradient
            # A grad log pi(y) - (tau / 2) grad (log pi(y) / pi_old(y))^2 is that of this surrogate.
            rho = (log_ratio * m).sum()
            policy = -(a * rho - 0.5 * o.kimi_tau * rho**2) * w * m.sum()
        total = total + keep * policy
        if o.entropy_coef:
            total = total - o.entropy_coef * (entropy * m).sum() * w
        if o.kl_of(s.group):
            with torch.no_grad():
                ref, _ = own_logprobs(stale.reference, s)
            kl = _kl(lp, ref, old, o.kl_estimator)
            total = total + o.kl_of(s.group) * (kl * m).sum() * w
    return total


def _kl(lp: torch.Tensor, ref: torch.Tensor, old: torch.Tensor, estimator: str) -> torch.Tensor:
    """Schulman's estimators of KL(pi || pi_ref) from samples of pi (joschu.net/blog/kl-approx.html)
    with x = pi_ref / pi: k1 = -log x, k2 = (log x)^2 / 2, k3 = x - 1 - log x; DeepSeek-V3.2's
    unbiased k3 (arXiv 2512.02556 eq. 7) weights k3 by pi / pi_old, that weight not detached."""
    log_x = ref - lp
    if estimator == "k1":
        return -log_x
    if estimator == "k2":
        return 0.5 * log_x**2
    k3 = torch.exp(log_x) - 1.0 - log_x
    if estimator == "k3":
        return k3
    assert estimator == "unbiased_k3"
    return torch.exp(lp - old) * k3


def reference_update(stale: Stale, o: Objective) -> dict[str, torch.Tensor]:
    """AdamW's first update on the reference gradient: `-lr * g / (|g| + eps)` (no decay)."""
    model = copy.deepcopy(stale.policy.model)
    model.train()
    model.zero_grad(set_to_none=True)
    reference_loss(model, stale, o).backward()
    out = {}
    for name, p in model.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        out[name] = -LR * g / (g.abs() + ADAM_EPS)
    return out


def trainer_update(stale: Stale, o: Objective) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    policy = copy.deepcopy(stale.policy)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    optim = OptimConfig(lr=LR, eps=ADAM_EPS, weight_decay=0.0, warmup_steps=0, grad_clip=None,
                        micro_batch_size=3)
    trainer = Trainer(policy, o.algorithm(), optim, temperature=TEMPERATURE, max_new_tokens=MAX_NEW_TOKENS)
    metrics = trainer.step(stale.groups(tis=o.tis_cap is not None))
    assert metrics["skipped_nonfinite"] == 0.0 and metrics["skipped_no_signal"] == 0.0
    assert trainer.version == 1
    return {n: p.detach() - before[n] for n, p in policy.model.named_parameters()}, metrics


def _gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest element-wise difference, in units of the tolerance of `b` (the reference)."""
    scale = max(float(v.abs().max()) for v in b.values())
    return max(float(((a[n] - b[n]).abs() / (ATOL_FRAC * scale + RTOL * b[n].abs())).max()) for n in b)


def _assert_distinct(
    stale: Stale, o: Objective, ref: dict[str, torch.Tensor], wrong: list[Objective]
) -> None:
    """Each bypass of the key (`wrong`) must move the reference well outside the tolerance."""
    for w in wrong:
        gap = _gap(reference_update(stale, w), ref)
        assert gap > SEPARATION, f"{w} is within {gap:.1f} tolerances of {o}: the test cannot tell them apart"


# -- the cases -----------------------------------------------------------------------------------

GRPO = Objective(loss_type="grpo", aggregation="sample")
CISPO = Objective(loss_type="cispo", aggregation="prompt", eps_max=1.6)

CASES: dict[str, tuple[Objective, list[Objective]]] = {
    # name: (the objective, the wrong objectives a bypassed code path would train instead)
    "grpo": (GRPO, [replace(GRPO, loss_type="cispo"), replace(GRPO, loss_type="gspo")]),
    "dapo_clip_higher": (
        replace(GRPO, eps_high=0.28, aggregation="token"),
        [replace(GRPO, eps_high=0.2, aggregation="token"),
         replace(GRPO, eps_high=0.28, aggregation="sample")],
    ),
    "dual_clip": (replace(GRPO, dual_clip_c=2.0), [GRPO]),
    "gspo": (
        replace(GRPO, loss_type="gspo", eps_high=0.28),
        [replace(GRPO, eps_high=0.28), replace(GRPO, loss_type="cispo")],
    ),
    "gspo_dual_clip": (
        replace(GRPO, loss_type="gspo", dual_clip_c=1.4),
        [replace(GRPO, loss_type="gspo")],
    ),
    "cispo": (CISPO, [replace(CISPO, loss_type="grpo"), replace(CISPO, eps_max=1e9)]),
    "kimi": (
        Objective(loss_type="kimi", kimi_tau=0.3),
        [Objective(loss_type="kimi", kimi_tau=0.1), GRPO, replace(GRPO, loss_type="cispo")],
    ),
    "entropy": (replace(CISPO, entropy_coef=0.05), [CISPO, replace(CISPO, entropy_coef=0.1)]),
    "tis_token": (
        replace(CISPO, tis_cap=1.5, tis_level="token"),
        [CISPO, replace(CISPO, tis_cap=1e9, tis_level="token"),
         replace(CISPO, tis_cap=1.5, tis_level="sequence")],
    ),
    "tis_sequence": (
        replace(GRPO, tis_cap=1.5, tis_level="sequence"),
        [GRPO, replace(GRPO, tis_cap=1e9, tis_level="sequence"),
         replace(GRPO, tis_cap=1.5, tis_level="token")],
    ),
    "offpolicy_mask": (replace(GRPO, offpolicy_delta=0.1), [GRPO, replace(GRPO, offpolicy_delta=0.4)]),
}
KL_ESTIMATORS = ("k1", "k2", "k3", "unbiased_k3")
AGGREGATIONS = ("prompt", "sample", "token", "constant")
for _est in KL_ESTIMATORS:
    CASES[f"kl_{_est}"] = (
        replace(GRPO, kl_coef=0.5, kl_estimator=_est),
        [GRPO] + [replace(GRPO, kl_coef=0.5, kl_estimator=e) for e in KL_ESTIMATORS if e != _est],
    )
# The deepseek_v32 recipe's objective (its KL weight raised so the term shows): GRPO with the
# unbiased k3 and the off-policy sequence mask; the mask multiplies the clipped policy term, the KL
# term stays (V3.2 §3.1 writes M_{i,t} on the clipped term, beside -beta D_KL).
DSV32 = replace(GRPO, kl_coef=0.5, kl_estimator="unbiased_k3", offpolicy_delta=0.1)
CASES["deepseek_v32"] = (
    DSV32,
    [replace(DSV32, offpolicy_delta=None), replace(DSV32, kl_estimator="k3"), replace(DSV32, kl_coef=0.0)],
)
# DeepSeek-V3.2's KL strength per domain: none for math, a stronger one for code, the global
# kl_coef for the other task (algorithm.kl_coef_by_task).
PER_TASK = replace(GRPO, kl_coef=0.5, kl_by_task=(("math", 0.0), ("code", 2.0)))
CASES["kl_by_task"] = (
    PER_TASK,
    [replace(PER_TASK, kl_by_task=()), replace(PER_TASK, kl_by_task=(("math", 2.0), ("code", 0.0))),
     replace(PER_TASK, kl_coef=0.0)],
)
# Only one task has a KL term (kl_coef 0): the reference model is still used.
CASES["kl_by_task_only"] = (
    replace(GRPO, kl_by_task=(("code", 1.0),)),
    [GRPO, replace(GRPO, kl_by_task=(("math", 1.0),))],
)
for _agg in AGGREGATIONS:
    CASES[f"aggregation_{_agg}"] = (
        replace(GRPO, aggregation=_agg, eps_high=0.28),
        [replace(GRPO, aggregation=a, eps_high=0.28) for a in AGGREGATIONS if a != _agg],
    )


@pytest.mark.parametrize("name", list(CASES))
def test_one_trainer_step_is_the_papers_update(stale, name):
    objective, wrong = CASES[name]
    ref = reference_update(stale, objective)
    got, _ = trainer_update(stale, objective)
    gap = _gap(got, ref)
    assert gap <= 1.0, f"{name}: the trainer's update is {gap:.2f} tolerances from the paper's"
    _assert_distinct(stale, objective, ref, wrong)


def test_the_batch_is_off_policy_beyond_every_bound(stale):
    """The stale batch reaches every branch the cases rely on (else a case could pass vacuously)."""
    model = stale.policy.model
    adv = advantages(stale.samples)
    ratios, seq_ratios, tis_w, seq_tis, drifts = [], [], [], [], []
    with torch.no_grad():
        for s, a in zip(stale.samples, adv, strict=True):
            lp, _ = own_logprobs(model, s)
            m = torch.tensor(s.mask)
            old = torch.tensor(s.old, dtype=torch.float64)
            beh = torch.tensor(s.behaviour, dtype=torch.float64)
            r = torch.exp(lp - old)[m]
            ratios += [(float(x), a) for x in r]
            seq_ratios.append((float(torch.exp(torch.log(r).mean())), a))
            tis_w += torch.exp(old - beh)[m].tolist()
            seq_tis.append(float(torch.exp((old - beh)[m].sum())))
            drifts.append((float((old - lp)[m].mean()), a))
    assert min(r for r, _ in ratios) < 0.35 and max(r for r, _ in ratios) > 2.5
    assert any(r < 0.8 and a < 0 for r, a in ratios), "no A < 0 token below 1 - eps_low"
    assert any(r > 1.28 and a > 0 for r, a in ratios), "no A > 0 token above 1 + eps_high"
    assert any(1.2 < r < 1.28 and a > 0 for r, a in ratios), "no A > 0 token between eps_high 0.2 and 0.28"
    assert any(r > 1.6 for r, _ in ratios) and any(r < 1.6 for r, _ in ratios), "eps_max splits no tokens"
    assert any(r > 2.0 and a < 0 for r, a in ratios), "no A < 0 token beyond dual_clip_c"
    assert any(s > 1.4 and a < 0 for s, a in seq_ratios), "no A < 0 sequence beyond GSPO's dual clip"
    assert any(s > 1.28 and a > 0 for s, a in seq_ratios) and any(0.8 < s < 1.2 for s, _ in seq_ratios)
    assert any(w > 1.5 for w in tis_w) and any(w < 1.5 for w in tis_w)
    assert any(w > 1.5 for w in seq_tis) and any(w < 1.5 for w in seq_tis)
    masked = [d > 0.1 and a < 0 for d, a in drifts]
    assert any(masked) and any(a < 0 and not k for (_, a), k in zip(drifts, masked, strict=True))
    # No value sits within float32 rounding of a boundary, where the two sides could decide apart.
    for r, _ in ratios:
        for bound in (0.8, 1.2, 1.28, 1.6, 2.0):
            assert abs(r - bound) > 1e-4
