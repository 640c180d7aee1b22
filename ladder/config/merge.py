"""The four layers, defaults < TOML file < `LADDER_*` env < CLI flags, merged by one function.

Why one pure `merge`: the precedence rule is the part of a config system that silently goes
wrong (a flag that loses to a file, an env var read as a string), so it is decided in one
function that takes plain mappings and is tested exhaustively; the CLI only gathers the
layers. Each layer is first flattened to key path -> (value, source); then, key by key, the
highest layer wins, and every value goes through its knob's parser once, so an error names
the key path and, for env and CLI values, the variable or flag that set it.

Env naming: `LADDER_` + the key path, upper case, `__` between levels; servers by their index
in file order (`LADDER_SERVERS__0__URL`). Env and CLI values may be strings; they are parsed
by the key's knob, so `LADDER_SAFEGUARDS__COOLDOWN_S=30` is a float and
`LADDER_SERVERS__0__LADDER__KV_FLOOR_TOKENS=64k` is 65536.

Pure: no I/O except `load_toml`, which reads the path it is given (and `load`, which calls it).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ladder.config.schema import (
    ENV_DELIMITER,
    ENV_PREFIX,
    ConfigError,
    DaemonConfig,
    KeyPath,
    Options,
    ServerConfig,
    Source,
    Table,
    config_keys,
    label,
    unknown_key,
)
from ladder.knobs import SPEC, Knob, KnobError
from ladder.parsers import BadValue, describe, option_value, parse_hostport

__all__ = ["cli_overrides", "load", "load_toml", "merge"]

_SECTIONS: dict[str, type] = {name: key.spec.cls for name, key in config_keys(DaemonConfig).items()
                              if isinstance(key.spec, Table)}
_TOP_KEYS = ("servers", *_SECTIONS)
_OPTIONS = next(name for name, key in config_keys(ServerConfig).items()
                if isinstance(key.spec, Options))


def _origin(source: Source) -> str:
    if source.startswith("env "):
        return f" (from {source[4:]})"
    if source == "cli":
        return " (from the command line)"
    return ""


@dataclass(frozen=True, slots=True)
class _Entry:
    value: object
    source: Source
    rank: int  # 1 file, 2 env, 3 cli wildcard, 4 cli


# --------------------------------------------------------------------------------- layers


def _walk_table(cls: type, table: object, path: KeyPath, out: dict[KeyPath, _Entry]) -> None:
    if not isinstance(table, Mapping):
        raise ConfigError(label(path) or "(top level)", f"expected a table, got {describe(table)}")
    known = config_keys(cls)
    for key, value in table.items():
        if key not in known:
            raise unknown_key(path, str(key), list(known), "")
        here = (*path, key)
        spec = known[key].spec
        if isinstance(spec, Table):
            _walk_table(spec.cls, value, here, out)
        elif isinstance(spec, Options):
            if not isinstance(value, Mapping):
                raise ConfigError(label(here), f"expected a table, got {describe(value)}")
            for option, option_given in value.items():
                out[(*here, str(option))] = _Entry(option_given, "file", 1)
        else:
            out[here] = _Entry(value, "file", 1)


def _walk_file(doc: Mapping[str, Any]) -> tuple[dict[KeyPath, _Entry], int]:
    out: dict[KeyPath, _Entry] = {}
    for key, value in doc.items():
        if key == "servers":
            if not isinstance(value, list):
                raise ConfigError("servers", f"expected an array of tables ([[servers]]), "
                                             f"got {describe(value)}")
            for index, table in enumerate(value):
                _walk_table(ServerConfig, table, ("servers", index), out)
        elif key in _SECTIONS:
            _walk_table(_SECTIONS[key], value, (key,), out)
        else:
            raise unknown_key((), str(key), _TOP_KEYS, "")
    servers = doc.get("servers", [])
    return out, len(servers)


def _resolve(parts: Sequence[str], source: Source, *, wildcard: bool) -> KeyPath:
    """Env or CLI segments -> a schema path; unknown segments fail with a suggestion."""
    origin = _origin(source)
    if not parts or not parts[0]:
        raise ConfigError(source, "names no key")
    head = parts[0]
    if head in _SECTIONS:
        cls: type | None = _SECTIONS[head]
        path: list[str | int] = [head]
        rest = list(parts[1:])
    elif head == "servers":
        if len(parts) < 2 or not (parts[1].isdigit() or (wildcard and parts[1] == "*")):
            raise ConfigError("servers", f"expected a server index after 'servers'{origin}, "
                                         f"like servers.0.url or LADDER_SERVERS__0__URL")
        cls = ServerConfig
        path = ["servers", "*" if parts[1] == "*" else int(parts[1])]
        rest = list(parts[2:])
    else:
        raise unknown_key((), head, _TOP_KEYS, origin)
    while rest:
        key = rest.pop(0)
        if cls is None:
            raise ConfigError(label(path), f"is not a table{origin}")
        known = config_keys(cls)
        if key not in known:
            raise unknown_key(path, key, list(known), origin)
        path.append(key)
        spec = known[key].spec
        if isinstance(spec, Table):
            cls = spec.cls
        elif isinstance(spec, Options):
            if len(rest) != 1 or not rest[0]:
                raise ConfigError(label(path), f"name one option, like "
                                               f"{label(path)}.dwell_s{origin}")
            path.append(rest.pop(0))
            return tuple(path)
        else:
            cls = None
    if cls is not None:
        raise ConfigError(label(path), f"is a table; name one of its keys "
                                       f"({', '.join(config_keys(cls))}){origin}")
    return tuple(path)


def _walk_env(env: Mapping[str, str]) -> dict[KeyPath, _Entry]:
    out: dict[KeyPath, _Entry] = {}
    for name in sorted(env):
        if not name.upper().startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX):]
        # Variables without the delimiter (LADDER_API_KEY, LADDER_CONFIG) belong to the CLI,
        # not to the tree: every key in the tree is at least two levels deep.
        if ENV_DELIMITER not in rest:
            continue
        path = _resolve(rest.lower().split(ENV_DELIMITER), f"env {name}", wildcard=False)
        out[path] = _Entry(env[name], f"env {name}", 2)
    return out


def _walk_cli(cli: Mapping[str, Any]) -> dict[KeyPath, _Entry]:
    out: dict[KeyPath, _Entry] = {}
    for dotted, value in cli.items():
        if value is None:  # a flag not given
            continue
        path = _resolve(dotted.split("."), "cli", wildcard=True)
        out[path] = _Entry(value, "cli", 3 if "*" in path else 4)
    return out


# --------------------------------------------------------------------------------- merge


def merge(file_doc: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
          cli: Mapping[str, Any] | None = None, *, single_server: bool = False) -> DaemonConfig:
    """The effective config: knob defaults < `file_doc` < `LADDER_*` in `env` < `cli`.

    `file_doc` is a parsed ladder.toml (see `load_toml`). `env` is the process environment
    (only `LADDER_<SECTION>__...` names are read). `cli` maps dotted paths to values
    ("servers.0.url", "control.poll_s"; "servers.*.policy" sets every server; None means the
    flag was not given), see `cli_overrides`. `single_server` (the CLI's `--server URL`) keeps
    servers[0] only. Raises ConfigError, whose message names the key path and its source.
    """
    file_entries, file_servers = _walk_file(file_doc or {})
    env_entries = _walk_env(env or {})
    cli_entries = _walk_cli(cli or {})
    count = _server_count(file_servers, [*env_entries, *cli_entries])
    if single_server:
        count = 1
    merged: dict[KeyPath, _Entry] = {}
    for layer in (file_entries, env_entries, cli_entries):
        for path, entry in sorted(layer.items(), key=lambda item: item[1].rank):
            if "*" in path:
                for index in range(count):
                    merged[tuple(index if p == "*" else p for p in path)] = entry
            else:
                merged[path] = entry
    merged = {p: e for p, e in merged.items()
              if not (p[0] == "servers" and isinstance(p[1], int) and p[1] >= count)}
    sources: dict[str, Source] = {}
    servers = tuple(_build_server(index, count, merged, env or {}, sources)
                    for index in range(count))
    sections = {name: _build(cls, (name,), merged, sources) for name, cls in _SECTIONS.items()}
    config = DaemonConfig(servers=servers, sources=MappingProxyType(sources), **sections)
    _validate(config)
    return config


def _server_count(file_servers: int, paths: Sequence[KeyPath]) -> int:
    indexes = sorted({p[1] for p in paths if p[0] == "servers" and isinstance(p[1], int)})
    count = file_servers
    for index in indexes:
        if index > count:
            raise ConfigError(f"servers[{index}]", f"is set from env or the command line but "
                                                   f"servers[{count}] is not configured; servers "
                                                   f"are numbered from 0 in file order")
        count = max(count, index + 1)
    return max(count, 1)  # no servers anywhere: the one default server


def _build(cls: type, path: KeyPath, merged: Mapping[KeyPath, _Entry],
           sources: dict[str, Source]) -> Any:
    """An instance of the table type `cls` at `path`, every knob parsed from its winning layer
    (or left to its default), every key's source recorded."""
    kwargs: dict[str, Any] = {}
    keys: dict[str, str] = {}  # field -> key, for errors the settings type raises itself
    for f in fields(cls):
        spec = f.metadata.get(SPEC)
        if isinstance(spec, Table):
            kwargs[f.name] = _build(spec.cls, path if spec.flat else (*path, f.name), merged,
                                    sources)
        elif isinstance(spec, Knob):
            keys[f.name] = key = spec.key or f.name
            here = (*path, key)
            entry = merged.get(here)
            if entry is None:
                sources[label(here)] = "default"
                continue
            try:
                kwargs[f.name] = spec.parse(entry.value)
            except BadValue as exc:
                raise ConfigError(label(here), f"{exc}{_origin(entry.source)}") from None
            sources[label(here)] = entry.source
        # Options tables are recorded by _build_server, one source per option; fields that
        # are no knob (ApplySettings' budget) are not config.
    try:
        return cls(**kwargs)
    except KnobError as exc:  # a rule across keys (kv_max_tokens below kv_floor_tokens)
        raise ConfigError(label((*path, keys.get(exc.name, exc.name))), exc.message) from None


def _build_server(index: int, count: int, merged: dict[KeyPath, _Entry], env: Mapping[str, str],
                  sources: dict[str, Source]) -> ServerConfig:
    path: KeyPath = ("servers", index)
    key, key_env = merged.get((*path, "api_key")), merged.get((*path, "api_key_env"))
    if key is not None and key_env is not None:
        # Across layers the higher one wins like any key; within one layer it is ambiguous.
        if key.rank == key_env.rank:
            raise ConfigError(label((*path, "api_key")),
                              f"give api_key or api_key_env, not both{_origin(key.source)}")
        del merged[(*path, "api_key_env") if key.rank > key_env.rank else (*path, "api_key")]
    if (*path, "name") not in merged and count > 1:
        raise ConfigError(label((*path, "name")), "is required when there are several servers")
    options = {p[3]: e for p, e in merged.items() if p[:3] == (*path, _OPTIONS)}
    server: ServerConfig = _build(ServerConfig, path, merged, sources)
    for option, entry in options.items():
        sources[label((*path, _OPTIONS, str(option)))] = entry.source
    changes: dict[str, Any] = {
        _OPTIONS: MappingProxyType({str(k): _option_value(e) for k, e in options.items()})}
    if server.api_key_env is not None:
        var = server.api_key_env
        if not env.get(var):
            raise ConfigError(label((*path, "api_key_env")),
                              f"environment variable {var} is not set or empty")
        changes["api_key"] = env[var]
        sources[label((*path, "api_key"))] = f"env {var} (via api_key_env)"
    return replace(server, **changes)


def _option_value(entry: _Entry) -> Any:
    if entry.source.startswith("env ") and isinstance(entry.value, str):
        return option_value(entry.value)
    return entry.value


def _wildcard_host(host: str) -> bool:
    return host in ("0.0.0.0", "::", "")


def _validate(config: DaemonConfig) -> None:
    """Checks across servers and listeners; each error names the key that should change.
    Rules within one settings type (a ceiling below its base) are that type's own."""
    names: dict[str, int] = {}
    listen = (config.listen.host, config.listen.port)
    binds: dict[tuple[str, int], str] = {listen: "listen"}
    for index, server in enumerate(config.servers):
        at = f"servers[{index}]"
        if server.name in names:
            raise ConfigError(f"{at}.name", f"duplicate server name {server.name!r} (also "
                                            f"servers[{names[server.name]}].name)")
        names[server.name] = index
        if server.gate_listen is not None:
            host, port = parse_hostport(server.gate_listen, any_port=True)
            for (other_host, other_port), owner in binds.items():
                if port == other_port and port != 0 and (
                        host == other_host or _wildcard_host(host)
                        or _wildcard_host(other_host)):
                    raise ConfigError(f"{at}.gate_listen",
                                      f"{server.gate_listen} is also taken by {owner}")
            binds[(host, port)] = f"{at}.gate_listen"


# --------------------------------------------------------------------------------- I/O edge


def load_toml(path: str | Path) -> dict[str, Any]:
    """Parse a ladder.toml; any failure is a ConfigError naming the file (and line)."""
    name = str(path)
    try:
        with open(path, "rb") as handle:  # tomllib needs a binary handle
            return tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(None, f"{name}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(None, f"{name}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        text = str(exc)
        # Python 3.11's TOMLDecodeError has no lineno; the message ends "(at line N, column M)".
        match = re.search(r"\(at line (\d+), column (\d+)\)$", text)
        where = f"{name}:{match.group(1)}" if match else name
        reason = text[: match.start()].strip() if match else text
        raise ConfigError(None, f"{where}: invalid TOML: {reason}") from None


def load(path: str | Path | None, env: Mapping[str, str] | None = None,
         cli: Mapping[str, Any] | None = None, *, single_server: bool = False) -> DaemonConfig:
    """`load_toml(path)` (when given), then `merge`: what `ladder run --config PATH` does."""
    doc = load_toml(path) if path is not None else {}
    return merge(doc, env, cli, single_server=single_server)


def cli_overrides(*, server: str | None = None, api_key: str | None = None,
                  policy: str | None = None, poll_s: float | str | None = None,
                  gate: str | None = None, listen: str | None = None,
                  ladder: Mapping[str, Any] | None = None,
                  policy_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The `cli` layer from flags; pass `single_server=server is not None` to `merge`.

    `--policy`, `--gate`, the ladder-layout flags (`ladder`: LadderSpec key -> value) and
    `--policy-option` (`policy_options`) apply to every server (`servers.*`), so `--gate` with
    several servers fails as a duplicate bind: a gate address only makes sense for one server.
    """
    out: dict[str, Any] = {"servers.0.url": server, "servers.0.api_key": api_key,
                           "servers.*.policy": policy, "servers.*.gate_listen": gate,
                           "control.poll_s": poll_s}
    for key, value in (ladder or {}).items():
        out[f"servers.*.ladder.{key}"] = value
    for key, value in (policy_options or {}).items():
        out[f"servers.*.policy_options.{key}"] = value
    if listen is not None:
        try:
            out["listen.host"], out["listen.port"] = parse_hostport(listen, any_port=True)
        except BadValue as exc:
            raise ConfigError("listen", f"{exc} (from the command line)") from None
    return {k: v for k, v in out.items() if v is not None}
