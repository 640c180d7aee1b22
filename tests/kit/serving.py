"""Reference engines served on free loopback ports, restartable: the rig of the fault tests.

Why one rig: the fault tests and the soak put the real daemon in front of a real engine over
loopback HTTP, behind `tests.kit.faults.FaultProxy`, and the proxy's `restart` fault needs the
upstream to restart for real: a new engine (a new `instance_id`) with another geometry, the old
one gone. Serving itself is the product's `engine.reference.server.serving`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from types import TracebackType

from engine.reference.runtime import EngineConfig, ReferenceEngine
from engine.reference.server import serving

__all__ = ["EngineFleet"]


class EngineFleet:
    """Engines of one config served one after another; `engines[-1]` is the live one.

    `restart` starts the next engine with another geometry that fits, as another serve script
    would: half the live engine's KV with its expert slots, then the base config again, in
    turn; then stops the previous one. Use as `async with EngineFleet(config) as fleet`.
    """

    def __init__(self, base: EngineConfig) -> None:
        self.base = base
        self.engines: list[ReferenceEngine] = []
        self._running: list[tuple[ReferenceEngine, contextlib.AsyncExitStack]] = []
        self._latched_when_stopped = 0

    async def start(self, config: EngineConfig | None = None) -> str:
        """Serve a new engine of `config` (default: the base); returns its URL."""
        engine = ReferenceEngine(config or self.base)
        stack = contextlib.AsyncExitStack()
        # A short shutdown: a test's hung request must not hold its teardown for a second.
        url = await stack.enter_async_context(serving(engine, shutdown_timeout_s=0.1))
        self.engines.append(engine)
        self._running.append((engine, stack))
        return url

    async def restart(self) -> str:
        g = self.engines[-1].geometry()
        config = self.base if len(self.engines) % 2 == 0 else dataclasses.replace(
            self.base, num_pages=max(1, g.num_pages // 2), moe_cache_size=g.moe_cache_size)
        url = await self.start(config)
        while len(self._running) > 1:
            await self._stop(0)
        return url

    def latched(self) -> int:
        """Engines that latched `failed`, stopped ones included."""
        return self._latched_when_stopped + sum(e.state == "failed" for e, _ in self._running)

    async def _stop(self, index: int) -> None:
        engine, stack = self._running.pop(index)
        # Stopping an engine overwrites its state; a latched one must still count.
        self._latched_when_stopped += engine.state == "failed"
        await stack.aclose()

    async def aclose(self) -> None:
        while self._running:
            await self._stop(-1)

    async def __aenter__(self) -> EngineFleet:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()
