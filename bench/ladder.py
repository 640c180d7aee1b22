"""`bench/ladder`: replay request traces against the reference engine, one arm after another.

Arms, each on a fresh reference engine (same seed, same config) served on loopback, all fed
the same requests (the same prompts, so the same expert routing):

* `static-full`: no daemon, the top rung of the ladder (longest context, fewest expert slots).
* `static-short`: no daemon, the bottom rung; it refuses (HTTP error) or truncates
  (`completion_tokens < max_tokens`) whatever does not fit.
* `grow-only`: PR #300's ladder (linear, 32k-token steps from 64k; both scaled like the trace)
  with a policy (`GrowOnly`, below) that only ever steps up, run through the real daemon and
  gate.
* `headroom`, `throughput`: moe-ladder, the real daemon and gate with each built-in policy on
  the default geometric ladder (floor 4k, ratio sqrt(2), steps of at most 32k; both scaled like
  the trace).
* `pinned-0`: moe-ladder's `pinned` policy at the bottom rung (raised only when demand needs).
* `oracle`: no daemon; the offline optimum over rung schedules (`bench/schedule.py`, priced
  by `bench/oracle.py`), run after the other arms because it is priced with what they
  measured: the expert hit rate on each rung and the cost of a miss, and each step's cost.
  The schedule is planned on the trace's own send order and live set (taken from the
  `static-full` arm, which never holds a request). Before each request the bench sets, with
  `engine.rebuild`, the planned rung, raised to the lowest rung holding the request plus
  everything already running or waiting (never a refusal), and only then sends it. The
  `oracle_plan` block of the JSON holds the prices, the schedule and its predicted cost.
* `freetoken-static-full`, `freetoken-grow-only`, `freetoken-headroom`: the same arms on an
  engine in `freetoken` mode, what a user beside the real `ft serve` gets: a rebuild only when
  no request is active (the daemon waits for that moment while the gate holds new requests),
  every pool touched reallocated whole, so the expert cache restarts cold. (The reference
  engine has no prefix cache, so the prefix-cache wipe ft serve adds is not modelled.)

Per request: client-side decode tokens/s (streamed, first to last token, as FreeToken's
`bench_decode_moe.py` computes it: (tokens - 1) / (t_last - t_first)), TTFT, refused,
truncated. Per arm: aggregate decode tokens/s = total (tokens - 1) / total decode seconds,
refused, truncated, transitions and seconds spent in them (the controller's records for daemon
arms, the engine's rebuilds for the oracle), expert hit rate (deltas of the engine's expert
pool counters), and ratios against `static-full`, `grow-only` and `oracle`.

Replay is closed-loop per session, as bench/traces.py says: a session's first request is sent
at its `t_s`, each next one after the previous reply plus the session's gap; every time is
divided by `--compress` (default 20: a 15 s human gap becomes 0.75 s), and so are the daemon's
time constants (cooldown, dwell, the policies' windows), so the run is the real schedule played
fast. Chat requests are one-request sessions, i.e. open-loop arrivals.

Sizing. CPU (`--device cpu`, the default; CI smoke): `ladder.demo.demo_engine_config()`: 8
layers x 64 experts top-4, 512 KiB expert slots, 8 KiB of KV per token (64 tokens cost one
slot), a budget of 64 slots beside ~6.6k KV tokens or 165 slots beside 128 KV tokens. Traces are
divided by `--scale` (default 36) so the largest agentic request (200k context + up to 10k out)
fits the engine's 6,144-token context; 32k real tokens become 910 here, 14 slots, 2.7 % of the
512 experts, against Qwen3-Next's 455 slots of 24,576 (1.9 %): the same order of trade-off.

GPU (`--device cuda`, the H200): a 16 GB card (`device_memory_bytes` = 16 GiB, emulated by
the engine's filler), model 24 layers x 128 experts top-8 (routing preset A, Qwen3-30B-like),
hidden 1024 x expert_hidden 256 x 2 matrices x fp32 = 2 MiB per expert slot, so a miss is a
2 MiB pinned host-to-device copy (~41 us at ~51 GB/s, as a 1.8-2.8 MB real expert costs over
PCIe Gen5), KV 24 layers x 2 x 128 x fp32 = 24 KiB per token (Qwen3-Next bf16: 24.6 KB), so
32k tokens cost 384 slots (Qwen3-Next: ~455); cache budget 5.5 GiB (the report's RTX 5080 had
4.8 GiB beside the real weights): ~2,700 slots (88 % of the 3,072 experts) at the 4k rung,
~2,050 at 64k, ~400 at 200k, the 128-slot floor at ~224k tokens, which holds the largest
agentic request. Traces run at full size (`--scale 1`); the host expert bank is 6 GiB pinned,
built once for all arms. A miss's layer waits for its copy (`engine.reference.decoder`), and the run
reports what a miss cost in decode (`miss_cost`, a fit over the arms) beside one expert's
copy alone (`expert_copy_us`), and what the misses alone predict (`miss_model`: each miss at
one copy, the rest the same in every arm; its ratios set apart what a ladder gains from a
call's noise, and `no_miss_vs_grow_only` bounds any ladder over grow-only where misses are all
that rungs change, which small residuals confirm and large ones deny). A trace whose arms
outlast one 10-minute device call goes on in the next with `--resume`, which keeps the arms
already measured:

    python bench/ladder.py --device cuda --trace agentic --output-scale 8
        --out bench/results/ladder-h200-agentic.json (add --plot FILE.png for the plots)
    python bench/ladder.py --device cuda --trace agentic --output-scale 8
        --resume bench/results/ladder-h200-agentic.json

The targets (moe-ladder >= 1.3x static-full, >= 1.1x grow-only, >= 0.95x oracle, 0 refused
and 0 truncated) are checked in the JSON's `targets` block; they are meant for that run, not
for the CPU numbers.

Prints a table, writes one JSON object with `--out FILE`, and with `--plot FILE.png` (needs
matplotlib; optional) draws rung and live context over time for each arm and tokens/s per arm.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    # Run as `python bench/ladder.py`: bench/ is sys.path[0] and this file would shadow the
    # `ladder` package; put the repository root there instead.
    _HERE = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != _HERE]
    if str(_ROOT) not in sys.path:
        sys.path.insert(0, str(_ROOT))

import aiohttp  # noqa: E402

from bench.oracle import PRICED_ARMS, oracle_plan  # noqa: E402
from bench.seeds import FREETOKEN, render_summary, run_key, summarize, target_bounds  # noqa: E402
from bench.traces import (  # noqa: E402
    TraceRequest,
    agentic_session,
    handoff,
    mixed,
    scaled,
    short_chat,
)
from policies.api import Decision, LadderView, Observation  # noqa: E402
from policies.headroom import check_options  # noqa: E402

__all__ = ["ARMS", "ArmInterrupted", "BenchOptions", "GrowOnly", "build_trace",
           "gpu_engine_config", "main", "run_bench"]

SCHEMA = "moe-ladder.bench-ladder.v1"
# The oracle last: it is priced with what the arms before it measured.
ARMS = ("static-full", "static-short", "grow-only", "headroom", "throughput", "pinned-0",
        f"{FREETOKEN}static-full", f"{FREETOKEN}grow-only", f"{FREETOKEN}headroom", "oracle")
DAEMON_ARMS = ("grow-only", "headroom", "throughput", "pinned-0")
MOE_LADDER_ARMS = ("headroom", "throughput")
# The arm of the daemon's default policy (`ladder run` without --policy; a test holds the two
# together): the seeds summary reports it under the `headroom_vs_*` keys.
DEFAULT_ARM = "headroom"
TRACES = ("mixed", "agentic", "chat", "handoff")


def base_arm(arm: str) -> str:
    """The arm's policy and geometry, whatever engine mode it runs on."""
    return arm.removeprefix(FREETOKEN)


def engine_mode(arm: str) -> str:
    return "freetoken" if arm.startswith(FREETOKEN) else "incremental"
_SAMPLE_S = 0.1


class ArmInterrupted(RuntimeError):
    """A signal (a device call's time limit) stopped the engine before the arm's trace ended."""


class GrowOnly:
    """PR #300's policy: KV only grows (to the lowest rung holding live + pending demand),
    never steps down; starts at rung `start_rung` of its ladder (the 64k rung)."""

    name = "grow-only"

    def __init__(self, *, start_rung: int = 0, **unknown: Any) -> None:
        check_options(self.name, unknown, ("start_rung",))
        self.level = int(start_rung)

    def decide(self, observation: Observation, ladder: LadderView) -> Decision:
        if not ladder.rungs:
            raise ValueError("grow-only: the ladder has no rungs")
        demand = observation.demand_kv_tokens
        needed = ladder.lowest_holding(demand)
        self.level = min(max(self.level, needed), len(ladder.rungs) - 1)
        return Decision(self.level, f"grow-only: rung {self.level} "
                                    f"({ladder.rungs[self.level].kv_tokens:,} KV tokens) holds "
                                    f"{demand:,} live + pending; never steps down")


# ---- configuration --------------------------------------------------------------------------


def gpu_engine_config() -> Any:
    """The 16 GB-card engine of the module docstring (2 MiB experts, 24 KiB of KV a token)."""
    from engine.reference.decoder import ModelSpec
    from engine.reference.runtime import EngineConfig

    spec = ModelSpec(num_layers=24, num_experts=128, top_k=8, hidden=1024, expert_hidden=256,
                     head_dim=128, state_heads=1, page_size=16, routing_preset="A")
    assert spec.expert_bytes == 2 << 20
    assert spec.kv_bytes_per_token == 24 << 10
    return EngineConfig(model=spec, device="cuda", device_memory_bytes=16 << 30,
                        cache_budget_bytes=int(5.5 * (1 << 30)), moe_cache_size=128,
                        num_pages=4096 // 16, num_mamba_slots=4, max_running_requests=2,
                        max_seq_len=262_144, rebuild_mode="incremental", chunk_bytes=64 << 20,
                        served_model_name="bench-moe-16gb")


def cpu_engine_config() -> Any:
    from ladder.demo import demo_engine_config

    return replace(demo_engine_config(), served_model_name="bench-moe-cpu")


@dataclass(frozen=True)
class BenchOptions:
    device: str = "cpu"
    scale: float = 36.0
    compress: float = 20.0
    seed: int = 0
    arms: tuple[str, ...] = ARMS
    poll_s: float = 0.25
    # torch intra-op threads for the run (restored after); None leaves torch's default. On a
    # small shared CPU, 1: the engine's tensors are small, and with 2 threads an op waits for a
    # descheduled worker (a 512 KiB copy went from 16 us to 1.6 ms under load).
    threads: int | None = 1
    settle_timeout_s: float = 30.0
    quiet: bool = False

    def seconds(self, real_s: float) -> float:
        """A time constant of the real schedule, played `compress` times faster."""
        return real_s / self.compress

    def tokens(self, real_tokens: int) -> int:
        return max(1, round(real_tokens / self.scale))


SMOKE_REQUESTS = {"mixed": 20, "agentic": 10, "chat": 16, "handoff": 16}
FULL_REQUESTS = {"mixed": 40, "agentic": 24, "chat": 40, "handoff": 40}


def build_trace(kind: str, n: int, *, seed: int = 0, scale: float = 1.0,
                output_scale: float = 1.0) -> list[TraceRequest]:
    """The seeded trace of bench/traces.py, `n` requests, token counts divided by `scale`,
    and `max_tokens` by `output_scale` on top (shorter runs; contexts, the KV side of the
    trade-off, keep their size)."""
    if kind == "agentic":
        trace = agentic_session(seed, n)
    elif kind == "chat":
        trace = short_chat(seed, n)
    elif kind == "mixed":
        trace = mixed(seed, n)
    elif kind == "handoff":
        trace = handoff(seed, n)
    else:
        raise ValueError(f"unknown trace {kind!r}: {', '.join(TRACES)}")
    trace = scaled(trace, scale) if scale != 1.0 else trace
    if output_scale != 1.0:
        trace = [replace(r, max_tokens=max(2, round(r.max_tokens / output_scale)))
                 for r in trace]
    return trace


# ---- measurement ----------------------------------------------------------------------------

# A decode window shorter than this is one network read that carried several tokens, not
# decode: a decode round of the reference engine takes several milliseconds on either device.
# Such a request has no per-request rate (its tokens still count in the aggregate).
MEASURED_WINDOW_S = 1e-3


def _request_tps(decode_tokens: int, decode_s: float) -> float | None:
    return decode_tokens / decode_s if decode_s >= MEASURED_WINDOW_S else None


def _per_request_tps(rates: Sequence[float | None]) -> dict[str, float | None]:
    measured = [t for t in rates if t is not None]
    return {"per_request_tps_median": round(statistics.median(measured), 2) if measured else None,
            "per_request_tps_mean": round(statistics.fmean(measured), 2) if measured else None}


@dataclass
class RequestRow:
    index: int
    session: str
    kind: str
    prompt_tokens: int
    max_tokens: int
    sent_s: float = 0.0
    status: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None
    decode_s: float = 0.0
    rung: int | None = None
    error: str | None = None
    # The engine's expert-pool counters over the decode window as the client saw it, first
    # token to last (shared with any request decoding beside it; empty when the client read
    # every token at once).
    window_hits: int = 0
    window_misses: int = 0

    @property
    def refused(self) -> bool:
        return self.status != 200

    @property
    def truncated(self) -> bool:
        return self.status == 200 and self.completion_tokens < self.max_tokens

    @property
    def decode_tokens(self) -> int:
        return max(0, self.completion_tokens - 1)

    @property
    def decode_tps(self) -> float | None:
        return _request_tps(self.decode_tokens, self.decode_s)

    def to_json(self) -> dict[str, Any]:
        tps = self.decode_tps
        lookups = self.window_hits + self.window_misses
        return {**{k: v for k, v in asdict(self).items() if k not in ("decode_s",)},
                "window_hit_rate": round(self.window_hits / lookups, 4) if lookups else None,
                "sent_s": round(self.sent_s, 3), "decode_s": round(self.decode_s, 4),
                "ttft_s": None if self.ttft_s is None else round(self.ttft_s, 4),
                "decode_tps": None if tps is None else round(tps, 2),
                "refused": self.refused, "truncated": self.truncated}


@dataclass
class ArmResult:
    name: str
    rows: list[RequestRow] = field(default_factory=list)
    hits: int = 0
    misses: int = 0
    transitions: list[dict[str, Any]] = field(default_factory=list)
    engine_rebuilds: int = 0
    engine_rebuild_s: float = 0.0
    # The engine's rebuilds were sent by the bench itself (the oracle), not by a daemon.
    bench_driven: bool = False
    # (seconds, rung or -1, KV capacity, live KV tokens, expert hits, expert misses): the
    # counters let the oracle price each rung by the hit rate measured on it.
    timeline: list[tuple[float, int, int, int, int, int]] = field(default_factory=list)
    ladder: list[dict[str, int]] = field(default_factory=list)
    wall_s: float = 0.0

    def aggregate(self) -> dict[str, Any]:
        served = [r for r in self.rows if not r.refused]
        tokens = sum(r.decode_tokens for r in served)
        seconds = sum(r.decode_s for r in served)
        ttfts = [r.ttft_s for r in served if r.ttft_s is not None]
        lookups = self.hits + self.misses
        if self.bench_driven:
            count, spent = self.engine_rebuilds, self.engine_rebuild_s
        else:
            count = len(self.transitions)
            spent = sum(t["seconds"] for t in self.transitions)
        return {
            "requests": len(self.rows), "served": len(served),
            "refused": sum(r.refused for r in self.rows),
            "truncated": sum(r.truncated for r in self.rows),
            "completion_tokens": sum(r.completion_tokens for r in served),
            "decode_tokens": tokens, "decode_s": round(seconds, 3),
            "decode_tps": round(tokens / seconds, 2) if seconds > 0 else 0.0,
            **_per_request_tps([r.decode_tps for r in served]),
            "ttft_median_s": round(statistics.median(ttfts), 4) if ttfts else None,
            "ttft_mean_s": round(statistics.fmean(ttfts), 4) if ttfts else None,
            "hit_rate": round(self.hits / lookups, 4) if lookups else None,
            "expert_hits": self.hits, "expert_misses": self.misses,
            "transitions": count, "transition_s": round(spent, 3),
            "bench_driven": self.bench_driven,
            "engine_rebuilds": self.engine_rebuilds,
            "engine_rebuild_s": round(self.engine_rebuild_s, 3),
            "wall_s": round(self.wall_s, 2),
        }


async def _stream(session: aiohttp.ClientSession, url: str, row: RequestRow, prompt: str,
                  seed: int, counters: Callable[[], tuple[int, int]],
                  admitted: asyncio.Event | None = None) -> None:
    """One streamed completion; fills `row`. `counters` reads the engine's expert (hits,
    misses). `admitted` is set at the first token or the end.

    Like ladder.demo's `_request`, plus TTFT, the error text and per-request rows.
    """
    from ladder.sse import generated_text

    started = time.perf_counter()
    try:
        async with session.post(f"{url}/v1/completions", json={
                "prompt": prompt, "max_tokens": row.max_tokens, "stream": True,
                "seed": seed}) as resp:
            row.status = resp.status
            if resp.status != 200:
                row.error = (await resp.text())[:200]
                return
            first = last = None
            at_first = at_last = (0, 0)
            async for line in resp.content:
                if generated_text(line):
                    last, at_last = time.perf_counter(), counters()
                    if first is None:
                        first, at_first = last, at_last
                        row.ttft_s = first - started
                        if admitted is not None:
                            admitted.set()
                    row.completion_tokens += 1
            if first is not None and last is not None:
                row.decode_s = last - first
                row.window_hits = at_last[0] - at_first[0]
                row.window_misses = at_last[1] - at_first[1]
    except aiohttp.ClientError as exc:
        row.status, row.error = 599, f"{type(exc).__name__}: {exc}"[:200]
    finally:
        if admitted is not None:
            admitted.set()


def _prompt(seed: int, index: int, tokens: int) -> str:
    """The same prompt for request `index` in every arm (so the same routing): `tokens` words,
    each one token of the reference tokenizer."""
    from ladder.demo import _words

    return _words(tokens, random.Random(seed * 1_000_003 + index))


# ---- one arm --------------------------------------------------------------------------------


def _ladder_spec(arm: str, opts: BenchOptions) -> Any:
    from ladder.rungs import LadderSpec

    if arm == "grow-only":
        return LadderSpec(kv_floor_tokens=opts.tokens(65_536), spacing="linear",
                          kv_step_tokens=opts.tokens(32_768))
    return LadderSpec(kv_floor_tokens=opts.tokens(4096), kv_step_tokens=opts.tokens(32_768))


def _ladder_table(spec: Any) -> dict[str, Any]:
    return {"kv_floor_tokens": spec.kv_floor_tokens, "spacing": spec.spacing,
            "kv_step_tokens": spec.kv_step_tokens, "kv_step_ratio": spec.kv_step_ratio}


def _policy(arm: str, opts: BenchOptions) -> tuple[str, dict[str, Any]]:
    growth = opts.tokens(8192)
    if arm == "grow-only":
        return f"{__name__}:GrowOnly", {"start_rung": 0}
    if arm == "headroom":
        # module:attr works whether or not the package's entry points are installed.
        return "policies.headroom:Headroom", {"growth_tokens": growth,
                                              "dwell_s": opts.seconds(300.0)}
    if arm == "throughput":
        return "policies.throughput:Throughput", {
            "growth_tokens": growth, "min_measured_s": opts.seconds(30.0),
            "max_stay_s": opts.seconds(900.0)}
    if arm == "pinned-0":
        return "policies.pinned:Pinned", {"rung": 0}
    raise ValueError(f"{arm} runs without a daemon")


def _daemon_config(arm: str, url: str, gate_port: int, tokenizer: str,
                   opts: BenchOptions) -> Any:
    from ladder.config import merge

    policy, options = _policy(base_arm(arm), opts)
    s = opts.seconds
    return merge({
        "servers": [{"name": arm, "url": url, "gate_listen": f"127.0.0.1:{gate_port}",
                     "policy": policy, "policy_options": options, "tokenizer_path": tokenizer,
                     "ladder": _ladder_table(_ladder_spec(base_arm(arm), opts))}],
        # The defaults of docs/config.md, on the compressed clock.
        "safeguards": {"cooldown_s": s(60.0), "min_dwell_s": s(120.0),
                       "max_transitions_per_hour": max(1, round(12 * opts.compress)),
                       "backoff_base_s": s(5.0), "backoff_max_s": s(300.0),
                       "breaker_open_s": s(600.0)},
        "control": {"poll_s": opts.poll_s, "apply_poll_s": 0.05, "busy_backoff_base_s": 0.1},
        "listen": {"port": 0}})


def _ladder_of(engine: Any, spec: Any) -> Any:
    from engine.ftserve.budget import MemoryModel
    from engine.ftserve.geometry import parse_cache_status
    from ladder.rungs import build_ladder

    status = parse_cache_status(engine.status_doc())
    return build_ladder(MemoryModel.from_status(status, reserve_bytes=spec.reserve_bytes),
                        status.geometry, spec)


async def _set_geometry(engine: Any, geometry: Any) -> None:
    """`engine.rebuild` to `geometry` through the planner's steps: one call on an incremental
    engine, which frees first; shrinks first on a freetoken one, whose single call can OOM."""
    from engine.ftserve.budget import MemoryModel
    from engine.ftserve.geometry import parse_cache_status
    from engine.ftserve.planner import plan_transition

    status = parse_cache_status(engine.status_doc())
    plan = plan_transition(MemoryModel.from_status(status), status.geometry, geometry)
    if not plan.feasible:
        raise RuntimeError(f"no plan to {geometry.to_json()}: {plan.reason}")
    for step in plan.steps:
        code, body = await engine.rebuild(dict(step.body))
        if code != 200:
            raise RuntimeError(f"rebuild {dict(step.body)} failed: {code} {body}")


def _say(opts: BenchOptions) -> Callable[[str], None]:
    return (lambda _msg: None) if opts.quiet else (lambda msg: print(msg, file=sys.stderr))


async def run_arm(arm: str, trace: Sequence[TraceRequest], config: Any,
                  opts: BenchOptions, model: Any = None,
                  oracle_rungs: Sequence[int] | None = None) -> ArmResult:
    """One arm on a fresh engine (pools, scheduler, server; `model`'s weights when given):
    set its geometry or start its daemon, replay, measure. `oracle_rungs`: the oracle's
    planned rung for each request of `trace` (by index)."""
    from engine.reference.runtime import ReferenceEngine
    from engine.reference.server import serve
    from ladder.daemon import build_daemon
    from ladder.demo import _free_port

    say = _say(opts)
    result = ArmResult(arm, bench_driven=arm == "oracle")
    policy_arm = base_arm(arm)
    engine = ReferenceEngine(replace(config, rebuild_mode=engine_mode(arm)), model=model)
    stop_engine = asyncio.Event()
    port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    engine_task = asyncio.create_task(serve(engine, port=0, stop=stop_engine,
                                            on_ready=port.set_result))
    url = f"http://127.0.0.1:{await port}"
    page = engine.shape.page_size
    spec = _ladder_spec(policy_arm, opts)
    ladder = _ladder_of(engine, spec)
    result.ladder = [r.to_json() for r in ladder.rungs]
    start = {"static-full": ladder.top, "static-short": ladder.rungs[0]}.get(policy_arm,
                                                                              ladder.rungs[0])
    await _set_geometry(engine, start.geometry)

    rebuilds: list[float] = []

    def on_event(event: str, payload: Any) -> None:
        if event == "rebuild_finished":
            rebuilds.append(float(payload[2]))

    engine.listeners.append(on_event)
    daemon = daemon_task = controller = None
    tmp = tempfile.TemporaryDirectory()
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            target = url
            if policy_arm in DAEMON_ARMS:
                tokenizer = Path(tmp.name) / "tokenizer.json"
                tokenizer.write_text(json.dumps({"kind": "moe-ladder-reference",
                                                 "vocab_size": engine.tokenizer.vocab_size}))
                gate_port = _free_port()
                daemon = build_daemon(_daemon_config(arm, url, gate_port, str(tokenizer), opts),
                                      session)
                controller = daemon.controllers[0]
                daemon_task = asyncio.create_task(daemon.run())
                target = f"http://127.0.0.1:{gate_port}"
                deadline = time.perf_counter() + opts.settle_timeout_s
                # Settled: observed, not stepping, and on the rung its policy wants when idle.
                while (controller.rung is None or controller.transition_running()
                       or controller.last_decision is None
                       or controller.last_decision.rung != controller.rung):
                    if time.perf_counter() > deadline:
                        raise RuntimeError(f"{arm}: the daemon did not settle (rung "
                                           f"{controller.rung}, {controller.last_error})")
                    await controller.wait_changed(0.5)
                await asyncio.sleep(opts.poll_s)  # the gate has seen the settled rung
            rebuilds.clear()
            hits0, misses0 = engine.experts.hits, engine.experts.misses
            seen: set[tuple[float, int]] = {(r.started_s, r.to_rung)
                                            for r in (controller.transitions if controller
                                                      else ())}
            t0 = time.perf_counter()
            t0_mono = controller.clock.monotonic() if controller is not None else 0.0

            def note_transitions() -> None:
                if controller is None:
                    return
                for record in list(controller.transitions):
                    key = (record.started_s, record.to_rung)
                    if key in seen:
                        continue
                    seen.add(key)
                    rungs = controller.ladder.rungs if controller.ladder else ()
                    to = rungs[record.to_rung] if record.to_rung < len(rungs) else None
                    result.transitions.append({
                        "t_s": round(record.started_s - t0_mono, 3),
                        "from_rung": record.from_rung, "to_rung": record.to_rung,
                        "kv_tokens": None if to is None else to.kv_tokens,
                        "expert_slots": None if to is None else to.geometry.moe_cache_size,
                        "reached": record.reached, "seconds": round(record.seconds, 4),
                        "reason": record.reason})

            async def sample() -> None:
                while True:
                    note_transitions()
                    g = engine.geometry()
                    rung = ladder.index_of(g)
                    result.timeline.append((round(time.perf_counter() - t0, 3),
                                            -1 if rung is None else rung, g.num_pages * page,
                                            engine.kv.used_pages * page, engine.experts.hits,
                                            engine.experts.misses))
                    await asyncio.sleep(_SAMPLE_S)

            sampler = asyncio.create_task(sample())

            def check_not_stopped() -> None:
                # serve() sets stop_engine on SIGTERM/SIGINT (a device call's time limit):
                # what follows would be refusals the arm did not make. How far it got says
                # whether the cut arm was slow or stuck.
                if stop_engine.is_set():
                    note_transitions()
                    raise ArmInterrupted(
                        f"{arm}: the engine was stopped by a signal mid-trace, "
                        f"{time.perf_counter() - t0:.0f} s in, {len(result.rows)} of "
                        f"{len(trace)} requests sent, {len(result.transitions)} transitions; "
                        "the arm is not recorded")

            def counters() -> tuple[int, int]:
                return engine.experts.hits, engine.experts.misses

            oracle_lock = asyncio.Lock()

            async def oracle_send(row: RequestRow, prompt: str) -> None:
                async with oracle_lock:
                    queued = sum(w.need_pages for w in engine.waiting)
                    need = math.ceil((row.prompt_tokens + row.max_tokens) / page)
                    wanted = (engine.kv.used_pages + queued + need) * page
                    holding = ladder.rung_holding(wanted) or ladder.top
                    planned = 0 if oracle_rungs is None else oracle_rungs[row.index]
                    rung = ladder.rungs[max(holding.index, planned)]
                    await _set_geometry(engine, rung.geometry)
                    row.rung = rung.index
                    admitted = asyncio.Event()
                    row.sent_s = time.perf_counter() - t0
                    task = asyncio.create_task(_stream(session, url, row, prompt, row.index,
                                                       counters, admitted))
                    await admitted.wait()
                await task

            async def send(row: RequestRow) -> None:
                prompt = _prompt(opts.seed, row.index, row.prompt_tokens)
                if arm == "oracle":
                    await oracle_send(row, prompt)
                    return
                row.sent_s = time.perf_counter() - t0
                row.rung = controller.rung if controller is not None else start.index
                await _stream(session, target, row, prompt, row.index, counters)

            sessions: dict[str, list[tuple[int, TraceRequest]]] = {}
            for i, request in enumerate(trace):
                sessions.setdefault(request.session, []).append((i, request))

            async def replay(turns: list[tuple[int, TraceRequest]]) -> None:
                previous: TraceRequest | None = None
                for i, request in turns:
                    if previous is None:
                        delay = opts.seconds(request.t_s) - (time.perf_counter() - t0)
                    else:
                        delay = opts.seconds(request.t_s - previous.t_s)
                    if delay > 0:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop_engine.wait(), delay)
                    check_not_stopped()
                    row = RequestRow(i, request.session, request.kind, request.prompt_tokens,
                                     request.max_tokens)
                    result.rows.append(row)
                    await send(row)
                    previous = request

            await asyncio.gather(*(replay(turns) for turns in sessions.values()))
            check_not_stopped()
            result.wall_s = time.perf_counter() - t0
            result.rows.sort(key=lambda r: r.index)
            result.hits = engine.experts.hits - hits0
            result.misses = engine.experts.misses - misses0
            result.engine_rebuilds = len(rebuilds)
            result.engine_rebuild_s = sum(rebuilds)
            note_transitions()
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            if daemon is not None and daemon_task is not None:
                daemon.stop.set()
                await daemon_task
    finally:
        tmp.cleanup()
        stop_engine.set()
        await engine_task
    agg = result.aggregate()
    say(f"  {arm:<13} {agg['decode_tps']:>8.1f} tok/s  hit {agg['hit_rate'] or 0:.0%}  "
        f"refused {agg['refused']}  truncated {agg['truncated']}  transitions "
        f"{agg['transitions']} ({agg['transition_s']:.2f} s)  wall {result.wall_s:.1f} s")
    return result


# ---- a whole run ----------------------------------------------------------------------------


def _ratios(arms: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    def ratio(a: str, b: str) -> float | None:
        if a not in arms or b not in arms or not arms[b]["decode_tps"]:
            return None
        return round(arms[a]["decode_tps"] / arms[b]["decode_tps"], 3)

    return {a: {"vs_static_full": ratio(a, "static-full"), "vs_grow_only": ratio(a, "grow-only"),
                "vs_oracle": ratio(a, "oracle")} for a in arms}


def _targets(trace_kind: str, arms: dict[str, dict[str, Any]],
             ratios: dict[str, dict[str, float | None]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in (*MOE_LADDER_ARMS, f"{FREETOKEN}headroom"):
        if a not in arms:
            continue
        verdict: dict[str, bool | None] = {
            f"{key}>={bound:g}": None if ratios[a][key] is None else ratios[a][key] >= bound
            for key, bound in target_bounds(trace_kind, a).items()}
        verdict["refused==0"] = arms[a]["refused"] == 0
        verdict["truncated==0"] = arms[a]["truncated"] == 0
        out[a] = verdict
    return out


async def run_bench(trace_kind: str, trace: Sequence[TraceRequest], opts: BenchOptions,
                    on_arm: Callable[[dict[str, Any]], None] | None = None,
                    previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every arm of `opts.arms` on `trace` (already scaled): the run's JSON object.

    `on_arm` gets the object so far after each arm, so a run cut short keeps what it measured.
    `previous` is an earlier run's object for the same trace: its arms are kept, not run again,
    and the ratios are taken over the union.
    """
    if previous is not None and previous["requests"] != len(trace):
        raise ValueError(f"bench/ladder: the run to resume has {previous['requests']} "
                         f"{trace_kind} requests, this trace {len(trace)}")
    config = gpu_engine_config() if opts.device.startswith("cuda") else cpu_engine_config()
    if opts.device.startswith("cuda"):
        config = replace(config, device=opts.device)
    import torch

    threads_before = torch.get_num_threads()
    if opts.threads is not None:
        torch.set_num_threads(opts.threads)
    try:
        return await _run_arms(trace_kind, trace, opts, config, on_arm, previous)
    finally:
        torch.set_num_threads(threads_before)


async def _run_arms(trace_kind: str, trace: Sequence[TraceRequest], opts: BenchOptions,
                    config: Any, on_arm: Callable[[dict[str, Any]], None] | None,
                    previous: dict[str, Any] | None) -> dict[str, Any]:
    import torch

    from engine.reference.decoder import TinyMoE

    say = _say(opts)
    say(f"trace {trace_kind}: {len(trace)} requests, scale 1/{opts.scale:g}, time 1/"
        f"{opts.compress:g}, device {opts.device}")
    # One model for every arm: the same weights, and the host expert bank (6 GiB pinned on
    # the GPU config) is built once, not once an arm.
    model = TinyMoE(config.model, torch.device(config.device))
    copy_us = _expert_copy_us(model)
    results: dict[str, ArmResult] = {}
    plan = (previous or {}).get("oracle_plan")
    run = _run_doc(trace_kind, opts.seed, trace, results, previous, copy_us, plan)
    # The oracle last, whatever order --arms gave: it is priced with the others' measurements.
    for arm in sorted(opts.arms, key=lambda a: a == "oracle"):
        if arm in run["arms"]:
            continue
        if arm == "oracle":
            plan = _oracle_plan(trace, run, config.model, copy_us)
        results[arm] = await run_arm(arm, trace, config, opts, model,
                                     plan["rungs"] if arm == "oracle" and plan else None)
        gc.collect()  # the arm's engine and pools go before the next one is built
        if opts.device.startswith("cuda"):
            torch.cuda.empty_cache()
        run = _run_doc(trace_kind, opts.seed, trace, results, previous, copy_us, plan)
        if on_arm is not None:
            on_arm(run)
    return run


def _oracle_plan(trace: Sequence[TraceRequest], run: dict[str, Any], model: Any,
                 copy_us: float) -> dict[str, Any] | None:
    """The oracle's schedule (bench/oracle.py), or None when no arm on the default ladder has
    run yet to price it (then the oracle takes the lowest rung holding each request)."""
    ladder = next((run["ladders"][a] for a in PRICED_ARMS if a in run["ladders"]), None)
    if ladder is None:
        return None
    return oracle_plan([(r.prompt_tokens, r.max_tokens) for r in trace], run, ladder,
                       page_size=model.page_size,
                       lookups_per_token=model.num_layers * model.top_k,
                       expert_copy_us=copy_us)


def _expert_copy_us(model: Any) -> float:
    """Median microseconds of one expert's host-to-device copy and the wait for it: what a
    miss costs at the least, to set beside the fitted cost (`miss_cost`)."""
    import torch

    source = model.host_bank[0, 0]
    target = torch.empty_like(source, device=model.device)
    cuda = model.device.type == "cuda"
    samples = []
    for _ in range(40):
        started = time.perf_counter()
        target.copy_(source, non_blocking=cuda)
        if cuda:
            torch.cuda.current_stream(model.device).synchronize()
        samples.append(time.perf_counter() - started)
    return round(statistics.median(samples[8:]) * 1e6, 1)


def _miss_cost(arms: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """What a miss costs in decode: the least-squares line of seconds per token against
    misses per token over the arms that served the whole trace (the same tokens over the same
    contexts, so the misses are what differs). None when fewer than two distinct points."""
    points = [(a["expert_misses"] / a["decode_tokens"], a["decode_s"] / a["decode_tokens"])
              for a in _full_arms(arms).values()]
    if len({round(x, 6) for x, _ in points}) < 2:
        return None
    slope, intercept = statistics.linear_regression([x for x, _ in points],
                                                    [y for _, y in points])
    return {"us_per_miss": round(slope * 1e6, 1),
            "ms_per_token_without_misses": round(intercept * 1e3, 2), "arms": len(points)}


_PER_ARM = ("arms", "ladders", "transitions", "per_request", "timeline")


def _run_doc(trace_kind: str, seed: int, trace: Sequence[TraceRequest],
             results: dict[str, ArmResult],
             previous: dict[str, Any] | None, expert_copy_us: float,
             oracle_block: dict[str, Any] | None) -> dict[str, Any]:
    new = {
        "arms": {a: r.aggregate() for a, r in results.items()},
        "ladders": {a: r.ladder for a, r in results.items()},
        "transitions": {a: r.transitions for a, r in results.items() if r.transitions},
        "per_request": {a: [row.to_json() for row in r.rows] for a, r in results.items()},
        "timeline": {a: r.timeline for a, r in results.items()},
    }
    merged = {k: {**(previous or {}).get(k, {}), **new[k]} for k in _PER_ARM}
    largest = max((r.prompt_tokens + r.max_tokens for r in trace), default=0)
    return {
        "trace": trace_kind,
        "seed": seed,
        "requests": len(trace),
        "largest_request_tokens": largest,
        "arms": merged["arms"],
        **_derived(trace_kind, merged["arms"], merged["per_request"], expert_copy_us),
        "expert_copy_us": expert_copy_us,
        "oracle_plan": oracle_block,
        **{k: merged[k] for k in _PER_ARM if k != "arms"},
    }


def _full_arms(arms: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The arms that served the whole trace: the same tokens over the same contexts."""
    return {a: v for a, v in arms.items()
            if v["refused"] == 0 and v["truncated"] == 0 and v["decode_tokens"] > 0}


def _miss_model(arms: dict[str, dict[str, Any]],
                expert_copy_us: float | None) -> dict[str, Any] | None:
    """What the expert misses alone predict, to tell a ladder's gain from call noise.

    Each miss costs one expert's measured copy (`expert_copy_us`, not the fit, which noise
    moves); everything else costs the same per token in every arm that served the whole
    trace (their mean). On that model: each arm's tokens/s and ratios; its residual
    (measured / modelled decode seconds - 1: noise, plus any cost other than misses, e.g.
    another request's prefill inside a decode window); and `no_miss_vs_grow_only`, the
    ratio a run without a single miss would have over grow-only: the ceiling of any ladder
    against it if misses are all that the rung changes (residuals far from 0 say they are
    not)."""
    full = _full_arms(arms)
    if not full or expert_copy_us is None:
        return None
    miss_s = {a: v["expert_misses"] * expert_copy_us * 1e-6 for a, v in full.items()}
    base_s = statistics.fmean((v["decode_s"] - miss_s[a]) / v["decode_tokens"]
                              for a, v in full.items())
    modelled_s = {a: v["decode_tokens"] * base_s + miss_s[a] for a, v in full.items()}
    tps = {a: {"decode_tps": round(v["decode_tokens"] / modelled_s[a], 2)}
           for a, v in full.items()}
    ceiling = None
    if "grow-only" in full:
        ceiling = round(modelled_s["grow-only"] / (full["grow-only"]["decode_tokens"] * base_s),
                        3)
    return {"us_per_miss": expert_copy_us, "ms_per_token_without_misses": round(base_s * 1e3, 2),
            "arms": {a: t["decode_tps"] for a, t in tps.items()}, "ratios": _ratios(tps),
            "residual": {a: round(full[a]["decode_s"] / modelled_s[a] - 1, 3) for a in full},
            "no_miss_vs_grow_only": ceiling}


def _derived(trace_kind: str, arms: dict[str, dict[str, Any]],
             per_request: dict[str, list[dict[str, Any]]],
             expert_copy_us: float | None) -> dict[str, Any]:
    """What a run's figures follow from its per-arm measurements (written, and re-derived by
    `--report`)."""
    ratios = _ratios(arms)
    return {"ratios": ratios, "targets": _targets(trace_kind, arms, ratios),
            "miss_cost": _miss_cost(arms),
            "miss_model": _miss_model(arms, expert_copy_us), "common": _common(per_request)}


def _common(per_request: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """Each arm's aggregate decode tokens/s over the requests every arm served, and the
    ratios: the like-for-like comparison when an arm refused some (static-short, which refuses
    by design, is left out)."""
    compared = [a for a in per_request if a != "static-short"]
    if not compared:
        return None
    served = set.intersection(*({row["index"] for row in per_request[a] if not row["refused"]}
                                for a in compared))
    tps: dict[str, dict[str, Any]] = {}
    for a in compared:
        rows = [row for row in per_request[a] if row["index"] in served]
        tokens = sum(max(0, row["completion_tokens"] - 1) for row in rows)
        seconds = sum(row["decode_s"] for row in rows)
        tps[a] = {"decode_tps": round(tokens / seconds, 2) if seconds > 0 else 0.0}
    return {"requests": len(served), "arms": {a: t["decode_tps"] for a, t in tps.items()},
            "ratios": _ratios(tps)}


def _meta(opts: BenchOptions) -> dict[str, Any]:
    config = gpu_engine_config() if opts.device.startswith("cuda") else cpu_engine_config()
    m = config.model
    import torch

    return {
        "schema": SCHEMA, "device": opts.device, "torch": torch.__version__,
        "platform": platform.platform(), "python": platform.python_version(),
        "cpu_note": None if opts.device.startswith("cuda") else (
            "CPU run of the scaled-down engine: speeds are this machine's, not a GPU's; the "
            "GPU targets do not apply"),
        "scale": opts.scale, "compress": opts.compress, "seed": opts.seed,
        "threads": opts.threads,
        "arms": list(opts.arms),
        "engine": {"num_layers": m.num_layers, "num_experts": m.num_experts, "top_k": m.top_k,
                   "hidden": m.hidden, "expert_hidden": m.expert_hidden,
                   "expert_bytes": m.expert_bytes, "kv_bytes_per_token": m.kv_bytes_per_token,
                   "routing_preset": m.routing_preset,
                   "device_memory_bytes": config.device_memory_bytes,
                   "cache_budget_bytes": config.cache_budget_bytes,
                   "max_seq_len": config.max_seq_len,
                   "max_running_requests": config.max_running_requests,
                   "rebuild_mode": config.rebuild_mode},
    }


_SAME_RUN = ("schema", "device", "scale", "compress", "seed", "output_scale", "engine")


def _resumable(path: str, meta: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The runs of an earlier JSON, and its calls' metadata, when it measured the same thing
    (device, scales, seed, engine) as `meta` describes; else ValueError saying what differs."""
    doc = json.loads(Path(path).read_text())
    earlier = doc["meta"]
    differ = [k for k in _SAME_RUN if earlier.get(k) != meta.get(k)]
    if differ:
        raise ValueError("it measured another setup (" + ", ".join(
            f"{k} {earlier.get(k)!r} here {meta.get(k)!r}" for k in differ) + ")")
    calls = earlier.pop("previous_calls", [])
    return doc["runs"], [*calls, earlier]


def _write_doc(path: str, doc: dict[str, Any]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def _report(path: str, out: str | None, plot_path: str | None) -> int:
    try:
        doc = json.loads(Path(path).read_text())
        for run in doc["runs"].values():
            _rerate_requests(run)
            run.update(_derived(run["trace"], run["arms"], run["per_request"],
                                run.get("expert_copy_us")))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"bench/ladder: cannot report {path}: {exc}", file=sys.stderr)
        return 2
    for run in doc["runs"].values():
        print(render_table(run))
    if "traces" in doc:
        doc["traces"] = summarize(doc["runs"], doc["meta"].get("default_arm", DEFAULT_ARM))
        print(render_summary(doc["traces"]))
    if out:
        _write_doc(out, doc)
    if plot_path and not plot(doc, plot_path):
        print("bench/ladder: matplotlib is not installed; no plot", file=sys.stderr)
    return 0


def _rerate_requests(run: dict[str, Any]) -> None:
    """Each arm's per-request summary again, without the rates of windows shorter than
    MEASURED_WINDOW_S (files written before that rule rated one network read as decode). A
    row keeps its rate otherwise: it was taken from the unrounded window."""
    for arm, rows in run["per_request"].items():
        for row in rows:
            if row["decode_s"] < MEASURED_WINDOW_S:
                row["decode_tps"] = None
        run["arms"][arm].update(_per_request_tps([row["decode_tps"] for row in rows]))


def _ratio_cells(r: dict[str, float | None]) -> str:
    return " ".join(f"{'-' if v is None else f'{v:.2f}':>6}"
                    for v in (r["vs_static_full"], r["vs_grow_only"], r["vs_oracle"]))


def render_table(run: dict[str, Any]) -> str:
    lines = [f"trace {run['trace']} ({run['requests']} requests)",
             f"  {'arm':<13} {'tok/s':>8} {'xfull':>6} {'xgrow':>6} {'xorac':>6} {'refused':>7} "
             f"{'trunc':>5} {'trans':>5} {'trans_s':>7} {'hit':>5} {'ttft_p50':>8}"]
    for arm, a in run["arms"].items():
        ttft = "-" if a["ttft_median_s"] is None else f"{a['ttft_median_s']:.3f}"
        hit = "-" if a["hit_rate"] is None else f"{a['hit_rate']:.0%}"
        lines.append(f"  {arm:<13} {a['decode_tps']:>8.1f} {_ratio_cells(run['ratios'][arm])} "
                     f"{a['refused']:>7} {a['truncated']:>5} {a['transitions']:>5} "
                     f"{a['transition_s']:>7.2f} {hit:>5} {ttft:>8}")
    common = run.get("common")
    if common is not None and common["requests"] < run["requests"]:
        lines.append(f"  like for like, the {common['requests']} requests every arm but "
                     f"static-short served:")
        for arm, tps in common["arms"].items():
            r = common["ratios"][arm]
            lines.append(f"  {arm:<13} {tps:>8.1f} {_ratio_cells(r)}")
    if (cost := run.get("miss_cost")) is not None:
        lines.append(f"  a miss costs {cost['us_per_miss']:.1f} us of decode (fit over "
                     f"{cost['arms']} arms); one expert's copy alone "
                     f"{run['expert_copy_us']:.1f} us")
    if (model := run.get("miss_model")) is not None:
        lines.append(f"  misses alone (each {model['us_per_miss']:.1f} us, the rest "
                     f"{model['ms_per_token_without_misses']:.2f} ms a token): "
                     "tok/s xfull xgrow xorac residual")
        for arm, tps in model["arms"].items():
            r = model["ratios"][arm]
            lines.append(f"  {arm:<13} {tps:>8.1f} {_ratio_cells(r)} "
                         f"{model['residual'][arm]:>+8.1%}")
        if model["no_miss_vs_grow_only"] is not None:
            lines.append(f"  no miss at all would be {model['no_miss_vs_grow_only']:.2f}x "
                         "grow-only: any ladder's ceiling, if misses are all a rung changes")
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: str) -> bool:
    """Rung and live context over time per arm, and tokens/s per arm; False without
    matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = list(doc["runs"].values())
    arms = list(runs[0]["arms"]) if runs else []
    fig, axes = plt.subplots(len(arms) + 1, len(runs), figsize=(6 * len(runs),
                                                                 2.0 * (len(arms) + 1)),
                             squeeze=False)
    for col, run in enumerate(runs):
        for row, arm in enumerate(arms):
            ax = axes[row][col]
            timeline = run["timeline"].get(arm, [])
            t = [s[0] for s in timeline]
            ax.step(t, [s[2] for s in timeline], where="post", label="KV capacity")
            ax.plot(t, [s[3] for s in timeline], label="live context")
            ax.set_ylabel("tokens")
            ax.set_title(f"{run['trace']}: {arm}", fontsize=9)
            twin = ax.twinx()
            twin.step(t, [s[1] for s in timeline], where="post", color="tab:gray",
                      alpha=0.5, linestyle=":")
            twin.set_ylabel("rung", fontsize=8)
            if row == 0:
                ax.legend(fontsize=7, loc="upper left")
        ax = axes[len(arms)][col]
        names = list(run["arms"])
        ax.bar(names, [run["arms"][a]["decode_tps"] for a in names])
        ax.set_ylabel("decode tok/s")
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
        ax.set_title(f"{run['trace']}: aggregate decode tokens/s", fontsize=9)
    fig.suptitle(f"bench/ladder on {doc['meta']['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default="mixed",
                        help="mixed, agentic, chat, handoff, a comma list, or all (default "
                             "mixed)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    parser.add_argument("--smoke", action="store_true", help="few requests (CI)")
    parser.add_argument("--requests", type=int, default=None, help="requests per trace")
    parser.add_argument("--scale", type=float, default=None,
                        help="divide token counts by this (default 36 on cpu, 1 on cuda)")
    parser.add_argument("--output-scale", type=float, default=1.0,
                        help="divide max_tokens by this too (GPU runs: 8 keeps a trace under "
                             "10 minutes; contexts keep their size)")
    parser.add_argument("--compress", type=float, default=20.0,
                        help="divide trace times and daemon time constants by this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", default=None, metavar="LIST",
                        help="a comma list of seeds: every trace on each, runs kept as "
                             "runs['TRACE/seedN'], and a `traces` block with each arm's "
                             "tokens/s per seed, median and spread (instead of --seed)")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma list of arms")
    parser.add_argument("--out", default=None,
                        help="write the JSON here (default with --resume: that file)")
    parser.add_argument("--resume", default=None, metavar="JSON",
                        help="a JSON this bench wrote: keep its arms, run only the --arms it "
                             "lacks, write the union (a trace longer than one 10-minute "
                             "device call goes on in the next)")
    parser.add_argument("--plot", default=None, help="write a PNG here (needs matplotlib)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default 1 on cpu, torch's own on cuda)")
    parser.add_argument("--report", default=None, metavar="JSON",
                        help="run nothing: re-derive a written JSON's ratios and targets, print "
                             "its tables (and --plot, --out)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.report:
        return _report(args.report, args.out, args.plot)
    from ladder.logs import configure

    configure("text", "warning")  # the daemons' warnings with their fields (the error text)
    kinds = list(TRACES) if args.trace == "all" else args.trace.split(",")
    arms = tuple(a.strip() for a in args.arms.split(",") if a.strip())
    for bad in [k for k in kinds if k not in TRACES] + [
            a for a in arms if a not in ARMS]:
        print(f"bench/ladder: unknown trace or arm {bad!r}", file=sys.stderr)
        return 2
    try:
        seeds = None if args.seeds is None else [int(x) for x in args.seeds.split(",") if x]
    except ValueError:
        print(f"bench/ladder: --seeds wants a comma list of integers, got {args.seeds!r}",
              file=sys.stderr)
        return 2
    if seeds is not None and not seeds:
        print("bench/ladder: --seeds names no seed", file=sys.stderr)
        return 2
    cuda = args.device.startswith("cuda")
    scale = args.scale if args.scale is not None else (1.0 if cuda else 36.0)
    opts = BenchOptions(device=args.device, scale=scale, compress=args.compress,
                        seed=args.seed, arms=arms, quiet=args.quiet,
                        threads=args.threads if args.threads is not None else (
                            None if cuda else 1))
    meta = {**_meta(opts), "output_scale": args.output_scale}
    if seeds is not None:
        meta.update(seed=None, seeds=seeds, default_arm=DEFAULT_ARM)
    doc: dict[str, Any] = {"meta": meta, "runs": {}}
    previous_runs: dict[str, Any] = {}
    if args.resume:
        try:
            previous_runs, doc["meta"]["previous_calls"] = _resumable(args.resume, doc["meta"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"bench/ladder: cannot resume {args.resume}: {exc}", file=sys.stderr)
            return 2
        args.out = args.out or args.resume
        doc["runs"].update(previous_runs)  # runs this call does not redo stay in the file
    started = time.perf_counter()

    def write(key: str | None = None, run: dict[str, Any] | None = None) -> None:
        if key is not None:
            doc["runs"][key] = run
        if seeds is not None:
            doc["traces"] = summarize(doc["runs"], DEFAULT_ARM)
        doc["meta"]["wall_s"] = round(time.perf_counter() - started, 1)
        if args.out:
            _write_doc(args.out, doc)

    try:
        for seed in seeds or [args.seed]:
            for kind in kinds:
                key = kind if seeds is None else run_key(kind, seed)
                n = args.requests or (SMOKE_REQUESTS if args.smoke else FULL_REQUESTS)[kind]
                trace = build_trace(kind, n, seed=seed, scale=scale,
                                    output_scale=args.output_scale)
                run = asyncio.run(run_bench(
                    kind, trace, replace(opts, seed=seed),
                    on_arm=lambda partial, key=key: write(key, partial),
                    previous=previous_runs.get(key)))
                write(key, run)
                print(render_table(run))
        if seeds is not None:
            print(render_summary(doc["traces"]))
    except ArmInterrupted as exc:
        write()
        print(f"bench/ladder: {exc}", file=sys.stderr)
        return 3
    write()
    if opts.device == "cpu":
        print("(CPU numbers of the scaled-down engine: not a GPU's; targets are for the H200.)")
    if args.plot and not plot(doc, args.plot):
        print("bench/ladder: matplotlib is not installed; no plot", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
