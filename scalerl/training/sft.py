"""Supervised fine-tuning (the warm start before RL): prompt -> response pairs, loss on the response.

Each example is the prompt through the chat template with the generation prompt opened, then the
response and the end-of-sequence token; the loss is the mean negative log-likelihood of the
response tokens (the prompt is context only). Log-probs come from the same forward (and LM-head
code) as RL training.

`scalerl.assembly.warm_start.warm_start_default(cfg)` is what `scalerl train` calls when no model
is given (it reads the run's config, so it lives in the composition root): it SFTs the embedded
tiny model on the synthetic task's gold traces (`metadata["solution"]`) of the *training* split and
caches the result (`save_pretrained` model + tokenizer) under `~/.cache/scalerl/sft/` (or
`$SCALERL_CACHE_DIR/sft/`), keyed by a hash of everything that determines it, so later runs,
the demo and the tests reuse it. The warm start is one model for every RL recipe: it is trained
in a fixed way (float32, FP32 LM head, one CPU thread) whatever the RL run's `model.dtype`,
`model.fp32_lm_head` or the machine's cores, so runs that differ only in RL settings start from
the same weights, and training is deterministic given the seed. That seed is `model.init_seed`,
not the run's `seed`: the base model is the same for every RL seed of a run.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from scalerl.config import OptimConfig
from scalerl.data.records import PromptRecord
from scalerl.data.tokenize import encode_prompt
from scalerl.inputs import CACHE_DIR_VAR
from scalerl.ownership import check_output_dir_owned, mark_output_dir
from scalerl.training.batch import pad_prompt_response
from scalerl.training.forward import response_forward
from scalerl.training.optim import build_optimizer, build_scheduler
from scalerl.training.policy import Policy
from scalerl.training.sft_config import SFTConfig

logger = logging.getLogger(__name__)

# Bump when the warm-start procedure changes, so stale cached models are not reused.
# 2: trained on one thread with a fixed precision (not the RL run's fp32_lm_head / dtype).
SFT_RECIPE_VERSION = 2
INFO_FILE = "sft_info.json"
#: the kind an SFT output folder is marked with (`scalerl.ownership`)
SFT_KIND = "sft"


@dataclass(frozen=True)
class SFTExample:
    """`response_mask` (None: every response token) marks the tokens the loss is taken over: a
    multi-turn trace's environment segments (tool results) are context, not targets."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_mask: tuple[bool, ...] | None = None

    def __post_init__(self) -> None:
        if self.response_mask is not None and len(self.response_mask) != len(self.response_ids):
            raise ValueError(f"response_mask: {len(self.response_mask)} flags for "
                             f"{len(self.response_ids)} tokens")


@dataclass
class SFTResult:
    losses: list[float]
    tokens: int
    seconds: float
    examples: int

    @property
    def final_loss(self) -> float:
        tail = self.losses[-10:]
        return sum(tail) / len(tail) if tail else math.nan


def encode_example(
    record: PromptRecord, response: str, tokenizer: Any, system_prompt: str | None, template: str = "chat"
) -> SFTExample:
    """Prompt ids exactly as RL encodes them (`data.template`), then the response ids and eos."""
    prompt = encode_prompt(record, tokenizer, system_prompt, template)
    response_ids = list(tokenizer.encode(response, add_special_tokens=False))
    return SFTExample(tuple(prompt), (*response_ids, int(tokenizer.eos_token_id)))


def examples_from_records(
    pairs: Sequence[tuple[PromptRecord, str]],
    tokenizer: Any,
    system_prompt: str | None,
    max_length: int,
    template: str = "chat",
) -> list[SFTExample]:
    """Encode (record, response) pairs; pairs longer than `max_length` tokens are an error."""
    out = []
    for record, response in pairs:
        ex = encode_example(record, response, tokenizer, system_prompt, template)
        total = len(ex.prompt_ids) + len(ex.response_ids)
        if total > max_length:
            where = record.source or record.id
            raise ValueError(f"{where}: example has {total} tokens > sft max_length={max_length}")
        out.append(ex)
    if not out:
        raise ValueError("sft: no training examples")
    return out


def solution_pairs(records: Sequence[PromptRecord]) -> list[tuple[PromptRecord, str]]:
    """(record, gold trace) for records that carry `metadata["solution"]`."""
    pairs = [(r, r.metadata["solution"]) for r in records if isinstance(r.metadata.get("solution"), str)]
    if not pairs:
        raise ValueError('sft: no record has a metadata["solution"] gold response')
    return pairs


# ---------------------------------------------------------------------------------------------
# Training


def _batches(n: int, batch_size: int, seed: int) -> Iterator[list[int]]:
    """Example indices in seeded epoch-wise shuffles, `batch_size` at a time, forever."""
    gen = torch.Generator().manual_seed(seed)
    buffer: list[int] = []
    while True:
        while len(buffer) < batch_size:
            buffer.extend(torch.randperm(n, generator=gen).tolist())
        yield buffer[:batch_size]
        buffer = buffer[batch_size:]


def sft_loss(policy: Policy, examples: Sequence[SFTExample]) -> tuple[torch.Tensor, int]:
    """Mean NLL of the response tokens of `examples` (differentiable) and their token count."""
    tokens = pad_prompt_response([e.prompt_ids for e in examples], [e.response_ids for e in examples],
                                 policy.pad_token_id).to_device(policy.device)
    with policy.autocast():
        out = response_forward(policy.model, tokens, temperature=1.0, fp32_lm_head=policy.fp32_lm_head)
    lp = out.logprobs
    mask = tokens.token_mask
    if any(e.response_mask is not None for e in examples):
        given = torch.zeros_like(mask)
        for row, e in enumerate(examples):
            flags = e.response_mask if e.response_mask is not None else (True,) * len(e.response_ids)
            given[row, : len(flags)] = torch.tensor(flags, dtype=torch.bool)
        mask = mask & given.to(mask.device)
    count = int(mask.sum())
    return -torch.where(mask, lp, torch.zeros_like(lp)).sum() / count, count


def train_sft(
    policy: Policy,
    examples: Sequence[SFTExample],
    cfg: SFTConfig,
    on_step: Callable[[int, float], None] | None = None,
) -> SFTResult:
    """`cfg.steps` AdamW steps on random batches of `examples`; deterministic given `cfg.seed`."""
    model = policy.model
    model.train()
    optim_cfg = OptimConfig(lr=cfg.lr, weight_decay=cfg.weight_decay, warmup_steps=cfg.warmup_steps,
                            grad_clip=cfg.grad_clip)
    optimizer = build_optimizer(model, optim_cfg)
    scheduler = build_scheduler(optimizer, cfg.warmup_steps)
    losses: list[float] = []
    seen = 0
    start = time.perf_counter()
    for step, rows in zip(range(cfg.steps), _batches(len(examples), cfg.batch_size, cfg.seed), strict=False):
        optimizer.zero_grad(set_to_none=True)
        loss, count = sft_loss(policy, [examples[i] for i in rows])
        if not torch.isfinite(loss):
            raise FloatingPointError(f"sft step {step}: non-finite loss; lower the learning rate")
        loss.backward()
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        losses.append(float(loss.detach()))
        seen += count
        if on_step is not None:
            on_step(step + 1, losses[-1])
    optimizer.zero_grad(set_to_none=True)
    return SFTResult(losses=losses, tokens=seen, seconds=time.perf_counter() - start, examples=len(examples))


def progress_printer(total: int, prefix: str = "sft", every: int = 25,
                     stream: Any = None) -> Callable[[int, float], None]:
    """An `on_step` callback printing step, loss, elapsed time and ETA every `every` steps."""
    start = time.perf_counter()

    def report(step: int, loss: float) -> None:
        if step == 1 or step % every == 0 or step == total:
            elapsed = time.perf_counter() - start
            # The first step carries start-up costs: no estimate from it alone.
            eta = f", about {elapsed / step * (total - step):.0f} s to go" if 1 < step < total else ""
            print(f"{prefix}: step {step}/{total}  loss {loss:.4f}  {elapsed:.0f} s elapsed{eta}",
                  file=stream or sys.stderr, flush=True)

    return report


# ---------------------------------------------------------------------------------------------
# The cached default warm start


def cache_root() -> Path:
    base = os.environ.get(CACHE_DIR_VAR)
    return Path(base) if base else Path.home() / ".cache" / "scalerl"


def content_digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def result_summary(result: SFTResult) -> dict[str, Any]:
    # The CPU kernels' instruction set is recorded because it changes the trained weights: AVX-512
    # and AVX2 kernels round differently, so one seed trains bit-identical weights only on one ISA.
    return {"final_loss": result.final_loss, "first_loss": result.losses[0], "tokens": result.tokens,
            "seconds": result.seconds, "examples": result.examples,
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def save_sft_model(policy: Policy, path: Path, info: Mapping[str, Any], flag: str = "--output") -> None:
    """`save_pretrained` model and tokenizer plus `sft_info.json`, atomically (temp dir + rename).

    `path` must be new, empty or an earlier SFT output (its `OWNER_FILE` marker says `sft`): only
    then is it replaced; anything else is an `OwnershipError` naming `flag`, and nothing is deleted.
    """
    check_output_dir_owned(path, SFT_KIND, flag)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        policy.save_pretrained(tmp)
        (tmp / INFO_FILE).write_text(json.dumps(dict(info), indent=2))
        mark_output_dir(tmp, SFT_KIND)
        if path.is_dir() and any(path.iterdir()):
            # Checked again just before: only an SFT output of ours is replaced (an empty folder is
            # renamed over as it is).
            check_output_dir_owned(path, SFT_KIND, flag)
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
