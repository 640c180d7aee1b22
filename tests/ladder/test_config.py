"""Config: precedence of the four layers, env parsing by type, one-line errors naming the key."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ladder.config import (
    REDACTED,
    ConfigError,
    ControlConfig,
    DaemonConfig,
    ListenConfig,
    ServerConfig,
    cli_overrides,
    config_keys,
    env_name,
    explain,
    flagged_keys,
    load,
    load_toml,
    merge,
    reference_tables,
    to_json,
)
from ladder.controller import ControlSettings
from ladder.daemon import build_daemon
from ladder.executor import ApplySettings
from ladder.knobs import Knob
from ladder.logs import LogSettings
from ladder.parsers import parse_hostport
from ladder.rungs import LadderSpec
from ladder.safeguards import SafeguardSettings

DOCS = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def example_toml() -> str:
    """The full example from docs/config.md, so the documented file is the tested file."""
    match = re.search(r"```toml\n(.*?)```", DOCS.read_text(), re.DOTALL)
    assert match, "docs/config.md has no ```toml example"
    return match.group(1)


def error_of(*args: Any, **kwargs: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        merge(*args, **kwargs)
    return info.value


# ------------------------------------------------------------------------------ defaults


def test_nothing_given_is_one_default_server_and_every_source_is_default() -> None:
    config = merge()
    assert config == DaemonConfig()
    assert config.servers == (ServerConfig(),)
    assert config.servers[0].url == "http://127.0.0.1:1919"
    assert config.servers[0].ladder.kv_step_ratio == math.sqrt(2)
    assert set(config.sources.values()) == {"default"}
    assert config.sources["servers[0].ladder.kv_floor_tokens"] == "default"


TABLES = (ServerConfig, LadderSpec, SafeguardSettings, ControlConfig, ListenConfig, LogSettings)


def test_every_key_knows_how_to_parse_itself_and_what_it_means() -> None:
    for cls in TABLES:
        for name, key in config_keys(cls).items():
            if name not in ("ladder", "policy_options"):
                assert isinstance(key.spec, Knob), f"{cls.__name__}.{name}"
                assert key.spec.meaning.endswith("."), f"{cls.__name__}.{name}"


def test_the_config_tree_is_made_of_the_runtime_settings_types() -> None:
    # No mirror to drift: the objects the merge builds are the ones the daemon runs on.
    config = merge()
    assert isinstance(config.servers[0].ladder, LadderSpec)
    assert isinstance(config.safeguards, SafeguardSettings)
    assert isinstance(config.control.loop, ControlSettings)
    assert isinstance(config.control.apply, ApplySettings)
    assert isinstance(config.log, LogSettings)
    assert config.control.apply == ApplySettings() and config.safeguards == SafeguardSettings()


async def test_the_daemon_runs_on_the_configs_objects() -> None:
    config = merge({"servers": [{"ladder": {"kv_floor_tokens": 512, "fixed_bytes": "1GiB"}}],
                    "safeguards": {"reads_to_recover": 4}, "control": {"busy_retries": 3},
                    "log": {"repeat_s": 9}})
    async with aiohttp.ClientSession() as session:
        (controller,) = build_daemon(config, session).controllers
    assert controller.spec is config.servers[0].ladder
    assert controller.safeguards.settings is config.safeguards
    assert controller.settings is config.control.loop
    assert controller.apply_settings.busy_retries == 3
    assert controller.apply_settings.fixed_bytes == 1 << 30  # priced with the server's budget


def test_reads_to_recover_is_a_key() -> None:
    assert merge().safeguards.reads_to_recover == 2
    assert merge({"safeguards": {"reads_to_recover": 4}}).safeguards.reads_to_recover == 4
    env = {"LADDER_SAFEGUARDS__READS_TO_RECOVER": "5"}
    assert merge({}, env).safeguards.reads_to_recover == 5
    assert error_of({"safeguards": {"reads_to_recover": 0}}).key == "safeguards.reads_to_recover"


def test_config_objects_are_frozen() -> None:
    config = merge()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.control.loop.poll_s = 1.0  # type: ignore[misc]


# ------------------------------------------------------------------------------ precedence

# (path, strategy of native values, how the value is written as an env string)
FIELDS: list[tuple[tuple[str | int, ...], st.SearchStrategy[Any]]] = [
    (("safeguards", "cooldown_s"), st.integers(0, 10_000).map(float)),
    (("safeguards", "max_transitions_per_hour"), st.integers(1, 1000)),
    (("control", "poll_s"), st.integers(1, 600).map(lambda n: n / 4)),
    (("listen", "port"), st.integers(1, 65535)),
    (("log", "level"), st.sampled_from(["debug", "info", "warning", "error"])),
    (("servers", 0, "url"), st.integers(1, 65535).map(lambda p: f"http://10.0.0.1:{p}")),
    (("servers", 0, "ladder", "kv_floor_tokens"), st.integers(1, 1 << 20)),
    (("servers", 0, "ladder", "reserve_bytes"), st.integers(0, 1 << 40)),
]


def _nest(doc: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    if path[0] == "servers":
        servers = doc.setdefault("servers", [{}])
        table = servers[0]
        rest = path[2:]
    else:
        table = doc.setdefault(str(path[0]), {})
        rest = path[1:]
    for key in rest[:-1]:
        table = table.setdefault(str(key), {})
    table[str(rest[-1])] = value


def _value(node: Any, path: tuple[str | int, ...]) -> Any:
    """The value at a key path, through the flat tables ([control] is two objects)."""
    for part in path:
        if isinstance(part, int):
            node = node[part]
        elif part == "servers":
            node = node.servers
        else:
            for attr in config_keys(type(node))[part].attrs:
                node = getattr(node, attr)
    return node


def _label(path: tuple[str | int, ...]) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else p for p in path).replace(".[", "[")


layer_value = st.one_of(st.none(), st.just("present"))


@given(st.data())
def test_the_highest_layer_that_sets_a_key_wins(data: st.DataObject) -> None:
    doc: dict[str, Any] = {}
    env: dict[str, str] = {}
    cli: dict[str, Any] = {}
    expected: dict[tuple[str | int, ...], tuple[Any, str]] = {}
    for path, values in FIELDS:
        layers = data.draw(st.lists(st.one_of(st.none(), values), min_size=3, max_size=3))
        file_v, env_v, cli_v = layers
        winner: tuple[Any, str] | None = None
        if file_v is not None:
            _nest(doc, path, file_v)
            winner = (file_v, "file")
        if env_v is not None:
            env[env_name(path)] = str(env_v)  # env only has strings
            winner = (env_v, f"env {env_name(path)}")
        if cli_v is not None:
            cli[".".join(str(p) for p in path)] = cli_v
            winner = (cli_v, "cli")
        if winner is not None:
            expected[path] = winner
    config = merge(doc, env, cli)
    for path, _ in FIELDS:
        want, source = expected.get(path, (_value(DaemonConfig(), path), "default"))
        assert _value(config, path) == want, path
        assert config.sources[_label(path)] == source


def test_cli_wildcard_sets_every_server_but_an_indexed_flag_beats_it() -> None:
    doc = {"servers": [{"name": "a", "policy": "x"}, {"name": "b"}]}
    config = merge(doc, {}, {"servers.*.policy": "fixed", "servers.1.policy": "mine:Policy"})
    assert [s.policy for s in config.servers] == ["fixed", "mine:Policy"]


def test_single_server_keeps_the_first_and_its_file_settings() -> None:
    doc = {"servers": [{"name": "a", "timeout_s": 3}, {"name": "b"}]}
    cli = cli_overrides(server="http://h:1")
    config = merge(doc, {"LADDER_SERVERS__1__URL": "http://other:2"}, cli, single_server=True)
    assert len(config.servers) == 1
    assert (config.servers[0].name, config.servers[0].url, config.servers[0].timeout_s) == (
        "a", "http://h:1", 3.0)


def test_env_and_cli_can_add_the_next_server_in_order() -> None:
    config = merge({"servers": [{"name": "a"}]},
                   {"LADDER_SERVERS__1__NAME": "b", "LADDER_SERVERS__1__URL": "http://b:1"})
    assert [s.name for s in config.servers] == ["a", "b"]
    error = error_of({}, {"LADDER_SERVERS__2__URL": "http://c:1"})
    assert error.key == "servers[2]"


def test_cli_overrides_maps_flags_to_paths() -> None:
    assert cli_overrides() == {}
    assert cli_overrides(server="http://h:1", policy="headroom", poll_s=1.5,
                         gate="0.0.0.0:8000", listen="[::1]:9300") == {
        "servers.0.url": "http://h:1", "servers.*.policy": "headroom",
        "servers.*.gate_listen": "0.0.0.0:8000", "control.poll_s": 1.5,
        "listen.host": "::1", "listen.port": 9300}
    with pytest.raises(ConfigError) as info:
        cli_overrides(listen="localhost")
    assert info.value.key == "listen"


def test_none_in_the_cli_layer_means_not_given() -> None:
    config = merge({"control": {"poll_s": 7}}, {}, {"control.poll_s": None})
    assert config.control.loop.poll_s == 7.0


# ------------------------------------------------------------------------------ env parsing


def test_env_values_are_parsed_by_the_target_fields_type() -> None:
    env = {
        "LADDER_SAFEGUARDS__COOLDOWN_S": "30",
        "LADDER_SAFEGUARDS__DOWN_TOLERANCE": "0.25",
        "LADDER_SAFEGUARDS__BREAKER_FAILURES": " 7 ",
        "LADDER_CONTROL__POLL_S": "1",
        "LADDER_LISTEN__PORT": "9200",
        "LADDER_LOG__FORMAT": "JSON",
        "LADDER_SERVERS__0__LADDER__KV_FLOOR_TOKENS": "64k",
        "LADDER_SERVERS__0__LADDER__KV_MAX_TOKENS": "1m",
        "LADDER_SERVERS__0__LADDER__RESERVE_BYTES": "512MiB",
        "LADDER_SERVERS__0__LADDER__MAMBA_SLOTS": "4",
        "LADDER_SERVERS__0__GATE_LISTEN": "127.0.0.1:8001",
        "LADDER_SERVERS__0__POLICY_OPTIONS__WINDOW_S": "60",
        "LADDER_SERVERS__0__POLICY_OPTIONS__MODE": "fast",
        "LADDER_API_KEY": "belongs-to-the-cli",  # no "__": not a tree key, ignored
        "PATH": "/usr/bin",
    }
    config = merge({}, env)
    s, server = config.safeguards, config.servers[0]
    assert (s.cooldown_s, s.down_tolerance, s.breaker_failures) == (30.0, 0.25, 7)
    assert isinstance(s.cooldown_s, float) and isinstance(s.breaker_failures, int)
    assert config.control.loop.poll_s == 1.0 and config.listen.port == 9200
    assert config.log.format == "json"
    assert server.ladder.kv_floor_tokens == 65536 and server.ladder.kv_max_tokens == 1 << 20
    assert server.ladder.reserve_bytes == 512 * 1024**2 and server.ladder.mamba_slots == 4
    assert server.gate_listen == "127.0.0.1:8001"
    assert dict(server.policy_options) == {"window_s": 60, "mode": "fast"}
    assert server.api_key is None


def test_an_empty_env_value_unsets_an_optional_key() -> None:
    config = merge({"servers": [{"ladder": {"kv_max_tokens": 65536}}]},
                   {"LADDER_SERVERS__0__LADDER__KV_MAX_TOKENS": ""})
    assert config.servers[0].ladder.kv_max_tokens is None


def test_file_values_accept_human_sizes_and_store_ints() -> None:
    config = merge({"servers": [{"ladder": {"kv_floor_tokens": "8k", "fixed_bytes": "1.5GiB",
                                            "kv_step_tokens": 16384}}]})
    ladder = config.servers[0].ladder
    assert (ladder.kv_floor_tokens, ladder.fixed_bytes, ladder.kv_step_tokens) == (
        8192, 1536 * 1024**2, 16384)


def test_env_name_rule() -> None:
    assert env_name(("servers", 0, "ladder", "kv_floor_tokens")) == (
        "LADDER_SERVERS__0__LADDER__KV_FLOOR_TOKENS")
    assert env_name(("safeguards", "cooldown_s")) == "LADDER_SAFEGUARDS__COOLDOWN_S"


# ------------------------------------------------------------------------------ validation

INVALID: list[tuple[dict[str, Any], dict[str, str], dict[str, Any], str, str]] = [
    ({"servers": [{"ladder": {"kv_floor_tokens": "lots"}}]}, {}, {},
     "servers[0].ladder.kv_floor_tokens", "expected a token count like 4096 or 64k, got 'lots'"),
    ({}, {"LADDER_SERVERS__0__LADDER__KV_FLOOR_TOKENS": "lots"}, {},
     "servers[0].ladder.kv_floor_tokens", "(from LADDER_SERVERS__0__LADDER__KV_FLOOR_TOKENS)"),
    ({}, {}, {"control.poll_s": "soon"}, "control.poll_s", "(from the command line)"),
    ({"safeguards": {"cooldown_s": -1}}, {}, {}, "safeguards.cooldown_s", "must not be negative"),
    ({"control": {"poll_s": 0}}, {}, {}, "control.poll_s", "greater than 0"),
    ({"safeguards": {"cooldown_s": True}}, {}, {}, "safeguards.cooldown_s", "duration"),
    ({"safeguards": {"cooldown_s": "nan"}}, {}, {}, "safeguards.cooldown_s", "duration"),
    ({"safeguards": {"down_tolerance": 1.5}}, {}, {}, "safeguards.down_tolerance", "[0, 1)"),
    ({"servers": [{"ladder": {"kv_step_ratio": 1.0}}]}, {}, {},
     "servers[0].ladder.kv_step_ratio", "(1, 16]"),
    ({"safeguards": {"max_transitions_per_hour": 0}}, {}, {},
     "safeguards.max_transitions_per_hour", "at least 1"),
    ({"safeguards": {"breaker_failures": 2.5}}, {}, {}, "safeguards.breaker_failures",
     "whole number"),
    ({"safeguards": {"backoff_base_s": 10, "backoff_max_s": 5}}, {}, {},
     "safeguards.backoff_max_s", "below backoff_base_s"),
    ({"servers": [{"ladder": {"reserve_bytes": "-1GiB"}}]}, {}, {},
     "servers[0].ladder.reserve_bytes", "byte size"),
    ({"servers": [{"ladder": {"spacing": "fibonacci"}}]}, {}, {}, "servers[0].ladder.spacing",
     "geometric, linear"),
    ({"servers": [{"ladder": {"kv_floor_tokens": 8192, "kv_max_tokens": 4096}}]}, {}, {},
     "servers[0].ladder.kv_max_tokens", "impossible ladder"),
    ({"servers": [{"name": "a"}, {"name": "a"}]}, {}, {}, "servers[1].name",
     "duplicate server name 'a'"),
    ({"servers": [{"name": "a"}, {}]}, {}, {}, "servers[1].name", "required"),
    ({"servers": [{"name": "bad name"}]}, {}, {}, "servers[0].name", "a name of"),
    ({"servers": [{"url": "127.0.0.1"}]}, {}, {}, "servers[0].url", "http://"),
    ({"servers": [{"timeout_s": 0}]}, {}, {}, "servers[0].timeout_s", "greater than 0"),
    ({"servers": [{"policy": "not a policy"}]}, {}, {}, "servers[0].policy", "module:attr"),
    ({"servers": [{"gate_listen": "8000"}]}, {}, {}, "servers[0].gate_listen", "HOST:PORT"),
    ({"servers": [{"gate_listen": "127.0.0.1:70000"}]}, {}, {}, "servers[0].gate_listen",
     "0-65535"),
    ({"servers": [{"name": "a", "gate_listen": "0.0.0.0:8000"},
                  {"name": "b", "gate_listen": "127.0.0.1:8000"}]}, {}, {},
     "servers[1].gate_listen", "also taken by servers[0].gate_listen"),
    ({"servers": [{"gate_listen": "127.0.0.1:9190"}]}, {}, {}, "servers[0].gate_listen",
     "also taken by listen"),
    ({"servers": [{"name": "a"}, {"name": "b"}]}, {}, cli_overrides(gate="127.0.0.1:8000"),
     "servers[1].gate_listen", "also taken"),
    ({"listen": {"port": 70000}}, {}, {}, "listen.port", "0-65535"),
    ({"listen": {"port": "http"}}, {}, {}, "listen.port", "TCP port"),
    ({"log": {"level": "loud"}}, {}, {}, "log.level", "debug, info, warning, error"),
    ({"servers": {"url": "http://h:1"}}, {}, {}, "servers", "[[servers]]"),
    ({"safeguards": 5}, {}, {}, "safeguards", "expected a table"),
    ({"servers": [{"ladder": 5}]}, {}, {}, "servers[0].ladder", "expected a table"),
    ({"servers": [{"api_key": "k", "api_key_env": "FT_KEY"}]}, {"FT_KEY": "v"}, {},
     "servers[0].api_key", "not both"),
    ({"servers": [{"api_key_env": "FT_KEY"}]}, {}, {}, "servers[0].api_key_env",
     "FT_KEY is not set"),
    ({}, {"LADDER_SERVERS__X__URL": "http://h:1"}, {}, "servers", "server index"),
    ({}, {"LADDER_SAFEGUARDS__COOLDOWN_S__X": "1"}, {}, "safeguards.cooldown_s",
     "not a table"),
    ({}, {"LADDER_SERVERS__0__LADDER": "1"}, {}, "servers[0].ladder", "is a table"),
]


@pytest.mark.parametrize(("doc", "env", "cli", "key", "fragment"), INVALID)
def test_every_error_names_its_key_path_in_one_line(
        doc: dict[str, Any], env: dict[str, str], cli: dict[str, Any], key: str,
        fragment: str) -> None:
    error = error_of(doc, env, cli)
    assert error.key == key
    assert str(error).startswith(f"{key}: ")
    assert fragment in str(error)
    assert "\n" not in str(error)
    assert isinstance(error, ValueError)


@pytest.mark.parametrize(("doc", "env", "key", "suggestion"), [
    ({"safeguards": {"cooldown": 30}}, {}, "safeguards.cooldown", "'cooldown_s'"),
    ({"safegaurds": {}}, {}, "safegaurds", "'safeguards'"),
    ({"servers": [{"ladder": {"kv_flor_tokens": 1}}]}, {}, "servers[0].ladder.kv_flor_tokens",
     "'kv_floor_tokens'"),
    ({"servers": [{"uri": "http://h:1"}]}, {}, "servers[0].uri", "'url'"),
    ({}, {"LADDER_CONTROL__POLL": "1"}, "control.poll", "'poll_s'"),
    ({}, {"LADDER_SAFEGARDS__COOLDOWN_S": "1"}, "safegards", "'safeguards'"),
])
def test_unknown_keys_are_rejected_with_a_suggestion(
        doc: dict[str, Any], env: dict[str, str], key: str, suggestion: str) -> None:
    error = error_of(doc, env)
    assert error.key == key
    assert "unknown key" in str(error) and f"did you mean {suggestion}?" in str(error)
    if env:
        assert f"(from {next(iter(env))})" in str(error)


def test_an_unknown_key_with_no_near_match_lists_the_known_keys() -> None:
    error = error_of({"log": {"zzz": 1}})
    assert "known: format, level" in str(error)


def test_an_unknown_cli_path_is_rejected() -> None:
    assert error_of({}, {}, {"control.pol_s": 1}).key == "control.pol_s"


def test_parse_hostport() -> None:
    assert parse_hostport("127.0.0.1:9191") == ("127.0.0.1", 9191)
    assert parse_hostport("[::1]:80") == ("::1", 80)
    assert parse_hostport("gpu-box:8000") == ("gpu-box", 8000)
    for bad in ("", ":80", "host:", "host:0", "::1:80", "a b:1"):
        with pytest.raises(ValueError, match=r"HOST:PORT|port"):
            parse_hostport(bad)


# ------------------------------------------------------------------------------ api keys


def test_api_key_env_reads_the_key_from_the_environment() -> None:
    config = merge({"servers": [{"api_key_env": "FT_KEY"}]}, {"FT_KEY": "sekrit"})
    assert config.servers[0].api_key == "sekrit"
    assert config.sources["servers[0].api_key"] == "env FT_KEY (via api_key_env)"


def test_a_higher_layer_api_key_replaces_a_lower_api_key_env() -> None:
    config = merge({"servers": [{"api_key_env": "FT_KEY"}]}, {},
                   cli_overrides(api_key="from-flag"))
    assert config.servers[0].api_key == "from-flag"
    assert config.servers[0].api_key_env is None


# ------------------------------------------------------------------------------ files


def test_the_documented_example_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "ladder.toml"
    path.write_text(example_toml())
    env = {"FT_GPU1_KEY": "key-1"}
    config = load(path, env)
    assert [s.name for s in config.servers] == ["gpu0", "gpu1"]
    assert config.servers[1].api_key == "key-1"
    assert all(v == "default" or v.startswith(("file", "env FT_GPU1_KEY")) for v in
               config.sources.values())
    # to_json is a valid file document: feeding it back (secrets restored) gives the same config.
    doc = to_json(config)
    doc["servers"][1]["api_key"] = None
    for table in doc["servers"]:
        for key in [k for k, v in table.items() if v is None]:
            del table[key]
        for key in [k for k, v in table["ladder"].items() if v is None]:
            del table["ladder"][key]
    for section in ("listen",):
        doc[section] = {k: v for k, v in doc[section].items() if v is not None}
    assert merge(doc, env) == config
    json.dumps(to_json(config))  # JSON-ready


def test_example_maps_onto_ladder_spec_and_apply_settings(tmp_path: Path) -> None:
    path = tmp_path / "ladder.toml"
    path.write_text(example_toml())
    config = load(path, {"FT_GPU1_KEY": "k"})
    spec = config.servers[0].ladder
    assert (spec.kv_floor_tokens, spec.spacing, spec.kv_step_ratio, spec.fixed_bytes) == (
        4096, "geometric", 1.5, 1536 << 20)
    assert config.control.apply.rebuild_wait_s == 300.0 and config.control.loop.poll_s == 2.0


def test_load_without_a_file_is_merge(tmp_path: Path) -> None:
    assert load(None, {"LADDER_LISTEN__PORT": "9300"}).listen.port == 9300


def test_broken_toml_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("[safeguards]\ncooldown_s = \n")
    with pytest.raises(ConfigError) as info:
        load_toml(path)
    message = str(info.value)
    assert message.startswith(f"{path}:2: invalid TOML") and "\n" not in message


@pytest.mark.parametrize(("content", "fragment"), [
    (None, "cannot read"), (b"\xff\xfe = 1", "UTF-8"), (b"a = 1\na = 2\n", "invalid TOML")])
def test_unreadable_files_name_the_file(tmp_path: Path, content: bytes | None,
                                        fragment: str) -> None:
    path = tmp_path / "ladder.toml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_toml(path)
    assert str(path) in str(info.value) and fragment in str(info.value)


# ------------------------------------------------------------------------------ output


SECRETS = {"servers": [{"name": "a", "api_key": "sk-file-secret",
                        "policy_options": {"auth_token": "opt-secret", "window_s": 5}},
                       {"name": "b", "api_key_env": "B_KEY"}],
           "listen": {"token": "listen-secret"}}
SECRET_ENV = {"B_KEY": "env-secret", "LADDER_SERVERS__0__URL": "http://h:1"}


def test_secrets_never_appear_in_to_json_or_explain() -> None:
    config = merge(SECRETS, SECRET_ENV)
    assert config.servers[0].api_key == "sk-file-secret"  # kept for use, just never shown
    shown = json.dumps(to_json(config)) + explain(config) + repr(config)
    for secret in ("sk-file-secret", "opt-secret", "listen-secret", "env-secret"):
        assert secret not in shown
    doc = to_json(config)
    assert doc["servers"][0]["api_key"] == REDACTED and doc["listen"]["token"] == REDACTED
    assert doc["servers"][1]["api_key"] == REDACTED
    assert doc["servers"][0]["policy_options"] == {"auth_token": REDACTED, "window_s": 5}
    assert merge().servers[0].api_key is None and to_json(merge())["listen"]["token"] is None


def test_a_rejected_secret_is_not_echoed() -> None:
    error = error_of({"listen": {"token": 12345678}})
    assert error.key == "listen.token" and "12345678" not in str(error)


def test_explain_annotates_every_key_with_its_source() -> None:
    config = merge(SECRETS, SECRET_ENV, {"control.poll_s": 1})
    lines = explain(config).splitlines()
    by_key = {line.split(" = ")[0]: line for line in lines}
    assert by_key["servers[0].name"].endswith("# file")
    assert by_key["servers[0].url"].endswith("# env LADDER_SERVERS__0__URL")
    assert by_key["control.poll_s"].endswith("# cli")
    assert by_key["safeguards.cooldown_s"].endswith("# default")
    assert by_key["servers[1].api_key"].endswith("# env B_KEY (via api_key_env)")
    assert '"***"' in by_key["listen.token"]
    leaf_count = sum(len(config_keys(c)) for c in (
        SafeguardSettings, ControlConfig, ListenConfig, LogSettings))
    assert len([k for k in by_key if not k.startswith("servers")]) == leaf_count


@pytest.mark.parametrize(("table", "markdown"), list(reference_tables().items()),
                         ids=list(reference_tables()))
def test_docs_key_tables_are_the_declarations(table: str, markdown: str) -> None:
    """Each key's name, default and meaning in docs/config.md is what its knob declares: a key
    added, renamed or with a new default fails here until the page says so (the message is
    the table to paste)."""
    assert markdown in DOCS.read_text(), f"docs/config.md's {table} table should read:\n" + (
        markdown)


def test_docs_flag_table_names_every_flag_with_its_key() -> None:
    text = DOCS.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `--")]
    for path, flag in flagged_keys():
        assert any(f"`{flag}" in row and re.search(rf"[.`]{path[-1]}`", row) for row in rows), (
            flag, path)


@pytest.mark.parametrize(("given", "url"), [
    ("localhost:1919", "http://localhost:1919"), ("[::1]:1919", "http://[::1]:1919"),
    ("https://gpu0:1919/", "https://gpu0:1919"), ("http://10.0.0.2:1919", "http://10.0.0.2:1919"),
])
def test_a_server_may_be_given_as_host_port(given: str, url: str) -> None:
    assert merge({"servers": [{"url": given}]}).servers[0].url == url
    assert merge(cli=cli_overrides(server=given), single_server=True).servers[0].url == url


@pytest.mark.parametrize("given", ["gpu0", "ftp://gpu0:1919", "gpu0:0", "gpu0:1919/v1", ""])
def test_a_server_url_that_is_neither_is_refused(given: str) -> None:
    with pytest.raises(ConfigError, match=r"servers\[0\]\.url"):
        merge({"servers": [{"url": given}]})


def test_run_flags_for_the_ladder_and_the_policy_reach_every_server() -> None:
    doc = {"servers": [{"name": "a", "ladder": {"kv_floor_tokens": 4096}},
                       {"name": "b", "policy_options": {"dwell_s": 60}}]}
    config = merge(doc, cli=cli_overrides(
        ladder={"kv_floor_tokens": 512, "reserve_bytes": "1GiB", "kv_max_tokens": None},
        policy_options={"growth_tokens": 256}))
    for server in config.servers:
        assert server.ladder.kv_floor_tokens == 512
        assert server.ladder.reserve_bytes == 1 << 30
        assert server.ladder.kv_max_tokens is None  # a flag not given changes nothing
        assert server.policy_options["growth_tokens"] == 256
    assert config.server("b").policy_options["dwell_s"] == 60
    assert config.sources["servers[1].ladder.kv_floor_tokens"] == "cli"
