"""`ladder run`: one controller per server in a TaskGroup, the gates, and the daemon's own
HTTP endpoint (/healthz, /readyz, /status, /metrics), wired from a `DaemonConfig`.

/healthz never depends on the engine (a down engine must not get the daemon restarted);
/readyz is 200 once every server has been observed once. /status keeps the controllers'
monotonic timestamps (`*_s`, what the logic compares) and adds each as wall-clock ISO 8601
UTC beside it (`*_at`), which is what a person reading it at 3 a.m. can use. Listeners bind
127.0.0.1 unless configured otherwise, and a warning is logged when one is bound elsewhere
without a token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ladder.client import FtServeClient
from ladder.clock import Clock, SystemClock
from ladder.config import ConfigError, DaemonConfig, ServerConfig, to_json
from ladder.controller import ServerController
from ladder.gate import Gate, GateSettings
from ladder.metrics import DaemonMetrics
from ladder.parsers import parse_hostport
from ladder.safeguards import Safeguards
from policies.api import Policy
from policies.registry import PolicyLoadError, load_policy

__all__ = ["Daemon", "build_daemon", "load_policies"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = "moe-ladder.status.v1"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Monotonic instants in /status (durations such as `cooldown_s` are not instants).
_INSTANTS_S = frozenset({"as_of_s", "breaker_open_until_s", "backoff_until_s",
                         "last_transition_s", "rung_since_s", "started_s"})


def _iso(wall_s: float) -> str:
    return datetime.fromtimestamp(wall_s, UTC).isoformat(timespec="milliseconds")


def with_wall_times(doc: Any, now_s: float, now_wall_s: float) -> Any:
    """`doc` with an ISO 8601 `<name>_at` beside every monotonic instant `<name>_s`."""
    if isinstance(doc, list):
        return [with_wall_times(item, now_s, now_wall_s) for item in doc]
    if not isinstance(doc, dict):
        return doc
    out: dict[str, Any] = {}
    for key, value in doc.items():
        out[key] = with_wall_times(value, now_s, now_wall_s)
        if key in _INSTANTS_S and isinstance(value, int | float):
            out[key[:-2] + "_at"] = _iso(now_wall_s - (now_s - value))
    return out


@dataclass
class Daemon:
    config: DaemonConfig
    controllers: list[ServerController]
    gates: dict[str, Gate]
    metrics: DaemonMetrics
    session: aiohttp.ClientSession | None
    clock: Clock = field(default_factory=SystemClock)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    listening: dict[str, int] = field(default_factory=dict)

    def status_json(self) -> dict[str, Any]:
        servers = []
        for c in self.controllers:
            doc = c.status_json()
            gate = self.gates.get(c.name)
            if gate is not None:
                stats = gate.stats()
                doc["gate"] = {"listen": self.listening.get(f"gate:{c.name}"),
                               "held_now": stats.held_now, "held_total": stats.held_total,
                               "forwarded_total": stats.forwarded_total,
                               "refused_total": dict(stats.refused_total)}
            servers.append(doc)
        now_s, now_wall_s = self.clock.monotonic(), time.time()
        return {"schema_version": SCHEMA_VERSION, "as_of_s": now_s,
                "as_of_at": _iso(now_wall_s),
                "servers": with_wall_times(servers, now_s, now_wall_s),
                "config": to_json(self.config)}

    def ready_reasons(self) -> list[str]:
        return [f"{c.name}: not observed yet" + (f" ({c.last_error})" if c.last_error else "")
                for c in self.controllers if c.status is None]

    def make_app(self) -> web.Application:
        app = web.Application()

        async def healthz(_: web.Request) -> web.Response:
            return web.json_response({"status": "ok"})

        async def readyz(_: web.Request) -> web.Response:
            reasons = self.ready_reasons()
            if reasons:
                return web.json_response({"status": "not_ready", "reasons": reasons},
                                         status=503)
            return web.json_response({"status": "ready"})

        async def status(_: web.Request) -> web.Response:
            return web.json_response(self.status_json())

        async def metrics(_: web.Request) -> web.Response:
            self._export_gate_stats()
            return web.Response(body=generate_latest(self.metrics.registry),
                                headers={"Content-Type": CONTENT_TYPE_LATEST})

        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        app.router.add_get("/health", readyz)
        app.router.add_get("/status", status)
        app.router.add_get("/metrics", metrics)
        return app

    def _export_gate_stats(self) -> None:
        for name, gate in self.gates.items():
            stats = gate.stats()
            self.metrics.gate_held.labels(name).set(stats.held_now)
            held = self.metrics.gate_holds.labels(name)
            held.inc(max(0, stats.held_total - held._value.get()))  # counters only go up
            refused = self.metrics.gate_refused.labels(name)
            refused.inc(max(0, sum(stats.refused_total.values()) - refused._value.get()))

    async def _listen(self, key: str, app: web.Application, host: str, port: int,
                      *, has_token: bool) -> web.AppRunner:
        if host not in _LOOPBACK and not has_token:
            log.warning("listening beyond loopback without a token",
                        extra={"listener": key, "host": host})
        runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.listening[key] = sockets[0].getsockname()[1] if sockets else port
        return runner

    async def run(self, *, on_ready: Callable[[Daemon], None] | None = None) -> None:
        """Serve until `stop` is set (SIGINT/SIGTERM set it when run from the CLI)."""
        runners: list[web.AppRunner] = []
        try:
            listen = self.config.listen
            runners.append(await self._listen("daemon", self.make_app(), listen.host,
                                              listen.port, has_token=listen.token is not None))
            for server in self.config.servers:
                gate = self.gates.get(server.name)
                if gate is not None and server.gate_listen is not None:
                    host, port = parse_hostport(server.gate_listen, any_port=True)
                    runners.append(await self._listen(f"gate:{server.name}", gate.make_app(),
                                                      host, port, has_token=False))
            if on_ready is not None:
                on_ready(self)
            async with asyncio.TaskGroup() as group:
                for controller in self.controllers:
                    group.create_task(controller.run(self.stop), name=controller.name)
        finally:
            for runner in reversed(runners):
                await asyncio.shield(runner.cleanup())


def _api_key(server: ServerConfig) -> str | None:
    if server.api_key:
        return server.api_key
    if server.api_key_env:
        return os.environ.get(server.api_key_env)
    return None


def load_policies(config: DaemonConfig) -> dict[str, Policy]:
    """Every server's policy, built with its options: `config check` and the daemon's start
    share it, so a config that checks is a config that runs. Errors are ConfigErrors naming
    the server's key."""
    policies: dict[str, Policy] = {}
    for index, server in enumerate(config.servers):
        try:
            policies[server.name] = load_policy(server.policy, server.policy_options)
        except PolicyLoadError as exc:
            raise ConfigError(f"servers[{index}].policy", str(exc)) from None
        except (TypeError, ValueError) as exc:  # the factory refused its options
            raise ConfigError(f"servers[{index}].policy_options", str(exc)) from None
    return policies


def build_daemon(config: DaemonConfig, session: aiohttp.ClientSession | None, *,
                 clock: Clock | None = None, metrics: DaemonMetrics | None = None,
                 client_factory: Callable[[ServerConfig], FtServeClient] | None = None,
                 ) -> Daemon:
    """Controllers, policies, safeguards and gates for every configured server.

    `client_factory` builds each server's client (default: an `FtServeClient` on `session`);
    bench/replay passes one that answers from a simulated server in virtual time."""
    clock = clock or SystemClock()
    metrics = metrics or DaemonMetrics()
    controllers: list[ServerController] = []
    gates: dict[str, Gate] = {}
    policies = load_policies(config)

    def http_client(server: ServerConfig) -> FtServeClient:
        return FtServeClient(server.url, api_key=_api_key(server), timeout_s=server.timeout_s,
                             session=session)

    for server in config.servers:
        client = (client_factory or http_client)(server)
        # The config's settings objects are the runtime's: handed over, never copied.
        controller = ServerController(
            server.name, client, policies[server.name], Safeguards(config.safeguards),
            spec=server.ladder, settings=config.control.loop,
            apply_settings=config.control.apply, log=config.log, clock=clock, metrics=metrics,
            policy_name=server.policy)
        controllers.append(controller)
        if server.gate_listen is not None:
            gate = Gate(server.url, controller,
                        settings=GateSettings(tokenizer_path=server.tokenizer_path),
                        session=session)
            controller.request_log_listeners.append(gate.observe_request_log)
            controller.forwarded_kv_tokens = gate.forwarded_kv_tokens
            gates[server.name] = gate
    return Daemon(config, controllers, gates, metrics, session, clock)


async def run_daemon(config: DaemonConfig, *,
                     on_ready: Callable[[Daemon], None] | None = None) -> None:
    """The CLI entry: one ClientSession for everything, stop on SIGINT/SIGTERM."""
    timeout = aiohttp.ClientTimeout(total=None, connect=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        daemon = build_daemon(config, session)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, daemon.stop.set)
        await daemon.run(on_ready=on_ready)
