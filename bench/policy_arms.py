"""The policy bench's arms, and one arm's replay of a trace on a fresh reference engine.

Arms, each on a fresh reference engine (same seed, same config) served on loopback, all fed
the same requests (the same prompts, so the same expert routing):

* `static-full`: no daemon, the top rung of the ladder (longest context, fewest expert slots).
* `static-short`: no daemon, the bottom rung; it refuses (HTTP error) or truncates
  (`completion_tokens < max_tokens`) whatever does not fit.
* `grow-only`: PR #300's ladder (linear, 32k-token steps from 64k; both scaled like the trace)
  with a policy (`GrowOnly`, below) that only ever steps up, run through the real daemon and
  gate.
* `headroom`, `throughput`: moe-ladder, the real daemon and gate with each built-in policy on
  the default geometric ladder (floor 4k, ratio sqrt(2), steps of at most 16k; both scaled like
  the trace).
* `pinned-0`: moe-ladder's `pinned` policy at the bottom rung (raised only when demand needs).
* `oracle`: no daemon; the offline optimum over rung schedules (`bench/schedule.py`, priced
  by `bench/oracle.py`), run after the other arms because it is priced with what they
  measured: the expert hit rate on each rung and the cost of a miss, and each step's cost.
  The schedule is planned on the trace's own send order and live set (taken from the
  `static-full` arm, which never holds a request). Before each request the bench sets, with
  `engine.rebuild`, the planned rung, raised to the lowest rung holding the request plus
  everything already running or waiting (never a refusal), and only then sends it; the next
  request waits only for that rebuild and for the engine to queue this one
  (`oracle_waits_for`), so the oracle serves the trace's schedule as the other arms do. The
  `oracle_plan` block of the JSON holds the prices, the schedule and its predicted cost.
* `freetoken-static-full`, `freetoken-grow-only`, `freetoken-headroom`: the same arms on an
  engine in `freetoken` mode, what a user beside the real `ft serve` gets: a rebuild only when
  no request is active (the daemon waits for that moment while the gate holds new requests),
  every pool touched reallocated whole, so the expert cache restarts cold. (The reference
  engine has no prefix cache, so the prefix-cache wipe ft serve adds is not modelled.)

Per request (`RequestRow`): client-side decode tokens/s (streamed, first to last token, as
FreeToken's `bench_decode_moe.py` computes it: (tokens - 1) / (t_last - t_first)), TTFT,
refused, truncated. Per arm (`ArmResult`): aggregate decode tokens/s = total (tokens - 1) /
total decode seconds, refused, truncated, transitions and seconds spent in them (the
controller's records for daemon arms, the engine's rebuilds for the oracle), expert hit rate
(deltas of the engine's expert pool counters), and a timeline of rung, KV and expert counters.

Replay is closed-loop per session, as bench/traces.py says: a session's first request is sent
at its `t_s`, each next one after the previous reply plus the session's gap; every time is
divided by `BenchOptions.compress` (default 20: a 15 s human gap becomes 0.75 s), and so are
the daemon's time constants (cooldown, dwell, the policies' windows), so the run is the real
schedule played fast. Chat requests are one-request sessions, i.e. open-loop arrivals.

Sizing. CPU (`--device cpu`, the default; CI smoke): `ladder.demo.demo_engine_config()`: 8
layers x 64 experts top-4, 512 KiB expert slots, 8 KiB of KV per token (64 tokens cost one
slot), a budget of 64 slots beside ~6.6k KV tokens or 165 slots beside 128 KV tokens. Traces are
divided by `--scale` (default 36) so the largest agentic request (200k context + up to 10k out)
fits the engine's 6,144-token context; 32k real tokens become 910 here, 14 slots, 2.7 % of the
512 experts, against Qwen3-Next's 455 slots of 24,576 (1.9 %): the same order of trade-off.

GPU (`--device cuda`): a 16 GB card (`device_memory_bytes` = 16 GiB, emulated by the engine's
filler), model 24 layers x 128 experts top-8 (routing preset A, Qwen3-30B-like), hidden 1024 x
expert_hidden 256 x 2 matrices x fp32 = 2 MiB per expert slot, so a miss is a 2 MiB pinned
host-to-device copy (as a 1.8-2.8 MB real expert costs over PCIe Gen5), KV 24 layers x 2 x 128
x fp32 = 24 KiB per token (Qwen3-Next bf16: 24.6 KB), so 32k tokens cost 384 slots
(Qwen3-Next: ~455); cache budget 5.5 GiB (the report's RTX 5080 had 4.8 GiB beside the real
weights): ~2,700 slots (88 % of the 3,072 experts) at the 4k rung, ~2,050 at 64k, ~400 at
200k, the 128-slot floor at ~224k tokens, which holds the largest agentic request. Traces run
at full size (`--scale 1`); the host expert bank is 6 GiB pinned, built once for all arms. A
miss's layer waits for its copy (`engine.reference.decoder`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from bench.probe import PROBE, PROBE_PROMPT_TOKENS, probe_demand_tokens
from bench.round_profile import RoundProfile, allocator_counters
from bench.seeds import FREETOKEN
from bench.traces import TraceRequest, agentic_session, handoff, mixed, scaled, short_chat
from engine.ftserve.budget import MemoryModel
from engine.ftserve.geometry import parse_cache_status
from engine.ftserve.planner import plan_transition
from ladder.config import merge
from ladder.daemon import build_daemon
from ladder.demo import demo_engine_config, random_words, start_daemon
from ladder.rungs import Ladder, LadderSpec, build_ladder
from ladder.sse import generated_text
from ladder.tokenizer_file import write_reference_tokenizer
from policies.api import Decision, LadderView, Observation
from policies.headroom import check_options

__all__ = ["ARMS", "DAEMON_ARMS", "DEFAULT_ARM", "MEASURED_WINDOW_S", "MOE_LADDER_ARMS",
           "TRACES", "ArmInterrupted", "ArmResult", "BenchOptions", "GrowOnly", "RequestRow",
           "Sender", "arm_start", "base_arm", "build_trace", "cpu_engine_config",
           "daemon_config", "drive_arm", "engine_mode", "gpu_engine_config", "per_request_tps",
           "progress_printer", "run_arm", "settle"]

# The oracle last: it is priced with what the arms before it measured.
ARMS = ("static-full", "static-short", "grow-only", "headroom", "throughput", "pinned-0",
        f"{FREETOKEN}static-full", f"{FREETOKEN}grow-only", f"{FREETOKEN}headroom",
        f"{FREETOKEN}pinned-0", "oracle")
DAEMON_ARMS = ("grow-only", "headroom", "throughput", "pinned-0")
MOE_LADDER_ARMS = ("headroom", "throughput")
# The arm of the daemon's default policy (`ladder run` without --policy; a test holds the two
# together): the seeds summary reports it under the `headroom_vs_*` keys.
DEFAULT_ARM = "pinned-0"
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
    return replace(demo_engine_config(), served_model_name="bench-moe-cpu")


ORACLE_WAITS = ("queue", "first-token")


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
    # The moe-ladder arms' largest ladder step, real tokens: the daemon's default
    # (ladder.rungs `kv_step_tokens`); a recorded run replays with the step it ran.
    kv_step_tokens: int = LadderSpec().kv_step_tokens
    # What the oracle's sender waits for before it prices the next request (`ORACLE_WAITS`):
    # "queue", the engine has the request on its books (waiting or admitted), so every arm
    # sends the same schedule; "first-token", as runs without `oracle_waits_for` in their meta
    # ran, which held the next arrival behind a slow admission (docs/results.md).
    oracle_waits_for: str = "queue"
    # Run the speed probe (bench/probe.py) before every arm and after the last.
    probe: bool = False

    def __post_init__(self) -> None:
        if self.oracle_waits_for not in ORACLE_WAITS:
            raise ValueError(f"oracle_waits_for must be one of {', '.join(ORACLE_WAITS)}, "
                             f"got {self.oracle_waits_for!r}")

    def seconds(self, real_s: float) -> float:
        """A time constant of the real schedule, played `compress` times faster."""
        return real_s / self.compress

    def tokens(self, real_tokens: int) -> int:
        return max(1, round(real_tokens / self.scale))


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


def per_request_tps(rates: Sequence[float | None]) -> dict[str, float | None]:
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
    # Where the decode time went (bench/round_profile.py) and the CUDA allocator's counters
    # over the trace; None where the engine does not report them (the replay's).
    profile: dict[str, Any] | None = None
    allocator: dict[str, int] | None = None

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
            **per_request_tps([r.decode_tps for r in served]),
            "ttft_median_s": round(statistics.median(ttfts), 4) if ttfts else None,
            "ttft_mean_s": round(statistics.fmean(ttfts), 4) if ttfts else None,
            "hit_rate": round(self.hits / lookups, 4) if lookups else None,
            "expert_hits": self.hits, "expert_misses": self.misses,
            "transitions": count, "transition_s": round(spent, 3),
            "bench_driven": self.bench_driven,
            "engine_rebuilds": self.engine_rebuilds,
            "engine_rebuild_s": round(self.engine_rebuild_s, 3),
            "wall_s": round(self.wall_s, 2),
            **({} if self.profile is None else {"engine_profile": self.profile}),
            **({} if self.allocator is None else {"allocator": self.allocator}),
        }


async def _stream(session: aiohttp.ClientSession, url: str, row: RequestRow, prompt: str,
                  seed: int, counters: Callable[[], tuple[int, int]],
                  first_token: asyncio.Event | None = None) -> None:
    """One streamed completion; fills `row`. `counters` reads the engine's expert (hits,
    misses). `first_token` is set at the first token or the end.

    Like the demo's requests (ladder/demo.py), plus TTFT, the error text and per-request rows.
    """
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
                        if first_token is not None:
                            first_token.set()
                    row.completion_tokens += 1
            if first is not None and last is not None:
                row.decode_s = last - first
                row.window_hits = at_last[0] - at_first[0]
                row.window_misses = at_last[1] - at_first[1]
    except aiohttp.ClientError as exc:
        row.status, row.error = 599, f"{type(exc).__name__}: {exc}"[:200]
    finally:
        if first_token is not None:
            first_token.set()


def _prompt(seed: int, index: int, tokens: int) -> str:
    """The same prompt for request `index` in every arm (so the same routing): `tokens` words,
    each one token of the reference tokenizer."""
    return random_words(tokens, random.Random(seed * 1_000_003 + index))


# ---- one arm --------------------------------------------------------------------------------


def _ladder_spec(arm: str, opts: BenchOptions) -> LadderSpec:
    if arm == "grow-only":
        return LadderSpec(kv_floor_tokens=opts.tokens(65_536), spacing="linear",
                          kv_step_tokens=opts.tokens(32_768))
    return LadderSpec(kv_floor_tokens=opts.tokens(4096),
                      kv_step_tokens=opts.tokens(opts.kv_step_tokens))


def _ladder_table(spec: LadderSpec) -> dict[str, Any]:
    return {"kv_floor_tokens": spec.kv_floor_tokens, "spacing": spec.spacing,
            "kv_step_tokens": spec.kv_step_tokens, "kv_step_ratio": spec.kv_step_ratio}


def _policy(arm: str, opts: BenchOptions) -> tuple[str, dict[str, Any]]:
    growth = opts.tokens(8192)
    if arm == "grow-only":
        return f"{GrowOnly.__module__}:GrowOnly", {"start_rung": 0}
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


def daemon_config(arm: str, url: str, gate_listen: str, tokenizer: str | None,
                  opts: BenchOptions) -> Any:
    """The arm's daemon: its policy and ladder, the docs' safeguards on the compressed clock."""
    policy, options = _policy(base_arm(arm), opts)
    s = opts.seconds
    server: dict[str, Any] = {"name": arm, "url": url, "gate_listen": gate_listen,
                              "policy": policy, "policy_options": options,
                              "ladder": _ladder_table(_ladder_spec(base_arm(arm), opts))}
    if tokenizer is not None:
        server["tokenizer_path"] = tokenizer
    return merge({
        "servers": [server],
        # The defaults of docs/config.md, on the compressed clock.
        "safeguards": {"cooldown_s": s(60.0), "min_dwell_s": s(120.0),
                       "max_transitions_per_hour": max(1, round(12 * opts.compress)),
                       "backoff_base_s": s(5.0), "backoff_max_s": s(300.0),
                       "breaker_open_s": s(600.0)},
        "control": {"poll_s": opts.poll_s, "apply_poll_s": 0.05, "busy_backoff_base_s": 0.1},
        "listen": {"port": 0}})


def _ladder_of(engine: Any, spec: LadderSpec) -> Ladder:
    status = parse_cache_status(engine.status_doc())
    return build_ladder(MemoryModel.from_status(status, reserve_bytes=spec.reserve_bytes),
                        status.geometry, spec)


async def _set_geometry(engine: Any, geometry: Any) -> None:
    """`engine.rebuild` to `geometry` through the planner's steps: one call on an incremental
    engine, which frees first; shrinks first on a freetoken one, whose single call can OOM."""
    status = parse_cache_status(engine.status_doc())
    plan = plan_transition(MemoryModel.from_status(status), status.geometry, geometry)
    if not plan.feasible:
        raise RuntimeError(f"no plan to {geometry.to_json()}: {plan.reason}")
    for step in plan.steps:
        code, body = await engine.rebuild(dict(step.body))
        if code != 200:
            raise RuntimeError(f"rebuild {dict(step.body)} failed: {code} {body}")


def progress_printer(opts: BenchOptions) -> Callable[[str], None]:
    """Where an arm's progress lines go: stderr, or nowhere when `opts.quiet`."""
    return (lambda _msg: None) if opts.quiet else (lambda msg: print(msg, file=sys.stderr))


# What sends one request of an arm and fills its row: (row, through the gate?, an event set
# at its first token or its end, for the oracle). The HTTP one streams over loopback; the
# replay's (bench/replay) answers from its simulated server.
Sender = Callable[[RequestRow, bool, "asyncio.Event | None"], Coroutine[Any, Any, None]]


async def run_arm(arm: str, trace: Sequence[TraceRequest], config: Any,
                  opts: BenchOptions, model: Any = None,
                  oracle_rungs: Sequence[int] | None = None) -> ArmResult:
    """One arm on a fresh engine (pools, scheduler, server; `model`'s weights when given):
    set its geometry or start its daemon, replay, measure. `oracle_rungs`: the oracle's
    planned rung for each request of `trace` (by index)."""
    from engine.reference.runtime import ReferenceEngine
    from engine.reference.server import serve

    engine = ReferenceEngine(replace(config, rebuild_mode=engine_mode(arm)), model=model)
    stop_engine = asyncio.Event()
    port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    engine_task = asyncio.create_task(serve(engine, port=0, stop=stop_engine,
                                            on_ready=port.set_result))
    url = f"http://127.0.0.1:{await port}"
    tmp = tempfile.TemporaryDirectory()
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            ladder, start = await arm_start(arm, engine, opts)
            daemon = daemon_task = controller = None
            target = url
            if base_arm(arm) in DAEMON_ARMS:
                tokenizer = Path(tmp.name) / "tokenizer.json"
                write_reference_tokenizer(tokenizer, engine.tokenizer.vocab_size)
                daemon = build_daemon(daemon_config(arm, url, "127.0.0.1:0", str(tokenizer),
                                                    opts), session)
                controller = daemon.controllers[0]
                daemon_task, target = await start_daemon(daemon)
                await settle(arm, controller, opts)

            def counters() -> tuple[int, int]:
                return engine.experts.hits, engine.experts.misses

            async def send(row: RequestRow, via_gate: bool,
                           first_token: asyncio.Event | None) -> None:
                prompt = _prompt(opts.seed, row.index, row.prompt_tokens)
                await _stream(session, target if via_gate else url, row, prompt, row.index,
                              counters, first_token)

            before = allocator_counters(engine.device)
            try:
                result = await drive_arm(arm, trace, opts, engine, ladder, start, controller,
                                         send, stop_engine, oracle_rungs)
                after = allocator_counters(engine.device)
                if before is not None and after is not None:
                    result.allocator = {k: after[k] - before[k] for k in after}
                return result
            finally:
                if daemon is not None and daemon_task is not None:
                    daemon.stop.set()
                    await daemon_task
    finally:
        tmp.cleanup()
        stop_engine.set()
        await engine_task


async def arm_start(arm: str, engine: Any, opts: BenchOptions) -> tuple[Ladder, Any]:
    """The arm's ladder on `engine`, and its starting rung, set through the planner."""
    spec = _ladder_spec(base_arm(arm), opts)
    ladder = _ladder_of(engine, spec)
    if arm == PROBE:
        start = ladder.rung_holding(probe_demand_tokens(opts.tokens(PROBE_PROMPT_TOKENS)))
        if start is None:
            raise RuntimeError(f"{PROBE}: no rung of the ladder holds its two requests")
    else:
        start = {"static-full": ladder.top}.get(base_arm(arm), ladder.rungs[0])
    await _set_geometry(engine, start.geometry)
    return ladder, start


async def settle(arm: str, controller: Any, opts: BenchOptions) -> None:
    """Until the daemon has observed, is not stepping, and is on the rung its policy wants
    when idle; then one more poll, so the gate has seen that rung."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + opts.settle_timeout_s
    while (controller.rung is None or controller.transition_running()
           or controller.last_decision is None
           or controller.last_decision.rung != controller.rung):
        if loop.time() > deadline:
            raise RuntimeError(f"{arm}: the daemon did not settle (rung "
                               f"{controller.rung}, {controller.last_error})")
        await controller.wait_changed(0.5)
    await asyncio.sleep(opts.poll_s)


async def drive_arm(arm: str, trace: Sequence[TraceRequest], opts: BenchOptions, engine: Any,
                    ladder: Ladder, start: Any, controller: Any, send: Sender,
                    stop_engine: asyncio.Event,
                    oracle_rungs: Sequence[int] | None = None) -> ArmResult:
    """Replay `trace` against a started arm and measure it: the part of an arm that the HTTP
    bench and the virtual-time replay share. `engine` is the reference engine or the replay's
    simulated one (geometry, pools' counters, waiting queue, `rebuild`, `listeners`); time is
    the running loop's."""
    say = progress_printer(opts)
    loop = asyncio.get_running_loop()
    result = ArmResult(arm, bench_driven=arm == "oracle")
    result.ladder = [r.to_json() for r in ladder.rungs]
    page = engine.shape.page_size
    rebuilds: list[float] = []

    on_books = asyncio.Event()  # set when the engine queues a request

    def on_event(event: str, payload: Any) -> None:
        if event == "rebuild_finished":
            rebuilds.append(float(payload[2]))
        elif event == "request_queued":
            on_books.set()

    engine.listeners.append(on_event)
    t0 = loop.time()
    profile = RoundProfile(t0)  # the engines' clocks are the loop's (monotonic)
    engine.listeners.append(profile)
    hits0, misses0 = engine.experts.hits, engine.experts.misses
    seen: set[tuple[float, int]] = {(r.started_s, r.to_rung)
                                    for r in (controller.transitions if controller else ())}
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
            result.timeline.append((round(loop.time() - t0, 3),
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
                f"{loop.time() - t0:.0f} s in, {len(result.rows)} of "
                f"{len(trace)} requests sent, {len(result.transitions)} transitions; "
                "the arm is not recorded")

    oracle_lock = asyncio.Lock()

    async def oracle_send(row: RequestRow) -> None:
        async with oracle_lock:
            queued = sum(w.need_pages for w in engine.waiting)
            need = math.ceil((row.prompt_tokens + row.max_tokens) / page)
            wanted = (engine.kv.used_pages + queued + need) * page
            holding = ladder.rung_holding(wanted) or ladder.top
            planned = 0 if oracle_rungs is None else oracle_rungs[row.index]
            rung = ladder.rungs[max(holding.index, planned)]
            await _set_geometry(engine, rung.geometry)
            row.rung = rung.index
            first_token = asyncio.Event()
            on_books.clear()  # only the oracle's sender sends, one request at a time
            row.sent_s = loop.time() - t0
            task = asyncio.create_task(send(row, False, first_token))
            # The next request is priced with this one on the engine's books; a refusal
            # before it got there ends the task.
            until = first_token if opts.oracle_waits_for == "first-token" else on_books
            waiter = asyncio.ensure_future(until.wait())
            await asyncio.wait((waiter, task), return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        await task

    async def send_row(row: RequestRow) -> None:
        if arm == "oracle":
            await oracle_send(row)
            return
        row.sent_s = loop.time() - t0
        row.rung = controller.rung if controller is not None else start.index
        await send(row, controller is not None, None)

    sessions: dict[str, list[tuple[int, TraceRequest]]] = {}
    for i, request in enumerate(trace):
        sessions.setdefault(request.session, []).append((i, request))

    async def replay(turns: list[tuple[int, TraceRequest]]) -> None:
        previous: TraceRequest | None = None
        for i, request in turns:
            if previous is None:
                delay = opts.seconds(request.t_s) - (loop.time() - t0)
            else:
                delay = opts.seconds(request.t_s - previous.t_s)
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop_engine.wait(), delay)
            check_not_stopped()
            row = RequestRow(i, request.session, request.kind, request.prompt_tokens,
                             request.max_tokens)
            result.rows.append(row)
            await send_row(row)
            previous = request

    try:
        await asyncio.gather(*(replay(turns) for turns in sessions.values()))
        check_not_stopped()
        result.wall_s = loop.time() - t0
        result.rows.sort(key=lambda r: r.index)
        result.hits = engine.experts.hits - hits0
        result.misses = engine.experts.misses - misses0
        result.engine_rebuilds = len(rebuilds)
        result.engine_rebuild_s = sum(rebuilds)
        result.profile = profile.summary()
        note_transitions()
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    agg = result.aggregate()
    say(f"  {arm:<13} {agg['decode_tps']:>8.1f} tok/s  hit {agg['hit_rate'] or 0:.0%}  "
        f"refused {agg['refused']}  truncated {agg['truncated']}  transitions "
        f"{agg['transitions']} ({agg['transition_s']:.2f} s)  wall {result.wall_s:.1f} s")
    return result
