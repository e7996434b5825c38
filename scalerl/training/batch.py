"""Scored groups in, padded training tensors out.

A `ScoredGroup` is one prompt's samples with their rewards, as the pipeline hands them over. A
`TrainBatch` lays every sample out as `[left-padded prompt | right-padded response]`, so column
`P + t` of `input_ids` holds response token `t` of every row and the logits that predict it sit at
column `P + t - 1`. All per-token tensors are `[N, T]`, aligned with the response. `select(rows)`
takes a subset (kept groups, a micro-batch) and trims the padding columns the subset does not need.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

from scalerl.data.records import PromptRecord
from scalerl.rollout.protocol import Completion


@dataclass
class ScoredGroup:
    """One prompt's samples and their rewards.

    `rewards[i]` is the (possibly shaped) reward the advantage is computed from; `correct[i]` the
    verifier's verdict, kept apart so pass rates are not distorted by shaping (defaults to
    `reward > 0`). `old_logprobs[i]`, when set, are the trainer's recomputed log-probs of sample
    `i` (pi_old for the importance ratio, see `Trainer.attach_old_logprobs`). `reward_parts[i]`,
    when the run has `rewards.functions`, maps each function's name to its unweighted score of
    sample `i` (what `logging.samples_every` shows; the loss never reads it).
    """

    record: PromptRecord
    completions: list[Completion]
    rewards: list[float]
    correct: list[bool] | None = None
    old_logprobs: list[list[float]] | None = None
    reward_parts: list[Mapping[str, float] | None] | None = None

    def __post_init__(self) -> None:
        n = len(self.completions)
        if n == 0:
            raise ValueError(f"completions: empty group for prompt {self.record.id!r}")
        if len(self.rewards) != n:
            raise ValueError(f"rewards: {len(self.rewards)} rewards for {n} completions ({self.record.id!r})")
        if self.correct is not None and len(self.correct) != n:
            raise ValueError(f"correct: {len(self.correct)} flags for {n} completions ({self.record.id!r})")
        if self.reward_parts is not None and len(self.reward_parts) != n:
            raise ValueError(f"reward_parts: {len(self.reward_parts)} entries for {n} completions "
                             f"({self.record.id!r})")
        if self.old_logprobs is not None:
            if len(self.old_logprobs) != n:
                raise ValueError(f"old_logprobs: {len(self.old_logprobs)} rows for {n} completions")
            for c, lp in zip(self.completions, self.old_logprobs, strict=True):
                if len(lp) != c.num_tokens:
                    raise ValueError(f"old_logprobs: {len(lp)} values for {c.num_tokens} tokens")

    def __len__(self) -> int:
        return len(self.completions)

    @property
    def is_correct(self) -> list[bool]:
        return list(self.correct) if self.correct is not None else [r > 0 for r in self.rewards]


@dataclass
class TrainBatch:
    """Padded tensors of N samples (rows), prompt width P, response width T.

    `response_mask` marks the tokens the loss is taken over (generated AND the completion's
    `loss_mask`); `token_mask` every generated token (forced-interruption phrases included).
    Per-token tensors are 0 (log-probs) or -1 (versions) at padding.
    """

    input_ids: Tensor  # [N, P + T] long
    attention_mask: Tensor  # [N, P + T] long
    position_ids: Tensor  # [N, P + T] long
    prompt_width: int  # P
    response_mask: Tensor  # [N, T] bool
    token_mask: Tensor  # [N, T] bool
    behavior_logprobs: Tensor  # [N, T] float32
    versions: Tensor  # [N, T] long
    start_version: Tensor  # [N] long
    group_ids: Tensor  # [N] long
    rewards: Tensor  # [N] float32
    correct: Tensor  # [N] bool
    prompt_lengths: Tensor  # [N] long
    response_lengths: Tensor  # [N] long
    finish_reasons: list[str]
    old_logprobs: Tensor | None = None  # [N, T] float32
    advantages: Tensor | None = None  # [N] or [N, T] float32
    # Keep-sampling-mask: per response token the `Completion.support` code (-1 where none was
    # recorded) and the members of the sampler's set recorded as ids (`Completion.support_ids`,
    # -1 after each token's own; S = the most any token of the batch recorded, at most
    # `support_max_ids`), and per row the request's (top_k, top_p), 0 / 1.0 (untruncated) where none was.
    support_size: Tensor | None = None  # [N, T] long
    support_ids: Tensor | None = None  # [N, T, S] int32
    support_top_k: Tensor | None = None  # [N] long
    support_top_p: Tensor | None = None  # [N] float32
    # MoE: the engine's recorded experts per column of `input_ids` (prompt and response) and MoE
    # layer, `Completion.routing` laid out like the tokens; -1 at padding / where none was recorded.
    routing: Tensor | None = None  # [N, P + T, layers, k] int16
    tasks: list[str] | None = None  # [N] each row's prompt task (algorithm.kl_coef_by_task)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def response_width(self) -> int:
        return int(self.input_ids.shape[1]) - self.prompt_width

    @property
    def response_ids(self) -> Tensor:
        return self.input_ids[:, self.prompt_width :]

    @property
    def num_tokens(self) -> int:
        """Real (non-pad) tokens, prompt and response: what a forward pass processes."""
        return int(self.attention_mask.sum())

    def to(self, device: torch.device | str) -> TrainBatch:
        moved = {
            f.name: (v.to(device) if isinstance(v := getattr(self, f.name), Tensor) else v)
            for f in fields(self)
        }
        return TrainBatch(**moved)

    def select(self, rows: Sequence[int] | Tensor) -> TrainBatch:
        """Rows `rows` (in that order), with padding columns no selected row uses trimmed away."""
        idx = torch.as_tensor(rows, dtype=torch.long, device=self.input_ids.device)
        n = int(idx.numel())
        p_keep = int(self.prompt_lengths[idx].max()) if n else 0
        t_keep = int(self.response_lengths[idx].max()) if n else 0
        lo, hi = self.prompt_width - p_keep, self.prompt_width + t_keep

        def rows_of(t: Tensor | None, cols: slice | None = None) -> Tensor | None:
            if t is None:
                return None
            picked = t.index_select(0, idx)
            return picked[:, cols] if cols is not None else picked

        resp = slice(0, t_keep)
        return replace(
            self,
            input_ids=rows_of(self.input_ids, slice(lo, hi)),
            attention_mask=rows_of(self.attention_mask, slice(lo, hi)),
            position_ids=rows_of(self.position_ids, slice(lo, hi)),
            prompt_width=p_keep,
            response_mask=rows_of(self.response_mask, resp),
            token_mask=rows_of(self.token_mask, resp),
            behavior_logprobs=rows_of(self.behavior_logprobs, resp),
            versions=rows_of(self.versions, resp),
            start_version=rows_of(self.start_version),
            group_ids=rows_of(self.group_ids),
            rewards=rows_of(self.rewards),
            correct=rows_of(self.correct),
            prompt_lengths=rows_of(self.prompt_lengths),
            response_lengths=rows_of(self.response_lengths),
            finish_reasons=[self.finish_reasons[i] for i in idx.tolist()],
            old_logprobs=rows_of(self.old_logprobs, resp),
            # Per-sample [N] advantages, or per-token [N, T] ones (a critic, a per-token KL reward).
            advantages=rows_of(self.advantages, resp if self.advantages is not None
                               and self.advantages.dim() == 2 else None),
            support_size=rows_of(self.support_size, resp),
            support_ids=trim_ids(rows_of(self.support_ids, resp)),
            support_top_k=rows_of(self.support_top_k),
            support_top_p=rows_of(self.support_top_p),
            routing=rows_of(self.routing, slice(lo, hi)),
            tasks=None if self.tasks is None else [self.tasks[i] for i in idx.tolist()],
        )


@dataclass
class PaddedTokens:
    """`[left-padded prompt | right-padded response]` token layout shared by RL and SFT batches."""

    input_ids: Tensor  # [N, P + T] long
    attention_mask: Tensor  # [N, P + T] long
    position_ids: Tensor  # [N, P + T] long
    prompt_width: int  # P
    token_mask: Tensor  # [N, T] bool: a response token exists
    prompt_lengths: Tensor  # [N] long
    response_lengths: Tensor  # [N] long

    @property
    def response_ids(self) -> Tensor:
        return self.input_ids[:, self.prompt_width :]

    def to_device(self, device: torch.device | str) -> PaddedTokens:
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)
                                if isinstance(getattr(self, f.name), Tensor)})


def pad_prompt_response(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_token_id: int
) -> PaddedTokens:
    """Lay out prompt/response pairs as one padded batch (CPU tensors)."""
    if len(prompts) != len(responses) or not prompts:
        raise ValueError(f"prompts/responses: need as many prompts as responses (> 0), got "
                         f"{len(prompts)} and {len(responses)}")
    n = len(prompts)
    p_width = max(len(p) for p in prompts)
    t_width = max(1, max(len(r) for r in responses))
    input_ids = torch.full((n, p_width + t_width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((n, p_width + t_width), dtype=torch.long)
    token_mask = torch.zeros((n, t_width), dtype=torch.bool)
    for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        p, t = len(prompt), len(response)
        if p == 0:
            raise ValueError(f"prompt_ids: empty prompt in row {row}")
        input_ids[row, p_width - p : p_width] = torch.tensor(list(prompt), dtype=torch.long)
        input_ids[row, p_width : p_width + t] = torch.tensor(list(response), dtype=torch.long)
        attention[row, p_width - p : p_width + t] = 1
        token_mask[row, :t] = True
    # Positions count real tokens only, so a left-padded row sees the positions an unpadded
    # generator gave it.
    position_ids = (attention.cumsum(dim=1) - 1).clamp(min=0)
    return PaddedTokens(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=position_ids,
        prompt_width=p_width,
        token_mask=token_mask,
        prompt_lengths=torch.tensor([len(p) for p in prompts], dtype=torch.long),
        response_lengths=torch.tensor([len(r) for r in responses], dtype=torch.long),
    )


def collate(groups: Sequence[ScoredGroup], pad_token_id: int) -> TrainBatch:
    """Lay out every sample of `groups` as one padded batch (CPU tensors); group id = group index."""
    if not groups:
        raise ValueError("groups: no scored groups to collate")
    samples = [(g, k, c) for g, group in enumerate(groups) for k, c in enumerate(group.completions)]
    any_old = any(g.old_logprobs is not None for g in groups)
    if any_old and not all(g.old_logprobs is not None for g in groups):
        raise ValueError("old_logprobs: set on some groups but not others")
    tokens = pad_prompt_response([c.prompt_ids for _, _, c in samples],
                                 [c.token_ids for _, _, c in samples], pad_token_id)
    n, t_width = tokens.token_mask.shape
    response_mask = torch.zeros((n, t_width), dtype=torch.bool)
    behavior = torch.zeros((n, t_width), dtype=torch.float32)
    versions = torch.full((n, t_width), -1, dtype=torch.long)
    old = torch.zeros((n, t_width), dtype=torch.float32) if any_old else None
    for row, (g, k, c) in enumerate(samples):
        t = c.num_tokens
        response_mask[row, :t] = torch.tensor(c.loss_mask, dtype=torch.bool)
        behavior[row, :t] = torch.tensor(c.logprobs, dtype=torch.float32)
        versions[row, :t] = torch.tensor(c.versions, dtype=torch.long)
        if old is not None:
            old[row, :t] = torch.tensor(groups[g].old_logprobs[k], dtype=torch.float32)  # type: ignore[index]

    support_size = support_ids = support_top_k = support_top_p = None
    if any(c.support is not None for _, _, c in samples):
        support_size = torch.full((n, t_width), -1, dtype=torch.long)
        support_ids = collate_support_ids([c for _, _, c in samples], t_width)
        support_top_k = torch.zeros(n, dtype=torch.long)
        support_top_p = torch.ones(n, dtype=torch.float32)
        for row, (_, _, c) in enumerate(samples):
            if c.support is not None and c.support_cut is not None:
                support_size[row, : c.num_tokens] = torch.tensor(c.support, dtype=torch.long)
                support_top_k[row], support_top_p[row] = int(c.support_cut[0]), float(c.support_cut[1])
    routing = collate_routing(samples, tokens)
    return TrainBatch(
        input_ids=tokens.input_ids,
        attention_mask=tokens.attention_mask,
        position_ids=tokens.position_ids,
        prompt_width=tokens.prompt_width,
        response_mask=response_mask,
        token_mask=tokens.token_mask,
        behavior_logprobs=behavior,
        versions=versions,
        start_version=torch.tensor([c.start_version for _, _, c in samples], dtype=torch.long),
        group_ids=torch.tensor([g for g, _, _ in samples], dtype=torch.long),
        rewards=torch.tensor([groups[g].rewards[k] for g, k, _ in samples], dtype=torch.float32),
        correct=torch.tensor([groups[g].is_correct[k] for g, k, _ in samples], dtype=torch.bool),
        prompt_lengths=tokens.prompt_lengths,
        response_lengths=tokens.response_lengths,
        finish_reasons=[c.finish_reason for _, _, c in samples],
        old_logprobs=old,
        support_size=support_size,
        support_ids=support_ids,
        support_top_k=support_top_k,
        support_top_p=support_top_p,
        routing=routing,
        tasks=[groups[g].record.task for g, _, _ in samples],
    )


def collate_support_ids(completions: Sequence[Completion], t_width: int) -> Tensor:
    """`Completion.support_ids` of every sample as `[N, t_width, S]` int32, -1 after each token's
    recorded ids (and for a sample without a record: the trainer then completes its sets)."""
    width = max((max(c.support_ids.counts, default=0) for c in completions if c.support_ids is not None),
                default=0)
    out = torch.full((len(completions), t_width, width), -1, dtype=torch.int32)
    for row, c in enumerate(completions):
        if c.support_ids is not None and width:
            out[row, : c.num_tokens] = c.support_ids.padded(width)
    return out


def trim_ids(ids: Tensor | None) -> Tensor | None:
    """`[n, T, S]` recorded ids without the trailing columns no token of these rows uses."""
    if ids is None or ids.shape[-1] == 0:
        return ids
    width = int((ids >= 0).sum(dim=-1).max())
    return ids[..., :width]


def collate_routing(samples: Sequence[tuple[int, int, Completion]], tokens: PaddedTokens) -> Tensor | None:
    """`Completion.routing` of every sample laid out like `tokens.input_ids` (`[N, P + T, layers, k]`,
    -1 at padding), or None when no sample carries one. A sample without a record (another engine,
    a multi-turn trajectory) gets -1 throughout: routed freely, counted by the trainer."""
    records = [c.routing for _, _, c in samples]
    shapes = {tuple(r.shape[1:]) for r in records if r is not None}
    if not shapes:
        return None
    if len(shapes) > 1:
        raise ValueError(f"routing: samples recorded with different [layers, k] {sorted(shapes)}")
    layers, k = shapes.pop()
    n, width = tokens.input_ids.shape
    out = torch.full((n, width, layers, k), -1, dtype=torch.int16)
    p_width = tokens.prompt_width
    for row, r in enumerate(records):
        if r is None:
            continue
        p = int(tokens.prompt_lengths[row])
        out[row, p_width - p : p_width - p + int(r.shape[0])] = r.to(torch.int16)
    return out
