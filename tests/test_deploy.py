"""The deployment kit in deploy/ fits together, fits the daemon and fits docs/deploy.md: the
systemd unit runs the config that compose mounts and the docs install, the daemon starts with
torch absent, Prometheus scrapes the daemon's listener, every metric the Grafana dashboard
queries is one the daemon exports, and every `ladder` command in the guide parses. (The TOML
here and in docs/ is also started against the reference engine by tests/test_docs_configs.py.)
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from ladder.cli import build_parser, main
from ladder.config import ConfigError, ListenConfig, load, merge
from ladder.daemon import load_policies
from ladder.metrics import DaemonMetrics
from policies.registry import load_policy

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
GUIDE = ROOT / "docs" / "deploy.md"
CONFIG_PATH = "/etc/moe-ladder/ladder.toml"
KEY_LINE = re.compile(r'^# (api_key_env = "([A-Z_][A-Z0-9_]*)")$', re.M)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string((DEPLOY / "ladder.service").read_text())
    return parser


def compose() -> Any:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def guide_commands() -> list[list[str]]:
    """Every shell command in the guide's fenced blocks (not TOML), `&&` chains split, `sudo`
    and comments dropped."""
    text = GUIDE.read_text()
    commands = []
    for lang, block in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        if lang == "toml":
            continue
        for line in block.splitlines():
            for part in line.split("&&"):
                argv = shlex.split(part, comments=True)
                if argv and argv[0] == "sudo":
                    argv = argv[1:]
                if argv:
                    commands.append(argv)
    return commands


def guide_ladder_commands() -> list[list[str]]:
    """`ladder ...` in the guide's blocks and inline code spans (`ladder rungs --reserve 1GiB`)."""
    spans = re.findall(r"(?<!`)`([^`\n]*(?:\n[^`\n]*)?)`(?!`)", GUIDE.read_text())
    inline = [shlex.split(s) for s in spans if s.split() and Path(s.split()[0]).name == "ladder"]
    return [argv for argv in [*guide_commands(), *inline] if Path(argv[0]).name == "ladder"]


def test_the_unit_runs_the_daemon_on_the_shipped_config_after_ft_serve() -> None:
    service = unit()
    argv = shlex.split(service["Service"]["ExecStart"])
    assert Path(argv[0]).name == "ladder" and Path(argv[0]).is_absolute()
    args = build_parser().parse_args(argv[1:])
    assert args.command == "run" and args.config == CONFIG_PATH
    assert "ft-serve.service" in service["Unit"]["After"].split()
    assert "ft-serve.service" in service["Unit"]["Wants"].split()
    assert service["Service"]["Restart"] == "on-failure"
    assert float(service["Service"]["RestartSec"]) > 0
    for key in ("NoNewPrivileges", "DynamicUser", "PrivateTmp", "PrivateDevices"):
        assert service["Service"][key] == "yes", key
    assert service["Service"]["ProtectSystem"] == "strict"
    assert service["Service"]["EnvironmentFile"].lstrip("-").startswith("/etc/moe-ladder/")
    assert service["Install"]["WantedBy"] == "multi-user.target"


def test_the_guide_installs_what_the_unit_runs() -> None:
    """The unit's binary is where the guide's venv puts it, its config is where the guide copies
    deploy/ladder.toml, and the unit name the guide enables is the file it installs."""
    service = unit()
    binary = shlex.split(service["Service"]["ExecStart"])[0]
    commands = guide_commands()
    venvs = [argv[-1] for argv in commands if argv[:3] == ["python3", "-m", "venv"]]
    assert [f"{venv}/bin/ladder" for venv in venvs] == [binary]
    assert [f"{venvs[0]}/bin/pip", "install", "."] in commands
    copies = {argv[-2]: argv[-1] for argv in commands if argv[0] == "install"}
    assert copies["deploy/ladder.toml"] == CONFIG_PATH
    installed = Path(copies["deploy/ladder.service"])
    assert installed.parent == Path("/etc/systemd/system") and installed.suffix == ".service"
    assert ["systemctl", "enable", "--now", installed.stem] in commands
    assert ["journalctl", "-u", installed.stem, "-f"] in commands
    env_file = service["Service"]["EnvironmentFile"].lstrip("-")
    assert f"`{env_file}`" in GUIDE.read_text()
    for src in copies:
        assert (ROOT / src).is_file(), src


def test_compose_mounts_the_same_config_and_keeps_to_loopback() -> None:
    doc = compose()
    ladder = doc["services"]["ladder"]
    assert ladder["network_mode"] == "host"
    assert f"./ladder.toml:{CONFIG_PATH}:ro" in ladder["volumes"]
    args = build_parser().parse_args(ladder["command"])
    assert args.command == "run" and args.config == CONFIG_PATH
    assert ladder["build"]["context"] == ".."
    assert (DEPLOY / ladder["build"]["context"] / ladder["build"]["dockerfile"]).is_file()
    assert "profiles" not in ladder  # `docker compose up` starts the daemon
    prometheus = doc["services"]["prometheus"]
    assert prometheus["network_mode"] == "host"
    assert "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    named = [v.split(":")[0] for v in prometheus["volumes"] if not v.startswith(".")]
    assert named and set(named) <= set(doc["volumes"])
    assert "--web.listen-address=127.0.0.1:9090" in prometheus["command"]
    # Optional, and the guide starts it by the profile the file gives it.
    compose_runs = [argv for argv in guide_commands() if argv[:2] == ["docker", "compose"]]
    assert compose_runs
    for argv in compose_runs:
        assert (ROOT / argv[argv.index("-f") + 1]).resolve() == DEPLOY / "compose.yaml"
    profiles = {argv[argv.index("--profile") + 1] for argv in compose_runs if "--profile" in argv}
    assert profiles == set(prometheus["profiles"])


def test_the_image_holds_every_package_and_no_torch() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert dockerfile.splitlines()[1] == "FROM python:3.12-slim"
    for package in pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]:
        assert f"COPY {package} {package}" in dockerfile
    installs = [line for line in dockerfile.splitlines() if line.startswith("RUN")]
    assert installs == ["RUN pip install --no-cache-dir ."]  # the base install, no extra
    cmd = next(line for line in dockerfile.splitlines() if line.startswith("CMD "))
    assert json.loads(cmd.removeprefix("CMD ")) == compose()["services"]["ladder"]["command"]
    # The daemon's own requirements are torch-free: torch is the engine extra's, which the
    # guide names for the reference engine.
    assert not any("torch" in dep for dep in pyproject["project"]["dependencies"])
    assert any(dep.startswith("torch") for dep in pyproject["project"]["optional-dependencies"]
               ["engine"])
    assert '".[engine]"' in GUIDE.read_text()


_NO_TORCH = """
import importlib.abc, sys
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "numpy"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
        return None
sys.meta_path.insert(0, NoTorch())
from ladder.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.timeout(90)
def test_the_daemon_runs_on_the_shipped_config_without_torch() -> None:
    """What `pip install .` gives (no torch, no numpy) is enough for `ladder run`: it starts on
    deploy/ladder.toml, serves /healthz and /metrics, and stops cleanly on SIGTERM."""
    env = {**os.environ, "LADDER_LISTEN__PORT": "0",
           "LADDER_SERVERS__0__URL": f"http://127.0.0.1:{free_port()}",  # nothing there
           "LADDER_SERVERS__0__GATE_LISTEN": f"127.0.0.1:{free_port()}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _NO_TORCH, "run", "--config", str(DEPLOY / "ladder.toml")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        match = re.search(r"daemon on :(\d+)", banner)
        if not match:
            proc.kill()
            pytest.fail(f"no banner: {banner!r} {proc.communicate()[1]}")
        base = f"http://127.0.0.1:{match.group(1)}"
        with urllib.request.urlopen(f"{base}/healthz", timeout=10) as reply:
            assert reply.status == 200
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as reply:
            assert b"# TYPE ladder_rung gauge" in reply.read()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "blocked by the test" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


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
    (server,) = config.servers
    assert server.url == "http://127.0.0.1:1919"
    assert server.gate_listen == "127.0.0.1:8001"
    assert server.policy == "headroom"
    policy: Any = load_policy(server.policy, server.policy_options)
    assert policy.name == "headroom"
    assert policy.dwell_s == server.policy_options["dwell_s"]
    assert policy.rule.growth_tokens == server.policy_options["growth_tokens"]
    assert set(load_policies(config)) == {server.name}


def test_the_commented_api_key_line_reads_the_variable_the_guide_sets() -> None:
    text = (DEPLOY / "ladder.toml").read_text()
    (match,) = KEY_LINE.finditer(text)
    var = match.group(2)
    doc = tomllib.loads(text.replace(match.group(0), match.group(1)))
    assert merge(doc, {var: "sk-test"}).servers[0].api_key == "sk-test"
    with pytest.raises(ConfigError, match=var):
        merge(doc, {})
    # The unit's env file, the compose file and the guide all name that variable.
    assert var in (DEPLOY / "ladder.service").read_text()
    assert f"{var}: ${{{var}}}" in (DEPLOY / "compose.yaml").read_text()
    assert f"`{var}=...`" in GUIDE.read_text()
    assert f'`api_key_env = "{var}"`' in GUIDE.read_text()


def test_every_ladder_command_in_the_guide_parses(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    commands = guide_ladder_commands()
    assert len(commands) >= 5, commands
    for argv in commands:
        build_parser().parse_args(argv[1:])  # SystemExit (a failure here) on a bad command
    monkeypatch.chdir(ROOT)
    checks = [argv for argv in commands if argv[1:3] == ["config", "check"]]
    assert checks
    for argv in checks:
        assert main(argv[1:]) == 0, capsys.readouterr().err


def test_the_guides_toml_blocks_pass_config_check(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```toml\n(.*?)```", GUIDE.read_text(), re.S)
    assert blocks
    for n, block in enumerate(blocks):
        path = tmp_path / f"block{n}.toml"
        path.write_text(block)
        assert main(["config", "check", str(path)]) == 0, capsys.readouterr().err


def test_every_deploy_file_is_in_the_guide_and_every_path_it_names_exists() -> None:
    text = GUIDE.read_text()
    paths = r"(?<![\w/.-])((?:deploy|docs|ladder|engine|policies|tests)/[\w./-]*\w)"
    named = set(re.findall(paths, text))
    for path in named:
        assert (ROOT / path).exists(), path
    assert {p.relative_to(ROOT).as_posix() for p in DEPLOY.iterdir()} <= named


def _exported_series() -> set[str]:
    names: set[str] = set()
    for family in DaemonMetrics().registry.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                    "gauge": ("",)}[family.type]
        names.update(family.name + s for s in suffixes)
    return names


RENAMED = {"ladder_live_kv_tokens", "ladder_live_expert_slots", "ladder_live_mamba_slots",
           "ladder_server_completion_tokens_total"}


def test_every_dashboard_query_names_metrics_the_daemon_exports() -> None:
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    assert dashboard["schemaVersion"] >= 39
    assert {p["type"] for p in dashboard["panels"]} <= {"timeseries", "stat"}
    exported = _exported_series()
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    used = {name for q in queries for name in re.findall(r"\bladder_[a-z_]+", q)}
    assert used, "the dashboard queries nothing"
    assert used <= exported, sorted(used - exported)
    assert used >= RENAMED, sorted(RENAMED - used)
    # Every panel query is filtered by the `server` variable.
    assert "server" in {v["name"] for v in dashboard["templating"]["list"]}
    assert all('server=~"$server"' in q for q in queries if "label_values" not in q)
    # And it shows every metric the daemon has, so a new one is not forgotten.
    families = {re.sub(r"(_total|_bucket|_sum|_count)$", "", n) for n in exported}
    shown = {re.sub(r"(_total|_bucket|_sum|_count)$", "", n) for n in used}
    assert families <= shown, sorted(families - shown)
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
