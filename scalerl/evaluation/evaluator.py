"""Held-out validation: mean@k pass rate, the y axis of ScaleRL's compute-scaling fits.

`evaluate` samples `k` completions for every held-out prompt with the policy the engine holds and
reports `val_pass_rate` = mean over prompts of (correct samples / k) (ScaleRL: 1,000 prompts x 16
samples every 100 steps), plus reward, length, truncation and interruption rates and pass@k, and
the same per task of the set (`val_pass_rate/math`, `val_pass_rate/code`, ...), so each domain of a
multi-task run is a curve `scalerl fit RUN --y val_pass_rate/code` reads directly.

Generation goes through a `generate(requests) -> completions` function, so the caller picks how the
engine is shared: in `sync`/`ppo_offpolicy` the engine is idle between rounds and `engine.generate`
is used directly; in `pipeline` mode the requests ride along with the training rollouts on the
generator thread (`Generator.generate_side`) while the trainer waits, so the policy does not change
during the evaluation and no second engine (and no second copy of the weights) is needed.

Held-out entropy (ScaleRL, arXiv 2510.13786, A.12, tracks it against compute): `val_entropy` is
`sampled_token_entropy` of the samples, the mean over the tokens the policy chose of -log pi(token),
with the log-probs the engine returns. For a token drawn from pi(. | prefix), E[-log pi(x | prefix)]
= H(pi(. | prefix)), so this is an unbiased per-token estimate of the policy's entropy along its own
held-out samples, with no extra forward pass and the same on every engine. It is the entropy of the
distribution sampled from (after `eval.temperature` and any top-k/top-p cut), in nats.

Determinism: request `i` of a set samples with seed `seed * 2**32 + i`, and the engines seed one
generator per sample from it, so the draws do not depend on batching. The same seeds are used at
every evaluation (common random numbers), so differences between evaluations reflect the policy,
not the sampling noise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from scalerl.data.modes import row_mode
from scalerl.data.records import PromptRecord
from scalerl.rewards.groups import GroupScorer, ScoredBatch
from scalerl.rollout.protocol import Completion, GenerationRequest, SamplingParams

GenerateFn = Callable[[Sequence[GenerationRequest]], list[Completion]]
_SEED_STRIDE = 1 << 32


def evaluate(
    generate: GenerateFn,
    records: Sequence[PromptRecord],
    encode: Callable[[PromptRecord], list[int]],
    k: int,
    params: SamplingParams,
    scorer: GroupScorer,
    *,
    seed: int = 0,
    prefix: str = "val_",
    request_prefix: str = "eval/",
    on_scored: Callable[[Sequence[ScoredBatch]], None] | None = None,
) -> dict[str, float]:
    """mean@k of `records` under the engine's current weights; keys are `prefix + name`.

    `scorer` must not be shared with a running generator (its results are collected here).
    `on_scored` receives every prompt's scored samples (`scalerl eval --save-samples`).
    """
    if k < 1:
        raise ValueError(f"k: must be >= 1, got {k}")
    if not records:
        raise ValueError("records: no evaluation prompts")
    start = time.perf_counter()
    requests = [
        GenerationRequest(
            request_id=f"{request_prefix}{i}",
            prompt_ids=encode(record),
            params=replace(params, n=k, seed=(seed * _SEED_STRIDE + i) % (1 << 63)),
            metadata={"prompt_id": record.id, "record": record},
        )
        for i, record in enumerate(records)
    ]
    completions = generate(requests)
    by_request: dict[str, list[Completion]] = {r.request_id: [] for r in requests}
    for c in completions:
        if c.request_id not in by_request:
            raise RuntimeError(f"evaluation got a completion for unknown request {c.request_id!r}")
        by_request[c.request_id].append(c)
    for r in requests:
        got = sorted(c.sample_index for c in by_request[r.request_id])
        if got != list(range(k)):
            raise RuntimeError(f"evaluation request {r.request_id!r}: samples {got}, expected 0..{k - 1}")
    scored = scorer.score_all(
        [(r.request_id, record, sorted(by_request[r.request_id], key=lambda c: c.sample_index))
         for r, record in zip(requests, records, strict=True)]
    )

    if on_scored is not None:
        on_scored(scored)
    per_prompt = [sum(s.correct) / k for s in scored]
    samples = [c for s in scored for c in s.completions]
    rewards = [x for s in scored for x in s.rewards]
    versions = [v for c in samples for v in c.versions] or [c.start_version for c in samples]
    n = len(samples)
    metrics = {
        "pass_rate": sum(per_prompt) / len(per_prompt),
        "pass_at_k": sum(p > 0 for p in per_prompt) / len(per_prompt),
        "reward_mean": sum(rewards) / n,
        "response_length": sum(c.num_tokens for c in samples) / n,
        "truncation_rate": sum(c.finish_reason == "length" for c in samples) / n,
        "interruption_rate": sum(c.finish_reason == "interrupted" for c in samples) / n,
        "verifier_failures": float(sum(s.failures for s in scored)),
        "num_prompts": float(len(records)),
        "k": float(k),
        "version_min": float(min(versions)),
        "version_max": float(max(versions)),
        "time_s": time.perf_counter() - start,
    }
    entropy = sampled_token_entropy(samples)
    if entropy is not None:  # every sample forced or empty: no estimate, the key is absent
        metrics["entropy"] = entropy
    metrics.update(_task_metrics(records, scored, k))
    if any("agentic" in c.metadata for c in samples):
        from scalerl.agentic.metrics import agentic_metrics

        metrics.update(agentic_metrics(samples))
    return {f"{prefix}{name}": value for name, value in metrics.items()}


def sampled_token_entropy(samples: Sequence[Completion]) -> float | None:
    """Mean per-token entropy estimate, in nats: sum of -logprob over policy-chosen tokens / their count.

    H(p) = E_{x~p}[-log p(x)] (Shannon), so each sampled token's -log pi is an unbiased estimate of
    the entropy at its prefix; pooling tokens (not per-sample means) weights every token equally,
    as the trainer's token-mean entropy does. Forced tokens (`loss_mask` False: the interruption
    phrase, tool output) were not sampled and are left out. None when no token was sampled.
    """
    total, count = 0.0, 0
    for c in samples:
        for lp, chosen in zip(c.logprobs, c.loss_mask, strict=True):
            if chosen:
                total -= lp
                count += 1
    return total / count if count else None


def _task_metrics(records: Sequence[PromptRecord], scored: Sequence[ScoredBatch], k: int) -> dict[str, float]:
    """`pass_rate/<task>` (mean@k over the task's prompts), reward, length, truncation, prompt count.

    Every task of the set gets its keys, a single-task set too (see `pipeline.stats.task_metrics`).
    """
    by_task: dict[str, list[ScoredBatch]] = {}
    for record, group in zip(records, scored, strict=True):
        by_task.setdefault(record.task, []).append(group)
        mode = row_mode(record)  # rows with a `thinking` column: per mode too (scalerl.data.modes)
        if mode is not None:
            by_task.setdefault(f"mode={mode}", []).append(group)
    out: dict[str, float] = {}
    for task in sorted(by_task):
        groups = by_task[task]
        samples = [c for g in groups for c in g.completions]
        rewards = [x for g in groups for x in g.rewards]
        out[f"pass_rate/{task}"] = sum(sum(g.correct) / k for g in groups) / len(groups)
        out[f"reward_mean/{task}"] = sum(rewards) / len(rewards)
        out[f"response_length/{task}"] = sum(c.num_tokens for c in samples) / len(samples)
        out[f"truncation_rate/{task}"] = sum(c.finish_reason == "length" for c in samples) / len(samples)
        entropy = sampled_token_entropy(samples)
        if entropy is not None:
            out[f"entropy/{task}"] = entropy
        out[f"num_prompts/{task}"] = float(len(groups))
    return out


class Evaluator:
    """The held-out set (`val_*` keys) and optional extra sets (`val_<name>_*` keys), one call.

    `scorer` and `decode` build a private `GroupScorer` (verifier failures count as incorrect).
    """

    def __init__(
        self,
        heldout: Sequence[PromptRecord],
        encode: Callable[[PromptRecord], list[int]],
        scorer: GroupScorer,
        *,
        k: int,
        params: SamplingParams,
        seed: int = 0,
        extra_sets: Mapping[str, Sequence[PromptRecord]] | None = None,
    ) -> None:
        if not heldout:
            raise ValueError("heldout: the evaluator needs at least one held-out prompt")
        for name in extra_sets or {}:
            if not name.isidentifier():
                raise ValueError(f"extra_sets: name {name!r} must be an identifier (it becomes a metric key)")
        self.heldout = list(heldout)
        self.extra_sets = {name: list(records) for name, records in (extra_sets or {}).items()}
        self.encode = encode
        self.scorer = scorer
        self.k = k
        self.params = params
        self.seed = seed

    def run(self, generate: GenerateFn) -> dict[str, float]:
        out = evaluate(
            generate, self.heldout, self.encode, self.k, self.params, self.scorer,
            seed=self.seed, prefix="val_", request_prefix="eval/heldout/",
        )
        for name, records in self.extra_sets.items():
            out.update(
                evaluate(
                    generate, records, self.encode, self.k, self.params, self.scorer,
                    seed=self.seed, prefix=f"val_{name}_", request_prefix=f"eval/{name}/",
                )
            )
        return out

    def close(self) -> None:
        self.scorer.close()
