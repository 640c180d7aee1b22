"""The chunked pools: exact bytes, content kept across free-first resizes, safe failures."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.reference.memory import DeviceMemory
from engine.reference.pools import (
    ChunkEvent,
    ExpertSlotPool,
    PagedKVPool,
    PoolExhausted,
    PoolShrinkRejected,
    StatePool,
)

# KV: 4 tokens x 16 B = 64 B pages, 16 per 1 KiB chunk. Experts: 256 B, 4 per chunk.
PAGE_SIZE, KV_PER_TOKEN, PAGE_BYTES = 4, 16, 64
EXPERT_BYTES, STATE_BYTES, CHUNK_BYTES = 256, 48, 1024
LAYERS, EXPERTS = 4, 8


def _kv(memory: DeviceMemory, num_pages: int, chunk_bytes: int = CHUNK_BYTES) -> PagedKVPool:
    return PagedKVPool(memory, page_size=PAGE_SIZE, kv_bytes_per_token=KV_PER_TOKEN,
                       num_pages=num_pages, chunk_bytes=chunk_bytes)


def _experts(memory: DeviceMemory, num_slots: int) -> ExpertSlotPool:
    return ExpertSlotPool(memory, num_layers=LAYERS, num_experts=EXPERTS,
                          expert_bytes=EXPERT_BYTES, num_slots=num_slots, chunk_bytes=CHUNK_BYTES)


def _states(memory: DeviceMemory, num_slots: int) -> StatePool:
    return StatePool(memory, state_bytes=STATE_BYTES, num_slots=num_slots, chunk_bytes=CHUNK_BYTES)


def _bank(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (LAYERS, EXPERTS, EXPERT_BYTES), dtype=torch.uint8, generator=g)


class Model:
    """What each pool's live units must hold, written with random bytes as they are handed out."""

    def __init__(self, kv: PagedKVPool, experts: ExpertSlotPool, states: StatePool) -> None:
        self.kv, self.experts, self.states = kv, experts, states
        self.bank = _bank()
        self.pages: dict[str, list[torch.Tensor]] = {}
        self.state: dict[str, torch.Tensor] = {}
        self.g = torch.Generator().manual_seed(1)

    def _random(self, n: int) -> torch.Tensor:
        return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=self.g)

    def add_pages(self, rid: str, n: int) -> list[int]:
        pages = self.kv.allocate_pages(rid, n)
        for page in pages:
            data = self._random(PAGE_BYTES)
            self.kv.page_view(page).copy_(data)
            self.pages.setdefault(rid, []).append(data)
        return pages

    def drop_request(self, rid: str) -> None:
        self.kv.free_request(rid)
        self.pages.pop(rid, None)
        self.states.release(rid)
        self.state.pop(rid, None)

    def add_state(self, rid: str) -> None:
        slot = self.states.acquire(rid)
        assert not self.states.slot_view(slot).any()
        data = self._random(STATE_BYTES)
        self.states.slot_view(slot).copy_(data)
        self.state[rid] = data

    def touch_expert(self, layer: int, expert: int) -> None:
        slot = self.experts.lookup(layer, expert)
        if slot is None:
            slot = self.experts.admit(layer, expert, self.bank[layer, expert])
        assert torch.equal(self.experts.slot_view(slot), self.bank[layer, expert])

    def check(self, memory: DeviceMemory) -> None:
        pools = (self.kv, self.experts, self.states)
        storage = sum(t.untyped_storage().nbytes() for p in pools for t in p.chunk_tensors())
        assert memory.allocated_bytes == sum(p.nbytes for p in pools) == storage
        tables = self.kv.page_tables()
        assert set(tables) == set(self.pages)
        seen: set[int] = set()
        for rid, data in self.pages.items():
            assert len(tables[rid]) == len(data)
            for page, expected in zip(tables[rid], data, strict=True):
                assert page != PagedKVPool.DUMMY_PAGE and page not in seen
                seen.add(page)
                assert torch.equal(self.kv.page_view(page), expected)
        assert self.kv.used_pages == len(seen) <= self.kv.num_pages
        for rid, expected in self.state.items():
            slot = self.states.slot_of(rid)
            assert slot != StatePool.SINK_SLOT
            assert torch.equal(self.states.slot_view(slot), expected)
        resident = self.experts.resident_slots()
        assert len(set(resident.values())) == len(resident) <= self.experts.num_slots
        for (layer, expert), slot in resident.items():
            assert torch.equal(self.experts.slot_view(slot), self.bank[layer, expert])


def test_chunks_hold_exact_unit_counts_plus_dummy_and_sink() -> None:
    memory = DeviceMemory()
    kv = _kv(memory, 40)  # 41 physical pages: chunks of 16, 16, 9
    assert kv.units_per_chunk == 16
    assert [t.numel() for t in kv.chunk_tensors()] == [1024, 1024, 9 * 64]
    assert kv.nbytes == 41 * PAGE_BYTES and kv.num_pages == 40 and kv.free_pages == 40
    states = _states(memory, 3)
    assert states.units_per_chunk == CHUNK_BYTES // STATE_BYTES
    assert states.nbytes == 4 * STATE_BYTES and states.num_slots == 3
    assert not states.slot_view(StatePool.SINK_SLOT).any()
    experts = _experts(memory, 5)
    assert experts.nbytes == 5 * EXPERT_BYTES
    big = ExpertSlotPool(memory, num_layers=1, num_experts=4, expert_bytes=3000, num_slots=2,
                         chunk_bytes=CHUNK_BYTES)
    assert big.units_per_chunk == 1 and len(big.chunk_tensors()) == 2
    assert memory.allocated_bytes == kv.nbytes + states.nbytes + experts.nbytes + big.nbytes
    assert memory.bytes_by_tag() == {"kv": kv.nbytes, "mamba": states.nbytes,
                                     "moe": experts.nbytes + big.nbytes}


def test_dummy_page_and_sink_slot_are_never_handed_out() -> None:
    memory = DeviceMemory()
    kv, states = _kv(memory, 5), _states(memory, 2)
    assert sorted(kv.allocate_pages("a", 5)) == [1, 2, 3, 4, 5]
    with pytest.raises(PoolExhausted, match="1 pages requested, 0 free"):
        kv.allocate_pages("b", 1)
    assert {states.acquire("a"), states.acquire("b")} == {1, 2}
    assert states.acquire("a") == states.slot_of("a")  # idempotent
    with pytest.raises(PoolExhausted):
        states.acquire("c")
    kv.free_request("a")
    kv.free_request("a")  # repeated aborts are harmless
    assert kv.free_pages == 5


def test_kv_shrink_moves_live_pages_and_rewrites_tables() -> None:
    memory = DeviceMemory()
    kv, experts, states = _kv(memory, 63), _experts(memory, 4), _states(memory, 4)
    model = Model(kv, experts, states)
    for i in range(12):
        model.add_pages(f"r{i}", 5)
    for i in range(0, 12, 2):  # holes low down, live pages up to the last chunk
        model.drop_request(f"r{i}")
    assert max(max(t) for t in kv.page_tables().values()) >= 48
    before = kv.page_tables()
    start = memory.allocated_bytes
    memory.reset_peak()
    events = kv.resize(31)  # 64 -> 32 physical pages: the last two chunks go
    assert kv.num_pages == 31 and kv.nbytes == 32 * PAGE_BYTES
    assert memory.peak_bytes == start
    assert [e.op for e in events].count("free") == 2
    assert all(isinstance(e, ChunkEvent) and e.pool == "kv" and e.seconds >= 0 for e in events)
    assert events[-1].units_after == 31 and events[-1].pool_nbytes_after == kv.nbytes
    assert kv.page_tables() != before
    model.check(memory)
    assert all(p < 32 for t in kv.page_tables().values() for p in t)


def test_shrink_into_a_partial_chunk_keeps_content_and_exact_bytes() -> None:
    memory = DeviceMemory()
    kv, experts, states = _kv(memory, 47), _experts(memory, 4), _states(memory, 4)
    model = Model(kv, experts, states)
    model.add_pages("a", 40)
    model.drop_request("a")
    model.add_pages("b", 3)
    model.add_pages("c", 44)  # fills up to page 47: the boundary chunk holds live pages
    model.drop_request("c")
    model.add_pages("d", 9)
    for new in (30, 19, 12):
        start = memory.allocated_bytes
        memory.reset_peak()
        kv.resize(new)
        # The live tail goes through host memory: never two copies on the device.
        assert memory.peak_bytes == start
        assert kv.nbytes == (new + 1) * PAGE_BYTES
        model.check(memory)
    kv.resize(40)
    assert kv.nbytes == 41 * PAGE_BYTES
    model.add_pages("e", kv.free_pages)
    model.check(memory)


def test_shrink_below_live_is_rejected_before_anything_changes() -> None:
    memory = DeviceMemory()
    kv, experts, states = _kv(memory, 63), _experts(memory, 4), _states(memory, 8)
    model = Model(kv, experts, states)
    model.add_pages("a", 30)
    model.add_pages("b", 10)
    for rid in ("a", "b", "c"):
        model.add_state(rid)
    before, bytes_before = kv.page_tables(), memory.allocated_bytes
    with pytest.raises(PoolShrinkRejected,
                       match="kv: 40 pages are live in running requests; cannot shrink to 39"):
        kv.resize_steps(39)
    with pytest.raises(PoolShrinkRejected, match="mamba: 3 state slots"):
        states.resize(2)
    assert isinstance(PoolShrinkRejected("x"), ValueError)
    assert kv.page_tables() == before and memory.allocated_bytes == bytes_before
    assert kv.num_pages == 63 and states.num_slots == 8
    model.check(memory)
    kv.resize(40)  # exactly live is fine
    states.resize(3)
    model.check(memory)
    with pytest.raises(ValueError, match=">= 1"):
        kv.resize(0)


def test_expert_shrink_keeps_the_hottest_and_their_weights() -> None:
    memory = DeviceMemory()
    kv, experts, states = _kv(memory, 3), _experts(memory, 16), _states(memory, 1)
    model = Model(kv, experts, states)
    keys = [(layer, expert) for layer in range(LAYERS) for expert in range(4)]
    for key in keys:  # 16 admits fill every slot, coldest = first
        model.touch_expert(*key)
    hot = keys[:3]
    for key in hot:  # now the hottest, and sitting in the first chunk
        model.touch_expert(*key)
    evictions = experts.evictions
    experts.resize(6)
    assert experts.resident_count == 6 and experts.nbytes == 6 * EXPERT_BYTES
    assert experts.evictions == evictions + 10
    resident = experts.resident_slots()
    assert list(resident)[-3:] == hot
    assert set(resident) == set(keys[13:] + hot)
    model.check(memory)
    hits = experts.hits
    assert experts.lookup(*hot[0]) is not None and experts.hits == hits + 1
    experts.resize(12)  # growing keeps everyone resident
    assert experts.resident_slots().keys() == resident.keys()
    model.check(memory)


def test_expert_admit_evicts_lru_and_counts() -> None:
    memory = DeviceMemory()
    experts = _experts(memory, 2)
    bank = _bank()
    assert experts.lookup(0, 0) is None
    experts.admit(0, 0, bank[0, 0])
    experts.admit(0, 1, bank[0, 1])
    assert experts.lookup(0, 0) is not None  # (0, 1) is now the LRU victim
    slot = experts.admit(1, 1, bank[1, 1].view(torch.float32))  # any dtype, same bytes
    assert experts.resident_slots() == {(0, 0): 0, (1, 1): slot}
    assert torch.equal(experts.slot_view(slot), bank[1, 1])
    assert (experts.hits, experts.misses, experts.evictions) == (1, 1, 1)
    with pytest.raises(ValueError, match="256"):
        experts.admit(2, 2, torch.zeros(10, dtype=torch.uint8))
    with pytest.raises(IndexError):
        experts.admit(LAYERS, 0, bank[0, 0])


def test_chunked_conversion_fits_where_freetoken_order_ooms() -> None:
    # KV 128 physical pages = 8 chunks, experts 8 slots = 2 chunks, one chunk of slack.
    start_total = 128 * PAGE_BYTES + 8 * EXPERT_BYTES
    cap = start_total + CHUNK_BYTES
    x_bytes = 4 * CHUNK_BYTES

    def setup() -> tuple[DeviceMemory, Model]:
        memory = DeviceMemory(capacity_bytes=cap)
        model = Model(_kv(memory, 127), _experts(memory, 8), _states(memory, 0))
        for i in range(20):
            model.add_pages(f"r{i}", 5)
        for i in range(20):  # 35 live pages left, up to page 95: in chunks the shrink frees
            if i % 3:
                model.drop_request(f"r{i}")
        for layer in range(2):
            for expert in range(4):
                model.touch_expert(layer, expert)
        return memory, model

    memory, model = setup()
    kv, experts = model.kv, model.experts
    assert max(max(t) for t in kv.page_tables().values()) >= 64
    start = memory.allocated_bytes
    memory.reset_peak()
    kv.resize(127 - x_bytes // PAGE_BYTES)
    experts.resize(8 + x_bytes // EXPERT_BYTES)
    assert memory.peak_bytes <= start and memory.allocated_bytes == start
    assert experts.resident_count == 8
    model.check(memory)

    # ft serve's order (MoE first, each pool freeing only itself) needs old KV + new MoE.
    memory, model = setup()
    with pytest.raises(torch.OutOfMemoryError, match="emulated card"):
        model.experts.reallocate(8 + x_bytes // EXPERT_BYTES)
    assert model.experts.nbytes == 0 and model.experts.resident_count == 0
    assert model.experts.num_slots == 0 and memory.allocated_bytes == model.kv.nbytes + \
        model.states.nbytes
    model.experts.reallocate(8)  # the caller's rollback
    assert model.experts.num_slots == 8 and model.experts.nbytes == 8 * EXPERT_BYTES
    model.touch_expert(0, 0)


def test_gather_and_write_pages_follow_the_table_across_chunks() -> None:
    memory = DeviceMemory("cpu")
    kv = _kv(memory, 40)  # 16 pages a chunk: the table below crosses two chunk boundaries
    kv.allocate_pages("x", 3)
    pages = kv.allocate_pages("a", 30)
    kv.free_request("x")
    pages += kv.allocate_pages("a", 2)  # pages 1-3 again: the table is no longer one run
    assert kv.page_table("a") == pages
    data = torch.randint(0, 256, (len(pages), PAGE_BYTES), dtype=torch.uint8)
    kv.write_pages(pages, data)
    for row, page in enumerate(pages):
        assert torch.equal(kv.page_view(page), data[row])
    assert torch.equal(kv.gather_pages(pages), data)
    assert torch.equal(kv.gather_pages(pages[5:9][::-1]), data[5:9].flip(0))
    gathered = kv.gather_pages(pages)
    gathered.zero_()  # a copy: the pool is untouched
    assert torch.equal(kv.gather_pages(pages), data)


def test_gather_and_write_pages_reject_bad_input() -> None:
    kv = _kv(DeviceMemory("cpu"), 8)
    with pytest.raises(ValueError, match="at least one page"):
        kv.gather_pages([])
    with pytest.raises(IndexError, match="outside"):
        kv.gather_pages([7, 8, 9])
    with pytest.raises(ValueError, match=r"uint8 \[2, 64\]"):
        kv.write_pages([1, 2], torch.zeros(2, PAGE_BYTES, dtype=torch.float32))


def test_close_frees_every_byte_and_forgets_content() -> None:
    memory = DeviceMemory("cpu")
    kv, experts, states = _kv(memory, 20), _experts(memory, 8), _states(memory, 3)
    kv.allocate_pages("a", 5)
    experts.admit(0, 1, _bank()[0, 1])
    states.acquire("a")
    steps = kv.resize_steps(8)  # a resize in progress: close must wait for it
    next(steps)
    with pytest.raises(RuntimeError, match="during a resize"):
        kv.close()
    steps.close()
    for pool in (kv, experts, states):
        pool.close()
        assert pool.nbytes == 0
    assert memory.allocated_bytes == 0
    assert experts.resident_count == 0 and kv.used_pages == 0 and states.used_slots == 0


def test_reallocate_drops_all_content() -> None:
    memory = DeviceMemory()
    kv, experts, states = _kv(memory, 20), _experts(memory, 4), _states(memory, 3)
    model = Model(kv, experts, states)
    model.add_pages("a", 10)
    model.add_state("a")
    model.touch_expert(0, 0)
    events: list[ChunkEvent] = []
    kv.reallocate(30, on_chunk=events.append)
    assert [e.op for e in events] == ["free", "free", "alloc", "alloc"]
    assert kv.page_tables() == {} and kv.free_pages == 30 and kv.nbytes == 31 * PAGE_BYTES
    states.reallocate(5)
    assert states.slots() == {} and not any(t.any() for t in states.chunk_tensors())
    experts.reallocate(4)
    assert experts.resident_count == 0 and experts.lookup(0, 0) is None
    model.pages.clear()
    model.state.clear()
    model.check(memory)


def test_oom_mid_grow_leaves_the_chunks_it_has() -> None:
    memory = DeviceMemory(capacity_bytes=4 * CHUNK_BYTES + 2 * PAGE_BYTES)
    kv = _kv(memory, 23)  # 24 pages: one full chunk and a partial of 8
    experts = _experts(memory, 4)
    states = _states(memory, 0)
    model = Model(kv, experts, states)
    model.add_pages("a", 20)
    model.touch_expert(1, 2)
    events: list[ChunkEvent] = []
    with pytest.raises(torch.OutOfMemoryError):
        kv.resize(100, on_chunk=events.append)
    # The partial tail became a full chunk, a third chunk fit, the fourth did not.
    assert [e.op for e in events] == ["alloc", "free", "alloc"]
    assert kv.num_pages == 47 and kv.nbytes == 48 * PAGE_BYTES
    assert kv.free_pages == 27
    model.check(memory)
    model.add_pages("b", 27)
    model.check(memory)
    # A failed tail copy changes nothing at all.
    memory2 = DeviceMemory(capacity_bytes=CHUNK_BYTES + 8 * PAGE_BYTES)
    small = _kv(memory2, 23)
    with pytest.raises(torch.OutOfMemoryError):
        small.resize(24)
    assert small.num_pages == 23 and small.nbytes == 24 * PAGE_BYTES
    assert memory2.allocated_bytes == small.nbytes


def test_pool_keeps_serving_between_chunk_steps() -> None:
    memory = DeviceMemory()
    kv, experts, states = _kv(memory, 79), _experts(memory, 16), _states(memory, 8)
    model = Model(kv, experts, states)
    model.add_pages("filler", 39)
    for i in range(8):  # pages 40..79, all in chunks the shrink releases or cuts
        model.add_pages(f"r{i}", 5)
        model.add_state(f"r{i}")
    model.drop_request("filler")
    for key in range(16):
        model.touch_expert(key % LAYERS, key // LAYERS)
    steps = kv.resize_steps(47)
    expert_steps = experts.resize_steps(5)
    for n, event in enumerate(steps, start=1):
        model.check(memory)
        # Requests finish and arrive mid-resize; new pages come only from kept chunks.
        model.drop_request(f"r{n}")
        if kv.free_pages >= 2:
            assert all(p <= 47 for p in model.add_pages(f"new{n}", 2))
        assert event.units_after == 47
    for _ in expert_steps:
        model.touch_expert(3, 7)  # admits during the shrink evict into kept slots
        model.check(memory)
    assert kv.num_pages == 47 and experts.num_slots == 5
    assert all(p <= 47 for t in kv.page_tables().values() for p in t)
    started = kv.resize_steps(60)
    next(started)
    with pytest.raises(RuntimeError, match="in progress"):
        kv.resize(70)
    started.close()  # an abandoned resize settles where it stopped
    model.check(memory)
    model.add_pages("tail", kv.free_pages)
    model.check(memory)


@settings(max_examples=50)
@given(st.lists(st.tuples(st.sampled_from(["kv", "moe", "mamba", "pages", "drop", "state",
                                            "expert"]),
                          st.integers(0, 200)),
                max_size=30))
def test_random_resizes_keep_accounting_and_content(ops: list[tuple[str, int]]) -> None:
    memory = DeviceMemory()
    kv, experts, states = _kv(memory, 30), _experts(memory, 6), _states(memory, 3)
    model = Model(kv, experts, states)
    def resize(pool: PagedKVPool | ExpertSlotPool | StatePool, new_units: int) -> None:
        start, chunk_bytes = memory.allocated_bytes, pool.units_per_chunk * pool.unit_bytes
        shrinking = new_units < pool._usable
        memory.reset_peak()
        pool.resize(new_units)
        # Free-first: a shrink never exceeds its start (a live partial tail goes through host
        # memory); a grow holds at most one chunk beyond its end state.
        if shrinking:
            assert memory.peak_bytes == start
        assert memory.peak_bytes <= max(start, memory.allocated_bytes) + chunk_bytes

    for i, (op, n) in enumerate(ops):
        try:
            if op == "kv":
                resize(kv, 1 + n)
            elif op == "moe":
                resize(experts, 1 + n % 40)
            elif op == "mamba":
                resize(states, n % 12)
            elif op == "pages":
                model.add_pages(f"r{n % 7}", min(n % 9, kv.free_pages))
            elif op == "drop":
                model.drop_request(f"r{n % 7}")
            elif op == "state":
                if states.free_slots and f"r{n % 7}" not in model.state:
                    model.add_state(f"r{n % 7}")
            else:
                model.touch_expert(n % LAYERS, (n + i) % EXPERTS)
        except PoolShrinkRejected:
            assert op in ("kv", "mamba")
        model.check(memory)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_chunked_conversion_on_an_emulated_card() -> None:
    from engine.reference.memory import emulate_card

    mib = 1 << 20
    device = torch.device("cuda")
    torch.empty(1, device=device)
    free0, total = torch.cuda.mem_get_info(device)
    filler = emulate_card(total - free0 + 1024 * mib, device)  # 1 GiB left for the pools
    try:
        memory = DeviceMemory(device)
        base = torch.cuda.memory_allocated(device)
        # 64 KiB pages and 2 MiB experts in 32 MiB chunks: 768 MiB of KV, 128 MiB of experts.
        kv = PagedKVPool(memory, page_size=16, kv_bytes_per_token=4096,
                         num_pages=768 * 16 - 1, chunk_bytes=32 * mib)
        experts = ExpertSlotPool(memory, num_layers=4, num_experts=64, expert_bytes=2 * mib,
                                 num_slots=64, chunk_bytes=32 * mib)
        bank = torch.randint(0, 256, (4, 16, 2 * mib), dtype=torch.uint8).pin_memory()
        for layer in range(4):
            for expert in range(16):
                experts.admit(layer, expert, bank[layer, expert])
        kv.allocate_pages("filler", 8000)
        pages = kv.allocate_pages("a", 2000)  # up in the chunks a shrink releases
        kv.free_request("filler")
        for page in pages:
            kv.page_view(page).fill_(page % 251)
        torch.cuda.synchronize()
        start_free = torch.cuda.mem_get_info(device)[0]
        lowest = [start_free]

        def watch(event: ChunkEvent) -> None:
            assert torch.cuda.memory_allocated(device) - base == memory.allocated_bytes
            lowest[0] = min(lowest[0], torch.cuda.mem_get_info(device)[0])

        kv.resize(256 * 16 - 1, on_chunk=watch)  # free 512 MiB first ...
        experts.resize(64 + 256, on_chunk=watch)  # ... then grow experts by the same
        assert lowest[0] >= start_free
        assert experts.resident_count == 64
        for (layer, expert), slot in experts.resident_slots().items():
            assert torch.equal(experts.slot_view(slot).cpu(), bank[layer, expert])
        for index, page in enumerate(kv.page_table("a")):
            assert int(kv.page_view(page)[0]) == pages[index] % 251

        # Back, then ft serve's order: MoE grows while old KV is still held, and OOMs.
        experts.resize(64)
        kv.resize(768 * 16 - 1)
        with pytest.raises(torch.OutOfMemoryError):
            experts.reallocate(64 + 256)
        assert experts.nbytes == 0
        experts.reallocate(64)
        assert torch.cuda.memory_allocated(device) - base == memory.allocated_bytes
    finally:
        filler.release()


def test_page_runs_split_at_chunk_boundaries_and_at_breaks_in_the_table() -> None:
    kv = _kv(DeviceMemory("cpu"), 40)  # 16 pages a chunk
    pages = [*range(1, 21), 30, 31, 25]
    runs = [(start, len(rows)) for start, rows in kv.page_runs(pages)]
    # 1..15 end chunk 0, 16..20 then 30, 31 in chunk 1 (a break), 25 alone.
    assert runs == [(0, 15), (15, 5), (20, 2), (22, 1)]
    for start, rows in kv.page_runs(pages):
        assert rows.data_ptr() == kv.page_view(pages[start]).data_ptr()
    with pytest.raises(IndexError, match="page 41 outside"):
        kv.page_runs([1, 41])
