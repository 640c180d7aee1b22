"""End to end against the real `ft serve` 0.1.2 on the GPU machine (or the reference engine).

One run, one output folder (JSON + logs), every process cleaned up by PID:
1. boot `ft serve` on a nearly full card (a filler process leaves ~10 GiB), timing the boot;
2. fill KV to 99 % of the budget, send the motivating transition (MoE grows, KV shrinks) as ONE
   rebuild call: OOM and rollback; then `ladder apply` to the same target from the same
   geometry: reached, no rejected or failed call;
3. `ladder run --gate` (in process) with a short trace through the gate: the rung steps up
   before a long request and back down after; the daemon's /metrics scraped during the run;
   decode tokens/s per rung;
4. one call that grows KV while shrinking a large mamba pool (FreeToken #526): record what the
   server really does, then restart it, rebuild the same geometry and show that `ladder apply`
   plans and sends it as two safe calls instead;
5. `default_boot`: boot as users do, without `--num-tokens` (ft serve fills KV itself and lands a
   little above its reported budget), then through the real CLI: `status` and its ranges (the
   max of each "reachable now" plans, one more is refused), `plan` of pure shrinks (one call each),
   `apply` onto the top rung and down to the bottom rung (at most two calls each, each landing on
   its rung); restart the same way and run `ladder run --gate` (in process): its first move from
   the boot geometry, then stepping up before a long request and down after.

`--phases` picks `fixed` (1-4, on a `--num-tokens` boot) and/or `default_boot` (5), in order.

`--reference` runs the same script against the reference engine on the CPU (for developing
the script without a GPU): same API, same phases.

    python bench/ftserve_e2e.py --out OUT --model /tmp/tiny-moe --filler .ftserve/filler.py \
        [--phases fixed,default_boot]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.ftserve.budget import MemoryModel
from engine.ftserve.geometry import CacheStatus, Geometry
from engine.ftserve.planner import plan_transition
from ladder.client import ClientError, FtServeClient
from ladder.config import merge
from ladder.daemon import build_daemon
from ladder.executor import ApplySettings, apply_target
from ladder.sse import generated_text

APPLY = ApplySettings(poll_s=0.1, backoff_base_s=0.2, backoff_max_s=2.0, idle_wait_s=120,
                      settle_wait_s=300, rebuild_wait_s=300)


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.result: dict[str, Any] = {"server": "reference" if args.reference else "ft serve",
                                       "phases": {}}
        self.url = f"http://127.0.0.1:{args.port}"
        self.server: subprocess.Popen[bytes] | None = None

    # ---- processes -----------------------------------------------------------------------

    def spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None
              ) -> subprocess.Popen[bytes]:
        log = open(self.out / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def cleanup(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                self.kill(proc)

    def start_filler(self) -> None:
        if self.args.reference or not self.args.filler:
            return
        ready = Path("/tmp/filler.ready")
        ready.unlink(missing_ok=True)
        self.spawn("filler", [sys.executable, self.args.filler, "--leave-gib",
                              str(self.args.leave_gib), "--ready", str(ready)])
        deadline = time.monotonic() + 60
        while not ready.exists():
            if time.monotonic() > deadline:
                raise RuntimeError("filler did not start")
            time.sleep(0.2)
        self.result["filler"] = json.loads(ready.read_text())

    async def boot(self, label: str, *, kv_sized_by_server: bool = False
                   ) -> tuple[subprocess.Popen[bytes], float]:
        """Boot the server; `kv_sized_by_server` leaves KV to it, as users boot ft serve."""
        a = self.args
        if a.reference:
            kv = ["--kv-tokens", "auto"] if kv_sized_by_server else ["--kv-tokens", "20000"]
            cmd = [sys.executable, "-m", "ladder.cli", "engine", "--port", str(a.port),
                   "--rebuild-mode", "freetoken", "--device-memory-bytes", "96MiB",
                   "--memory-ratio", "0.9", *kv, "--moe-cache-size", "128",
                   "--mamba-slots", "8", "--max-running-requests", "1", "--max-seq-len", "8192",
                   "--experts", "64", "--layers", "8", "--hidden", "64", "--expert-hidden", "128"]
        else:
            kv = [] if kv_sized_by_server else ["--num-tokens", "1000000"]
            cmd = [sys.executable, "-m", "freetoken.cli", "serve", "--model-path", a.model,
                   "--served-model-name", "tiny-moe", "--host", "127.0.0.1", "--port",
                   str(a.port), "--moe-backend", "offload", "--moe-cache-size", "128", *kv,
                   "--max-running-requests", "1", "--memory-ratio", "0.9",
                   "--max-prefill-length", "2048"]
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        started = time.monotonic()
        proc = self.spawn(f"server-{label}", cmd, env)
        async with FtServeClient(self.url, timeout_s=5) as client:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited with {proc.returncode} during boot")
                with contextlib.suppress(ClientError):
                    if (await client.cache_status()).state == "serving":
                        break
                if time.monotonic() - started > a.boot_timeout_s:
                    raise RuntimeError("server did not reach serving in time")
                await asyncio.sleep(0.5)
        return proc, time.monotonic() - started

    # ---- helpers ---------------------------------------------------------------------------

    @staticmethod
    def fill_kv_target(status: CacheStatus, fill: float) -> Geometry:
        model = MemoryModel.from_status(status)
        g = status.geometry
        free = int(model.budget_bytes * fill) - model.moe_bytes(g.moe_cache_size) - (
            model.mamba_bytes(g.num_mamba_slots))
        pages = free // model.kv_bytes_per_page - 1
        return g.with_sizes(num_pages=pages)

    async def decode_tps(self, client_session: aiohttp.ClientSession, tokens: int) -> float:
        body = {"model": "tiny-moe", "prompt": "hello world", "max_tokens": tokens,
                "temperature": 0.0, "stream": True, "ignore_eos": True}
        first = last = None
        count = 0
        async with client_session.post(f"{self.url}/v1/completions", json=body) as resp:
            async for line in resp.content:
                if generated_text(line):
                    count += 1
                    last = time.perf_counter()
                    first = first or last
        if first is None or last is None or count < 2:
            return 0.0
        return (count - 1) / (last - first)

    async def cli(self, *args: str) -> tuple[int, Any]:
        """Run the real `ladder` CLI against the server, as a user would; (exit code, JSON)."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ladder.cli", *args, "--server", self.url, "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        assert proc.returncode is not None
        try:
            return proc.returncode, json.loads(out)
        except json.JSONDecodeError:
            return proc.returncode, {"stdout": out.decode()[-2000:],
                                     "stderr": err.decode()[-2000:]}

    # ---- phases -----------------------------------------------------------------------------

    async def motivating(self, client: FtServeClient) -> dict[str, Any]:
        status = await client.cache_status()
        phase: dict[str, Any] = {"boot_geometry": status.geometry.to_json(),
                                 "cache_budget_bytes": status.cache_budget_bytes}
        filled = self.fill_kv_target(status, 0.99)
        fill = await apply_target(client, lambda _s: filled, settings=APPLY)
        phase["fill_kv_99"] = {"reached": fill.reached, "steps": fill.to_json()["steps"]}
        status = await client.cache_status()
        model = MemoryModel.from_status(status)
        grow = 4 * status.geometry.moe_cache_size
        freed_pages = (grow - status.geometry.moe_cache_size) * model.units.moe_per_expert // (
            model.kv_bytes_per_page) + 1
        target = status.geometry.with_sizes(moe_cache_size=grow,
                                            num_pages=status.geometry.num_pages - freed_pages)
        plan = plan_transition(model, status.geometry, target)
        phase["target"] = target.to_json()
        phase["plan"] = plan.to_json()
        started = time.monotonic()
        single = await client.rebuild(target.to_json(), wait_s=300)
        phase["single_call"] = {"kind": single.kind, "http_status": single.http_status,
                                "error": single.error,
                                "seconds": round(time.monotonic() - started, 3)}
        after_single = await client.cache_status()
        phase["after_single_call"] = {"state": after_single.state,
                                      "geometry": after_single.geometry.to_json()}
        applied = await apply_target(client, lambda _s: target, settings=APPLY)
        phase["apply"] = applied.to_json()
        phase["apply_kinds"] = [s.kind for s in applied.steps]
        return phase

    async def daemon_trace(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        gate_port = self.args.gate_port or self.args.port + 101  # clear of ft serve's ports
        config = merge({
            "servers": [{"name": "e2e", "url": self.url,
                         "gate_listen": f"127.0.0.1:{gate_port}",
                         # module:attr: on the GPU machine the project is not pip-installed,
                         # so its entry points are not registered there.
                         "policy": "policies.headroom:Headroom",
                         "policy_options": {"margin": 0.1, "growth_tokens": 64, "dwell_s": 5},
                         "ladder": {"kv_floor_tokens": 512}}],
            "safeguards": {"cooldown_s": 1.0, "min_dwell_s": 2.0},
            "control": {"poll_s": 0.5, "apply_poll_s": 0.1},
            "listen": {"port": 0}})
        daemon = build_daemon(config, session)
        controller = daemon.controllers[0]
        task = asyncio.create_task(daemon.run())
        phase: dict[str, Any] = {"requests": [], "metrics_scrapes": 0}
        try:
            while controller.rung is None or controller.transition_running():
                if task.done():  # the daemon stopped: say why instead of waiting forever
                    task.result()
                    raise RuntimeError("the daemon stopped before settling on a rung")
                await controller.wait_changed(1.0)
            phase["ladder"] = [r.to_json() for r in controller.ladder.rungs]  # type: ignore[union-attr]
            phase["start_rung"] = controller.rung
            gate = f"http://127.0.0.1:{gate_port}"
            listen = daemon.listening["daemon"]
            trace = [("short", 64, 32), ("short", 200, 32), ("long", 6000, 64),
                     ("short", 100, 32)]
            for kind, prompt_words, max_tokens in trace:
                if kind == "short" and phase["requests"] and phase["requests"][-1]["kind"] == (
                        "long"):
                    await asyncio.sleep(8.0)  # past the dwell: the daemon steps down
                rung_before = controller.rung
                prompt = " ".join(f"w{i % 900}" for i in range(prompt_words))
                started = time.perf_counter()
                async with session.post(f"{gate}/v1/completions", json={
                        "model": "tiny-moe", "prompt": prompt, "max_tokens": max_tokens,
                        "temperature": 0.0, "ignore_eos": True}) as resp:
                    body = await resp.json()
                usage = body.get("usage", {}) if resp.status == 200 else {}
                phase["requests"].append({
                    "kind": kind, "prompt_words": prompt_words, "max_tokens": max_tokens,
                    "http_status": resp.status, "completion_tokens": usage.get(
                        "completion_tokens"), "seconds": round(time.perf_counter() - started, 3),
                    "rung_before": rung_before, "rung_after": controller.rung})
                async with session.get(f"http://127.0.0.1:{listen}/metrics") as m:
                    text = await m.text()
                    phase["metrics_scrapes"] += 1
                    (self.out / "daemon_metrics.txt").write_text(text)
            phase["transitions"] = [
                {"from": t.from_rung, "to": t.to_rung, "reason": t.reason, "reached": t.reached,
                 "seconds": round(t.seconds, 3),
                 "steps": [{"body": s["body"], "kind": s["kind"], "seconds": s["seconds"]}
                           for s in t.result["steps"]]} for t in controller.transitions]
            phase["status"] = daemon.status_json()
        finally:
            daemon.stop.set()
            await task
        refused = [r for r in phase["requests"] if r["http_status"] != 200]
        truncated = [r for r in phase["requests"] if r["completion_tokens"] is not None
                     and r["completion_tokens"] < r["max_tokens"]]
        phase["refused"], phase["truncated"] = len(refused), len(truncated)
        return phase

    async def rung_speeds(self, client: FtServeClient, session: aiohttp.ClientSession
                          ) -> dict[str, Any]:
        status = await client.cache_status()
        speeds: dict[str, Any] = {}
        for slots in (status.floors.moe_slots * 2, status.shape.max_expert_slots):
            target = status.geometry.with_sizes(moe_cache_size=slots)
            result = await apply_target(client, lambda _s, t=target: t, settings=APPLY)
            await self.decode_tps(session, 32)  # warm the expert cache
            speeds[str(slots)] = {"reached": result.reached,
                                  "decode_tps": round(await self.decode_tps(session, 256), 1)}
        return speeds

    async def issue_526(self, client: FtServeClient) -> dict[str, Any]:
        status = await client.cache_status()
        model = MemoryModel.from_status(status)
        g = status.geometry
        # A large mamba pool beside KV filled to ~99 % of the budget.
        big_mamba = max(g.num_mamba_slots,
                        int(model.budget_bytes * 0.3) // model.units.mamba_per_slot)
        prep = Geometry(min(g.moe_cache_size, 2 * model.floors.moe_slots), 1000, big_mamba)
        setup = [await apply_target(client, lambda _s: prep, settings=APPLY)]
        status = await client.cache_status()
        filled = self.fill_kv_target(status, 0.99)
        setup.append(await apply_target(client, lambda _s: filled, settings=APPLY))
        status = await client.cache_status()
        model = MemoryModel.from_status(status)
        g = status.geometry
        small = model.floors.mamba_slots
        grow_pages = (g.num_mamba_slots - small) * model.units.mamba_per_slot // (
            model.kv_bytes_per_page) - 2
        target = Geometry(g.moe_cache_size, g.num_pages + grow_pages, small)
        plan = plan_transition(model, g, target)
        phase: dict[str, Any] = {"setup_reached": [r.reached for r in setup],
                                 "from": g.to_json(), "target": target.to_json(),
                                 "plan": plan.to_json()}
        started = time.monotonic()
        single = await client.rebuild(target.to_json(), wait_s=300)
        phase["single_call"] = {"kind": single.kind, "http_status": single.http_status,
                                "error": single.error, "latched": single.latched,
                                "seconds": round(time.monotonic() - started, 3)}
        health = await client.health()
        phase["after_single_call"] = {"health_status": health.status,
                                      "maintenance": health.maintenance}
        return phase

    async def issue_526_with_ladder(self, client: FtServeClient, phase: dict[str, Any]
                                    ) -> dict[str, Any]:
        start = Geometry(**phase["from"])
        target = Geometry(**phase["target"])
        setup = await apply_target(client, lambda _s: start, settings=APPLY)
        applied = await apply_target(client, lambda _s: target, settings=APPLY)
        health = await client.health()
        return {"setup_reached": setup.reached, "apply": applied.to_json(),
                "apply_kinds": [s.kind for s in applied.steps],
                "after_apply_maintenance": health.maintenance}

    async def default_boot_cli(self) -> dict[str, Any]:
        """`status`, `plan` and `apply` through the CLI on a server that sized KV itself."""
        code, status = await self.cli("status")
        if code != 0:
            raise RuntimeError(f"ladder status exited {code}: {status}")
        g = status["geometry"]
        page_tokens = next(r for r in status["ranges"] if r["pool"] == "kv")["current"] // (
            g["num_pages"])
        phase: dict[str, Any] = {
            "boot_geometry": g, "allocated_bytes": status["allocated_bytes"],
            "budget_bytes": status["budget_bytes"],
            "over_budget_bytes": status["allocated_bytes"] - status["budget_bytes"],
            "ranges": status["ranges"], "rungs": status["rungs"]}

        def to(sizes: dict[str, int]) -> str:
            merged = {**g, **sizes}
            return (f"moe={merged['moe_cache_size']},kv_pages={merged['num_pages']},"
                    f"mamba={merged['num_mamba_slots']}")

        async def plan(sizes: dict[str, int]) -> dict[str, Any]:
            code, doc = await self.cli("plan", "--to", to(sizes))
            return {"to": to(sizes), "exit": code, "feasible": doc.get("feasible"),
                    "calls": len(doc.get("steps", [])), "peak_bytes": doc.get("peak_bytes"),
                    "live_bytes": doc.get("live_bytes"),
                    "live_over_budget_bytes": doc.get("live_over_budget_bytes"),
                    "reason": doc.get("reason")}

        floors = {r["pool"]: r["min"] for r in status["ranges"]}
        field = {"moe": "moe_cache_size", "kv": "num_pages", "mamba": "num_mamba_slots"}

        def in_units(pool: str, size: int) -> int:
            return size // page_tokens if pool == "kv" else size

        # The report's commands first: a pure KV shrink, and KV shrink + MoE grow.
        half = g["num_pages"] // 2
        phase["plans"] = {
            "kv_half": await plan({"num_pages": half}),
            "moe_double_kv_half": await plan({"num_pages": half,
                                              "moe_cache_size": 2 * g["moe_cache_size"]}),
            "all_to_floors": await plan({field[p]: in_units(p, n) for p, n in floors.items()}),
        }
        # `status` must never advertise a size `plan` refuses; one more must be refused.
        phase["ranges_checked"] = {}
        for r in status["ranges"]:
            top = in_units(r["pool"], r["max_keeping_others"])
            cap = in_units(r["pool"], r["advertised_max"])
            checked = {"max": await plan({field[r["pool"]]: top})}
            if top < cap:
                checked["max_plus_one"] = await plan({field[r["pool"]]: top + 1})
            phase["ranges_checked"][r["pool"]] = checked
        # Onto the top rung from the boot geometry, then down to the bottom one.
        phase["applies"] = []
        for rung in (status["rungs"][-1], status["rungs"][0]):
            sizes = {f: rung[f] for f in field.values()}
            code, doc = await self.cli("apply", "--to", to(sizes), "--wait-s", "120")
            _, after = await self.cli("status")
            phase["applies"].append({
                "rung": rung["index"], "to": to(sizes), "exit": code,
                "reached": doc.get("reached"), "reason": doc.get("reason"),
                "steps": [{k: s_[k] for k in ("body", "kind", "http_status", "seconds")}
                          for s_ in doc.get("steps", [])],
                "live_rung_after": after.get("live_rung"), "geometry_after": after.get(
                    "geometry"), "state_after": after.get("state")})
        plans, applies = phase["plans"], phase["applies"]
        phase["checks"] = {
            "live_over_budget_reported": phase["over_budget_bytes"] == (
                plans["kv_half"]["live_over_budget_bytes"]),
            "pure_shrinks_one_call": all(p["exit"] == 0 and p["calls"] == 1 for k, p in
                                         plans.items() if k != "moe_double_kv_half"),
            "shrink_then_grow_feasible": plans["moe_double_kv_half"]["exit"] == 0,
            "ranges_max_plans": all(c["max"]["exit"] == 0
                                    for c in phase["ranges_checked"].values()),
            "ranges_max_plus_one_refused": all(c["max_plus_one"]["exit"] == 1 for c in
                                               phase["ranges_checked"].values()
                                               if "max_plus_one" in c),
            "applies_reach_rung_in_two_calls": all(
                a["exit"] == 0 and a["reached"] and len(a["steps"]) <= 2
                and all(s_["kind"] == "ok" for s_ in a["steps"])
                and a["live_rung_after"] == a["rung"] for a in applies),
        }
        return phase

    async def phase(self, name: str, limit_s: float, work: Any) -> Any:
        """Run one phase within `limit_s`; a failure is recorded and the run goes on."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(limit_s):
                value = await work
        except Exception as exc:  # noqa: BLE001 - recorded in the result, next phase runs
            value = {"error": f"{type(exc).__name__}: {exc}"}
        if isinstance(value, dict):
            value["phase_seconds"] = round(time.monotonic() - started, 2)
        self.result["phases"][name] = value
        self.save()
        return value

    async def main(self) -> None:
        self.start_filler()
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for name in self.args.phases:
                await {"fixed": self.fixed_phases, "default_boot": self.default_boot_phases
                       }[name](session)
        self.save()

    async def restart(self, label: str, *, kv_sized_by_server: bool) -> None:
        if self.server is not None:
            self.kill(self.server)
        self.server, boot_s = await self.boot(label, kv_sized_by_server=kv_sized_by_server)
        self.result.setdefault("boot_s", {})[label] = round(boot_s, 1)

    async def default_boot_phases(self, session: aiohttp.ClientSession) -> None:
        await self.restart("default-1", kv_sized_by_server=True)
        await self.phase("default_boot_cli", 240, self.default_boot_cli())
        # A fresh default boot, so the daemon's first move starts from ft serve's own geometry.
        await self.restart("default-2", kv_sized_by_server=True)
        trace = await self.phase("default_boot_daemon", 150, self.daemon_trace(session))
        if "transitions" in trace:
            first, moves = trace["transitions"][0], trace["transitions"][1:]
            trace["checks"] = {
                "first_move_from_boot_reaches_rung_in_two_calls": first["from"] is None
                and first["reached"] and len(first["steps"]) <= 2,
                "steps_up_and_down": any(m["to"] > m["from"] for m in moves)
                and any(m["to"] < m["from"] for m in moves),
                "every_call_ok": all(s_["kind"] == "ok" for t in trace["transitions"]
                                     for s_ in t["steps"]),
                "no_request_refused": trace["refused"] == 0,
            }
            self.save()

    async def fixed_phases(self, session: aiohttp.ClientSession) -> None:
        await self.restart("1", kv_sized_by_server=False)
        async with FtServeClient(self.url, timeout_s=30, session=session) as client:
            await self.phase("motivating", 120, self.motivating(client))
            await self.phase("decode_tps_by_slots", 60, self.rung_speeds(client, session))
        await self.phase("daemon_gate_trace", 120, self.daemon_trace(session))
        async with FtServeClient(self.url, timeout_s=30, session=session) as client:
            phase = await self.phase("issue_526", 90, self.issue_526(client))
        if "target" not in phase:
            return
        await self.restart("2", kv_sized_by_server=False)
        async with FtServeClient(self.url, timeout_s=30, session=session) as client:
            await self.phase("issue_526_ladder", 90, self.issue_526_with_ladder(client, phase))

    def save(self) -> None:
        (self.out / "result.json").write_text(json.dumps(self.result, indent=2))


PHASES = ("fixed", "default_boot")


def _phases(value: str) -> list[str]:
    chosen = list(dict.fromkeys(value.split(",")))
    if set(chosen) - set(PHASES):
        raise argparse.ArgumentTypeError(f"pick from {','.join(PHASES)}, got {value!r}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder (JSON + logs)")
    ap.add_argument("--model", default="/tmp/tiny-moe", help="checkpoint folder")
    ap.add_argument("--filler", default=None, help="filler.py from the ftserve-gpu recipe")
    ap.add_argument("--leave-gib", type=float, default=10.0)
    ap.add_argument("--port", type=int, default=18919)
    ap.add_argument("--gate-port", type=int, default=None,
                    help="the daemon's gate (default: --port + 101)")
    ap.add_argument("--boot-timeout-s", type=float, default=240.0)
    ap.add_argument("--phases", type=_phases, default=list(PHASES),
                    help="comma-separated, run in this order: fixed (a --num-tokens boot: "
                    "motivating, decode, daemon, #526) and/or default_boot (KV sized by the "
                    "server); default both")
    ap.add_argument("--reference", action="store_true",
                    help="run against the reference engine on the CPU instead of ft serve")
    args = ap.parse_args(argv)
    run = Run(args)
    try:
        asyncio.run(run.main())
    except Exception as exc:  # noqa: BLE001 - the run must save what it has and clean up
        run.result["error"] = f"{type(exc).__name__}: {exc}"
        run.save()
        print(json.dumps(run.result, indent=2))
        return 1
    finally:
        run.cleanup()
    print(json.dumps(run.result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
