"""The deployment kit in deploy/ fits together and fits the daemon: the systemd unit runs the
config that compose mounts, Prometheus scrapes the daemon's listener, and every metric the
Grafana dashboard queries is one the daemon exports. (deploy/ladder.toml itself is checked and
started against the reference engine by tests/test_docs_configs.py.)"""

from __future__ import annotations

import configparser
import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import yaml

from ladder.cli import build_parser
from ladder.config import ListenConfig, load
from ladder.daemon import load_policies
from ladder.metrics import DaemonMetrics

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
CONFIG_PATH = "/etc/moe-ladder/ladder.toml"


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string((DEPLOY / "ladder.service").read_text())
    return parser


def compose() -> Any:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_the_unit_runs_the_daemon_on_the_shipped_config_after_ft_serve() -> None:
    service = unit()
    argv = shlex.split(service["Service"]["ExecStart"])
    assert Path(argv[0]).name == "ladder"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "run" and args.config == CONFIG_PATH
    assert "ft-serve.service" in service["Unit"]["After"].split()
    assert service["Service"]["Restart"] == "on-failure"
    assert service["Service"]["NoNewPrivileges"] == "yes"
    assert service["Install"]["WantedBy"] == "multi-user.target"


def test_compose_mounts_the_same_config_and_keeps_to_loopback() -> None:
    ladder = compose()["services"]["ladder"]
    assert ladder["network_mode"] == "host"
    assert f"./ladder.toml:{CONFIG_PATH}:ro" in ladder["volumes"]
    args = build_parser().parse_args(ladder["command"])
    assert args.command == "run" and args.config == CONFIG_PATH
    assert (DEPLOY / ladder["build"]["dockerfile"].removeprefix("deploy/")).is_file()
    prometheus = compose()["services"]["prometheus"]
    assert "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]


def test_the_image_holds_every_package_and_no_torch() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for package in pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]:
        assert f"COPY {package} {package}" in dockerfile
    installs = [line for line in dockerfile.splitlines() if line.startswith("RUN")]
    assert installs == ["RUN pip install --no-cache-dir ."]  # the base install, no extra
    # The daemon's own requirements are torch-free: torch is the engine extra's.
    assert not any("torch" in dep for dep in pyproject["project"]["dependencies"])


def test_prometheus_scrapes_the_daemon_where_it_listens() -> None:
    scrape = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())["scrape_configs"]
    targets = [t for job in scrape for c in job["static_configs"] for t in c["targets"]]
    config = load(DEPLOY / "ladder.toml")
    default = ListenConfig()
    assert targets == [f"{config.listen.host}:{config.listen.port}"]
    assert (config.listen.host, config.listen.port) == (default.host, default.port)
    assert all(job["metrics_path"] == "/metrics" for job in scrape)


def test_the_shipped_config_points_at_ft_serve_and_builds_its_policy() -> None:
    config = load(DEPLOY / "ladder.toml")
    server = config.servers[0]
    assert server.url == "http://127.0.0.1:1919"
    assert server.gate_listen == "127.0.0.1:8001"
    assert set(load_policies(config)) == {server.name}


def _exported_series() -> set[str]:
    names: set[str] = set()
    for family in DaemonMetrics().registry.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                    "gauge": ("",)}[family.type]
        names.update(family.name + s for s in suffixes)
    return names


def test_every_dashboard_query_names_metrics_the_daemon_exports() -> None:
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exported = _exported_series()
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    used = {name for q in queries for name in re.findall(r"\bladder_[a-z_]+", q)}
    assert used, "the dashboard queries nothing"
    assert used <= exported, sorted(used - exported)
    # And it shows every metric the daemon has, so a new one is not forgotten.
    families = {re.sub(r"(_total|_bucket|_sum|_count)$", "", n) for n in exported}
    shown = {re.sub(r"(_total|_bucket|_sum|_count)$", "", n) for n in used}
    assert families <= shown, sorted(families - shown)
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
