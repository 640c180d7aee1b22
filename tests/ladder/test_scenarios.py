"""The README's `ladder engine --scenario report`, steered as its banner suggests, really
steps: up for a long request through the gate, down after it (issue 17: with the default 4k
floor that scaled card gave one rung and the daemon never moved)."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import sys
from typing import Any

import aiohttp
import pytest

from ladder.demo import free_port
from tests.kit.prompts import words
from tests.ladder.test_daemon import wait_for


async def _spawn(*argv: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ladder.cli", *argv, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, env={**os.environ, **(env or {})})


async def _line(proc: asyncio.subprocess.Process, pattern: str) -> re.Match[str]:
    assert proc.stdout is not None
    async with asyncio.timeout(60):
        while True:
            line = (await proc.stdout.readline()).decode()
            assert line, "the process ended before printing what was expected"
            match = re.search(pattern, line)
            if match:
                return match


@pytest.mark.timeout(180)
async def test_the_report_scenario_steered_as_its_banner_says_steps_up_and_down() -> None:
    engine_port, gate_port = free_port(), free_port()
    engine = await _spawn("engine", "--scenario", "report", "--port", str(engine_port))
    procs = [engine]
    try:
        suggestion = await _line(engine, r"steer it with: ladder run (.*)$")
        flags = shlex.split(suggestion.group(1))
        assert "--kv-floor" in flags
        # The safeguards' minutes are shortened for the test; the ladder is the banner's.
        daemon = await _spawn(
            "run", *flags, "--gate", f"127.0.0.1:{gate_port}", "--listen", "127.0.0.1:0",
            "--poll-s", "0.2",
            env={"LADDER_SAFEGUARDS__COOLDOWN_S": "0", "LADDER_SAFEGUARDS__MIN_DWELL_S": "0"})
        procs.append(daemon)
        listen = int((await _line(daemon, r"daemon on :(\d+)")).group(1))
        status_url = f"http://127.0.0.1:{listen}/status"
        async with aiohttp.ClientSession() as session:
            doc = await wait_for(session, status_url, lambda d: d["servers"][0]["rung"] is not None)
            server = doc["servers"][0]
            assert len(server["ladder"]) >= 4
            start = server["rung"]
            async with session.post(f"http://127.0.0.1:{gate_port}/v1/completions", json={
                    "prompt": words(1200), "max_tokens": 16}) as resp:
                assert resp.status == 200, await resp.text()
            up: Any = await wait_for(session, status_url, lambda d: any(
                t["to_rung"] > start for t in _transitions(d)), timeout_s=30)
            peak = max(t["to_rung"] for t in _transitions(up))
            await wait_for(session, status_url,
                           lambda d: d["servers"][0]["rung"] is not None
                           and d["servers"][0]["rung"] < peak, timeout_s=60)
    finally:
        for proc in reversed(procs):
            proc.terminate()
            await proc.wait()


def _transitions(doc: Any) -> list[Any]:
    last = doc["servers"][0]["last_transition"]
    return [] if last is None else [last]
