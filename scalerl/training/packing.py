"""Micro-batches sized by tokens, and samples packed into one sequence without padding.

Two independent choices of how a step's rows reach the model (`optim.micro_batch_tokens`,
`optim.packing`; `MicroBatching.from_optim`):

- **Sizing.** By count (`micro_batch_size` consecutive rows, the default), or by a token budget: rows
  are binned first-fit-decreasing by their length (prompt + response) so that each micro-batch's cost
  stays within `micro_batch_tokens` (a row longer than the budget goes alone). The cost is what the
  forward really processes: the sum of the lengths when packed; rows x (longest prompt + longest
  response) when padded (`TrainBatch.select` pads every row to those widths). On FSDP ranks the rows
  are first spread by tokens (longest-processing-time-first), so ranks get balanced token counts.
- **Layout.** Padded `[left-padded prompt | right-padded response]` rows, or packed: every row's real
  tokens one after the other in a single `[1, L]` sequence, position ids restarting at 0 for each
  row, no attention mask. Hugging Face decoders (transformers >= 4.53 `masking_utils`) read restarting
  position ids as packed sequences and keep attention inside each one: a block-diagonal causal mask
  for sdpa/eager (the CPU path), `flash_attn_varlen` with the sequences' boundaries for
  flash_attention_2. `check_packed_attention` verifies that on the model at hand before a run relies
  on it (a model that lets packed sequences see each other would train on garbage silently).

Neither choice changes the loss: the per-token tensors the objective reads stay `[n, T]` in the
padded layout (`response_states` gathers the packed decoder's states back into it), and the
aggregation weights are computed once on the whole batch (`training.trainer`), so any split into
micro-batches, any assignment to ranks and either layout give the same loss and gradients up to float
rounding of the matrix products (tests/training/test_packing.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from scalerl.config import OptimConfig

Lengths = Sequence[tuple[int, int]]  # per row: (prompt tokens, response tokens)


@dataclass(frozen=True)
class MicroBatching:
    """How a step's rows are split into forward/backward passes (module docstring)."""

    samples: int = 64  # optim.micro_batch_size: rows per pass when `tokens` is None
    tokens: int | None = None  # optim.micro_batch_tokens: token budget per pass
    packed: bool = False  # optim.packing (null: packed exactly when `tokens` is set)

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ValueError(f"optim.micro_batch_size: expected >= 1, got {self.samples}")
        if self.tokens is not None and self.tokens < 1:
            raise ValueError(f"optim.micro_batch_tokens: expected >= 1, got {self.tokens}")

    @classmethod
    def from_optim(cls, optim: OptimConfig) -> MicroBatching:
        packed = optim.packing if optim.packing is not None else optim.micro_batch_tokens is not None
        return cls(samples=optim.micro_batch_size, tokens=optim.micro_batch_tokens, packed=packed)

    def cost(self, lengths: Lengths) -> int:
        """Token slots one pass over `lengths` processes: the real tokens when packed; rows x
        (longest prompt + longest response) when padded."""
        if not lengths:
            return 0
        if self.packed:
            return sum(p + t for p, t in lengths)
        return len(lengths) * (max(p for p, _ in lengths) + max(max(t for _, t in lengths), 1))

    def plan(self, lengths: Lengths) -> list[list[int]]:
        """The passes over rows `0..len(lengths)-1` (indices into `lengths`), every row exactly once.

        By count: consecutive chunks of `samples`. By tokens: first-fit decreasing on `cost`, bins in
        the order they were opened, rows ascending inside each bin; deterministic.
        """
        n = len(lengths)
        if self.tokens is None:
            return [list(range(s, min(n, s + self.samples))) for s in range(0, n, self.samples)]
        order = sorted(range(n), key=lambda i: -(lengths[i][0] + lengths[i][1]))
        bins: list[_Bin] = []
        for i in order:
            p, t = lengths[i]
            for b in bins:
                if b.cost_with(p, t, self.packed) <= self.tokens:
                    b.add(i, p, t)
                    break
            else:
                b = _Bin()
                b.add(i, p, t)
                bins.append(b)
        return [sorted(b.rows) for b in bins]


@dataclass
class _Bin:
    """A micro-batch being filled: its rows and the running figures its cost is computed from."""

    rows: list[int] | None = None
    total: int = 0
    max_prompt: int = 0
    max_response: int = 0

    def add(self, row: int, p: int, t: int) -> None:
        self.rows = [*(self.rows or []), row]
        self.total += p + t
        self.max_prompt, self.max_response = max(self.max_prompt, p), max(self.max_response, t)

    def cost_with(self, p: int, t: int, packed: bool) -> int:
        if packed:
            return self.total + p + t
        n = len(self.rows or []) + 1
        return n * (max(self.max_prompt, p) + max(self.max_response, t, 1))


def balance_rows(lengths: Lengths, world_size: int) -> list[list[int]]:
    """Rows spread over `world_size` ranks by tokens: longest-processing-time-first (each row, longest
    first, to the rank holding the fewest tokens so far; ties to the lowest rank), rows ascending per
    rank. LPT's largest load is within 4/3 of the best possible (Graham 1969)."""
    if world_size < 1:
        raise ValueError(f"world_size: expected >= 1, got {world_size}")
    loads = [0] * world_size
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(lengths)), key=lambda i: -(lengths[i][0] + lengths[i][1])):
        r = min(range(world_size), key=lambda r: (loads[r], r))
        ranks[r].append(i)
        loads[r] += lengths[i][0] + lengths[i][1]
    return [sorted(rows) for rows in ranks]


def row_lengths(batch: Any) -> list[tuple[int, int]]:
    """`(prompt, response)` token counts of every row of a `TrainBatch`."""
    return list(zip(batch.prompt_lengths.tolist(), batch.response_lengths.tolist(), strict=True))


class PaddedLayout(Protocol):
    input_ids: Tensor  # [n, P + T]
    attention_mask: Tensor  # [n, P + T]
    position_ids: Tensor  # [n, P + T]
    prompt_width: int
    token_mask: Tensor  # [n, T]


@dataclass(frozen=True)
class PackedView:
    """A padded micro-batch's real tokens as one sequence, and where its response is predicted."""

    input_ids: Tensor  # [1, L]
    position_ids: Tensor  # [1, L], restarting at 0 for every row
    # [n, T]: the packed position whose state predicts response token t of row i (clamped where
    # (i, t) is padding; those positions are masked by every consumer).
    index: Tensor


def packed_view(batch: PaddedLayout) -> PackedView:
    """Pack `batch` (module docstring): row-major real tokens, so row i's tokens are contiguous and
    in order. Response token t of row i sits at padded column `P + t` and is predicted by the state
    at column `P + t - 1`; its packed position is the number of real tokens before that column."""
    real = batch.attention_mask.bool()
    packed_pos = real.reshape(-1).cumsum(0).reshape(real.shape) - 1
    p, width = batch.prompt_width, batch.token_mask.shape[1]
    index = packed_pos[:, p - 1 : p - 1 + width].clamp(min=0)
    return PackedView(
        input_ids=batch.input_ids[real].unsqueeze(0),
        position_ids=batch.position_ids[real].unsqueeze(0),
        index=index,
    )


def response_states(decoder: nn.Module, batch: PaddedLayout, *, packed: bool,
                    at: Tensor | None = None) -> Tensor:
    """Final hidden states that predict `batch`'s response tokens: `[n, T, H]`, or `[M, H]` at the
    positions the bool mask `at [n, T]` selects (row-major), without materialising padding states.

    Padded: one decoder pass over `[n, P + T]`. Packed: one pass over `[1, L]` (module docstring).
    """
    if not packed:
        out = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                      position_ids=batch.position_ids, use_cache=False)
        states = out.last_hidden_state[:, batch.prompt_width - 1 : -1]
        return states if at is None else states[at]
    view = packed_view(batch)
    out = decoder(input_ids=view.input_ids, attention_mask=None, position_ids=view.position_ids,
                  use_cache=False)
    flat = out.last_hidden_state[0]
    return flat[view.index] if at is None else flat[view.index[at]]


def decoder_order_real(batch: PaddedLayout, *, packed: bool) -> Tensor:
    """`[tokens]` bool, the real (non-padding) tokens of `response_states`'s decoder pass."""
    real = batch.attention_mask.bool()
    return real[real] if packed else real.reshape(-1)


def decoder_order_routing(batch: PaddedLayout, routing: Tensor, *, packed: bool) -> tuple[Tensor, Tensor]:
    """`routing [n, P + T, layers, k]` (laid out like `input_ids`) in the order `response_states`'s
    decoder pass sees the tokens, `[tokens, layers, k]`: every column row-major (padded), or the
    real tokens only, row after row (packed; `packed_view`); and `[tokens]` bool, the positions
    whose routing reaches a predicted token: real tokens but each row's last (whose state predicts
    nothing, and which an engine never feeds, so never records)."""
    real = batch.attention_mask.bool()
    last = batch.prompt_width + real[:, batch.prompt_width :].sum(dim=1) - 1
    needed = real.clone()
    needed[torch.arange(real.shape[0], device=real.device), last] = False
    if packed:
        return routing[real], needed[real]
    return routing.reshape(-1, *routing.shape[2:]), needed.reshape(-1)


#: `check_packed_attention`: the packed pass's largest deviation from the separate passes, as a share
#: of how far a pass that lets the sequences see each other deviates. Float rounding (bf16 included)
#: is far below it; any cross-sequence attention is far above.
PACKING_TOLERANCE = 0.05


@torch.no_grad()
def check_packed_attention(decoder: nn.Module, vocab_size: int, device: torch.device | str) -> float:
    """Verify that `decoder` keeps packed sequences apart; return the measured ratio.

    Two short random sequences, each run alone, then packed (restarting position ids, no mask), then
    packed with a full causal mask (sequence 2 sees sequence 1: what a model that ignores packing
    computes). Raises `ValueError` naming `optim.packing` when the packed states of sequence 2 are
    not far closer to its lone states than the leaking ones are.
    """
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(0, vocab_size, (7,), generator=gen)
    b = torch.randint(0, vocab_size, (5,), generator=gen)

    def run(ids: Tensor, pos: Tensor, mask: Tensor | None) -> Tensor:
        out = decoder(input_ids=ids[None].to(device), position_ids=pos[None].to(device),
                      attention_mask=None if mask is None else mask[None].to(device), use_cache=False)
        return out.last_hidden_state[0].float()

    alone = run(b, torch.arange(5), None)
    ids = torch.cat([a, b])
    pos = torch.cat([torch.arange(7), torch.arange(5)])
    packed = run(ids, pos, None)[7:]
    leaked = run(ids, pos, torch.ones(12, dtype=torch.long))[7:]
    err = float((packed - alone).abs().max())
    leak = float((leaked - alone).abs().max())
    ratio = err / leak if leak > 0 else (0.0 if err == 0 else float("inf"))
    if not ratio <= PACKING_TOLERANCE:
        raise ValueError(
            f"optim.packing: {type(decoder).__name__} lets packed sequences attend to each other "
            f"(packed states deviate {err:.3g} from separate passes, {ratio:.2f} of a full leak); its "
            "attention implementation does not read restarting position ids as sequence boundaries "
            "(transformers >= 4.53 with sdpa, eager or flash_attention_2 does). Set optim.packing=false"
        )
    return ratio
