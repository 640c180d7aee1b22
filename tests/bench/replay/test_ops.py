"""The replay's chunk operations are the real pools' chunk operations, counted."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.replay.ops import PoolLayout, packed, reallocate_ops, resize_ops, spread
from engine.reference.memory import DeviceMemory
from engine.reference.pools import ExpertSlotPool, PagedKVPool

PAGE_SIZE, KV_PER_TOKEN, CHUNK_BYTES = 4, 16, 1024  # 64 B pages, 16 to a chunk
EXPERT_BYTES = 256  # 4 to a chunk


def _events(events) -> list[tuple[str, int, int]]:  # type: ignore[no-untyped-def]
    return [(e.op, e.nbytes, e.units_after) for e in events]


def _ops(ops) -> list[tuple[str, int, int]]:  # type: ignore[no-untyped-def]
    return [(o.op, o.nbytes, o.usable_after) for o in ops]


@settings(max_examples=60, deadline=None)
@given(pages=st.integers(2, 80), new_pages=st.integers(2, 80), used=st.integers(0, 40))
def test_kv_resize_matches_the_pool(pages: int, new_pages: int, used: int) -> None:
    """Pages handed out lowest first sit packed behind the dummy page, so the replay knows
    exactly which chunks hold live pages and which moves a shrink makes."""
    used = min(used, pages - 1, new_pages - 1)
    memory = DeviceMemory("cpu")
    pool = PagedKVPool(memory, page_size=PAGE_SIZE, kv_bytes_per_token=KV_PER_TOKEN,
                       num_pages=pages, chunk_bytes=CHUNK_BYTES)
    if used:
        pool.allocate_pages("r", used)
    layout = PoolLayout(PAGE_SIZE * KV_PER_TOKEN, CHUNK_BYTES, 1)
    expected = _ops(resize_ops("kv", layout, pool.num_pages, new_pages, packed(1, used)))
    assert _events(pool.resize(new_pages)) == expected
    assert pool.nbytes == memory.allocated_bytes


@settings(max_examples=40, deadline=None)
@given(slots=st.integers(1, 40), new_slots=st.integers(1, 40))
def test_empty_expert_pool_resize_and_reallocate_match(slots: int, new_slots: int) -> None:
    memory = DeviceMemory("cpu")
    pool = ExpertSlotPool(memory, num_layers=2, num_experts=32, expert_bytes=EXPERT_BYTES,
                          num_slots=slots, chunk_bytes=CHUNK_BYTES)
    layout = PoolLayout(EXPERT_BYTES, CHUNK_BYTES, 0)
    assert _events(pool.resize(new_slots)) == _ops(
        resize_ops("moe", layout, slots, new_slots, spread(slots, 0)))
    assert _events(pool.reallocate(slots)) == _ops(
        reallocate_ops("moe", layout, new_slots, slots))
