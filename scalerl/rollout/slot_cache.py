"""A KV cache with one row per batch slot, for continuous batching on a Hugging Face decoder.

Layout: per layer, key and value buffers `[slots, kv_heads, capacity, head_dim]`. Slot s holds its
sequence's tokens contiguously from column 0, so column = position, and each slot has its own length.
A forward pass runs on a group of slots, each feeding a right-padded chunk of `q` tokens written at
columns `start_s .. start_s + q - 1`; query j of slot s may attend to columns `<= start_s + j`
(`attention_masks` builds that 4-D mask, plus the sliding window where the model has one). Padded
query columns write junk beyond the slot's real length, which is never attended (the mask ends at the
real query) and is overwritten as the slot grows. A finished slot is reused by restarting at 0.

Compared with a left-padded `DynamicCache`, nothing is re-packed when a slot changes sequence, and
the buffers grow by doubling instead of by a `torch.cat` of the whole cache at every step.

This object implements the one call Hugging Face attention layers make on a cache
(`update(key_states, value_states, layer_idx, ...)`); it is not a `transformers.Cache`.
"""

from __future__ import annotations

from typing import Any

import torch

_CAPACITY_QUANTUM = 64


class SlotKVCache:
    """Per-layer K/V buffers indexed by slot; see the module docstring for the layout."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots: must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        self.capacity = 0
        self._keys: list[torch.Tensor | None] = []
        self._values: list[torch.Tensor | None] = []
        # The plan of the forward pass in progress (set by `plan`).
        self._rows: torch.Tensor | None = None
        self._all_rows = False
        self._cols: torch.Tensor | None = None
        self._kv_len = 0

    def reset(self) -> None:
        """Drop all buffers (frees memory when the engine is idle)."""
        self.capacity = 0
        self._keys, self._values = [], []

    def plan(self, rows: list[int], starts: list[int], q: int, device: torch.device) -> int:
        """Prepare a forward over slots `rows`, each writing `q` columns from `starts[i]`.

        Grows the buffers if needed and returns the key length the attention will see
        (`max(starts) + q`).
        """
        if len(rows) != len(starts) or not rows:
            raise ValueError("plan: rows and starts must be non-empty and of equal length")
        kv_len = max(starts) + q
        self._ensure_capacity(kv_len)
        self._all_rows = rows == list(range(self.num_slots))
        self._rows = torch.tensor(rows, device=device)
        start_t = torch.tensor(starts, device=device)
        self._cols = start_t.unsqueeze(1) + torch.arange(q, device=device).unsqueeze(0)
        self._kv_len = kv_len
        return kv_len

    def _ensure_capacity(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        new_cap = max(needed, 2 * self.capacity)
        new_cap = -(-new_cap // _CAPACITY_QUANTUM) * _CAPACITY_QUANTUM
        for store in (self._keys, self._values):
            for i, buf in enumerate(store):
                if buf is None:
                    continue
                # Zeros, not uninitialised memory: masked columns still enter the attention's
                # weights @ V product, and 0 * NaN garbage would be NaN.
                grown = buf.new_zeros(buf.shape[0], buf.shape[1], new_cap, buf.shape[3])
                grown[:, :, : self.capacity] = buf[:, :, : self.capacity]
                store[i] = grown
        self.capacity = new_cap

    def state(self, columns: int) -> dict[str, Any]:
        """The buffers' first `columns` columns (every slot's real tokens), for an exact resume;
        the columns past them are junk no query attends to."""
        def cut(store: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
            return [None if b is None else b[:, :, :columns].cpu().clone() for b in store]

        return {"num_slots": self.num_slots, "capacity": self.capacity, "keys": cut(self._keys),
                "values": cut(self._values)}

    def load_state(self, state: dict[str, Any], device: torch.device) -> None:
        """Restore `state()` on `device`: the same capacity, its columns, zeros past them."""
        if int(state["num_slots"]) != self.num_slots:
            raise ValueError(f"KV cache state has {state['num_slots']} slots, this cache {self.num_slots}")
        self.capacity = int(state["capacity"])

        def grow(saved: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
            out: list[torch.Tensor | None] = []
            for b in saved:
                if b is None:
                    out.append(None)
                    continue
                full = b.new_zeros(b.shape[0], b.shape[1], self.capacity, b.shape[3], device=device)
                full[:, :, : b.shape[2]] = b.to(device)
                out.append(full)
            return out

        self._keys, self._values = grow(state["keys"]), grow(state["values"])

    def _buffers(self, layer_idx: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        while len(self._keys) <= layer_idx:
            self._keys.append(None)
            self._values.append(None)
        k, v = self._keys[layer_idx], self._values[layer_idx]
        if k is None or v is None:
            shape = (self.num_slots, like.shape[1], self.capacity, like.shape[3])
            k = like.new_zeros(shape)
            v = like.new_zeros(shape)
            self._keys[layer_idx], self._values[layer_idx] = k, v
        return k, v

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the chunk's keys/values `[G, kv_heads, q, head_dim]` into the planned slots and
        return the slots' keys/values up to the planned key length."""
        if self._rows is None or self._cols is None:
            raise RuntimeError("SlotKVCache.update called without a plan")
        k_buf, v_buf = self._buffers(layer_idx, key_states)
        key_states, value_states = key_states.to(k_buf.dtype), value_states.to(v_buf.dtype)
        if self._all_rows:
            # Every slot in order: a scatter along the column axis (much cheaper than index_put).
            index = self._cols.view(self.num_slots, 1, -1, 1).expand_as(key_states)
            k_buf.scatter_(2, index, key_states)
            v_buf.scatter_(2, index, value_states)
            return k_buf[:, :, : self._kv_len], v_buf[:, :, : self._kv_len]
        rows = self._rows.unsqueeze(1)
        # Advanced indices on dims 0 and 2 put their broadcast shape [G, q] first: [G, q, H, D].
        k_buf[rows, :, self._cols] = key_states.transpose(1, 2)
        v_buf[rows, :, self._cols] = value_states.transpose(1, 2)
        return k_buf[self._rows, :, : self._kv_len], v_buf[self._rows, :, : self._kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Key length of the planned forward before its chunk (for code that asks the cache)."""
        return self._kv_len - (self._cols.shape[1] if self._cols is not None else 0)


def attention_masks(
    starts: torch.Tensor,
    q: int,
    kv_len: int,
    *,
    sliding_window: int | None,
    additive_dtype: torch.dtype | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """4-D masks `[G, 1, q, kv_len]` for slots whose chunk starts at column `starts[g]`.

    Query j of slot g sits at column/position `pos = starts[g] + j` and may see key column c iff
    `c <= pos` (causal; columns past the slot's real length are beyond every real query). The
    sliding-window mask additionally requires `c > pos - window` (Hugging Face's
    `sliding_window_overlay`). Returns (full, sliding or None). Masks are bool (True = attend) for
    SDPA, or additive (0 / dtype min) when `additive_dtype` is given (eager attention).
    """
    device = starts.device
    pos = starts.unsqueeze(1) + torch.arange(q, device=device).unsqueeze(0)
    cols = torch.arange(kv_len, device=device)
    full = cols.view(1, 1, -1) <= pos.unsqueeze(-1)
    sliding = None
    if sliding_window is not None:
        sliding = full & (cols.view(1, 1, -1) > (pos - sliding_window).unsqueeze(-1))

    def finish(mask: torch.Tensor) -> torch.Tensor:
        mask = mask.unsqueeze(1)
        if additive_dtype is None:
            return mask
        zeros = torch.zeros(mask.shape, dtype=additive_dtype, device=device)
        return zeros.masked_fill(~mask, torch.finfo(additive_dtype).min)

    return finish(full), finish(sliding) if sliding is not None else None
