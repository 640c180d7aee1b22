"""The reference engine's three cache pools, made of chunks that resize free-first.

A pool is a list of chunks, each one `DeviceMemory` allocation of `units_per_chunk` units (the
last may be partial: sizes are exact unit counts). Unit `u` lives in chunk `u // units_per_chunk`
for the pool's whole life, so page tables and slot maps stay valid while chunks come and go.

`resize` is what makes a rung change cheap and safe: a shrink first moves the live content of
the chunks it releases into free units of the chunks it keeps (hot experts, live KV pages,
running requests' states), then frees those chunks one at a time, and cuts a live partial
tail through host memory so the device never holds two copies; a grow adds one chunk at a
time. A freed chunk goes back to torch's caching allocator, not the driver: the next chunk of
the same rebuild reuses it without a device sync, and when a differently sized request cannot,
torch releases its cache and retries before it reports an OOM, so caching never turns a fitting
step into a failing one. The pools' owner hands the cache back to the driver
(`DeviceMemory.release_to_driver`) once the whole resize is over. So a shrink never holds more
than its start total, a KV-to-experts conversion never more than the start plus one chunk, and
the pools keep serving in between: `resize_steps` does one chunk operation per `next()` and the
other methods may run between steps. `reallocate` is the other execution model, ft serve's:
drop everything, then allocate the new size, contents lost.

Like ft serve, the KV pool keeps one dummy page (unit 0, never handed out; a padding target)
beyond `num_pages`, and the state pool one sink slot (unit 0) beyond `num_slots`.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from engine.reference.memory import DeviceMemory

__all__ = [
    "ChunkEvent",
    "ExpertSlotPool",
    "PagedKVPool",
    "PoolExhausted",
    "PoolShrinkRejected",
    "StatePool",
]

ChunkOp = Literal["alloc", "free", "move"]
ExpertKey = tuple[int, int]


@dataclass(frozen=True, slots=True)
class ChunkEvent:
    """One chunk operation of a resize; `units_after` counts usable units."""

    pool: str
    op: ChunkOp
    nbytes: int
    units_after: int
    pool_nbytes_after: int
    seconds: float


class PoolShrinkRejected(ValueError):
    """A shrink below what live content needs; raised before anything is touched."""


class PoolExhausted(RuntimeError):
    """No free unit for a request (the scheduler should have checked `free_*` first)."""


class _ChunkedPool:
    """Chunks, the unit allocator and the free-first resize shared by the three pools.

    Subclasses keep their own maps (slot of an expert, pages of a request) and learn about
    moves through `_relocated`. Units below `_limit` may be handed out; during a shrink the
    limit drops to the target at once, so nothing new lands in a chunk about to be released,
    and `_reserve` holds the kept free units promised to the live units still out there.
    """

    def __init__(
        self,
        memory: DeviceMemory,
        *,
        name: str,
        unit_bytes: int,
        chunk_bytes: int,
        fixed_units: int,
        usable_units: int,
        min_usable: int,
        zero_fill: bool,
    ) -> None:
        if unit_bytes < 1:
            raise ValueError(f"{name}: unit size must be >= 1 byte, got {unit_bytes}")
        if chunk_bytes < 1:
            raise ValueError(f"{name}: chunk_bytes must be >= 1, got {chunk_bytes}")
        self.name = name
        self.unit_bytes = unit_bytes
        self.chunk_bytes = chunk_bytes
        self.units_per_chunk = max(1, chunk_bytes // unit_bytes)
        self._memory = memory
        self._fixed_units = fixed_units
        self._min_usable = min_usable
        self._zero_fill = zero_fill
        self._chunks: list[torch.Tensor] = []
        self._physical = 0
        self._limit = 0
        self._used: set[int] = set()
        self._free: list[int] = []
        self._reserve: list[int] = []
        # An old tail chunk already replaced by its copy, freed by the next step.
        self._retired: torch.Tensor | None = None
        self._busy = False
        self.reallocate(usable_units)

    # --- sizes and views -------------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        """Bytes this pool holds in `DeviceMemory` right now, to the byte."""
        return sum(t.numel() for t in self.chunk_tensors())

    @property
    def _usable(self) -> int:
        return max(0, self._limit - self._fixed_units)

    def chunk_tensors(self) -> tuple[torch.Tensor, ...]:
        """Every allocation the pool holds (for accounting checks)."""
        retired = () if self._retired is None else (self._retired,)
        return (*self._chunks, *retired)

    def _unit(self, unit: int) -> torch.Tensor:
        if not 0 <= unit < self._physical:
            raise IndexError(f"{self.name}: unit {unit} out of range 0..{self._physical - 1}")
        chunk, offset = divmod(unit, self.units_per_chunk)
        start = offset * self.unit_bytes
        return self._chunks[chunk][start : start + self.unit_bytes]

    # --- unit allocator --------------------------------------------------------------------

    def _take(self) -> int | None:
        # Lowest first keeps content packed at the front, so shrinks move little.
        if not self._free:
            return None
        unit = heapq.heappop(self._free)
        self._used.add(unit)
        return unit

    def _give(self, unit: int) -> None:
        self._used.remove(unit)
        if unit < self._limit:
            heapq.heappush(self._free, unit)
        elif self._reserve:
            # A live unit of a chunk being released went away: its destination is free again.
            heapq.heappush(self._free, self._reserve.pop())

    # --- hooks -----------------------------------------------------------------------------

    def _relocated(self, src: int, dst: int) -> None:
        raise NotImplementedError

    def _forget_all(self) -> None:
        raise NotImplementedError

    def _shrink_rejection(self, new_units: int) -> str | None:
        return None

    def _make_room(self, new_units: int) -> None:
        """Called as a shrink starts; pools that may drop content (experts) do it here."""

    # --- resizing --------------------------------------------------------------------------

    def _check_size(self, new_units: int) -> None:
        if isinstance(new_units, bool) or not isinstance(new_units, int):
            raise TypeError(f"{self.name}: size must be an int, got {type(new_units).__name__}")
        if new_units < self._min_usable:
            raise ValueError(f"{self.name}: size must be >= {self._min_usable}, got {new_units}")
        if self._busy:
            raise RuntimeError(f"{self.name}: a resize of this pool is already in progress")

    def resize_steps(self, new_units: int) -> Generator[ChunkEvent, None, None]:
        """Resize to `new_units` usable units, one chunk operation per `next()`.

        Raises `PoolShrinkRejected` here, before anything is touched, when live content does
        not fit. Drain or `close()` the iterator; the pool is consistent at every step and
        after an exception (e.g. `torch.OutOfMemoryError` mid-grow leaves the chunks it has).
        """
        self._check_size(new_units)
        reason = self._shrink_rejection(new_units)
        if reason is not None:
            raise PoolShrinkRejected(reason)
        return self._resize_steps(new_units)

    def resize(
        self, new_units: int, *, on_chunk: Callable[[ChunkEvent], None] | None = None
    ) -> list[ChunkEvent]:
        """`resize_steps` drained; `on_chunk` sees each event as it happens."""
        events = []
        for event in self.resize_steps(new_units):
            events.append(event)
            if on_chunk is not None:
                on_chunk(event)
        return events

    def reallocate(
        self, new_units: int, *, on_chunk: Callable[[ChunkEvent], None] | None = None
    ) -> list[ChunkEvent]:
        """ft serve's rebuild: free every chunk and its content, then allocate `new_units`.

        On `torch.OutOfMemoryError` the pool is left empty but valid (no chunks, nothing
        live) and the error propagates, so the caller can roll back with `reallocate(old)`.
        """
        self._check_size(new_units)
        events: list[ChunkEvent] = []
        self._busy = True
        try:
            self._forget_all()
            self._used.clear()
            self._free, self._reserve, self._limit = [], [], 0
            for event in self._release_all():
                events.append(event)
                if on_chunk is not None:
                    on_chunk(event)
            try:
                for event in self._grow(new_units + self._fixed_units):
                    events.append(event)
                    if on_chunk is not None:
                        on_chunk(event)
            except torch.OutOfMemoryError:
                for _ in self._release_all():
                    pass
                raise
        finally:
            self._settle()
            self._busy = False
        return events

    def close(self) -> None:
        """Drop every chunk and its content; the pool holds nothing and must not be used again."""
        if self._busy:
            raise RuntimeError(f"{self.name}: cannot close during a resize")
        self._forget_all()
        self._used.clear()
        self._free, self._reserve, self._limit = [], [], 0
        if self._retired is not None:
            self._free_retired()
        for _ in self._release_all():
            pass

    def _resize_steps(self, new_units: int) -> Generator[ChunkEvent, None, None]:
        # Checked again: the pool may have changed between the call and the first step.
        self._check_size(new_units)
        reason = self._shrink_rejection(new_units)
        if reason is not None:
            raise PoolShrinkRejected(reason)
        target = new_units + self._fixed_units
        self._busy = True
        try:
            if target < self._physical:
                yield from self._shrink(new_units, target)
            elif target > self._physical:
                yield from self._grow(target)
        finally:
            self._settle()
            self._busy = False

    def _event(self, op: ChunkOp, nbytes: int, started: float) -> ChunkEvent:
        return ChunkEvent(self.name, op, nbytes, self._usable, self.nbytes,
                          time.perf_counter() - started)

    def _alloc_chunk(self, units: int) -> torch.Tensor:
        tensor = self._memory.alloc(units * self.unit_bytes, tag=self.name)
        if self._zero_fill:
            tensor.zero_()
        return tensor

    def _release(self, holder: list[torch.Tensor]) -> int:
        """Free the tensor popped from `holder`, whose frame then holds its last reference.

        The reference must be gone by the owner's `release_to_driver`, or torch keeps the block.
        """
        tensor = holder.pop()
        nbytes = tensor.numel()
        self._memory.free(tensor)
        del tensor
        return nbytes

    def _add_units(self, count: int) -> None:
        for unit in range(self._physical, self._physical + count):
            if unit >= self._fixed_units:
                heapq.heappush(self._free, unit)
        self._physical += count
        self._limit = self._physical

    def _tail_units(self) -> int:
        return self._physical - (len(self._chunks) - 1) * self.units_per_chunk

    def _grow(self, target: int) -> Iterator[ChunkEvent]:
        upc = self.units_per_chunk
        while self._physical < target:
            started = time.perf_counter()
            tail = self._tail_units() if self._chunks else upc
            if tail < upc:
                # A partial tail cannot be extended in place: copy it into a larger chunk.
                # The old one lives one step longer, so the peak is the start plus one chunk.
                new_tail = min(upc, tail + target - self._physical)
                chunk = self._alloc_chunk(new_tail)
                chunk[: tail * self.unit_bytes].copy_(self._chunks[-1])
                self._retired, self._chunks[-1] = self._chunks[-1], chunk
                self._add_units(new_tail - tail)
                yield self._event("alloc", new_tail * self.unit_bytes, started)
                yield self._free_retired()
            else:
                count = min(upc, target - self._physical)
                self._chunks.append(self._alloc_chunk(count))
                self._add_units(count)
                yield self._event("alloc", count * self.unit_bytes, started)

    def _free_retired(self) -> ChunkEvent:
        started = time.perf_counter()
        assert self._retired is not None
        holder, self._retired = [self._retired], None
        return self._event("free", self._release(holder), started)

    def _shrink(self, new_units: int, target: int) -> Iterator[ChunkEvent]:
        upc = self.units_per_chunk
        self._make_room(new_units)
        self._limit = target
        kept_free = sorted(u for u in self._free if u < target)
        outside = sum(1 for u in self._used if u >= target)
        # Sorted ascending is a valid heap; the reserve pops its lowest unit first.
        self._free = kept_free[outside:]
        self._reserve = kept_free[:outside][::-1]
        boundary = (target - 1) // upc
        for index in range(len(self._chunks) - 1, boundary - 1, -1):
            # Chunks are released from the end, so `index` is always the last one.
            lo, hi = max(index * upc, target), self._physical
            movers = sorted(u for u in self._used if lo <= u < hi)
            if movers:
                started = time.perf_counter()
                for src in movers:
                    dst = self._reserve.pop()
                    self._unit(dst).copy_(self._unit(src))
                    self._used.remove(src)
                    self._used.add(dst)
                    self._relocated(src, dst)
                yield self._event("move", len(movers) * self.unit_bytes, started)
            if index > boundary:
                started = time.perf_counter()
                self._physical -= self._tail_units()
                yield self._event("free", self._release(self._chunks), started)
        yield from self._shrink_tail(target)

    def _shrink_tail(self, target: int) -> Iterator[ChunkEvent]:
        """Cut the boundary chunk down to the units below `target`."""
        upc = self.units_per_chunk
        start = (len(self._chunks) - 1) * upc
        keep, tail = target - start, self._tail_units()
        if keep >= tail:
            return
        started = time.perf_counter()
        if any(start <= u < target for u in self._used):
            # Live content stays, staged through host memory so the device never holds the
            # old and the new chunk at once: a shrink never exceeds its start total, which is
            # what lets the planner send one from a geometry at or above its budget. All of
            # it happens before the first yield, so no reader sees the chunk missing.
            kept_bytes = keep * self.unit_bytes
            staged = self._chunks[-1][:kept_bytes].to("cpu", copy=True)
            self._physical = start
            freed = self._event("free", self._release(self._chunks), started)
            started = time.perf_counter()
            self._chunks.append(self._memory.alloc(kept_bytes, tag=self.name))
            self._physical = target
            allocated = self._event("alloc", kept_bytes, started)
            started = time.perf_counter()
            self._chunks[-1].copy_(staged)
            del staged
            yield freed
            yield allocated
            yield self._event("move", kept_bytes, started)
            return
        # Nothing live here: free first, so even this step never exceeds the start total.
        self._limit = start
        self._free = [u for u in self._free if u < start]
        heapq.heapify(self._free)
        self._physical = start
        yield self._event("free", self._release(self._chunks), started)
        started = time.perf_counter()
        self._chunks.append(self._alloc_chunk(keep))
        self._add_units(keep)
        yield self._event("alloc", keep * self.unit_bytes, started)

    def _release_all(self) -> Iterator[ChunkEvent]:
        while self._chunks:
            started = time.perf_counter()
            self._physical -= self._tail_units()
            yield self._event("free", self._release(self._chunks), started)

    def _settle(self) -> None:
        """Back to rest after a resize, finished or not: every held unit is usable."""
        if self._retired is not None:
            self._free_retired()
        self._limit = self._physical
        self._reserve = []
        self._free = [u for u in range(self._fixed_units, self._physical) if u not in self._used]


class ExpertSlotPool(_ChunkedPool):
    """Expert slots shared by all MoE layers, filled on a miss, evicted by global LRU."""

    def __init__(
        self,
        memory: DeviceMemory,
        *,
        num_layers: int,
        num_experts: int,
        expert_bytes: int,
        num_slots: int,
        chunk_bytes: int,
    ) -> None:
        self.num_layers = num_layers
        self.num_experts = num_experts
        self.expert_bytes = expert_bytes
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        # Coldest first; a hit moves the entry to the end.
        self._slot_of: OrderedDict[ExpertKey, int] = OrderedDict()
        self._key_of: dict[int, ExpertKey] = {}
        super().__init__(memory, name="moe", unit_bytes=expert_bytes, chunk_bytes=chunk_bytes,
                         fixed_units=0, usable_units=num_slots, min_usable=1, zero_fill=False)

    @property
    def num_slots(self) -> int:
        return self._usable

    @property
    def resident_count(self) -> int:
        return len(self._slot_of)

    def resident_slots(self) -> dict[ExpertKey, int]:
        """(layer, expert) -> slot, coldest first; reading it touches nothing."""
        return dict(self._slot_of)

    def lookup(self, layer: int, expert: int) -> int | None:
        slot = self._slot_of.get((layer, expert))
        if slot is None:
            self.misses += 1
            return None
        self._slot_of.move_to_end((layer, expert))
        self.hits += 1
        return slot

    def admit(self, layer: int, expert: int, host_weights: torch.Tensor) -> int:
        """Copy an expert's weights into a slot, evicting the LRU victim when none is free."""
        key = (layer, expert)
        if not (0 <= layer < self.num_layers and 0 <= expert < self.num_experts):
            raise IndexError(f"moe: expert {key} outside {self.num_layers} x {self.num_experts}")
        source = host_weights.reshape(-1).view(torch.uint8)
        if source.numel() != self.expert_bytes:
            raise ValueError(f"moe: expert weights are {source.numel()} bytes, "
                             f"slots hold {self.expert_bytes}")
        if key in self._slot_of:
            self._slot_of.move_to_end(key)
            return self._slot_of[key]
        slot = self._take()
        while slot is None:
            if not self._slot_of:
                raise PoolExhausted("moe: no expert slot can be freed")
            self._evict_coldest()
            slot = self._take()
        pinned = self._memory.device.type == "cuda" and source.is_pinned()
        self._unit(slot).copy_(source, non_blocking=pinned)
        self._slot_of[key] = slot
        self._key_of[slot] = key
        return slot

    def slot_view(self, slot: int) -> torch.Tensor:
        """The slot's `expert_bytes` as uint8; the decoder reinterprets them."""
        return self._unit(slot)

    def _evict_coldest(self) -> None:
        _, slot = self._slot_of.popitem(last=False)
        del self._key_of[slot]
        self._give(slot)
        self.evictions += 1

    def _make_room(self, new_units: int) -> None:
        while len(self._slot_of) > new_units:
            self._evict_coldest()

    def _relocated(self, src: int, dst: int) -> None:
        key = self._key_of.pop(src)
        self._key_of[dst] = key
        self._slot_of[key] = dst

    def _forget_all(self) -> None:
        self._slot_of.clear()
        self._key_of.clear()


class PagedKVPool(_ChunkedPool):
    """KV pages of `page_size` tokens; page 0 is the dummy page and is never handed out."""

    DUMMY_PAGE = 0

    def __init__(
        self,
        memory: DeviceMemory,
        *,
        page_size: int,
        kv_bytes_per_token: int,
        num_pages: int,
        chunk_bytes: int,
    ) -> None:
        self.page_size = page_size
        self.kv_bytes_per_token = kv_bytes_per_token
        self._tables: dict[str, list[int]] = {}
        # page -> (request, index in its table), to rewrite a table when a page moves.
        self._owner: dict[int, tuple[str, int]] = {}
        super().__init__(memory, name="kv", unit_bytes=page_size * kv_bytes_per_token,
                         chunk_bytes=chunk_bytes, fixed_units=1, usable_units=num_pages,
                         min_usable=1, zero_fill=False)

    @property
    def page_bytes(self) -> int:
        return self.unit_bytes

    @property
    def num_pages(self) -> int:
        """Usable pages (the dummy page excluded)."""
        return self._usable

    @property
    def used_pages(self) -> int:
        return len(self._used)

    @property
    def free_pages(self) -> int:
        """Pages `allocate_pages` can hand out now."""
        return len(self._free)

    def allocate_pages(self, request_id: str, n: int) -> list[int]:
        """Append `n` pages to the request's table; all or nothing."""
        if n < 0:
            raise ValueError(f"kv: cannot allocate {n} pages")
        if n > len(self._free):
            raise PoolExhausted(f"kv: {n} pages requested, {len(self._free)} free "
                                f"of {self.num_pages}")
        if n == 0:
            return []
        table = self._tables.setdefault(request_id, [])
        pages = []
        for _ in range(n):
            page = self._take()
            assert page is not None
            self._owner[page] = (request_id, len(table))
            table.append(page)
            pages.append(page)
        return pages

    def free_request(self, request_id: str) -> None:
        """Return the request's pages; an unknown request is a no-op (aborts may repeat)."""
        for page in self._tables.pop(request_id, ()):
            del self._owner[page]
            self._give(page)

    def page_table(self, request_id: str) -> list[int]:
        return list(self._tables[request_id])

    def page_tables(self) -> dict[str, list[int]]:
        return {rid: list(pages) for rid, pages in self._tables.items()}

    def page_view(self, page: int) -> torch.Tensor:
        return self._unit(page)

    def gather_pages(self, pages: list[int]) -> torch.Tensor:
        """A copy of the pages' bytes in table order, as one `[len(pages), page_bytes]` tensor.

        One slice per run of consecutive pages (tables are mostly such runs: pages are handed
        out lowest first), so a long context costs a few copies, not one view per page.
        """
        runs = [rows for _, rows in self.page_runs(pages)]
        if not runs:
            raise ValueError("kv: gather_pages needs at least one page")
        return torch.cat(runs)

    def write_pages(self, pages: list[int], data: torch.Tensor) -> None:
        """Copy `data` (`[len(pages), page_bytes]` uint8) into the pages, in table order."""
        if tuple(data.shape) != (len(pages), self.unit_bytes) or data.dtype != torch.uint8:
            raise ValueError(f"kv: write_pages needs uint8 [{len(pages)}, {self.unit_bytes}], "
                             f"got {data.dtype} {list(data.shape)}")
        for start, rows in self.page_runs(pages):
            rows.copy_(data[start : start + len(rows)])

    def page_runs(self, pages: list[int]) -> list[tuple[int, torch.Tensor]]:
        """(index in `pages`, rows view) for each run of consecutive pages inside one chunk.

        A run is confirmed with one list comparison, not a Python loop over its pages: a
        200k-token table is ~12k pages, and the decoder asks for its runs every token.
        """
        upc = self.units_per_chunk
        runs: list[tuple[int, torch.Tensor]] = []
        start = 0
        while start < len(pages):
            first = pages[start]
            if not 0 <= first < self._physical:
                raise IndexError(f"kv: page {first} outside 0..{self._physical - 1}")
            chunk, offset = divmod(first, upc)
            limit = min(len(pages), start + upc - offset, start + self._physical - first)
            end = limit
            if pages[start:limit] != list(range(first, first + limit - start)):
                end = start + 1
                while end < limit and pages[end] == first + end - start:
                    end += 1
            rows = self._chunks[chunk].view(-1, self.unit_bytes)
            runs.append((start, rows[offset : offset + end - start]))
            start = end
        return runs

    def _shrink_rejection(self, new_units: int) -> str | None:
        if len(self._used) > new_units:
            return (f"kv: {len(self._used)} pages are live in running requests; "
                    f"cannot shrink to {new_units}")
        return None

    def _relocated(self, src: int, dst: int) -> None:
        request_id, index = self._owner.pop(src)
        self._owner[dst] = (request_id, index)
        self._tables[request_id][index] = dst

    def _forget_all(self) -> None:
        self._tables.clear()
        self._owner.clear()


class StatePool(_ChunkedPool):
    """Per-request recurrent (mamba/GDN) state slots; slot 0 is the sink and never handed out."""

    SINK_SLOT = 0

    def __init__(
        self, memory: DeviceMemory, *, state_bytes: int, num_slots: int, chunk_bytes: int
    ) -> None:
        self.state_bytes = state_bytes
        self._slot_of: dict[str, int] = {}
        self._owner: dict[int, str] = {}
        super().__init__(memory, name="mamba", unit_bytes=state_bytes, chunk_bytes=chunk_bytes,
                         fixed_units=1, usable_units=num_slots, min_usable=0, zero_fill=True)

    @property
    def num_slots(self) -> int:
        """Usable slots (the sink excluded)."""
        return self._usable

    @property
    def used_slots(self) -> int:
        return len(self._used)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def acquire(self, request_id: str) -> int:
        """The request's slot, zeroed when new (a recycled slot holds someone else's state)."""
        slot = self._slot_of.get(request_id)
        if slot is not None:
            return slot
        slot = self._take()
        if slot is None:
            raise PoolExhausted(f"mamba: all {self.num_slots} state slots are in use")
        self._unit(slot).zero_()
        self._slot_of[request_id] = slot
        self._owner[slot] = request_id
        return slot

    def release(self, request_id: str) -> None:
        """Return the request's slot; an unknown request is a no-op."""
        slot = self._slot_of.pop(request_id, None)
        if slot is not None:
            del self._owner[slot]
            self._give(slot)

    def slot_of(self, request_id: str) -> int:
        return self._slot_of[request_id]

    def slots(self) -> dict[str, int]:
        return dict(self._slot_of)

    def slot_view(self, slot: int) -> torch.Tensor:
        return self._unit(slot)

    def _shrink_rejection(self, new_units: int) -> str | None:
        if len(self._used) > new_units:
            return (f"mamba: {len(self._used)} state slots are held by running requests; "
                    f"cannot shrink to {new_units}")
        return None

    def _relocated(self, src: int, dst: int) -> None:
        request_id = self._owner.pop(src)
        self._owner[dst] = request_id
        self._slot_of[request_id] = dst

    def _forget_all(self) -> None:
        self._slot_of.clear()
        self._owner.clear()
