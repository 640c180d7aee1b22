"""The policy bench: replay request traces against every arm, and compare decode speed.

Why: a ladder is worth its transitions only if it decodes faster than the static geometries
it replaces and than PR #300's grow-only ladder, and refuses nothing. This script replays the
seeded traces of bench/traces.py against each arm of bench/policy_arms.py (static geometries,
grow-only, each built-in policy through the real daemon and gate, the same on a
`freetoken`-mode engine, and an offline oracle), one fresh reference engine an arm, and derives
the ratios, the targets and the miss model with bench/policy_report.py.

On the GPU (`--probe`, the default there) the speed probe of bench/probe.py runs before every
arm and after the last, into the run's `probes`: the call's own speed on fixed work, which
`python -m bench.replay compare` prices the arms at, and what the host and the card did
meanwhile (bench/host_state.py).

A trace whose arms outlast one 10-minute device call goes on in the next with `--resume`,
which keeps the arms already measured; `--seeds` runs every trace on several seeds and sums
them up per trace (bench/seeds.py); `--report FILE` re-derives a written JSON's figures and
runs nothing:

    python bench/policy_bench.py --device cuda --trace agentic --output-scale 8
        --out bench/results/ladder-h200-agentic.json (add --plot FILE.png for the plots)
    python bench/policy_bench.py --device cuda --trace agentic --output-scale 8
        --resume bench/results/ladder-h200-agentic.json
    python bench/policy_bench.py --report bench/results/h200/ladder-agentic.json

Prints a table (with, on the reference engine, where each arm's decode time went:
bench/round_profile.py), writes one JSON object with `--out FILE`, and with `--plot FILE.png` (needs
matplotlib; optional) draws rung and live context over time for each arm and tokens/s per arm.
The figures of the recorded runs are in README.md ("Results": ladder against static
geometries) and bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/policy_bench.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.host_state import host_during, take_sample
from bench.oracle import PRICED_ARMS, oracle_plan
from bench.output import report_json
from bench.policy_arms import (
    ARMS,
    DEFAULT_ARM,
    TRACES,
    ArmInterrupted,
    ArmResult,
    BenchOptions,
    build_trace,
    cpu_engine_config,
    gpu_engine_config,
    progress_printer,
    run_arm,
)
from bench.policy_report import derived, plot, render_table, rerate_requests
from bench.probe import PROBE, PROBE_PROMPT_TOKENS, probe_trace
from bench.seeds import render_summary, run_key, summarize
from bench.traces import TraceRequest
from ladder.units import format_count, parse_count

__all__ = ["SCHEMA", "main", "oracle_plan_for", "run_bench", "run_doc"]

# The name of bench/policy_bench.py's first form, kept: `--resume` refuses another schema, and
# the recorded runs in bench/results carry this one.
SCHEMA = "moe-ladder.bench-ladder.v1"
SMOKE_REQUESTS = {"mixed": 20, "agentic": 10, "chat": 16, "handoff": 16}
FULL_REQUESTS = {"mixed": 40, "agentic": 24, "chat": 40, "handoff": 40}


async def run_bench(trace_kind: str, trace: Sequence[TraceRequest], opts: BenchOptions,
                    on_arm: Callable[[dict[str, Any]], None] | None = None,
                    previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every arm of `opts.arms` on `trace` (already scaled): the run's JSON object.

    `on_arm` gets the object so far after each arm, so a run cut short keeps what it measured.
    `previous` is an earlier run's object for the same trace: its arms are kept, not run again,
    and the ratios are taken over the union.
    """
    if previous is not None and previous["requests"] != len(trace):
        raise ValueError(f"bench/policy_bench: the run to resume has {previous['requests']} "
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

    say = progress_printer(opts)
    say(f"trace {trace_kind}: {len(trace)} requests, scale 1/{opts.scale:g}, time 1/"
        f"{opts.compress:g}, device {opts.device}")
    # One model for every arm: the same weights, and the host expert bank (6 GiB pinned on
    # the GPU config) is built once, not once an arm.
    model = TinyMoE(config.model, torch.device(config.device))
    copy_us = _expert_copy_us(model)
    results: dict[str, ArmResult] = {}
    probes = list((previous or {}).get("probes", ()))
    plan = (previous or {}).get("oracle_plan")
    started = time.perf_counter()

    def doc() -> dict[str, Any]:
        return run_doc(trace_kind, opts.seed, trace, results, previous, copy_us, plan,
                       probes=probes)

    async def run_one(arm: str, requests: Sequence[TraceRequest]) -> ArmResult:
        result = await run_arm(arm, requests, config, opts, model,
                               plan["rungs"] if arm == "oracle" and plan else None)
        gc.collect()  # the arm's engine and pools go before the next one is built
        if opts.device.startswith("cuda"):
            torch.cuda.empty_cache()
        return result

    gpu_index = (torch.device(config.device).index or 0) if opts.device.startswith(
        "cuda") else None

    async def probe(before: str | None) -> None:
        at_s = time.perf_counter() - started
        start = take_sample(gpu_index)
        result = await run_one(PROBE, probe_trace(opts.tokens(PROBE_PROMPT_TOKENS)))
        probes.append(probe_record(result, before, at_s,
                                   host_during(start, take_sample(gpu_index))))

    run = doc()
    todo = [a for a in sorted(opts.arms, key=lambda a: a == "oracle") if a not in run["arms"]]
    # The oracle last, whatever order --arms gave: it is priced with the others' measurements.
    for arm in todo:
        if opts.probe:
            await probe(arm)
        if arm == "oracle":
            plan = oracle_plan_for(trace, run, page_size=config.model.page_size,
                                   lookups_per_token=config.model.num_layers
                                   * config.model.top_k, copy_us=copy_us)
        results[arm] = await run_one(arm, trace)
        run = doc()
        if on_arm is not None:
            on_arm(run)
    if opts.probe and todo:
        await probe(None)
        run = doc()
    return run


def probe_record(result: ArmResult, before: str | None, at_s: float,
                 host: dict[str, Any] | None) -> dict[str, Any]:
    """One probe as the run keeps it: which arm it ran before (None: after the last), when
    (seconds into this call's trace), its summary, what the host and card did meanwhile
    (bench/host_state.py) and its requests."""
    agg = result.aggregate()
    return {"before": before, "at_s": round(at_s, 2),
            **{k: agg[k] for k in ("served", "decode_tps", "hit_rate", "wall_s")},
            "host": host,
            "per_request": [row.to_json() for row in result.rows]}


def oracle_plan_for(trace: Sequence[TraceRequest], run: dict[str, Any], *, page_size: int,
                    lookups_per_token: int, copy_us: float) -> dict[str, Any] | None:
    """The oracle's schedule (bench/oracle.py), or None when no arm on the default ladder has
    run yet to price it (then the oracle takes the lowest rung holding each request)."""
    ladder = next((run["ladders"][a] for a in PRICED_ARMS if a in run["ladders"]), None)
    if ladder is None:
        return None
    return oracle_plan([(r.prompt_tokens, r.max_tokens) for r in trace], run, ladder,
                       page_size=page_size, lookups_per_token=lookups_per_token,
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


_PER_ARM = ("arms", "ladders", "transitions", "per_request", "timeline")


def run_doc(trace_kind: str, seed: int, trace: Sequence[TraceRequest],
            results: dict[str, ArmResult],
            previous: dict[str, Any] | None, expert_copy_us: float,
            oracle_block: dict[str, Any] | None, *,
            probes: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
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
        **derived(trace_kind, merged["arms"], merged["per_request"], expert_copy_us,
                  merged["transitions"]),
        "expert_copy_us": expert_copy_us,
        "oracle_plan": oracle_block,
        **{k: merged[k] for k in _PER_ARM if k != "arms"},
        **({"probes": list(probes)} if probes else {}),
    }


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
        "threads": opts.threads, "kv_step_tokens": opts.kv_step_tokens,
        "oracle_waits_for": opts.oracle_waits_for, "probe": opts.probe,
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


_SAME_RUN = ("schema", "device", "scale", "compress", "seed", "output_scale", "engine",
             "kv_step_tokens", "oracle_waits_for")


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


def _report(path: str, out: str | None, plot_path: str | None) -> int:
    try:
        doc = json.loads(Path(path).read_text())
        for run in doc["runs"].values():
            rerate_requests(run)
            run.update(derived(run["trace"], run["arms"], run["per_request"],
                               run.get("expert_copy_us"), run.get("transitions", {})))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"bench/policy_bench: cannot report {path}: {exc}", file=sys.stderr)
        return 2
    for run in doc["runs"].values():
        print(render_table(run))
    if "traces" in doc:
        doc["traces"] = summarize(doc["runs"], doc["meta"].get("default_arm", DEFAULT_ARM))
        print(render_summary(doc["traces"]))
    if out:
        report_json(doc, out, indent=1, emit=None)
    if plot_path and not plot(doc, plot_path):
        print("bench/policy_bench: matplotlib is not installed; no plot", file=sys.stderr)
    return 0


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
    parser.add_argument("--kv-step", default=None, metavar="TOKENS",
                        help="largest step of the moe-ladder arms' ladder, real tokens "
                             f"(default the daemon's, {format_count(BenchOptions.kv_step_tokens)}"
                             "; grow-only keeps PR #300's 32k)")
    parser.add_argument("--seeds", default=None, metavar="LIST",
                        help="a comma list of seeds: every trace on each, runs kept as "
                             "runs['TRACE/seedN'], and a `traces` block with each arm's "
                             "tokens/s per seed, median and spread (instead of --seed)")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma list of arms")
    parser.add_argument("--passes", type=int, default=1, metavar="N",
                        help="run the arms of each trace N times in a row (A B A B ...), each "
                             "pass its own run (`KEY/passP` from the second): how far one "
                             "ratio moves within a device call, beside how far it moves "
                             "between calls (default 1)")
    parser.add_argument("--probe", action=argparse.BooleanOptionalAction, default=None,
                        help="run the speed probe (bench/probe.py: fixed work on a static "
                             "geometry) before every arm and after the last, into the run's "
                             "`probes`, so the replay can price this call at its own speed "
                             "(default on with cuda, off on cpu)")
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
        print(f"bench/policy_bench: unknown trace or arm {bad!r}", file=sys.stderr)
        return 2
    try:
        seeds = None if args.seeds is None else [int(x) for x in args.seeds.split(",") if x]
    except ValueError:
        print(f"bench/policy_bench: --seeds wants a comma list of integers, got {args.seeds!r}",
              file=sys.stderr)
        return 2
    if seeds is not None and not seeds:
        print("bench/policy_bench: --seeds names no seed", file=sys.stderr)
        return 2
    if args.passes < 1:
        print(f"bench/policy_bench: --passes must be >= 1, got {args.passes}", file=sys.stderr)
        return 2
    cuda = args.device.startswith("cuda")
    scale = args.scale if args.scale is not None else (1.0 if cuda else 36.0)
    try:
        kv_step = (BenchOptions.kv_step_tokens if args.kv_step is None
                   else parse_count(args.kv_step))
        if kv_step < 1:
            raise ValueError(f"{args.kv_step!r} is not a positive count")
    except ValueError as exc:
        print(f"bench/policy_bench: --kv-step: {exc}", file=sys.stderr)
        return 2
    opts = BenchOptions(device=args.device, scale=scale, compress=args.compress,
                        seed=args.seed, arms=arms, quiet=args.quiet, kv_step_tokens=kv_step,
                        threads=args.threads if args.threads is not None else (
                            None if cuda else 1),
                        probe=cuda if args.probe is None else args.probe)
    meta = {**_meta(opts), "output_scale": args.output_scale, "passes": args.passes}
    if seeds is not None:
        meta.update(seed=None, seeds=seeds, default_arm=DEFAULT_ARM)
    doc: dict[str, Any] = {"meta": meta, "runs": {}}
    previous_runs: dict[str, Any] = {}
    if args.resume:
        try:
            previous_runs, doc["meta"]["previous_calls"] = _resumable(args.resume, doc["meta"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"bench/policy_bench: cannot resume {args.resume}: {exc}", file=sys.stderr)
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
            report_json(doc, args.out, indent=1, emit=None)

    try:
        for seed, kind, pass_no in itertools.product(seeds or [args.seed], kinds,
                                                     range(1, args.passes + 1)):
            key = (kind if seeds is None else run_key(kind, seed)) + (
                "" if pass_no == 1 else f"/pass{pass_no}")
            n = args.requests or (SMOKE_REQUESTS if args.smoke else FULL_REQUESTS)[kind]
            trace = build_trace(kind, n, seed=seed, scale=scale, output_scale=args.output_scale)
            run = asyncio.run(run_bench(
                kind, trace, replace(opts, seed=seed),
                on_arm=lambda partial, key=key, p=pass_no: write(key, {**partial, "pass": p}),
                previous=previous_runs.get(key)))
            run = {**run, "pass": pass_no}
            write(key, run)
            print(render_table(run))
        if seeds is not None:
            print(render_summary(doc["traces"]))
    except ArmInterrupted as exc:
        write()
        print(f"bench/policy_bench: {exc}", file=sys.stderr)
        return 3
    write()
    if opts.device == "cpu":
        print("(CPU numbers of the scaled-down engine: not a GPU's; targets are for the H200.)")
    if args.plot and not plot(doc, args.plot):
        print("bench/policy_bench: matplotlib is not installed; no plot", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
