"""`ladder plan`, `ladder rungs`, `ladder status`: output, the --json contract, exit codes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.reference.runtime import ReferenceEngine
from engine.reference.server import make_app
from ladder.cli import _engine_config, build_parser, main
from ladder.demo import demo_engine_config
from tests.conftest import FIXTURES

REPORT = str(FIXTURES / "seed-rtx5080-status.json")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("to", "bodies"),
    [
        ("moe=1024,kv=65536", [{"num_pages": 1024}, {"moe_cache_size": 1024}]),
        ("moe=1400,kv=8192,mamba=4",
         [{"num_pages": 128, "num_mamba_slots": 4}, {"moe_cache_size": 1400}]),
        ("moe=1k,kv=64k", [{"num_pages": 1024}, {"moe_cache_size": 1024}]),
    ],
)
def test_plan_json_for_the_report(capsys: pytest.CaptureFixture[str], to: str,
                                  bodies: list[dict[str, int]]) -> None:
    code, out, _ = run(capsys, "plan", "--status", REPORT, "--to", to, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["feasible"] is True
    assert doc["engine"] == "freetoken"
    assert [s["body"] for s in doc["steps"]] == bodies
    assert doc["peak_bytes"] <= doc["budget_bytes"] < doc["single_call_peak_bytes"]
    assert doc["to"] == doc["steps"][-1]["after"]


def test_plan_table_shows_the_single_call_next_to_the_plan(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "plan", "--status", REPORT, "--to", "moe=1024,kv=64k")
    assert code == 0
    assert '{"num_pages": 1024}' in out and '{"moe_cache_size": 1024}' in out
    assert "as one call: peak 5.5 GiB" in out and "OOM" in out


def test_infeasible_plan_exits_1_with_reason(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--status", REPORT, "--to", "moe=2000,kv=64", "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["feasible"] is False and "over the budget" in doc["reason"]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["plan", "--status", REPORT, "--to", "moe=abc"], "--to moe: 'abc' is not a count"),
        (["plan", "--status", REPORT, "--to", "experts=5"], "is not pool=size"),
        (["plan", "--status", REPORT, "--to", "kv=1k,kv_pages=3"], "not both"),
        (["plan", "--status", "/nonexistent.json", "--to", "moe=1"], "cannot read --status"),
        (["plan", "--status", REPORT, "--server", "http://127.0.0.1:1", "--to", "moe=1"],
         "not both"),
        (["rungs", "--status", REPORT, "--kv-ratio", "0.5"], "--kv-ratio must be greater than 1"),
        (["plan", "--status", REPORT], "--to"),
        (["rungs", "--status", REPORT, "--reserve", "lots"], "byte size"),
        (["engine", "--kv-tokens", "some"], "--kv-tokens"),
        (["engine", "--cache-budget", "64MiB", "--boot-drift", "1MiB"],
         "a boot drift applies only to KV sized at boot"),
        (["engine", "--cache-budget", "64MiB", "--kv-tokens", "auto", "--boot-drift=-x"],
         "--boot-drift"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str],
                                         words: str) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    _, err = capsys.readouterr()
    assert code == 2
    assert words in err
    assert len(err.strip().splitlines()) == 1


def test_broken_status_file_names_the_field(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    doc = json.loads(Path(REPORT).read_text())
    doc["geometry"]["unit_bytes"]["moe_per_expert"] = 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    code, _, err = run(capsys, "rungs", "--status", str(bad))
    assert code == 2
    assert "geometry.unit_bytes.moe_per_expert" in err
    (tmp_path / "junk.json").write_text("{not json")
    code, _, err = run(capsys, "rungs", "--status", str(tmp_path / "junk.json"))
    assert code == 2 and "is not JSON" in err


def test_rungs_and_status(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "rungs", "--status", REPORT, "--kv-max", "256k", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["rungs"][0]["kv_tokens"] == 4096
    assert doc["rungs"][-1]["kv_tokens"] == 262144
    assert doc["live_rung"] is None
    code, out, _ = run(capsys, "status", "--status", REPORT)
    assert code == 0
    assert "reachable now" in out and "512..1843" in out and "512..722" in out
    code, out, _ = run(capsys, "status", "--status", REPORT, "--json")
    ranges = {r["pool"]: r for r in json.loads(out)["ranges"]}
    assert ranges["moe"]["max_keeping_others"] == 722


def test_console_script_is_installed() -> None:
    proc = subprocess.run([sys.executable, "-m", "ladder.cli", "plan", "--status", REPORT,
                           "--to", "moe=1024,kv=64k", "--json"],
                          capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["feasible"] is True
    help_text = subprocess.run([sys.executable, "-m", "ladder.cli", "plan", "--help"],
                               capture_output=True, text=True, check=True, timeout=60).stdout
    assert "--to" in help_text and "Exit 0 feasible" in help_text


def test_engine_kv_tokens_auto_boots_like_ft_serve() -> None:
    args = build_parser().parse_args(["engine", "--cache-budget", "64MiB", "--kv-tokens", "auto",
                                      "--boot-drift=-2MiB"])
    config = _engine_config(args)
    assert (config.num_pages, config.boot_drift_bytes) == (None, -2 * (1 << 20))
    fixed = _engine_config(build_parser().parse_args(["engine", "--cache-budget", "64MiB",
                                                      "--kv-tokens", "4096"]))
    assert fixed.num_pages == 4096 // fixed.model.page_size and fixed.boot_drift_bytes == 0


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    from importlib.metadata import version

    assert capsys.readouterr().out.strip() == f"ladder {version('moe-ladder')}"


def test_a_target_below_the_floor_is_not_called_a_fit(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--status", REPORT, "--to", "moe=0")
    assert code == 1
    assert "fits" not in out
    assert "infeasible: moe_cache_size 0 is below the floor" in out


async def test_host_port_without_a_scheme_works_on_every_command(
        aiohttp_server: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # `ft ctl` users type `--server localhost:1919`; it means http://localhost:1919.
    engine = ReferenceEngine(demo_engine_config())
    server = await aiohttp_server(make_app(engine))
    where = f"localhost:{server.port}"
    target = f"kv={engine.geometry().num_pages * engine.shape.page_size // 2}"
    for argv in (["status", "--server", where], ["rungs", "--server", where],
                 ["plan", "--server", where, "--to", target],
                 ["apply", "--server", where, "--to", target, "--idle-wait-s", "5"]):
        code, out, err = await asyncio.to_thread(run, capsys, *argv, "--json")
        assert code == 0, (argv, err)
        assert json.loads(out)
    assert engine.geometry().num_pages * engine.shape.page_size == int(target[3:])


def test_a_small_budget_gets_a_floor_and_growth_that_fit(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # The report's card scaled to the tiny model holds ~3.3k KV tokens: the 4k floor gives one
    # rung, and headroom's 8k growth reserve never fits. The hint's flags give a real ladder.
    from engine.reference.runtime import ReferenceEngine as Engine
    from engine.reference.scenarios import report_config

    status = tmp_path / "report.json"
    status.write_text(json.dumps(Engine(report_config()).status_doc()))
    code, out, _ = run(capsys, "rungs", "--status", str(status), "--json")
    doc = json.loads(out)
    assert code == 0 and len(doc["rungs"]) < 4
    assert "try --kv-floor 128 (with --policy headroom, also --policy-option " \
        "growth_tokens=256" in doc["hint"]
    code, out, _ = run(capsys, "rungs", "--status", str(status), "--kv-floor", "128")
    assert code == 0 and "rungs within" in out and "try --kv-floor" not in out
    assert int(out.split()[0]) >= 4
    code, out, _ = run(capsys, "rungs", "--status", REPORT)
    assert "try --kv-floor" not in out  # the real card needs no hint
