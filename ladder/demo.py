"""`ladder demo`: the reference engine, the daemon with its gate, and a workload, in one run.

Everything is real: the engine's pools are torch tensors under a card-sized cap, the daemon
talks to it over loopback HTTP through the same client, planner and executor it uses against
ft serve, and the workload goes through the gate. The phases are short chat (the ladder
should sit on its lowest rung: most expert slots), one long request (the gate holds it while
the controller steps up), and short chat again (the controller steps back down after the
dwell). The summary says what happened in words, and the decode speed of each phase.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from ladder.sse import generated_text
from ladder.tokenizer_file import write_reference_tokenizer

__all__ = ["DemoResult", "demo_engine_config", "free_port", "plot", "random_words",
           "render_summary", "run_demo", "start_daemon"]


@dataclass
class PhaseStats:
    name: str
    started_s: float = 0.0
    ended_s: float = 0.0
    requests: int = 0
    refused: int = 0
    truncated: int = 0
    completion_tokens: int = 0
    decode_s: float = 0.0
    hits: int = 0
    misses: int = 0

    @property
    def decode_tps(self) -> float:
        return self.completion_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


@dataclass
class DemoResult:
    phases: list[PhaseStats]
    transitions: list[dict[str, Any]]
    timeline: list[tuple[float, int, int, int]] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def refused(self) -> int:
        return sum(p.refused for p in self.phases)

    @property
    def truncated(self) -> int:
        return sum(p.truncated for p in self.phases)

    def to_json(self) -> dict[str, Any]:
        return {
            "wall_s": round(self.wall_s, 2), "refused": self.refused,
            "truncated": self.truncated, "transitions": self.transitions,
            "phases": [{"name": p.name, "requests": p.requests, "refused": p.refused,
                        "truncated": p.truncated, "completion_tokens": p.completion_tokens,
                        "decode_tps": round(p.decode_tps, 1), "hit_rate": round(p.hit_rate, 3)}
                       for p in self.phases],
        }


def demo_engine_config() -> Any:
    """A card on which KV and expert slots really compete (CPU-sized).

    Expert slots of 512 KiB, KV of 8 KiB per token: 64 tokens cost one slot, as 135 do on
    Qwen3.8-Flash-Next. The budget holds the 64-slot floor beside ~6k KV tokens, or ~190
    slots beside the 512-token bottom rung.
    """
    from engine.reference.decoder import ModelSpec
    from engine.reference.runtime import EngineConfig

    spec = ModelSpec(num_layers=8, num_experts=64, top_k=4, hidden=128, expert_hidden=512,
                     head_dim=128, state_heads=1, page_size=16, routing_preset="A")
    mamba_bytes = 5 * spec.state_bytes
    budget = 72 * spec.expert_bytes + 6144 * spec.kv_bytes_per_token + mamba_bytes
    return EngineConfig(model=spec, cache_budget_bytes=budget,
                        device_memory_bytes=spec.dense_weight_bytes + budget + (4 << 20),
                        moe_cache_size=64, num_pages=6144 // 16, num_mamba_slots=4,
                        max_running_requests=2, max_seq_len=6144, rebuild_mode="incremental",
                        chunk_bytes=1 << 20, served_model_name="demo-moe")


def _daemon_config(engine_url: str, tokenizer_path: str, dwell_s: float) -> Any:
    from ladder.config import merge

    return merge({
        "servers": [{
            "name": "demo", "url": engine_url, "gate_listen": "127.0.0.1:0",
            "policy": "headroom", "tokenizer_path": tokenizer_path,
            "policy_options": {"margin": 0.1, "growth_tokens": 64, "dwell_s": dwell_s},
            "ladder": {"kv_floor_tokens": 512}}],
        "safeguards": {"cooldown_s": 1.0, "min_dwell_s": 2.0},
        "control": {"poll_s": 0.25, "apply_poll_s": 0.05, "busy_backoff_base_s": 0.1},
        "listen": {"port": 0}})


def random_words(count: int, rng: random.Random) -> str:
    """`count` words of the reference tokenizer's vocabulary, one token each."""
    return " ".join(f"w{rng.randrange(4000)}" for _ in range(count))


async def _request(session: aiohttp.ClientSession, gate: str, prompt: str, max_tokens: int,
                   phase: PhaseStats, seed: int) -> None:
    """One streamed completion through the gate, timed from its first token to its last."""
    phase.requests += 1
    async with session.post(f"{gate}/v1/completions", json={
            "prompt": prompt, "max_tokens": max_tokens, "stream": True, "seed": seed}) as resp:
        if resp.status != 200:
            phase.refused += 1
            return
        tokens, first = 0, None
        async for line in resp.content:
            if generated_text(line):
                tokens += 1
                first = first or time.perf_counter()
        if tokens < max_tokens:
            phase.truncated += 1
        if first is not None and tokens > 1:
            phase.completion_tokens += tokens - 1
            phase.decode_s += time.perf_counter() - first


async def run_demo(*, seed: int = 0, short_requests: int = 6, long_prompt_tokens: int = 4000,
                   dwell_s: float = 4.0, say: Callable[[str], None] = print) -> DemoResult:
    from engine.reference.runtime import ReferenceEngine
    from engine.reference.server import serving
    from ladder.daemon import build_daemon

    rng = random.Random(seed)
    started = time.perf_counter()
    engine = ReferenceEngine(demo_engine_config())
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(serving(engine))
        g = engine.geometry()
        say(f"reference engine up at {url}: a "
            f"{engine.memory_model.cache_budget_bytes / 2**20:.0f} MiB cache budget holding "
            f"{g.moe_cache_size} expert slots and {g.num_pages * 16} KV tokens")
        tokenizer = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "tokenizer.json"
        write_reference_tokenizer(tokenizer, engine.tokenizer.vocab_size)
        session = await stack.enter_async_context(
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)))
        daemon = build_daemon(_daemon_config(url, str(tokenizer), dwell_s), session)
        controller = daemon.controllers[0]
        daemon_task, gate = await start_daemon(daemon)
        result = DemoResult(phases=[], transitions=[])
        seen = 0

        def note_transitions() -> None:
            nonlocal seen
            for record in list(controller.transitions)[seen:]:
                rungs = controller.ladder.rungs if controller.ladder else ()
                to = rungs[record.to_rung] if record.to_rung < len(rungs) else None
                entry = {"t_s": round(record.started_s - started, 2),
                         "from_rung": record.from_rung, "to_rung": record.to_rung,
                         "kv_tokens": None if to is None else to.kv_tokens,
                         "expert_slots": None if to is None else to.geometry.moe_cache_size,
                         "reason": record.reason, "reached": record.reached,
                         "seconds": round(record.seconds, 3)}
                result.transitions.append(entry)
                say(f"  [{entry['t_s']:6.1f} s] rung {record.from_rung} -> {record.to_rung}"
                    f" ({entry['kv_tokens']} KV tokens, {entry['expert_slots']} expert "
                    f"slots) in {record.seconds * 1000:.0f} ms: {record.reason}")
            seen = len(controller.transitions)

        async def sample() -> None:
            while True:
                note_transitions()
                if controller.status is not None:
                    geo = controller.status.geometry
                    result.timeline.append((time.perf_counter() - started,
                                            controller.rung if controller.rung is not None
                                            else -1, geo.num_pages * 16,
                                            controller.live_kv_tokens))
                await asyncio.sleep(0.1)

        sampler = asyncio.create_task(sample())
        while controller.rung != 0:  # the daemon first settles on its lowest rung
            await controller.wait_changed(1.0)
        note_transitions()

        async def phase(name: str, jobs: list[tuple[str, int]]) -> None:
            stats = PhaseStats(name, started_s=time.perf_counter())
            hits0, misses0 = engine.experts.hits, engine.experts.misses
            say(f"phase '{name}': {len(jobs)} request(s)")
            queue = list(enumerate(jobs))

            async def worker() -> None:
                while queue:
                    n, (prompt, max_tokens) = queue.pop(0)
                    await _request(session, gate, prompt, max_tokens, stats, seed * 100 + n)

            await asyncio.gather(worker(), worker())
            stats.ended_s = time.perf_counter()
            stats.hits = engine.experts.hits - hits0
            stats.misses = engine.experts.misses - misses0
            result.phases.append(stats)
            say(f"  done: {stats.completion_tokens} tokens at {stats.decode_tps:.1f} tok/s, "
                f"expert hit rate {stats.hit_rate:.0%}, {stats.refused} refused, "
                f"{stats.truncated} truncated")

        def chat() -> list[tuple[str, int]]:
            return [(random_words(rng.randint(40, 300), rng), 48)
                    for _ in range(short_requests)]

        await phase("short chat", chat())
        await phase("long context", [(random_words(long_prompt_tokens, rng), 96)])
        await asyncio.sleep(dwell_s + 1.0)  # the daemon steps down after the dwell
        await phase("short chat again", chat())
        note_transitions()
        sampler.cancel()
        daemon.stop.set()
        await daemon_task
    result.wall_s = time.perf_counter() - started
    return result


async def start_daemon(daemon: Any) -> tuple[asyncio.Task[None], str]:
    """Run `daemon` (its gate listening on port 0) until it listens; its task and its gate's
    URL. The kernel picks the port as it binds: a port picked beforehand and bound later can
    be taken in between, by any loopback client's ephemeral port (a GPU run lost an arm so)."""
    ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(daemon.run(on_ready=lambda _d: ready.set_result(None)))
    await asyncio.wait({ready, task}, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        await task  # it ended before listening: raise its error
        raise RuntimeError("the daemon stopped before it listened")
    name = daemon.controllers[0].name
    return task, f"http://127.0.0.1:{daemon.listening[f'gate:{name}']}"


def free_port() -> int:
    """A loopback TCP port free now, for a listener that must be named before it binds."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def render_summary(result: DemoResult) -> str:
    lines = ["", "Summary", "  phase               requests  refused  truncated  decode tok/s"
             "  expert hit rate"]
    lines.extend(f"  {p.name:<18}  {p.requests:>8}  {p.refused:>7}  {p.truncated:>9}  "
                 f"{p.decode_tps:>12.1f}  {p.hit_rate:>15.0%}" for p in result.phases)
    lines.append("  rung changes:")
    lines.extend(f"    {t['t_s']:6.1f} s  rung {t['from_rung']} -> {t['to_rung']} "
                 f"({t['kv_tokens']} KV tokens, {t['expert_slots']} slots): {t['reason']}"
                 for t in result.transitions)
    served = sum(p.requests for p in result.phases) - result.refused
    lines.append(f"  {served} requests served, {result.refused} refused, {result.truncated} "
                 f"truncated, in {result.wall_s:.0f} s.")
    if result.phases and len(result.phases) >= 2:
        short, long_ = result.phases[0], result.phases[1]
        lines.append(
            f"  In words: short requests ran on the lowest rung, with the most expert slots "
            f"({short.hit_rate:.0%} of expert lookups hit the GPU cache); the long request was "
            f"held by the gate until the daemon had stepped up to a rung whose KV holds it "
            f"(hit rate {long_.hit_rate:.0%} there), and the daemon stepped back down once "
            "it had ended. No request was refused or cut short by a rung that was too small.")
    lines.append("  (CPU-only reference engine: speeds are this machine's, not a GPU's.)")
    return "\n".join(lines)


def plot(result: DemoResult, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [row[0] for row in result.timeline]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8, 5))
    top.step(t, [row[1] for row in result.timeline], where="post")
    top.set_ylabel("rung")
    bottom.step(t, [row[2] for row in result.timeline], where="post", label="KV capacity")
    bottom.plot(t, [row[3] for row in result.timeline], label="live context")
    bottom.set_ylabel("tokens")
    bottom.set_xlabel("seconds")
    bottom.legend()
    fig.suptitle("moe-ladder demo: rung and context over time")
    fig.tight_layout()
    fig.savefig(path)
