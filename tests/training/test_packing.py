"""Token-budget micro-batches and packing (`training.packing`): the plans cover every row once within
their budget, the packed decoder sees each sample alone, and the step's loss and gradients equal the
padded, count-sized step's for every objective setting."""

from __future__ import annotations

import copy
import importlib.util
import random

import pytest
import torch

from scalerl.config import AlgorithmConfig, CriticConfig, OptimConfig, TisConfig
from scalerl.models.lm_head import decoder_of
from scalerl.rollout import SamplingParams
from scalerl.training.batch import collate
from scalerl.training.critic import Critic
from scalerl.training.packing import (
    MicroBatching,
    balance_rows,
    check_packed_attention,
    packed_view,
    response_states,
    row_lengths,
)
from scalerl.training.trainer import Trainer
from tests.training.test_forward import PROMPTS, _generate

# float32: packing changes only the shapes of the decoder's matrix products (and so their rounding).
ATOL = 1e-6

# (micro_batch_tokens, packing): packed in budgets that hold one, a few, or all samples; padded by
# tokens (the budget then counts the padding); packed in micro-batches counted in samples.
LAYOUTS = [(1, True), (24, True), (60, True), (10**6, True), (60, False), (None, True)]


def _random_lengths(seed: int, n: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(1, 40), rng.randint(0, 300)) for _ in range(n)]


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_token_plan_covers_every_row_once_within_the_budget(seed, packed):
    lengths = _random_lengths(seed, 1 + 7 * seed)
    batching = MicroBatching(tokens=200, packed=packed)
    plan = batching.plan(lengths)
    assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))
    for mb in plan:
        assert mb == sorted(mb) and mb
        # Over budget only a row that is over budget alone.
        assert batching.cost([lengths[i] for i in mb]) <= 200 or len(mb) == 1
    assert plan == batching.plan(lengths)  # deterministic


def test_plan_costs_what_the_layout_processes():
    lengths = [(4, 10), (2, 1), (3, 5)]
    assert MicroBatching(packed=True).cost(lengths) == 25
    assert MicroBatching(packed=False).cost(lengths) == 3 * (4 + 10)
    # Counted in samples: consecutive chunks, as before token budgets existed.
    assert MicroBatching(samples=2).plan(lengths * 2) == [[0, 1], [2, 3], [4, 5]]
    # First-fit decreasing: 11 opens a pass, 10 another; 2 fits only beside 10, 1 beside 11.
    assert MicroBatching(tokens=12, packed=True).plan([(2, 9), (1, 1), (2, 8), (1, 0)]) == [[0, 3], [1, 2]]


@pytest.mark.parametrize("seed", range(5))
def test_rank_balance_is_within_lpt_bound(seed):
    lengths = _random_lengths(100 + seed, 37)
    world = 4
    ranks = balance_rows(lengths, world)
    assert sorted(i for r in ranks for i in r) == list(range(37))
    loads = [sum(sum(lengths[i]) for i in r) for r in ranks]
    lower = max(max(sum(x) for x in lengths), sum(loads) / world)  # no assignment does better
    assert max(loads) <= 4 / 3 * lower + 1e-9
    # A sample-balanced split of the same rows, for contrast, is typically far less even.
    assert max(loads) - min(loads) <= max(sum(x) for x in lengths)


def test_packed_states_equal_padded_states(make_policy, make_groups):
    policy = make_policy()
    batch = collate(make_groups(policy, n_groups=3, n=4), policy.pad_token_id)
    view = packed_view(batch)
    assert view.input_ids.shape == (1, batch.num_tokens)
    # Positions restart at 0 for every sample.
    starts = int((view.position_ids[0] == 0).sum())
    assert starts == len(batch)
    decoder = decoder_of(policy.model)
    mask = batch.token_mask
    with torch.no_grad():
        padded = response_states(decoder, batch, packed=False)
        packed = response_states(decoder, batch, packed=True)
        packed_at = response_states(decoder, batch, packed=True, at=mask)
    torch.testing.assert_close(packed[mask], padded[mask], rtol=0, atol=ATOL)
    torch.testing.assert_close(packed_at, padded[mask], rtol=0, atol=ATOL)


def _grads(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in trainer.policy.model.named_parameters() if p.grad is not None}


def _run(base, groups, algo, optim: OptimConfig, warm=None):
    trainer = Trainer(copy.deepcopy(base), algo, optim, max_new_tokens=16)
    if warm is not None:
        trainer.step(warm)  # so that the policy differs from the KL reference
    return trainer.compute_gradients(groups), _grads(trainer)


def _assert_layouts_agree(base, groups, algo, warm=None, chunk=None) -> None:
    ref_m, ref_g = _run(base, groups, algo, OptimConfig(micro_batch_size=64, lr=3e-3,
                                                        logit_chunk_tokens=chunk), warm)
    assert ref_m["padding_frac"] > 0.2  # the batch is uneven: padding is real
    assert ref_g and any(float(g.abs().max()) > 0 for g in ref_g.values())
    for tokens, packing in LAYOUTS:
        optim = OptimConfig(micro_batch_size=5, micro_batch_tokens=tokens, packing=packing, lr=3e-3,
                            logit_chunk_tokens=chunk)
        m, g = _run(base, groups, algo, optim, warm)
        where = f"tokens={tokens} packing={packing}"
        for key in ("loss", "entropy", "kl", "clip_frac_high", "is_ratio_mean"):
            assert m[key] == pytest.approx(ref_m[key], rel=0, abs=ATOL, nan_ok=True), (key, where)
        if packing:
            assert m["padding_frac"] == 0.0
        assert g.keys() == ref_g.keys()
        for name, grad in g.items():
            torch.testing.assert_close(grad, ref_g[name], rtol=0, atol=ATOL, msg=f"{name} {where}")


@pytest.fixture
def setup(make_policy, make_groups):
    base = make_policy()
    groups = make_groups(base, n_groups=3, n=4, noise=0.4) + make_groups(base, n_groups=1, n=2, seed=7)
    return base, groups


@pytest.mark.parametrize("loss_type", ["cispo", "grpo", "gspo", "kimi"])
@pytest.mark.parametrize("aggregation", ["prompt", "sample", "token", "constant"])
def test_packing_and_token_budgets_do_not_change_loss_or_gradients(setup, loss_type, aggregation):
    base, groups = setup
    algo = AlgorithmConfig(loss_type=loss_type, aggregation=aggregation, eps_max=1.5, entropy_coef=0.01)
    _assert_layouts_agree(base, groups, algo)


@pytest.mark.parametrize(
    "algo",
    [
        pytest.param(AlgorithmConfig(entropy_coef=-0.05, loss_type="grpo"), id="entropy-grad"),
        pytest.param(AlgorithmConfig(recompute_old_logprobs=True, tis=TisConfig(enabled=True, cap=1.5)),
                     id="tis-token"),
        pytest.param(AlgorithmConfig(kl_coef=0.1, kl_estimator="unbiased_k3", recompute_old_logprobs=True),
                     id="kl-loss-unbiased-k3"),
        pytest.param(AlgorithmConfig(kl_coef=0.1, kl_in_reward=True, kl_reward_level="token",
                                     adv_norm="batch"), id="kl-in-reward-token"),
        pytest.param(AlgorithmConfig(offpolicy_mask_delta=0.3), id="offpolicy-mask"),
    ],
)
def test_packing_is_exact_with_tis_kl_entropy_and_masks(setup, make_groups, algo):
    base, groups = setup
    warm = make_groups(base, seed=11) if algo.kl_coef > 0 else None
    _assert_layouts_agree(base, groups, algo, warm)


def test_packing_with_the_chunked_head(setup):
    base, groups = setup
    _assert_layouts_agree(base, groups, AlgorithmConfig(entropy_coef=0.01), chunk=7)


@pytest.mark.parametrize("params", [{"top_k": 4}, {"top_p": 0.7}])
def test_packing_with_keep_sampling_mask(make_policy, params):
    policy = make_policy()
    sampling = SamplingParams(n=3, temperature=1.0, max_new_tokens=8, return_support=True, seed=2, **params)
    groups = _generate(policy, sampling, PROMPTS)
    algo = AlgorithmConfig(keep_sampling_mask=True, entropy_coef=0.01)
    ref_m, ref_g = _run(policy, groups, algo, OptimConfig())
    for chunk in (None, 3):
        m, g = _run(policy, groups, algo, OptimConfig(micro_batch_tokens=20, logit_chunk_tokens=chunk))
        assert m["loss"] == pytest.approx(ref_m["loss"], rel=0, abs=ATOL)
        assert m["support_cut_mismatch_tokens"] == ref_m["support_cut_mismatch_tokens"] == 0
        for name, grad in g.items():
            torch.testing.assert_close(grad, ref_g[name], rtol=0, atol=ATOL, msg=name)


def test_old_logprob_and_reference_passes_are_packed_too(make_policy, make_groups):
    policy = make_policy()
    batch = collate(make_groups(policy, n_groups=3, n=4), policy.pad_token_id)
    padded = Trainer(policy, AlgorithmConfig(), OptimConfig()).compute_logprobs(batch)
    packed = Trainer(policy, AlgorithmConfig(), OptimConfig(micro_batch_tokens=30)).compute_logprobs(batch)
    torch.testing.assert_close(packed, padded, rtol=0, atol=ATOL)


def test_critic_values_and_update_are_the_same_packed(make_policy, make_groups):
    policy = make_policy()
    groups = make_groups(policy, n_groups=3, n=4, noise=0.4)
    algo = AlgorithmConfig(baseline="critic", adv_norm="batch", critic=CriticConfig())
    batch = collate(groups, policy.pad_token_id)
    results = []
    for optim in (OptimConfig(), OptimConfig(micro_batch_tokens=25)):
        critic = Critic.for_policy(copy.deepcopy(policy), algo, optim)
        # A head that reads the states (the same in both runs).
        critic.model.head.weight.data = torch.randn(critic.model.head.weight.shape,
                                                    generator=torch.Generator().manual_seed(0)) * 0.5
        adv, _ = critic.estimate(batch, batch.rewards, None)
        metrics = critic.update(batch)
        head_after = critic.model.head.weight.detach().clone()
        results.append((critic.values(batch), adv, metrics["value_loss"], head_after))
    (v0, a0, l0, h0), (v1, a1, l1, h1) = results
    mask = batch.response_mask
    torch.testing.assert_close(v1[mask], v0[mask], rtol=0, atol=ATOL)
    torch.testing.assert_close(a1[mask], a0[mask], rtol=0, atol=ATOL)
    assert l1 == pytest.approx(l0, rel=0, abs=ATOL)
    torch.testing.assert_close(h1, h0, rtol=0, atol=ATOL)


def test_a_model_that_lets_packed_samples_see_each_other_is_refused(make_policy):
    policy = make_policy()
    decoder = decoder_of(policy.model)
    assert check_packed_attention(decoder, 100, "cpu") < 1e-3

    class Leaky(torch.nn.Module):
        """A decoder that ignores sequence boundaries (an attention mask over everything)."""

        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *, input_ids, attention_mask=None, **kw):
            return self.inner(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kw)

    with pytest.raises(ValueError, match=r"optim\.packing"):
        check_packed_attention(Leaky(decoder), 100, "cpu")


def test_row_lengths_and_config_defaults(make_policy, make_groups):
    policy = make_policy()
    batch = collate(make_groups(policy), policy.pad_token_id)
    lengths = row_lengths(batch)
    assert sum(p + t for p, t in lengths) == batch.num_tokens
    # Packed exactly when sized by tokens, unless told otherwise; the default stays padded by count.
    assert MicroBatching.from_optim(OptimConfig()) == MicroBatching(64, None, False)
    assert MicroBatching.from_optim(OptimConfig(micro_batch_tokens=512)).packed
    assert not MicroBatching.from_optim(OptimConfig(micro_batch_tokens=512, packing=False)).packed
    assert MicroBatching.from_optim(OptimConfig(packing=True)).packed


def test_attention_implementation_is_a_key_and_packing_holds_under_each(make_groups):
    """`model.attn_implementation` reaches the model; packing is exact under eager as under sdpa; a
    kernel this machine cannot run is a config error naming the key, not a crash mid-run."""
    from scalerl.config import ConfigError, ModelConfig
    from scalerl.training.policy import load_policy

    policy = load_policy(ModelConfig(attn_implementation="eager"), device="cpu")
    assert policy.model.config._attn_implementation == "eager"
    groups = make_groups(policy, n_groups=3, n=4, noise=0.4)
    _assert_layouts_agree(policy, groups, AlgorithmConfig(aggregation="prompt"))
    if importlib.util.find_spec("flash_attn") is None or not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"model\.attn_implementation='flash_attention_2'"):
            load_policy(ModelConfig(attn_implementation="flash_attention_2"), device="cpu")
