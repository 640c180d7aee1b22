"""Security defaults: loopback binds, the API key forwarded but never shown, no shell anywhere.

Why as tests: each of these is one careless edit away from regressing (a debug log of the
headers, a `/status` that dumps the config, a `0.0.0.0` default), and none would fail a
functional test.
"""

from __future__ import annotations

import ast
import json
import logging
from pathlib import Path

import aiohttp
import pytest

from engine.reference.runtime import ReferenceEngine
from engine.reference.scenarios import report_config
from engine.reference.server import make_app
from ladder.client import FtServeClient
from ladder.config import DaemonConfig, ListenConfig, ServerConfig
from ladder.daemon import build_daemon

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-secret-0123456789abcdef"

# Modules allowed to start processes, with why; today there are none.
SHELL_EXCEPTIONS: dict[str, str] = {}
SHELL_NAMES = ("subprocess", "os.system", "os.popen", "os.spawn", "os.exec", "pty",
               "asyncio.create_subprocess")


def test_listeners_default_to_loopback() -> None:
    config = DaemonConfig()
    assert config.listen.host == "127.0.0.1"
    assert all(s.gate_listen is None for s in config.servers)
    assert config.servers[0].url.startswith("http://127.0.0.1:")
    assert ListenConfig().token is None


def test_secrets_stay_out_of_repr() -> None:
    server = ServerConfig(api_key=KEY)
    assert KEY not in repr(server) and KEY not in repr(DaemonConfig(servers=(server,)))
    assert KEY not in repr(FtServeClient("http://127.0.0.1:1", api_key=KEY))


async def test_key_is_forwarded_never_logged_nor_in_status(
        aiohttp_server: object, caplog: pytest.LogCaptureFixture) -> None:
    engine = ReferenceEngine(report_config("freetoken"))
    server = await aiohttp_server(make_app(engine, api_key=KEY))  # type: ignore[operator]
    url = str(server.make_url("")).rstrip("/")
    caplog.set_level(logging.DEBUG)
    async with FtServeClient(url, api_key=KEY, timeout_s=5) as client:
        status = await client.cache_status()  # 200 only because the key went out
        outcome = await client.rebuild({"num_pages": status.geometry.num_pages // 2}, wait_s=5)
        assert outcome.kind == "ok"
    async with FtServeClient(url, api_key="wrong-key", timeout_s=5) as bad:
        assert (await bad.rebuild({"num_pages": 8}, wait_s=5)).kind == "unauthorized"
    config = DaemonConfig(servers=(ServerConfig(url=url, api_key=KEY),))
    async with aiohttp.ClientSession() as session:
        daemon = build_daemon(config, session)
        await daemon.controllers[0].tick()
        assert daemon.controllers[0].status is not None  # it really talked to the server
        doc = json.dumps(daemon.status_json())
    assert KEY not in doc
    assert KEY not in caplog.text
    for record in caplog.records:
        assert KEY not in repr(record.__dict__)


async def test_warns_when_listening_beyond_loopback_without_a_token(
        caplog: pytest.LogCaptureFixture) -> None:
    from aiohttp import web

    config = DaemonConfig()
    async with aiohttp.ClientSession() as session:
        daemon = build_daemon(config, session)
        caplog.set_level(logging.WARNING)
        runner = await daemon._listen("daemon", web.Application(), "0.0.0.0", 0,
                                      has_token=False)
        await runner.cleanup()
        quiet = await daemon._listen("daemon", web.Application(), "127.0.0.1", 0,
                                     has_token=False)
        await quiet.cleanup()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "beyond loopback" in warnings[0].getMessage()


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update(f"{node.module}.{a.name}" for a in node.names)
            names.add(node.module)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            names.add(f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.keyword) and node.arg == "shell":
            names.add("shell=")
    return names


@pytest.mark.parametrize("package", ["ladder", "engine", "policies"])
def test_nothing_runs_a_shell(package: str) -> None:
    hits = []
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel in SHELL_EXCEPTIONS:
            continue
        hits.extend((rel, name) for name in _imports(path) if name == "shell=" or any(
            name == s or name.startswith(s + ".") or (
                name.startswith(s) and s.endswith(("spawn", "exec"))) for s in SHELL_NAMES))
    assert hits == [], hits
