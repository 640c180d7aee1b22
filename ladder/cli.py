"""The `ladder` command line: a thin shell over the pure planner, rungs and renderers.

Exit status, one rule for every command: 0 done (or a feasible plan); 1 the command ran and
the answer is no (an infeasible plan, a target not reached, no rungs); 2 it could not run:
bad input, an unreadable file, or a server it cannot reach or is not let in to. Status 2 is one
line on stderr naming what is wrong and the flag to change, and nothing was sent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from engine.ftserve.budget import MemoryModel
from engine.ftserve.fields import DocumentError
from engine.ftserve.geometry import CacheStatus, Geometry, parse_cache_status
from engine.ftserve.planner import plan_transition
from ladder.knobs import KnobError, knob_fields
from ladder.parsers import option_value, seconds, server_url
from ladder.render import render_ladder, render_plan, render_pools
from ladder.rungs import LadderSpec, build_ladder, reachable_ranges, small_budget_hint
from ladder.units import format_bytes, format_count, parse_bytes, parse_count, parse_target

__all__ = ["BadInput", "main"]

DEFAULT_SERVER = "http://127.0.0.1:1919"
_DEFAULT_SPEC = LadderSpec()


class BadInput(Exception):
    """Input the user must fix; printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line naming what is wrong, not argparse's usage dump.
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _count(text: str) -> int:
    try:
        return parse_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _bytes(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _server_url(text: str) -> str:
    try:
        return server_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _policy_option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z_]\w*", key.strip()):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), option_value(value)


def _kv_tokens(text: str) -> int | None:
    return None if text == "auto" else _count(text)


def _signed_bytes(text: str) -> int:
    return -_bytes(text[1:]) if text.startswith("-") else _bytes(text)


def _seconds(text: str) -> float:
    try:
        value: float = seconds()(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _milliseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected milliseconds, got {text!r}") from None
    if not value >= 0.0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be >= 0 ms, got {text}")
    return value


def _add_source(p: argparse.ArgumentParser) -> None:
    src = p.add_argument_group("where the geometry comes from")
    src.add_argument("--server", type=_server_url, default=None, metavar="URL",
                     help=f"a live ft serve or reference engine, as a URL or HOST:PORT "
                          f"(default {DEFAULT_SERVER})")
    src.add_argument("--status", type=Path, default=None, metavar="FILE",
                     help="a saved GET /v1/cache/status document instead of a server")
    src.add_argument("--api-key", default=None,
                     help="API key for ft serve 0.2.1 (default: $LADDER_API_KEY or "
                          "$FREETOKEN_API_KEY); sent as a bearer token, never printed")
    src.add_argument("--timeout-s", type=float, default=10.0, help="HTTP timeout (default 10)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    _add_layout(p, defaults=True)


def _add_layout(p: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The budget and ladder flags; `run` takes them without defaults, so that a flag not
    given leaves the config file's value alone."""

    def default(value: Any) -> Any:
        return value if defaults else None

    budget = p.add_argument_group("budget and ladder")
    budget.add_argument("--reserve", type=_bytes, default=default(_DEFAULT_SPEC.reserve_bytes),
                        metavar="BYTES",
                        help="keep this much of the budget free at every instant (e.g. 256MiB)")
    budget.add_argument("--fixed-bytes", type=_bytes,
                        default=default(_DEFAULT_SPEC.fixed_bytes), metavar="BYTES",
                        help="fixed costs the engine's fit-check adds that unit_bytes omits")
    budget.add_argument("--kv-floor", type=_count,
                        default=default(_DEFAULT_SPEC.kv_floor_tokens),
                        metavar="TOKENS", help=f"KV of the lowest rung (default "
                             f"{format_count(_DEFAULT_SPEC.kv_floor_tokens)})")
    budget.add_argument("--kv-max", type=_count, default=None, metavar="TOKENS",
                        help="KV of the top rung: the model's context (default: what fits)")
    budget.add_argument("--spacing", choices=("geometric", "linear"),
                        default=default(_DEFAULT_SPEC.spacing),
                        help=f"rung spacing (default {_DEFAULT_SPEC.spacing})")
    budget.add_argument("--kv-ratio", type=float, default=default(_DEFAULT_SPEC.kv_step_ratio),
                        help=f"geometric step between rungs (default "
                             f"{_DEFAULT_SPEC.kv_step_ratio:.3f})")
    budget.add_argument("--kv-step", type=_count, default=default(_DEFAULT_SPEC.kv_step_tokens),
                        metavar="TOKENS",
                        help="linear step between rungs; with geometric spacing, the largest "
                             f"step (default {format_count(_DEFAULT_SPEC.kv_step_tokens)})")


def _read_status_file(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise BadInput(f"cannot read --status {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(f"--status {path} is not JSON: {exc}") from None


async def _fetch_status(url: str, api_key: str | None, timeout_s: float) -> CacheStatus:
    from ladder.client import ClientError, FtServeClient, Unauthorized

    try:
        async with FtServeClient(url, api_key=api_key, timeout_s=timeout_s) as client:
            return await client.cache_status()
    except Unauthorized as exc:
        sent = "the key sent was refused" if api_key else "no API key was sent"
        raise BadInput(f"--server {url}: {exc} ({sent}; give --api-key KEY or set "
                       f"$LADDER_API_KEY)") from None
    except ClientError as exc:
        raise BadInput(f"--server {url}: {exc}") from None


def _load_status(args: argparse.Namespace) -> CacheStatus:
    if args.status is not None and args.server is not None:
        raise BadInput("give --status or --server, not both")
    if args.status is not None:
        doc = _read_status_file(args.status)
        try:
            return parse_cache_status(doc)
        except DocumentError as exc:
            raise BadInput(f"--status {args.status}: {exc}") from None
    return asyncio.run(_fetch_status(args.server or DEFAULT_SERVER, _api_key(args),
                                     args.timeout_s))


# The flag a user typed for each LadderSpec field (declared on the field), so an error names
# what to change.
_LAYOUT_FLAGS = {f.name: spec.flag for f, spec in knob_fields(LadderSpec) if spec.flag}


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _as_flags(message: str) -> str:
    return re.sub(r"\b(" + "|".join(_LAYOUT_FLAGS) + r")\b",
                  lambda m: _LAYOUT_FLAGS[m.group(1)], message)


def _spec(args: argparse.Namespace) -> LadderSpec:
    try:
        return LadderSpec(**{name: getattr(args, _dest(flag))
                             for name, flag in _LAYOUT_FLAGS.items()})
    except KnobError as exc:
        # "--kv-floor must be at least 1, got 0"; a rule that names its keys says it alone.
        said = exc.message if exc.name in exc.message else f"{exc.name} {exc.message}"
        raise BadInput(_as_flags(said)) from None


def _model(args: argparse.Namespace, status: CacheStatus) -> MemoryModel:
    model = MemoryModel.from_status(status, fixed_bytes=args.fixed_bytes,
                                    reserve_bytes=args.reserve)
    if model.budget_bytes <= 0:
        given = " + ".join(f"{flag} {format_bytes(getattr(args, attr))}" for flag, attr in (
            ("--reserve", "reserve"), ("--fixed-bytes", "fixed_bytes")) if getattr(args, attr))
        raise BadInput(f"{given} leaves nothing of the server's cache budget of "
                       f"{format_bytes(status.cache_budget_bytes)} "
                       f"({status.cache_budget_bytes} B)")
    return model


def _target(text: str, status: CacheStatus) -> Geometry:
    try:
        wanted = parse_target(text)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    live, shape = status.geometry, status.shape
    pages = live.num_pages
    if "kv" in wanted:
        pages = shape.pages_for_tokens(wanted["kv"])
    elif "kv_pages" in wanted:
        pages = wanted["kv_pages"]
    return Geometry(wanted.get("moe", live.moe_cache_size), pages,
                    wanted.get("mamba", live.num_mamba_slots), live.num_swa_pages)


def _emit(args: argparse.Namespace, obj: Any, text: str) -> None:
    print(json.dumps(obj, indent=2) if args.json else text)


def cmd_plan(args: argparse.Namespace) -> int:
    status = _load_status(args)
    model = _model(args, status)
    plan = plan_transition(model, status.geometry, _target(args.to, status))
    _emit(args, plan.to_json(), render_plan(plan, model))
    return 0 if plan.feasible else 1


def cmd_rungs(args: argparse.Namespace) -> int:
    status = _load_status(args)
    model = _model(args, status)
    spec = _spec(args)
    ladder = build_ladder(model, status.geometry, spec)
    hint = small_budget_hint(ladder, spec)
    obj = {"budget_bytes": model.budget_bytes,
           "rungs": [r.to_json() for r in ladder.rungs],
           "live_rung": ladder.index_of(status.geometry),
           "dropped": [{"kv_tokens": d.kv_tokens, "reason": d.reason} for d in ladder.dropped],
           "hint": None if hint is None else hint.message(len(ladder.rungs))}
    _emit(args, obj, render_ladder(ladder, status.geometry, hint))
    return 0 if ladder.rungs else 1


def cmd_status(args: argparse.Namespace) -> int:
    status = _load_status(args)
    model = _model(args, status)
    ranges = reachable_ranges(model, status.geometry, status.limits)
    spec = _spec(args)
    ladder = build_ladder(model, status.geometry, spec)
    hint = small_budget_hint(ladder, spec)
    obj = {"state": status.state, "engine": status.engine.name,
           "geometry": status.geometry.to_json(),
           "allocated_bytes": model.total_bytes(status.geometry),
           "budget_bytes": model.budget_bytes,
           "live_rung": ladder.index_of(status.geometry),
           "rungs": [r.to_json() for r in ladder.rungs],
           "ranges": [{"pool": r.pool, "unit": r.unit, "min": r.minimum, "current": r.current,
                       "max_keeping_others": r.max_keeping_others,
                       "max_with_others_at_floor": r.max_with_others_at_floor,
                       "advertised_max": r.advertised_max} for r in ranges],
           "hint": None if hint is None else hint.message(len(ladder.rungs))}
    text = (render_pools(status, model, ranges) + "\n\n"
            + render_ladder(ladder, status.geometry, hint))
    _emit(args, obj, text)
    return 0


def _api_key(args: argparse.Namespace) -> str | None:
    key: str | None = args.api_key or os.environ.get("LADDER_API_KEY") or os.environ.get(
        "FREETOKEN_API_KEY")
    return key


def cmd_apply(args: argparse.Namespace) -> int:
    from ladder.client import FtServeClient
    from ladder.executor import ApplySettings, apply_target

    if args.status is not None:
        raise BadInput("apply changes a live server: give --server, not --status")
    if args.dry_run:
        args.server = args.server or DEFAULT_SERVER
        return cmd_plan(args)
    url = args.server or DEFAULT_SERVER
    # Read once first: a server that cannot be reached, or a target or budget flag that is
    # wrong, is bad input (exit 2, nothing sent), the same as for `plan` and `status`.
    status = _load_status(args)
    _model(args, status)
    _target(args.to, status)
    # A wait not given is the knob's default, the daemon's `control.*_wait_s`.
    waits = {"rebuild_wait_s": args.wait_s, "idle_wait_s": args.idle_wait_s}
    settings = ApplySettings(fixed_bytes=args.fixed_bytes, reserve_bytes=args.reserve,
                             **{k: v for k, v in waits.items() if v is not None})

    def show(event: str, payload: dict[str, Any]) -> None:
        if not args.json:
            print(f"  {event}: {json.dumps(payload)}", flush=True)

    async def go() -> Any:
        async with FtServeClient(url, api_key=_api_key(args), timeout_s=args.timeout_s) as c:
            return await apply_target(c, lambda status: _target(args.to, status),
                                      settings=settings, on_event=show)

    result = asyncio.run(go())
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        verdict = "reached" if result.reached else "NOT reached"
        final = "unknown" if result.final is None else json.dumps(result.final.to_json())
        print(f"{verdict}: {result.reason}\n  final geometry {final}")
        if result.needs_restart:
            print("  the server needs a restart", flush=True)
    return 0 if result.reached else 1


def _load_config(args: argparse.Namespace) -> Any:
    from ladder.config import ConfigError, cli_overrides, load
    from ladder.daemon import load_policies

    path = args.config or os.environ.get("LADDER_CONFIG")
    try:
        layout = {key: getattr(args, _dest(flag), None) for key, flag in _LAYOUT_FLAGS.items()}
        cli = cli_overrides(server=getattr(args, "server", None),
                            api_key=getattr(args, "api_key", None),
                            policy=getattr(args, "policy", None),
                            poll_s=getattr(args, "poll_s", None),
                            gate=getattr(args, "gate", None), listen=getattr(args, "listen", None),
                            ladder=layout,
                            policy_options=dict(getattr(args, "policy_option", None) or []))
        config = load(path, dict(os.environ), cli,
                      single_server=getattr(args, "server", None) is not None)
        load_policies(config)
        return config
    except ConfigError as exc:
        raise BadInput(_config_error_as_flag(exc)) from None


def _config_error_as_flag(exc: Any) -> str:
    """A config error about a value typed as a flag names the flag, not the key path."""
    from ladder.config import flagged_keys

    text = str(exc)
    if "(from the command line)" not in text or not exc.key:
        return text
    # Keys name the flag that sets them; `--listen` is also parsed whole, as `listen`.
    flags = {"listen": "--listen", **{path[-1]: flag for path, flag in flagged_keys()}}
    flag = flags.get(exc.key.rsplit(".", 1)[-1])
    if flag is None:
        return text
    return f"{flag}: {exc.message.replace(' (from the command line)', '')}"


def _setup_logging(fmt: str, level: str) -> None:
    from ladder.logs import configure

    configure(fmt, level)


def cmd_run(args: argparse.Namespace) -> int:
    from ladder.config import ConfigError
    from ladder.daemon import run_daemon

    config = _load_config(args)
    _setup_logging(config.log.format, config.log.level)

    def ready(daemon: Any) -> None:
        ports = ", ".join(f"{k} on :{v}" for k, v in daemon.listening.items())
        print(f"ladder run: {len(daemon.controllers)} server(s); {ports}", flush=True)

    try:
        asyncio.run(run_daemon(config, on_ready=ready))
    except ConfigError as exc:
        raise BadInput(str(exc)) from None
    except OSError as exc:
        raise BadInput(f"cannot listen: {exc.strerror or exc}") from None
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    from ladder.config import explain

    args.config = args.file
    config = _load_config(args)
    print(f"{args.file}: valid")
    print(explain(config))
    return 0


def cmd_policies(args: argparse.Namespace) -> int:
    from policies.registry import installed_policies

    infos = installed_policies()
    if args.json:
        print(json.dumps([{"name": i.name, "value": i.value, "distribution": i.distribution,
                           "version": i.version} for i in infos], indent=2))
        return 0
    width = max((len(i.name) for i in infos), default=4)
    for info in infos:
        provider = " ".join(str(x) for x in (info.distribution, info.version) if x)
        print(f"{info.name.ljust(width)}  {info.value}  ({provider or 'unknown distribution'})")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    _require_torch("demo")
    from ladder.demo import plot, render_summary, run_demo

    if args.plot:
        # Checked before the demo runs: a minute of work must not end in a path error.
        folder = Path(args.plot).resolve().parent
        if not folder.is_dir():
            raise BadInput(f"--plot {args.plot}: folder {folder} does not exist")
        if not os.access(folder, os.W_OK):
            raise BadInput(f"--plot {args.plot}: folder {folder} is not writable")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise BadInput("--plot needs matplotlib: pip install matplotlib") from None
    say = (lambda _line: None) if args.json else (lambda line: print(line, flush=True))
    result = asyncio.run(run_demo(seed=args.seed, say=say))
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(render_summary(result))
    if args.plot:
        plot(result, args.plot)
        if not args.json:
            print(f"  plot written to {args.plot}")
    return 0 if result.refused == 0 and result.truncated == 0 else 1


def _engine_config(args: argparse.Namespace) -> Any:
    from engine.reference.decoder import ModelSpec
    from engine.reference.runtime import EngineConfig
    from engine.reference.scenarios import report_config

    budget_s = args.pause_budget_ms / 1e3
    try:
        if args.scenario == "report":
            return replace(report_config(args.rebuild_mode, device=args.device),
                           rebuild_pause_budget_s=budget_s)
        spec = ModelSpec(num_layers=args.layers, num_experts=args.experts, top_k=args.top_k,
                         hidden=args.hidden, expert_hidden=args.expert_hidden,
                         head_dim=args.head_dim, state_heads=args.state_heads,
                         page_size=args.page_size, routing_preset=args.routing, seed=args.seed)
        if args.device_memory_bytes is None and args.cache_budget is None:
            raise BadInput("give --device-memory-bytes (the card to emulate) or --cache-budget")
        return EngineConfig(
            model=spec, device=args.device, device_memory_bytes=args.device_memory_bytes,
            memory_ratio=args.memory_ratio, cache_budget_bytes=args.cache_budget,
            moe_cache_size=args.moe_cache_size or spec.num_experts,
            num_pages=None if args.kv_tokens is None else -(-args.kv_tokens // spec.page_size),
            boot_drift_bytes=args.boot_drift,
            num_mamba_slots=args.mamba_slots, max_running_requests=args.max_running_requests,
            max_seq_len=args.max_seq_len, rebuild_mode=args.rebuild_mode,
            chunk_bytes=args.chunk_bytes, rebuild_pause_budget_s=budget_s)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def _require_torch(command: str) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise BadInput(f"`ladder {command}` runs the reference engine, which needs torch: "
                       f"install the engine extra, e.g. pip install torch==2.13.0 -e \".[engine]\" "
                       f"(the daemon itself needs no torch)") from None


def cmd_engine(args: argparse.Namespace) -> int:
    _require_torch("engine")
    import torch

    from engine.reference.runtime import ReferenceEngine
    from engine.reference.server import serve

    config = _engine_config(args)
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise BadInput("--device cuda: no CUDA device is available")
    try:
        engine = ReferenceEngine(config)
    except torch.OutOfMemoryError as exc:
        raise BadInput(f"the initial geometry does not fit the card: {exc}") from None
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print(f"ladder engine: WARNING: listening on {args.host} without --api-key",
              file=sys.stderr)

    def ready(port: int) -> None:
        g = engine.geometry()
        print(f"reference engine on http://{args.host}:{port} ({config.rebuild_mode} "
              f"rebuilds, {config.device}): {g.moe_cache_size} expert slots, "
              f"{g.num_pages * config.model.page_size} KV tokens, {g.num_mamba_slots} mamba "
              f"slots, budget {engine.memory_model.cache_budget_bytes} B", flush=True)
        status = parse_cache_status(engine.status_doc())
        ladder = build_ladder(MemoryModel.from_status(status), status.geometry, _DEFAULT_SPEC)
        hint = small_budget_hint(ladder, _DEFAULT_SPEC)
        flags = "" if hint is None else f" {hint.flags()}"
        print(f"steer it with: ladder run --server {args.host}:{port}{flags}", flush=True)
        if hint is not None:
            print(f"  ({hint.message(len(ladder.rungs))})", flush=True)

    try:
        asyncio.run(serve(engine, host=args.host, port=args.port, api_key=args.api_key,
                          on_ready=ready))
    except OSError as exc:
        raise BadInput(f"--host {args.host} --port {args.port}: cannot listen: "
                       f"{exc.strerror or exc}") from None
    return 0


def _add_engine(sub: Any) -> None:
    p = sub.add_parser(
        "engine", help="run the reference engine (ft serve's control API on torch pools)",
        description="Serve the reference engine: a tiny MoE decoder on real torch pools "
                    "behind ft serve's control API, with chunked, content-keeping rebuilds "
                    "(incremental) or ft serve's own (freetoken).")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=1919, help="listen port (default 1919)")
    p.add_argument("--api-key", default=None, help="require this bearer token, as ft serve "
                                                   "0.2.1 does (all routes but /health)")
    p.add_argument("--scenario", choices=("report",), default=None,
                   help="report: the motivating report's RTX 5080 geometry, scaled")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--device-memory-bytes", type=_bytes, default=None, metavar="BYTES",
                   help="behave as a card of this size: a filler outside torch on CUDA, the "
                        "pool allocator's cap on the CPU (e.g. 16GiB)")
    p.add_argument("--memory-ratio", type=float, default=0.9,
                   help="budget = ratio x card - weights, as ft serve (default 0.9)")
    p.add_argument("--cache-budget", type=_bytes, default=None, metavar="BYTES",
                   help="set cache_budget_bytes directly")
    p.add_argument("--rebuild-mode", choices=("incremental", "freetoken"),
                   default="incremental", help="how rebuilds run (default incremental)")
    p.add_argument("--chunk-bytes", type=_bytes, default=2 << 20, metavar="BYTES",
                   help="pool chunk size (default 2MiB)")
    p.add_argument("--pause-budget-ms", type=_milliseconds, default=2.0, metavar="MS",
                   help="chunk-operation time per decode round while requests run (default "
                        "2): more finishes a rebuild in fewer decode rounds but stalls each of "
                        "them longer; 0 is one operation a round (longest rebuild, shortest "
                        "stalls). With no request queued a rebuild runs straight through")
    pools = p.add_argument_group("initial geometry")
    pools.add_argument("--moe-cache-size", type=_count, default=0,
                       help="expert slots (default: one per expert)")
    pools.add_argument("--kv-tokens", type=_kv_tokens, default=16384, metavar="TOKENS|auto",
                       help="KV tokens (default 16k); auto: fill what the budget leaves, as "
                            "ft serve boots without --num-tokens (up to a page above the budget)")
    pools.add_argument("--boot-drift", type=_signed_bytes, default=0, metavar="BYTES",
                       help="with --kv-tokens auto: how far ft serve's free-memory reading "
                            "lands from the budget, e.g. 2MiB or --boot-drift=-2MiB (default 0)")
    pools.add_argument("--mamba-slots", type=_count, default=8, help="state slots (default 8)")
    pools.add_argument("--max-running-requests", type=int, default=4)
    pools.add_argument("--max-seq-len", type=_count, default=1 << 20,
                       help="the model's context limit (default 1m)")
    model = p.add_argument_group("model shape")
    model.add_argument("--layers", type=int, default=8)
    model.add_argument("--experts", type=int, default=64)
    model.add_argument("--top-k", type=int, default=4)
    model.add_argument("--hidden", type=int, default=64)
    model.add_argument("--expert-hidden", type=int, default=128)
    model.add_argument("--head-dim", type=int, default=32)
    model.add_argument("--state-heads", type=int, default=1)
    model.add_argument("--page-size", type=int, default=16)
    model.add_argument("--routing", choices=("A", "B", "C"), default="A",
                       help="routing locality preset (engine/reference/routing.py PRESETS)")
    model.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_engine)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("moe-ladder")
    except PackageNotFoundError:  # a source checkout that was never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ladder", description=(
        "Resize ft serve's expert slots and KV pages without OOM: free-first plans, "
        "precomputed rungs, and a daemon that steps between them."))
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("plan", help="plan a safe transition to a target geometry",
                       description="Print the steps from the live geometry to --to, with the "
                                   "peak bytes of each, next to what one rebuild call would "
                                   "peak at. Exit 0 feasible, 1 infeasible, 2 bad input.")
    p.add_argument("--to", required=True, metavar="moe=N,kv=TOKENS[,mamba=N]",
                   help="target sizes; kv in tokens (k/m suffixes: 64k = 65536) or "
                        "kv_pages=N; omitted pools keep their size")
    _add_source(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("apply", help="execute a safe plan against a live server",
                       description="Plan like `ladder plan`, then execute step by step: wait "
                                   "for a safe moment, send one rebuild, read the geometry "
                                   "back, and only then the next step. Exit 0 reached, 1 not "
                                   "reached (the reason says why), 2 bad input.")
    p.add_argument("--to", required=True, metavar="moe=N,kv=TOKENS[,mamba=N]",
                   help="target sizes, as for `ladder plan`")
    p.add_argument("--dry-run", action="store_true", help="print the plan, send nothing")
    p.add_argument("--wait-s", type=_seconds, default=None,
                   help="how long the server may take per rebuild (default 300)")
    p.add_argument("--idle-wait-s", type=_seconds, default=None,
                   help="how long to wait for a safe moment (default 600)")
    _add_source(p)
    p.set_defaults(func=cmd_apply)

    p = sub.add_parser("demo", help="the reference engine, the daemon and a workload, end to end",
                       description="Start the reference engine on a card-sized memory cap, "
                                   "the daemon with its admission gate, and a workload of "
                                   "short and long requests; print what happened. Exit 0 when "
                                   "no request was refused or truncated.")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw rung and context over time (needs matplotlib)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("run", help="run the daemon next to one or more servers",
                       description="Watch each server's context use and decode speed and step "
                                   "between precomputed rungs with free-first plans. Config: "
                                   "defaults < --config TOML < LADDER_* environment < flags "
                                   "(docs/config.md). Stops cleanly on SIGINT/SIGTERM.")
    p.add_argument("--config", default=None, metavar="FILE", help="ladder.toml")
    p.add_argument("--server", type=_server_url, default=None, metavar="URL",
                   help="one server to steer, as a URL or HOST:PORT (overrides the file's "
                        "[[servers]])")
    p.add_argument("--api-key", default=None, help="the server's API key (ft serve 0.2.1)")
    p.add_argument("--policy", default=None, help="policy name or module:attr (default "
                   "pinned: the lowest rung holding demand)")
    p.add_argument("--policy-option", action="append", default=[], type=_policy_option,
                   metavar="KEY=VALUE", help="an option for the policy, read as a TOML value "
                   "(growth_tokens=256, dwell_s=60); repeat for more")
    p.add_argument("--poll-s", default=None, type=float, help="observation period (default 2)")
    p.add_argument("--gate", default=None, metavar="HOST:PORT",
                   help="run the admission gate here, in front of the server's OpenAI and "
                        "Anthropic routes")
    p.add_argument("--listen", default=None, metavar="HOST:PORT",
                   help="the daemon's /status and /metrics (default 127.0.0.1:9190)")
    _add_layout(p, defaults=False)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("config", help="check a config file")
    config_sub = p.add_subparsers(dest="config_command", required=True, parser_class=_Parser,
                                  metavar="check")
    check = config_sub.add_parser("check", help="validate a ladder.toml and explain it",
                                  description="Validate FILE with the environment's LADDER_* "
                                              "overrides and print every effective value with "
                                              "where it came from. Exit 2 when invalid.")
    check.add_argument("file", metavar="FILE")
    check.set_defaults(func=cmd_config_check)

    p = sub.add_parser("policies", help="list the policies: built-ins and installed plugins",
                       description="Policies found through the moe_ladder.policies entry "
                                   "points, with the distribution that provides each, then "
                                   "the built-ins no installed metadata offers (a source "
                                   "checkout), marked built-in.")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_policies)

    p = sub.add_parser("rungs", help="print the ladder of precomputed rungs",
                       description="Print every rung (KV tokens, pages, expert slots, mamba "
                                   "slots, bytes); every transition between two rungs is "
                                   "planned and verified, unsafe rungs are dropped with why.")
    _add_source(p)
    p.set_defaults(func=cmd_rungs)

    p = sub.add_parser("status", help="show the pools, the rung and the reachable ranges",
                       description="Show the live pools like `ft ctl cache`, with the ranges "
                                   "each pool can really reach live, and the ladder.")
    _add_source(p)
    p.set_defaults(func=cmd_status)
    _add_engine(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except BadInput as exc:
        print(f"ladder: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # Output piped into `head`: not an error of ours.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
