"""The replay's expert cache is ExpertSlotPool's LRU, lookup for lookup, across resizes and
clears; the routing bank is the engine's generator and the same in every arm."""

from __future__ import annotations

import torch

from bench.replay.experts import ExpertCache, RoutingBank, RoutingShape
from engine.reference.memory import DeviceMemory
from engine.reference.pools import ExpertSlotPool

SHAPE = RoutingShape(num_layers=4, num_experts=32, top_k=4, preset="A")


def _pool_token(pool: ExpertSlotPool, keys: list[int], weights: torch.Tensor) -> int:
    misses = 0
    for key in keys:
        layer, expert = divmod(key, SHAPE.num_experts)
        if pool.lookup(layer, expert) is None:
            misses += 1
            pool.admit(layer, expert, weights)
    return misses


def test_cache_matches_the_pool_through_resizes() -> None:
    bank = RoutingBank(SHAPE, trace_seed=3)
    pool = ExpertSlotPool(DeviceMemory("cpu"), num_layers=SHAPE.num_layers,
                          num_experts=SHAPE.num_experts, expert_bytes=64, num_slots=24,
                          chunk_bytes=256)
    cache = ExpertCache(24)
    weights = torch.zeros(64, dtype=torch.uint8)
    schedule = {40: 10, 80: 50, 120: 17, 160: 64}
    for index in range(3):
        for step, keys in enumerate(bank.keys(index, 200)):
            if step in schedule:
                pool.resize(schedule[step])
                cache.resize(schedule[step])
            assert cache.token(keys) == _pool_token(pool, keys, weights)
        assert cache.resident == pool.resident_count
        assert (cache.hits, cache.misses, cache.evictions) == (pool.hits, pool.misses,
                                                               pool.evictions)
    cache.clear()
    pool.reallocate(pool.num_slots)
    keys = bank.keys(7, 1)[0]
    assert cache.token(keys) == _pool_token(pool, keys, weights) == len(set(keys))


def test_the_bank_is_deterministic_and_a_prefix_is_a_prefix() -> None:
    a, b = RoutingBank(SHAPE, trace_seed=1), RoutingBank(SHAPE, trace_seed=1)
    short = a.keys(5, 10)
    assert a.keys(5, 30)[:10] == short == b.keys(5, 10)
    assert RoutingBank(SHAPE, trace_seed=2).keys(5, 10) != short
    assert all(len(k) == SHAPE.lookups_per_token for k in short)
    assert all(layer * 32 <= key < (layer + 1) * 32
               for token in short for layer, key in enumerate(token[::4]))
