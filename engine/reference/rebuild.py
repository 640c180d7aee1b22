"""How the reference engine carries out an accepted rebuild, and what it costs running requests.

`ReferenceEngine.rebuild` answers `POST /v1/cache/rebuild` (state checks, fit-check, reply);
this module executes the rebuild it accepted over the pools, knowing nothing of requests, HTTP
or documents. Two modes, so benchmarks compare them on one engine:

- `incremental`: free-first and chunked, content-keeping. Shrinking pools move their live
  content into kept chunks and release chunks one at a time; growing pools then add chunks one
  at a time, so the scheduler decodes between operations. An OOM rolls every pool back to the
  start geometry.
- `freetoken`: what ft serve 0.1.2 does, as one blocking step: MoE then KV then mamba, each pool
  dropped whole and reallocated, contents lost. An OOM rolls back and replies `rejected`; an
  OOM in the KV or mamba step leaves the rollback broken and latches `failed`, as FreeToken
  #526 describes.

Each scheduler round runs a slice of operations, at least one. While requests run or wait the
slice is the pause budget: one operation a round would stretch an N-chunk rebuild over N decode
rounds and queue requests behind it, while a pause of a few ms a round costs decode little.
With no request running or waiting, nothing waits for the rebuild to step aside: it runs to its
end, yielding to the event loop every `_IDLE_SLICE_S` only so that HTTP handlers stay
responsive. Every operation is recorded as a `ChunkPause`; a round with requests running is
recorded as a `RebuildPause`, since theirs is the decode that waited.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from engine.ftserve.geometry import Geometry
from engine.ftserve.planner import POOL_ORDER, pool_size
from engine.reference.pools import ChunkEvent, ExpertSlotPool, PagedKVPool, StatePool

__all__ = ["ChunkPause", "Pool", "RebuildEnd", "RebuildJob", "RebuildMode", "RebuildPause",
           "RebuildRunner"]

RebuildMode = Literal["incremental", "freetoken"]
Pool = ExpertSlotPool | PagedKVPool | StatePool
Reply = tuple[int, dict[str, Any]]

# Idle rebuilds yield to the event loop after this much work: long enough that yielding costs
# nothing measurable, short enough that /v1/cache/status or a new request is answered without
# a delay a human or the daemon's status poll (0.5 s apart while a rebuild runs) would notice.
_IDLE_SLICE_S = 0.05


@dataclass(frozen=True, slots=True)
class ChunkPause:
    """One chunk operation of an incremental rebuild: how long it took."""

    pool: str
    op: str
    seconds: float


@dataclass(frozen=True, slots=True)
class RebuildPause:
    """One scheduler round's rebuild work while requests were running: how long their decode
    waited, for how many chunk operations, touching how many bytes (moved, allocated and
    freed, as the operations' `ChunkEvent.nbytes`)."""

    ops: int
    nbytes: int
    seconds: float


@dataclass(frozen=True, slots=True)
class RebuildEnd:
    """How a rebuild ended: the reply's status and error, its HTTP status, and whether the
    engine is latched `failed` until restart."""

    status: str
    error: str | None
    http_status: int
    latch: bool = False


@dataclass(slots=True)
class RebuildJob:
    """The rebuild in flight. Not frozen: a listener of `rebuild_started` may wrap `ops` to
    watch every operation (the transition bench does)."""

    request_id: str
    start: Geometry
    target: Geometry
    ops: Generator[ChunkEvent | None, None, None]
    done: asyncio.Future[Reply]
    started_s: float


class RebuildRunner:
    """The engine's one rebuild at a time, advanced a slice of operations per scheduler round.

    `live` reads the geometry the pools hold now; `on_end` is called once per job, after the
    runner has dropped it; `emit` tells listeners of every `chunk` and `rebuild_pause`.
    """

    def __init__(self, pools: Mapping[str, Pool], *, mode: RebuildMode, pause_budget_s: float,
                 live: Callable[[], Geometry], emit: Callable[[str, Any], None],
                 on_end: Callable[[RebuildJob, RebuildEnd], None]) -> None:
        self.pools = pools
        self.mode = mode
        self.pause_budget_s = pause_budget_s
        self.live = live
        self.emit = emit
        self.on_end = on_end
        self.job: RebuildJob | None = None
        self.chunk_pauses: collections.deque[ChunkPause] = collections.deque(maxlen=4096)
        self.rebuild_pauses: collections.deque[RebuildPause] = collections.deque(maxlen=4096)

    def begin(self, request_id: str, live: Geometry, target: Geometry,
              done: asyncio.Future[Reply], started_s: float) -> RebuildJob:
        ops = (_freetoken_ops(self.pools, live, target) if self.mode == "freetoken"
               else _incremental_ops(self.pools, live, target))
        self.job = RebuildJob(request_id, live, target, ops, done, started_s)
        return self.job

    def close(self) -> None:
        """Abandon the job in flight, if any: its caller gets a 503 `failed`."""
        job, self.job = self.job, None
        if job is None:
            return
        job.ops.close()  # the pool being resized settles (its `finally`)
        if not job.done.done():
            job.done.set_result((503, {"status": "failed", "request_id": job.request_id,
                                       "error": "engine closed during the rebuild"}))

    def advance(self, *, running: bool, waiting: bool) -> None:
        """Chunk operations for one scheduler round (see the module docstring)."""
        job = self.job
        assert job is not None
        if self.mode == "freetoken" and (running or waiting):
            return  # requests admitted before the flip are served first
        slice_s = self.pause_budget_s if running or waiting else _IDLE_SLICE_S
        began = time.perf_counter()
        ops = nbytes = 0
        while True:
            op_bytes = self._op(job)
            if op_bytes is None:
                break
            ops += 1
            nbytes += op_bytes
            if time.perf_counter() - began >= slice_s:
                break
        if running:
            pause = RebuildPause(ops, nbytes, time.perf_counter() - began)
            self.rebuild_pauses.append(pause)
            self.emit("rebuild_pause", pause)

    def _op(self, job: RebuildJob) -> int | None:
        """Run the job's next operation: its bytes, or None once the rebuild has ended
        (completed, rolled back or latched)."""
        began = time.perf_counter()
        try:
            event = next(job.ops)
        except StopIteration:
            self._end(job, RebuildEnd("ok", None, 200))
            return None
        except _RolledBack as exc:
            self._end(job, RebuildEnd("rejected", str(exc), 503))
            return None
        except _Latched as exc:
            self._end(job, RebuildEnd("failed", str(exc), 503, latch=True))
            return None
        except torch.OutOfMemoryError as exc:
            self._roll_back(job.start)
            self._end(job, RebuildEnd(
                "rejected",
                f"rebuild failed and was rolled back: OutOfMemoryError({str(exc)!r})", 503))
            return None
        if event is None:  # freetoken's one blocking step
            return 0
        pause = ChunkPause(event.pool, event.op, time.perf_counter() - began)
        self.chunk_pauses.append(pause)
        self.emit("chunk", pause)
        return event.nbytes

    def _end(self, job: RebuildJob, end: RebuildEnd) -> None:
        self.job = None
        self.on_end(job, end)

    def _roll_back(self, start: Geometry) -> None:
        """Incremental: every pool back to its size at the start, grown ones first."""
        live = self.live()
        grown = [p for p in self.pools if pool_size(live, p) > pool_size(start, p)]
        shrunk = [p for p in self.pools if pool_size(live, p) < pool_size(start, p)]
        for pool in grown + shrunk:
            for _ in self.pools[pool].resize_steps(pool_size(start, pool)):
                pass


def _incremental_ops(pools: Mapping[str, Pool], live: Geometry,
                     target: Geometry) -> Generator[ChunkEvent, None, None]:
    changed = [p for p in POOL_ORDER if pool_size(live, p) != pool_size(target, p)]
    shrinks = [p for p in changed if pool_size(target, p) < pool_size(live, p)]
    for pool in shrinks + [p for p in changed if p not in shrinks]:
        yield from pools[pool].resize_steps(pool_size(target, pool))


def _freetoken_ops(pools: Mapping[str, Pool], live: Geometry,
                   target: Geometry) -> Generator[None, None, None]:
    # One blocking call, as ft serve's scheduler runs it: nothing interleaves.
    touched: list[str] = []
    for pool in POOL_ORDER:
        if pool_size(live, pool) == pool_size(target, pool):
            continue
        touched.append(pool)
        try:
            pools[pool].reallocate(pool_size(target, pool))
        except torch.OutOfMemoryError as exc:
            oom = f"OutOfMemoryError({str(exc)!r})"
            if pool != "moe":
                # #526: KV and mamba pools read their shape from the buffer they nulled.
                raise _Latched(f"{oom}; rollback to the prior geometry also failed: "
                               "AttributeError(\"'NoneType' object has no attribute "
                               "'shape'\")") from exc
            for done in touched:
                pools[done].reallocate(pool_size(live, done))
            raise _RolledBack(f"rebuild failed and was rolled back: {oom}") from exc
    yield None


class _RolledBack(Exception):
    pass


class _Latched(Exception):
    pass
