"""Virtual time: timers fire in order at their instant, no wall time passes, and a program
that can never wake (or never ends) is an error, not a hang."""

from __future__ import annotations

import asyncio
import time

import pytest

from bench.replay.vloop import LoopClock, VirtualTimeExceeded, run_virtual


def test_an_hour_of_sleeps_runs_at_once_in_order() -> None:
    fired: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        fired.append((name, asyncio.get_running_loop().time()))

    async def main() -> float:
        clock = LoopClock()
        await asyncio.gather(sleeper("late", 3600.0), sleeper("early", 0.25),
                             sleeper("mid", 60.0))
        await clock.sleep(-5)  # a negative wait is no wait
        return clock.monotonic()

    started = time.perf_counter()
    assert run_virtual(main()) == pytest.approx(3600.0)
    assert time.perf_counter() - started < 5.0
    assert fired == [("early", 0.25), ("mid", 60.0), ("late", 3600.0)]


def test_timeouts_fire_in_virtual_time() -> None:
    async def main() -> float:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(30.0):
                await asyncio.sleep(1e6)
        return asyncio.get_running_loop().time()

    assert run_virtual(main()) == pytest.approx(30.0)


def test_a_deadlock_raises() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(RuntimeError, match="deadlock"):
        run_virtual(main())


def test_a_livelock_passes_the_limit_and_raises() -> None:
    async def poll_forever() -> None:
        while True:
            await asyncio.sleep(1.0)

    with pytest.raises(VirtualTimeExceeded, match="virtual time passed"):
        run_virtual(poll_forever(), limit_s=100.0)
