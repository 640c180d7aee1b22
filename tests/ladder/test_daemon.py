"""`ladder run` as a process: endpoints, restart from the live geometry, graceful SIGTERM."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest

from engine.reference.runtime import ReferenceEngine
from engine.reference.scenarios import report_config
from engine.reference.server import make_app


async def start_daemon(url: str, *extra: str) -> tuple[asyncio.subprocess.Process, int]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ladder.cli", "run", "--server", url, "--listen", "127.0.0.1:0",
        "--poll-s", "0.2", *extra, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env={"LADDER_SERVERS__0__LADDER__KV_FLOOR_TOKENS": "256", "PATH": ""})
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), timeout=60)).decode()
    match = re.search(r"daemon on :(\d+)", line)
    assert match, line
    return proc, int(match.group(1))


async def wait_for(session: aiohttp.ClientSession, url: str,
                   predicate: Callable[[Any], bool], timeout_s: float = 30.0) -> Any:
    async with asyncio.timeout(timeout_s):
        while True:
            async with session.get(url) as resp:
                doc = await resp.json()
            if predicate(doc):
                return doc
            await asyncio.sleep(0.05)


@pytest.mark.timeout(120)
async def test_daemon_endpoints_restart_and_sigterm(aiohttp_server: Any) -> None:
    engine = ReferenceEngine(report_config("incremental"))
    server = await aiohttp_server(make_app(engine))
    url = str(server.make_url("")).rstrip("/")
    proc, port = await start_daemon(url)
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{base}/healthz") as resp:
            assert resp.status == 200
        status = await wait_for(session, f"{base}/status",
                                lambda d: d["servers"][0]["rung"] is not None)
        assert status["schema_version"] == "moe-ladder.status.v1"
        first = status["servers"][0]
        assert first["ladder"] and first["last_decision"]["reason"]
        async with session.get(f"{base}/readyz") as resp:
            assert resp.status == 200
        async with session.get(f"{base}/metrics") as resp:
            text = await resp.text()
        assert 'ladder_rung{server="default"}' in text
        assert "ladder_server_decode_tokens_per_second" in text
        # The live sizes are named for what they are, and the server's running total of
        # completion tokens is a counter, so rate() applies to it.
        kv_tokens = engine.geometry().num_pages * engine.config.model.page_size
        assert f'ladder_live_kv_tokens{{server="default"}} {float(kv_tokens)}' in text
        assert "# TYPE ladder_server_completion_tokens_total counter" in text
        assert 'ladder_server_completion_tokens_total{server="default"}' in text
        # Every monotonic instant in /status has its wall-clock twin.
        sg = first["safeguards"]
        assert sg["as_of_s"] is not None and sg["as_of_at"].endswith("+00:00")
        assert status["as_of_at"][:4] == str(datetime.now(UTC).year)
        # The daemon moved the engine onto its ladder; a restarted daemon starts from there.
        on_ladder = engine.geometry().to_json()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=20) == 0
        proc, port = await start_daemon(url)
        status = await wait_for(session, f"http://127.0.0.1:{port}/status",
                                lambda d: d["servers"][0]["rung"] is not None)
        assert status["servers"][0]["geometry"] == on_ladder
        assert status["servers"][0]["last_transition"] is None  # nothing to redo
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), timeout=20) == 0


async def test_daemon_survives_a_down_server_and_says_why() -> None:
    proc, port = await start_daemon("http://127.0.0.1:9")  # nothing listens there
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{base}/healthz") as resp:
            assert resp.status == 200  # liveness never depends on the engine
        doc = await wait_for(session, f"{base}/status",
                             lambda d: d["servers"][0]["last_error"] is not None)
        assert "127.0.0.1:9" in json.dumps(doc)
        async with session.get(f"{base}/readyz") as resp:
            assert resp.status == 503
            assert (await resp.json())["status"] == "not_ready"
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), timeout=20) == 0


def test_status_instants_get_wall_clock_twins_and_durations_do_not() -> None:
    from ladder.daemon import with_wall_times

    wall_s = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC).timestamp()
    doc = [{"safeguards": {"rung_since_s": 70.0, "cooldown_s": 60.0, "backoff_until_s": None},
            "last_transition": {"started_s": 100.0, "seconds": 1.5}}]
    out = with_wall_times(doc, 100.0, wall_s)[0]
    assert out["safeguards"]["rung_since_at"] == "2026-12-04T11:59:30.000+00:00"
    assert out["last_transition"]["started_at"] == "2026-12-04T12:00:00.000+00:00"
    assert "cooldown_at" not in out["safeguards"] and "backoff_until_at" not in out["safeguards"]
    assert "seconds_at" not in out["last_transition"]
