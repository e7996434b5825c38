"""scalerl.rollout.slot_cache: per-slot KV writes, reads, growth and the 4-D masks."""

from __future__ import annotations

import torch

from scalerl.rollout.slot_cache import SlotKVCache, attention_masks


def test_masks_are_causal_per_slot_with_window() -> None:
    full, sliding = attention_masks(
        torch.tensor([0, 3]), q=2, kv_len=5, sliding_window=2, additive_dtype=None
    )
    assert full.shape == (2, 1, 2, 5)
    assert full[0, 0].int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0]]
    assert full[1, 0].int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert sliding is not None
    assert sliding[1, 0].int().tolist() == [[0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    additive, _ = attention_masks(torch.tensor([1]), 1, 3, sliding_window=None, additive_dtype=torch.float32)
    assert additive[0, 0, 0].tolist() == [0.0, 0.0, torch.finfo(torch.float32).min]


def test_writes_land_in_their_slots_and_survive_growth() -> None:
    cache = SlotKVCache(num_slots=3)
    dev = torch.device("cpu")
    k = torch.arange(2 * 1 * 2 * 4, dtype=torch.float32).view(2, 1, 2, 4)  # slots 0 and 2, 2 tokens
    cache.plan([0, 2], [0, 5], q=2, device=dev)
    keys, values = cache.update(k, -k, layer_idx=0)
    assert keys.shape == (2, 1, 7, 4)
    torch.testing.assert_close(keys[0, :, 0:2], k[0])
    torch.testing.assert_close(keys[1, :, 5:7], k[1])
    torch.testing.assert_close(values[1, :, 5:7], -k[1])
    capacity = cache.capacity
    # A one-token decode of all slots far beyond the capacity grows the buffers, keeping old contents.
    cache.plan([0, 1, 2], [2, 0, capacity + 10], q=1, device=dev)
    new = torch.ones(3, 1, 1, 4)
    keys, _ = cache.update(new, new, layer_idx=0)
    assert cache.capacity > capacity and keys.shape[2] == capacity + 11
    torch.testing.assert_close(keys[0, :, 0:2], k[0])
    torch.testing.assert_close(keys[2, :, 5:7], k[1])
    torch.testing.assert_close(keys[2, :, capacity + 10], new[2, :, 0])


def test_grown_buffers_hold_no_garbage() -> None:
    # In deterministic mode torch fills uninitialised memory with NaN, so garbage would show up.
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        cache = SlotKVCache(num_slots=2)
        dev = torch.device("cpu")
        cache.plan([0, 1], [0, 0], q=1, device=dev)
        cache.update(torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4), layer_idx=0)
        cache.plan([0, 1], [0, cache.capacity + 5], q=1, device=dev)
        keys, values = cache.update(torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4), layer_idx=0)
        assert torch.isfinite(keys).all() and torch.isfinite(values).all()
    finally:
        torch.use_deterministic_algorithms(previous)
