"""Time as a dependency: the daemon asks a `Clock`, so tests run minutes of control in ms."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol

__all__ = ["Clock", "FakeClock", "SystemClock"]


class Clock(Protocol):
    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A virtual clock: `sleep` parks until `advance` or auto-advance moves time past it.

    With `auto=True` time jumps to the next sleeper as soon as every task is waiting, so a
    control loop runs as fast as the CPU allows while its timing stays exactly as written.
    """

    def __init__(self, start_s: float = 0.0, *, auto: bool = True) -> None:
        self.now_s = start_s
        self.auto = auto
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._ids = itertools.count()

    def monotonic(self) -> float:
        return self.now_s

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now_s + max(0.0, seconds), next(self._ids), future))
        if self.auto:
            asyncio.get_running_loop().call_soon(self._maybe_advance)
        await future

    def _maybe_advance(self) -> None:
        # Let every ready task run first: advance only once the loop would otherwise idle.
        loop = asyncio.get_running_loop()
        ready = getattr(loop, "_ready", ())
        if ready:
            loop.call_soon(self._maybe_advance)
            return
        self._wake_next()

    def _wake_next(self) -> None:
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)
        if not self._sleepers:
            return
        due, _, future = heapq.heappop(self._sleepers)
        self.now_s = max(self.now_s, due)
        future.set_result(None)

    def advance(self, seconds: float) -> None:
        self.now_s += seconds
        while self._sleepers and self._sleepers[0][0] <= self.now_s:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)
