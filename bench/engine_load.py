"""The reference engine under load while incremental rebuilds go back and forth.

Waves of 12 concurrent requests run while a second task flips the geometry between two rungs
(experts x2 with KV /2, and back) as fast as the engine completes the rebuilds. Each wave
stands for a minute of a busy server's traffic, so the default 30 waves are the "compressed
30 minutes" of issue 7. The same seeds run once without rebuilds; the outputs must be
identical, the accounting drift 0 bytes, and resident memory growth under 5 %.

    python bench/engine_load.py [--waves 30] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.output import report_json
from engine.reference.runtime import ReferenceEngine
from engine.reference.scenarios import report_config

PROMPTS = [[(7 * i + j) % 50 + 3 for j in range(5 + i % 7)] for i in range(12)]




def rss_bytes() -> int:
    # psutil may be absent; statm's second field is resident pages.
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def run_load(rounds: int, *, rebuild: bool, max_tokens: int = 24
                   ) -> tuple[list[list[int]], ReferenceEngine, int, list[int]]:
    """Outputs of `rounds` waves of concurrent requests; rebuilds between chunks if asked."""
    engine = ReferenceEngine(report_config("incremental"))
    await engine.start()
    g = engine.geometry()
    bodies = [{"moe_cache_size": 2 * g.moe_cache_size, "num_pages": g.num_pages // 2},
              {"moe_cache_size": g.moe_cache_size, "num_pages": g.num_pages}]
    outputs: list[list[int]] = []
    rebuilds = 0
    drift: list[int] = []
    stop = asyncio.Event()

    async def flip() -> None:
        nonlocal rebuilds
        i = 0
        while not stop.is_set():
            status, _ = await engine.rebuild(bodies[i % 2])
            if status == 200:
                rebuilds += 1
                i += 1
            drift.append(engine.memory.allocated_bytes - engine.storage_bytes())
            await asyncio.sleep(0.002)

    async def one(prompt: list[int], seed: int) -> list[int]:
        return [t async for t in engine.generate(prompt, max_tokens, seed=seed)]

    flipper = asyncio.ensure_future(flip()) if rebuild else None
    try:
        for wave in range(rounds):
            outputs += await asyncio.gather(*(one(p, seed=wave * 100 + i)
                                              for i, p in enumerate(PROMPTS)))
    finally:
        stop.set()
        if flipper is not None:
            await flipper
        await engine.close()
    return outputs, engine, rebuilds, drift



async def measure(waves: int) -> dict[str, object]:
    started = time.perf_counter()
    baseline, _, _, _ = await run_load(waves, rebuild=False)
    await run_load(1, rebuild=True)  # warm-up: allocator and caches settle first
    before = rss_bytes()
    outputs, engine, rebuilds, drift = await run_load(waves, rebuild=True)
    after = rss_bytes()
    return {
        "bench": "engine_load", "waves": waves, "requests": len(outputs),
        "rebuilds_during_load": rebuilds,
        "outputs_identical": outputs == baseline,
        "max_accounting_drift_bytes": max((abs(d) for d in drift), default=0),
        "final_accounting_drift_bytes": engine.memory.allocated_bytes - engine.storage_bytes(),
        "rss_before_bytes": before, "rss_after_bytes": after,
        "rss_growth": round(after / before - 1.0, 4),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waves", type=int, default=30)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    result = asyncio.run(measure(args.waves))
    report_json(result, args.out)
    ok = result["outputs_identical"] and result["max_accounting_drift_bytes"] == 0 and float(
        str(result["rss_growth"])) < 0.05
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
