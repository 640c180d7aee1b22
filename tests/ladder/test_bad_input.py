"""Bad input to the CLI: exit status 2 and one line on stderr naming what is wrong."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.reference.runtime import ReferenceEngine
from engine.reference.server import make_app
from ladder.cli import main
from ladder.demo import demo_engine_config

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "seed-rtx5080-status.json"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        raise SystemExit(main(argv))
    err = capsys.readouterr().err
    return int(info.value.code or 0), err


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(("toml", "names"), [
    ("[safeguards\ncooldown_s = 1\n", "toml"),
    ("[safeguards]\ncooldown = 5\n", "cooldown"),
    ("[[servers]]\nurl = \"http://127.0.0.1:1919\"\nbogus_key = 1\n", "bogus_key"),
    ("[control]\npoll_s = \"2 minutes\"\n", "poll_s"),
    ("[[servers]]\n[servers.ladder]\nkv_floor_tokens = \"lots\"\n", "kv_floor_tokens"),
    ("[[servers]]\n[servers.ladder]\nkv_floor_tokens = 4096\nkv_max_tokens = 2048\n",
     "kv_max_tokens"),
])
def test_config_check_rejects(tmp_path: Path, capsys: pytest.CaptureFixture[str], toml: str,
                              names: str) -> None:
    path = tmp_path / "ladder.toml"
    path.write_text(toml)
    code, err = run(["config", "check", str(path)], capsys)
    assert code == 2
    assert names in one_line(err).lower()


def test_config_check_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["config", "check", str(tmp_path / "nope.toml")], capsys)
    assert code == 2 and "nope.toml" in one_line(err)


@pytest.mark.parametrize("content", [None, "{not json", json.dumps({"state": "serving"}),
                                     "\udcff"])
def test_unreadable_status_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                content: str | None) -> None:
    path = tmp_path / "status.json"
    if content == "\udcff":
        path.write_bytes(b"\xff\xfe\x00garbage")
    elif content is not None:
        path.write_text(content)
    code, err = run(["plan", "--status", str(path), "--to", "moe=1024"], capsys)
    assert code == 2
    assert "--status" in one_line(err)


@pytest.mark.parametrize("to", ["moe=", "kv=lots", "moe=1024,moe=2", "gpu=3", "moe=-5", "",
                                "kv=64q"])
def test_bad_to_values(capsys: pytest.CaptureFixture[str], to: str) -> None:
    code, err = run(["plan", "--status", str(FIXTURE), "--to", to], capsys)
    assert code == 2, err
    one_line(err)


def test_bad_units_in_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["plan", "--status", str(FIXTURE), "--to", "moe=1024", "--reserve", "5 GB!"],
                    capsys)
    assert code == 2 and "reserve" in one_line(err)


# Every command: what a newcomer types wrong is exit 2 and one line naming the flag, never a
# traceback (an uncaught exception fails these tests before any assert).
DOWN = "127.0.0.1:9"  # nothing listens on the discard port


@pytest.mark.parametrize(("argv", "names"), [
    (["status", "--server", DOWN], "--server http://127.0.0.1:9"),
    (["rungs", "--server", DOWN], "--server"),
    (["plan", "--server", DOWN, "--to", "moe=128"], "--server"),
    (["apply", "--server", DOWN, "--to", "moe=128"], "--server"),
    (["status", "--server", "ftp://gpu0"], "--server"),
    (["status", "--server", "gpu0"], "HOST:PORT"),
    (["status", "--server", "gpu0:99999"], "--server"),
    (["plan", "--status", str(FIXTURE), "--to", "moe=1024", "--reserve", "100GiB"],
     "--reserve 100.0 GiB leaves nothing"),
    (["rungs", "--status", str(FIXTURE), "--fixed-bytes", "6GB"], "--fixed-bytes"),
    (["rungs", "--status", str(FIXTURE), "--kv-floor", "0"], "--kv-floor"),
    (["rungs", "--status", str(FIXTURE), "--kv-ratio", "0.5"], "--kv-ratio"),
    (["rungs", "--status", str(FIXTURE), "--kv-floor", "8k", "--kv-max", "4k"], "--kv-max"),
    (["run", "--server", DOWN, "--kv-floor", "0"], "--kv-floor"),
    (["run", "--server", DOWN, "--poll-s", "0"], "--poll-s"),
    (["run", "--server", DOWN, "--policy", "nosuch"], "nosuch"),
    (["run", "--server", DOWN, "--policy-option", "bogus=1"], "bogus"),
    (["run", "--server", DOWN, "--policy-option", "growth_tokens=-5"], "growth_tokens"),
    (["run", "--server", DOWN, "--policy-option", "no-equals-sign"], "KEY=VALUE"),
    (["run", "--server", DOWN, "--listen", "nowhere"], "listen"),
    (["engine"], "--device-memory-bytes"),
    (["engine", "--device-memory-bytes", "1MiB"], "fit"),
    (["engine", "--device-memory-bytes", "64MiB", "--pause-budget-ms", "-1"],
     "--pause-budget-ms"),
    (["demo", "--plot", "/nonexistent-folder/run.png"], "/nonexistent-folder"),
    (["demo", "--seed", "many"], "--seed"),
    (["policies", "--verbose"], "unrecognized arguments"),
    (["config"], "required: check"),
    (["config", "check"], "FILE"),
    (["nosuch"], "invalid choice"),
])
def test_every_command_refuses_bad_input_in_one_line(
        capsys: pytest.CaptureFixture[str], argv: list[str], names: str) -> None:
    code, err = run(argv, capsys)
    assert code == 2, err
    assert names in one_line(err)


@pytest.mark.parametrize("toml", [
    '[[servers]]\npolicy = "nosuch"\n',
    '[[servers]]\npolicy = "headroom"\n[servers.policy_options]\nheadroom_tokens = "8k"\n',
    '[[servers]]\npolicy = "headroom"\n[servers.policy_options]\ndwell_s = "long"\n',
])
def test_config_check_builds_the_policy_with_its_options(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], toml: str) -> None:
    # The run that `config check` passes must not then die on the policy (issue 17).
    path = tmp_path / "ladder.toml"
    path.write_text(toml)
    code, err = run(["config", "check", str(path)], capsys)
    assert code == 2
    assert one_line(err).startswith("ladder: error: servers[0].policy")


@pytest.mark.parametrize("command", [["engine", "--device-memory-bytes", "64MiB"], ["demo"]])
def test_engine_and_demo_without_torch_say_which_extra_to_install(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        command: list[str]) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails, as uninstalled
    code, err = run(command, capsys)
    assert code == 2
    line = one_line(err)
    assert ".[engine]" in line and "needs torch" in line


def test_engine_on_a_port_in_use_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = run(["engine", "--device-memory-bytes", "64MiB", "--port", str(port)],
                        capsys)
    assert code == 2
    assert f"--port {port}: cannot listen" in one_line(err)


async def test_a_401_names_the_flag_and_the_variable(
        aiohttp_server: Any, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LADDER_API_KEY", raising=False)
    monkeypatch.delenv("FREETOKEN_API_KEY", raising=False)
    engine = ReferenceEngine(demo_engine_config())
    server = await aiohttp_server(make_app(engine, api_key="right"))
    where = f"127.0.0.1:{server.port}"
    for argv, sent in ((["status", "--server", where], "no API key was sent"),
                       (["status", "--server", where, "--api-key", "wrong"],
                        "the key sent was refused")):
        code, err = await asyncio.to_thread(run, argv, capsys)
        line = one_line(err)
        assert code == 2 and "401" in line and sent in line
        assert "--api-key" in line and "$LADDER_API_KEY" in line and "wrong" not in line
    code, _ = await asyncio.to_thread(run, ["status", "--server", where, "--api-key", "right"],
                                      capsys)
    assert code == 0
