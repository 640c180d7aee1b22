"""DeviceMemory: exact accounting, the emulated CPU cap, and (on a GPU) the driver filler."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.reference.memory import DeviceMemory, emulate_card

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_alloc_returns_exact_flat_uint8_and_counts_it() -> None:
    memory = DeviceMemory()
    a = memory.alloc(1000, tag="kv")
    b = memory.alloc(24, tag="moe")
    c = memory.alloc(8, tag="kv")
    assert a.dtype == torch.uint8 and a.shape == (1000,) and a.untyped_storage().nbytes() == 1000
    assert memory.allocated_bytes == 1032
    assert memory.bytes_by_tag() == {"kv": 1008, "moe": 24}
    # Callers reinterpret; freeing through a view frees the allocation.
    memory.free(b.view(torch.float32).view(2, 3))
    assert memory.allocated_bytes == 1008
    memory.free(a)
    memory.free(c)
    assert memory.allocated_bytes == 0
    assert memory.bytes_by_tag() == {}


def test_peak_tracks_the_highest_total_since_reset() -> None:
    memory = DeviceMemory()
    a = memory.alloc(100, tag="x")
    b = memory.alloc(50, tag="x")
    memory.free(a)
    assert memory.peak_bytes == 150
    memory.reset_peak()
    assert memory.peak_bytes == 50
    c = memory.alloc(10, tag="x")
    assert memory.peak_bytes == 60
    memory.free(b)
    memory.free(c)
    assert memory.peak_bytes == 60


def test_cap_raises_torch_oom_with_a_torch_shaped_message() -> None:
    memory = DeviceMemory(capacity_bytes=1000)
    a = memory.alloc(600, tag="kv")
    with pytest.raises(torch.OutOfMemoryError,
                       match=r"emulated card of 1000 bytes\). Tried to allocate 500 bytes; 400 "):
        memory.alloc(500, tag="moe")
    assert memory.allocated_bytes == 600
    assert memory.free_bytes == 400
    b = memory.alloc(400, tag="moe")  # exactly full is allowed
    assert memory.free_bytes == 0
    memory.free(a)
    memory.free(b)


def test_bad_calls_are_refused() -> None:
    memory = DeviceMemory()
    with pytest.raises(ValueError, match="must be > 0"):
        memory.alloc(0, tag="kv")
    with pytest.raises(ValueError, match="not allocated by this DeviceMemory"):
        memory.free(torch.empty(4, dtype=torch.uint8))
    t = memory.alloc(4, tag="kv")
    memory.free(t)
    with pytest.raises(ValueError, match="freed twice"):
        memory.free(t)
    with pytest.raises(ValueError, match="emulate_card"):
        DeviceMemory("cuda", capacity_bytes=1 << 20)
    with pytest.raises(ValueError, match=">= 0"):
        DeviceMemory(capacity_bytes=-1)


@settings(max_examples=50)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 4096), st.sampled_from("abc")),
                max_size=40))
def test_accounting_equals_live_storage_bytes(ops: list[tuple[bool, int, str]]) -> None:
    memory = DeviceMemory(capacity_bytes=20_000)
    live: list[tuple[torch.Tensor, str]] = []
    high = 0
    for is_alloc, size, tag in ops:
        if is_alloc or not live:
            try:
                live.append((memory.alloc(size, tag=tag), tag))
            except torch.OutOfMemoryError:
                assert sum(t.numel() for t, _ in live) + size > 20_000
        else:
            t, _ = live.pop(size % len(live))
            memory.free(t)
        total = sum(t.untyped_storage().nbytes() for t, _ in live)
        high = max(high, total)
        assert memory.allocated_bytes == total
        assert memory.peak_bytes == high
        by_tag: dict[str, int] = {}
        for t, tg in live:
            by_tag[tg] = by_tag.get(tg, 0) + t.numel()
        assert memory.bytes_by_tag() == by_tag


@gpu
@needs_cuda
def test_cuda_accounting_matches_torch_memory_allocated() -> None:
    device = torch.device("cuda")
    torch.cuda.synchronize()
    memory = DeviceMemory(device)
    base = torch.cuda.memory_allocated(device)
    # Multiples of 512 bytes: torch rounds each block up to 512, DeviceMemory counts exactly.
    tensors = [memory.alloc(n, tag="kv") for n in (512, 1 << 20, 3 << 21, 4096)]
    assert torch.cuda.memory_allocated(device) - base == memory.allocated_bytes
    memory.free(tensors.pop(1))
    assert torch.cuda.memory_allocated(device) - base == memory.allocated_bytes
    while tensors:  # pop, so no loop variable keeps the last block alive
        memory.free(tensors.pop())
    memory.release_to_driver()
    assert torch.cuda.memory_allocated(device) == base
    assert memory.allocated_bytes == 0


@gpu
@needs_cuda
def test_emulated_card_makes_the_driver_refuse_what_does_not_fit() -> None:
    device = torch.device("cuda")
    torch.empty(1, device=device)
    free0, total = torch.cuda.mem_get_info(device)
    used = total - free0
    target = used + (1 << 30)  # a card with 1 GiB left
    filler = emulate_card(target, device)
    try:
        free1, _ = torch.cuda.mem_get_info(device)
        assert abs(free1 - (1 << 30)) <= 64 << 20, (free1, filler)
        assert filler.free_bytes_after == free1 and filler.backend == "driver"
        memory = DeviceMemory(device)
        with pytest.raises(torch.OutOfMemoryError):
            memory.alloc(2 << 30, tag="moe")
        ok = memory.alloc(256 << 20, tag="moe")
        memory.free(ok)
        del ok
        memory.release_to_driver()
    finally:
        filler.release()
    filler.release()  # idempotent
    free2, _ = torch.cuda.mem_get_info(device)
    assert free2 >= free0 - (64 << 20)
