"""Virtual time for a whole asyncio program: the loop's clock jumps to its next timer.

Why: the replay runs the real daemon (controller, executor, safeguards, gate, policies)
against a simulated server, and every one of them reads time from the event loop
(`asyncio.sleep`, `asyncio.timeout`, `loop.time()`) or from a `ladder.clock.Clock`. A loop
whose clock advances by exactly the wait it was asked to block for runs minutes of serving in
milliseconds and never sleeps, while every timer fires in the order and at the instant it
would have. Nothing in the program may wait on real I/O: there is none (the simulated server
answers in-process), and a loop with no timer left and nothing ready is a deadlock, which is
raised, not waited out.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["LoopClock", "VirtualTimeExceeded", "VirtualTimeLoop", "run_virtual"]

T = TypeVar("T")


class VirtualTimeExceeded(RuntimeError):
    """The program was still running when its virtual clock passed its limit: a livelock (a
    request waiting for pages no rung will give back, while the daemon polls forever)."""


class _JumpSelector(selectors.DefaultSelector):
    """The loop's selector: never blocks; a wait of `timeout` moves the clock by `timeout`."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            raise RuntimeError("virtual time: nothing is scheduled and nothing can wake the "
                               "loop (a deadlock)")
        assert self.loop is not None
        self.loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, start_s: float = 0.0, limit_s: float = float("inf")) -> None:
        selector = _JumpSelector()
        super().__init__(selector)
        selector.loop = self
        self._now_s = start_s
        self.limit_s = limit_s

    def time(self) -> float:
        return self._now_s

    def advance(self, seconds: float) -> None:
        self._now_s += max(0.0, seconds)
        if self._now_s > self.limit_s:
            self.limit_s = float("inf")  # once: the cleanup that follows may still run
            raise VirtualTimeExceeded(f"virtual time passed {self._now_s:.0f} s")


class LoopClock:
    """`ladder.clock.Clock` on the running loop's time (virtual under `VirtualTimeLoop`)."""

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


def run_virtual(main: Coroutine[Any, Any, T], *, limit_s: float = float("inf")) -> T:
    """`asyncio.run(main)` on a fresh `VirtualTimeLoop`, closed afterwards;
    `VirtualTimeExceeded` once its clock passes `limit_s`."""
    loop = VirtualTimeLoop(limit_s=limit_s)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
