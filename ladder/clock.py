"""Time as a dependency: the daemon asks a `Clock`, so tests run minutes of control in ms."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol

__all__ = ["Clock", "SystemClock", "VirtualClock"]


class Clock(Protocol):
    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class VirtualClock:
    """A virtual clock: time jumps to the next sleeper once every ready task has run.

    One wake-up chain runs at a time, so any number of tasks may sleep at once. "Idle"
    includes waiting on loopback I/O, so a sleeper may wake while a reply is in flight:
    virtual time can only run ahead, never stall. Minutes of control time run in ms.
    """

    def __init__(self, start_s: float = 0.0) -> None:
        self.now_s = start_s
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._ids = itertools.count()
        self._scheduled = False

    def monotonic(self) -> float:
        return self.now_s

    async def sleep(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._sleepers, (self.now_s + max(0.0, seconds), next(self._ids), future))
        self._kick(loop)
        await future

    def _kick(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._tick)

    def _tick(self) -> None:
        self._scheduled = False
        loop = asyncio.get_running_loop()
        if getattr(loop, "_ready", ()):
            self._kick(loop)  # let every ready task run before time moves
            return
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)
        if not self._sleepers:
            return
        due, _, future = heapq.heappop(self._sleepers)
        self.now_s = max(self.now_s, due)
        future.set_result(None)
        if self._sleepers:
            self._kick(loop)
