"""The daemon's configuration: one merge of defaults < TOML file < `LADDER_*` env < CLI flags.

Why one pure `merge`: the precedence rule is the part of a config system that silently goes
wrong (a flag that loses to a file, an env var read as a string), so it is decided in one
function that takes plain mappings and is tested exhaustively; the CLI only gathers the
layers. Why frozen dataclasses and no pydantic: a small sidecar, defaults
on the dataclasses, one validation pass whose errors name the key path and, for env and CLI
values, the variable or flag that set it, so a bad deployment fails at start with one line.

Why a provenance map: "which layer set this?" is the first question when a daemon misbehaves;
`explain` answers it for `ladder config check`, and the map is kept on the config itself
(`DaemonConfig.sources`, not compared) so it travels with the object that is being explained.

Env naming: `LADDER_` + the key path, upper case, `__` between levels; servers by their index
in file order (`LADDER_SERVERS__0__URL`). Env and CLI values may be strings; they are parsed
by the target field's type, so `LADDER_SAFEGUARDS__COOLDOWN_S=30` is a float and
`LADDER_SERVERS__0__LADDER__KV_FLOOR_TOKENS=64k` is 65536. Sizes are stored as integers.

Pure: no I/O except `load_toml`, which reads the path it is given (and `load`, which calls it).
"""

from __future__ import annotations

import difflib
import json
import math
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from ladder.units import parse_bytes, parse_count

if TYPE_CHECKING:
    from ladder.executor import ApplySettings
    from ladder.rungs import LadderSpec

__all__ = [
    "ENV_PREFIX",
    "REDACTED",
    "ConfigError",
    "ControlConfig",
    "DaemonConfig",
    "LadderConfig",
    "ListenConfig",
    "LogConfig",
    "SafeguardConfig",
    "ServerConfig",
    "cli_overrides",
    "env_name",
    "explain",
    "load",
    "load_toml",
    "merge",
    "option_value",
    "parse_hostport",
    "server_url",
    "to_json",
]

ENV_PREFIX = "LADDER_"
ENV_DELIMITER = "__"
REDACTED = "***"

Source = str  # "default" | "file" | "env LADDER_..." | "cli"


class ConfigError(ValueError):
    """A config the daemon must not start with; `str()` is one line that names the key path."""

    def __init__(self, key: str | None, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}" if key else message)


class _Bad(ValueError):
    """A value a parser refused; the caller adds the key path and the source."""


# --------------------------------------------------------------------------------- parsers
# Each parser takes what a layer gave (a TOML value, an env string, a CLI value) and returns
# the stored type, raising _Bad with "expected X, got Y". Strings are accepted everywhere
# because env and flags only have strings.

Parser = Callable[[object], Any]


def _got(value: object) -> str:
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list | tuple):
        return "an array"
    return repr(value)


def _optional(parse: Parser) -> Parser:
    # TOML has no null: absence means None; from env an empty string unsets an optional key.
    def parse_optional(value: object) -> Any:
        if value is None or (isinstance(value, str) and value.strip() == ""):
            return None
        return parse(value)
    return parse_optional


def _float(*, positive: bool = False, what: str = "a duration in seconds") -> Parser:
    def parse(value: object) -> float:
        if isinstance(value, bool):
            raise _Bad(f"expected {what}, got {value!r}")
        if isinstance(value, int | float):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                raise _Bad(f"expected {what}, got {value!r}") from None
        else:
            raise _Bad(f"expected {what}, got {_got(value)}")
        if not math.isfinite(number):
            raise _Bad(f"expected {what}, got {value!r}")
        if number < 0:
            raise _Bad(f"must not be negative, got {value!r}")
        if positive and number == 0:
            raise _Bad(f"must be greater than 0, got {value!r}")
        return number
    return parse


def _int(*, minimum: int = 0, what: str = "a whole number") -> Parser:
    def parse(value: object) -> int:
        if isinstance(value, bool):
            raise _Bad(f"expected {what}, got {value!r}")
        if isinstance(value, int):
            number = value
        elif isinstance(value, str):
            try:
                number = int(value.strip())
            except ValueError:
                raise _Bad(f"expected {what}, got {value!r}") from None
        else:
            raise _Bad(f"expected {what}, got {_got(value)}")
        if number < minimum:
            raise _Bad(f"must be at least {minimum}, got {value!r}")
        return number
    return parse


def _human(unit_parser: Callable[[str], int], what: str, *, minimum: int) -> Parser:
    def parse(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise _Bad(f"expected {what}, got {_got(value)}")
        if isinstance(value, int):
            number = value
        else:
            try:
                number = unit_parser(value)
            except ValueError:
                raise _Bad(f"expected {what}, got {value!r}") from None
        if number < minimum:
            raise _Bad(f"must be at least {minimum}, got {value!r}")
        return number
    return parse


def _tokens(*, minimum: int = 1) -> Parser:
    return _human(parse_count, "a token count like 4096 or 64k", minimum=minimum)


def _bytes() -> Parser:
    return _human(parse_bytes, "a byte size like 1073741824 or 512MiB", minimum=0)


def _ratio(*, low: float, high: float, low_open: bool, high_open: bool) -> Parser:
    left, right = "(" if low_open else "[", ")" if high_open else "]"
    span = f"{left}{low:g}, {high:g}{right}"
    as_float = _float(what="a number")

    def parse(value: object) -> float:
        try:
            number: float = as_float(value)
        except _Bad:
            number = math.nan
        too_low = number <= low if low_open else number < low
        too_high = number >= high if high_open else number > high
        if math.isnan(number) or too_low or too_high:
            raise _Bad(f"expected a ratio in {span}, got {value!r}")
        return number
    return parse


def _choice(*options: str) -> Parser:
    def parse(value: object) -> str:
        if isinstance(value, str) and value.strip().lower() in options:
            return value.strip().lower()
        raise _Bad(f"expected one of {', '.join(options)}, got {_got(value)}")
    return parse


def _text(pattern: str | None = None, what: str = "a string") -> Parser:
    compiled = re.compile(pattern) if pattern else None

    def parse(value: object) -> str:
        if not isinstance(value, str) or not value.strip():
            raise _Bad(f"expected {what}, got {_got(value)}")
        text = value.strip()
        if compiled is not None and not compiled.fullmatch(text):
            raise _Bad(f"expected {what}, got {value!r}")
        return text
    return parse


def _secret(value: object) -> str:
    # Never echo a rejected secret back into a log line.
    if not isinstance(value, str) or not value:
        raise _Bad("expected a non-empty string")
    return value


def server_url(value: object) -> str:
    """An http(s) URL, or `HOST:PORT` as `ft ctl` users type it (read as http://HOST:PORT);
    ValueError naming what is wrong."""
    what = "an http:// or https:// URL, or HOST:PORT"
    text: str = _text(what=what)(value)
    if "://" not in text and re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):\d{1,5}", text):
        parse_hostport(text)  # the port's range
        text = f"http://{text}"
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", text):
        raise _Bad(f"expected {what}, got {value!r}")
    return text.rstrip("/")


def _port(value: object) -> int:
    port: int = _int(what="a TCP port (0-65535)")(value)
    if port > 65535:
        raise _Bad(f"expected a TCP port (0-65535), got {value!r}")
    return port


def parse_hostport(text: object, *, any_port: bool = False) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::1]:9190`) -> (host, port); ValueError naming what is wrong.

    `any_port` admits port 0 ("any free port"), for the daemon's own listener."""
    if not isinstance(text, str):
        raise _Bad(f"expected HOST:PORT, got {_got(text)}")
    match = re.fullmatch(r"\s*(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]+):(\d{1,5})\s*", text)
    if not match:
        raise _Bad(f"expected HOST:PORT like 127.0.0.1:9191, got {text!r}")
    host, port = match.group(1).strip("[]"), int(match.group(2))
    if port < (0 if any_port else 1) or port > 65535:
        raise _Bad(f"port must be {0 if any_port else 1}-65535, got {text!r}")
    return host, port


def _format_hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _hostport(value: object) -> str:
    return _format_hostport(*parse_hostport(value))


_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
# An entry-point name (`headroom`) or `module.path:attr` (policies/api.py).
_POLICY = r"[A-Za-z_][\w.-]*(:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*)?"
_ENV_VAR = r"[A-Za-z_][A-Za-z0-9_]*"


def _key(default: Any, parse: Parser, **kwargs: Any) -> Any:
    return field(default=default, metadata={"parse": parse}, **kwargs)


# --------------------------------------------------------------------------------- the tree


@dataclass(frozen=True, slots=True)
class LadderConfig:
    """How to lay out one server's rungs; defaults argued in ladder/rungs.py."""

    kv_floor_tokens: int = _key(4096, _tokens())
    kv_max_tokens: int | None = _key(None, _optional(_tokens()))
    spacing: Literal["geometric", "linear"] = _key("geometric", _choice("geometric", "linear"))
    kv_step_ratio: float = _key(math.sqrt(2), _ratio(low=1.0, high=16.0, low_open=True,
                                                     high_open=False))
    kv_step_tokens: int = _key(32768, _tokens())
    reserve_bytes: int = _key(0, _bytes())
    fixed_bytes: int = _key(0, _bytes())
    mamba_slots: int | None = _key(None, _optional(_int()))
    min_moe_slots: int | None = _key(None, _optional(_int()))

    def to_spec(self) -> LadderSpec:
        from ladder.rungs import LadderSpec  # lazy: keeps `import ladder.config` light

        return LadderSpec(kv_floor_tokens=self.kv_floor_tokens, kv_max_tokens=self.kv_max_tokens,
                          spacing=self.spacing, kv_step_ratio=self.kv_step_ratio,
                          kv_step_tokens=self.kv_step_tokens, reserve_bytes=self.reserve_bytes,
                          mamba_slots=self.mamba_slots, min_moe_slots=self.min_moe_slots)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """One `ft serve` the daemon steers; several `[[servers]]` may share one daemon."""

    name: str = _key("default", _text(_NAME, "a name of letters, digits, '.', '_' or '-'"))
    url: str = _key("http://127.0.0.1:1919", server_url)
    api_key: str | None = _key(None, _optional(_secret), repr=False)
    api_key_env: str | None = _key(None, _optional(_text(_ENV_VAR, "an environment variable "
                                                                   "name")))
    timeout_s: float = _key(10.0, _float(positive=True))
    policy: str = _key("headroom", _text(_POLICY, "a policy name or module:attr"))
    # Free-form: the policy's factory validates its own options (policies/api.py). Not in
    # repr: an option may be a credential, and configs end up in log lines.
    policy_options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}),
                                              hash=False, repr=False)
    gate_listen: str | None = _key(None, _optional(_hostport))
    ladder: LadderConfig = field(default_factory=LadderConfig)
    tokenizer_path: str | None = _key(None, _optional(_text(what="a file path")))


@dataclass(frozen=True, slots=True)
class SafeguardConfig:
    """The controller's brakes: timing, rate, backoff, breaker, fallback."""

    cooldown_s: float = _key(60.0, _float())
    min_dwell_s: float = _key(120.0, _float())
    down_tolerance: float = _key(0.10, _ratio(low=0.0, high=1.0, low_open=False,
                                              high_open=True))
    max_transitions_per_hour: int = _key(12, _int(minimum=1))
    backoff_base_s: float = _key(5.0, _float())
    backoff_max_s: float = _key(300.0, _float())
    breaker_failures: int = _key(5, _int(minimum=1))
    breaker_open_s: float = _key(600.0, _float())
    fallback_after_failed_reads: int = _key(3, _int(minimum=1))


@dataclass(frozen=True, slots=True)
class ControlConfig:
    """The loop's tick and how one transition is executed (ladder/executor.py ApplySettings)."""

    poll_s: float = _key(2.0, _float(positive=True))
    apply_poll_s: float = _key(0.5, _float(positive=True))
    idle_wait_s: float = _key(600.0, _float())
    settle_wait_s: float = _key(600.0, _float())
    rebuild_wait_s: float = _key(300.0, _float())
    busy_retries: int = _key(8, _int())
    busy_backoff_base_s: float = _key(1.0, _float())
    busy_backoff_max_s: float = _key(30.0, _float())
    max_replans: int = _key(2, _int())
    transition_estimate_s: float = _key(1.0, _float())

    def apply_settings(self, ladder: LadderConfig) -> ApplySettings:
        from ladder.executor import ApplySettings  # lazy: the executor pulls in the client

        return ApplySettings(poll_s=self.apply_poll_s, idle_wait_s=self.idle_wait_s,
                             settle_wait_s=self.settle_wait_s, busy_retries=self.busy_retries,
                             backoff_base_s=self.busy_backoff_base_s,
                             backoff_max_s=self.busy_backoff_max_s,
                             rebuild_wait_s=self.rebuild_wait_s, max_replans=self.max_replans,
                             fixed_bytes=ladder.fixed_bytes, reserve_bytes=ladder.reserve_bytes)


@dataclass(frozen=True, slots=True)
class ListenConfig:
    """The daemon's own HTTP endpoint (/status, /metrics); `token` guards mutating calls."""

    host: str = _key("127.0.0.1", _text(r"[^\s:\[\]]+|[0-9A-Fa-f:.]+", "a host name or address"))
    port: int = _key(9190, _port)
    token: str | None = _key(None, _optional(_secret), repr=False)


@dataclass(frozen=True, slots=True)
class LogConfig:
    format: Literal["text", "json"] = _key("text", _choice("text", "json"))
    level: Literal["debug", "info", "warning", "error"] = _key(
        "info", _choice("debug", "info", "warning", "error"))
    repeat_s: float = _key(300.0, _float(positive=True))


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    servers: tuple[ServerConfig, ...] = (ServerConfig(),)
    safeguards: SafeguardConfig = field(default_factory=SafeguardConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    listen: ListenConfig = field(default_factory=ListenConfig)
    log: LogConfig = field(default_factory=LogConfig)
    # Key path ("servers[0].url") -> where its value came from; not part of equality.
    sources: Mapping[str, Source] = field(default_factory=lambda: MappingProxyType({}),
                                          compare=False, repr=False)

    def server(self, name: str) -> ServerConfig:
        for server in self.servers:
            if server.name == name:
                return server
        raise KeyError(name)


_SECTIONS: dict[str, type] = {"safeguards": SafeguardConfig, "control": ControlConfig,
                              "listen": ListenConfig, "log": LogConfig}
_TOP_KEYS = ("servers", *_SECTIONS)
_NESTED: dict[str, type] = {"ladder": LadderConfig}
_OPTIONS = "policy_options"
_SECRETS = frozenset({"api_key", "token"})
_SECRET_OPTION = re.compile(r"(key|token|secret|password)$", re.IGNORECASE)

# --------------------------------------------------------------------------------- paths
# A path is a tuple like ("servers", 0, "ladder", "kv_floor_tokens"); its label is the
# form errors and `explain` print: "servers[0].ladder.kv_floor_tokens".

KeyPath = tuple[str | int, ...]


def _label(path: Sequence[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def env_name(path: Sequence[str | int]) -> str:
    """The env variable for a key path: ("servers", 0, "url") -> LADDER_SERVERS__0__URL."""
    return ENV_PREFIX + ENV_DELIMITER.join(str(p).upper() for p in path)


def _leaf_names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


def _unknown(path: Sequence[str | int], key: str, known: Sequence[str], origin: str) -> ConfigError:
    close = difflib.get_close_matches(key.lower(), known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
    return ConfigError(_label([*path, key]), f"unknown key{origin}{hint}")


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


def _walk_table(cls: type, table: object, path: KeyPath, out: dict[KeyPath, _Entry]) -> None:
    if not isinstance(table, Mapping):
        raise ConfigError(_label(path) or "(top level)", f"expected a table, got {_got(table)}")
    known = _leaf_names(cls)
    for key, value in table.items():
        if key not in known:
            raise _unknown(path, str(key), known, "")
        here = (*path, key)
        if key in _NESTED:
            _walk_table(_NESTED[key], value, here, out)
        elif key == _OPTIONS:
            if not isinstance(value, Mapping):
                raise ConfigError(_label(here), f"expected a table, got {_got(value)}")
            for option, option_value in value.items():
                out[(*here, str(option))] = _Entry(option_value, "file", 1)
        else:
            out[here] = _Entry(value, "file", 1)


def _walk_file(doc: Mapping[str, Any]) -> tuple[dict[KeyPath, _Entry], int]:
    out: dict[KeyPath, _Entry] = {}
    for key, value in doc.items():
        if key == "servers":
            if not isinstance(value, list):
                raise ConfigError("servers", f"expected an array of tables ([[servers]]), "
                                             f"got {_got(value)}")
            for index, table in enumerate(value):
                _walk_table(ServerConfig, table, ("servers", index), out)
        elif key in _SECTIONS:
            _walk_table(_SECTIONS[key], value, (key,), out)
        else:
            raise _unknown((), str(key), _TOP_KEYS, "")
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
        raise _unknown((), head, _TOP_KEYS, origin)
    while rest:
        key = rest.pop(0)
        if cls is None:
            raise ConfigError(_label(path), f"is not a table{origin}")
        known = _leaf_names(cls)
        if key not in known:
            raise _unknown(path, key, known, origin)
        path.append(key)
        if key in _NESTED:
            cls = _NESTED[key]
        elif key == _OPTIONS:
            if len(rest) != 1 or not rest[0]:
                raise ConfigError(_label(path), f"name one option, like "
                                                f"{_label(path)}.dwell_s{origin}")
            path.append(rest.pop(0))
            return tuple(path)
        else:
            cls = None
    if cls is not None:
        raise ConfigError(_label(path), f"is a table; name one of its keys "
                                        f"({', '.join(_leaf_names(cls))}){origin}")
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
    """The effective config: dataclass defaults < `file_doc` < `LADDER_*` in `env` < `cli`.

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


def _parse(parse: Parser, path: KeyPath, entry: _Entry) -> Any:
    try:
        return parse(entry.value)
    except _Bad as exc:
        raise ConfigError(_label(path), f"{exc}{_origin(entry.source)}") from None


def _build(cls: type, path: KeyPath, merged: Mapping[KeyPath, _Entry],
           sources: dict[str, Source]) -> Any:
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        here = (*path, f.name)
        if f.name in _NESTED:
            kwargs[f.name] = _build(_NESTED[f.name], here, merged, sources)
            continue
        if f.name == _OPTIONS:  # one source per option, recorded by _build_server
            continue
        entry = merged.get(here)
        if entry is None:
            sources[_label(here)] = "default"
            continue
        kwargs[f.name] = _parse(f.metadata["parse"], here, entry)
        sources[_label(here)] = entry.source
    return cls(**kwargs)


def _build_server(index: int, count: int, merged: dict[KeyPath, _Entry], env: Mapping[str, str],
                  sources: dict[str, Source]) -> ServerConfig:
    path: KeyPath = ("servers", index)
    key, key_env = merged.get((*path, "api_key")), merged.get((*path, "api_key_env"))
    if key is not None and key_env is not None:
        # Across layers the higher one wins like any key; within one layer it is ambiguous.
        if key.rank == key_env.rank:
            raise ConfigError(_label((*path, "api_key")),
                              f"give api_key or api_key_env, not both{_origin(key.source)}")
        del merged[(*path, "api_key_env") if key.rank > key_env.rank else (*path, "api_key")]
    if (*path, "name") not in merged and count > 1:
        raise ConfigError(_label((*path, "name")), "is required when there are several servers")
    options = {p[3]: e for p, e in merged.items() if p[:3] == (*path, _OPTIONS)}
    server: ServerConfig = _build(ServerConfig, path, merged, sources)
    for option, entry in options.items():
        sources[_label((*path, _OPTIONS, str(option)))] = entry.source
    changes: dict[str, Any] = {
        _OPTIONS: MappingProxyType({str(k): _option_value(e) for k, e in options.items()})}
    if server.api_key_env is not None:
        var = server.api_key_env
        if not env.get(var):
            raise ConfigError(_label((*path, "api_key_env")),
                              f"environment variable {var} is not set or empty")
        changes["api_key"] = env[var]
        sources[_label((*path, "api_key"))] = f"env {var} (via api_key_env)"
    return replace(server, **changes)


def option_value(text: str) -> Any:
    """A policy option typed as text (env, `--policy-option`): its TOML value when it is one
    (60 -> int, 0.5 -> float, true -> bool), else the string itself. Options are typed by the
    policy, not here."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _option_value(entry: _Entry) -> Any:
    if entry.source.startswith("env ") and isinstance(entry.value, str):
        return option_value(entry.value)
    return entry.value


def _wildcard_host(host: str) -> bool:
    return host in ("0.0.0.0", "::", "")


def _validate(config: DaemonConfig) -> None:
    """Checks that span keys; each error names the key that should change."""
    names: dict[str, int] = {}
    listen = (config.listen.host, config.listen.port)
    binds: dict[tuple[str, int], str] = {listen: "listen"}
    for index, server in enumerate(config.servers):
        at = f"servers[{index}]"
        if server.name in names:
            raise ConfigError(f"{at}.name", f"duplicate server name {server.name!r} (also "
                                            f"servers[{names[server.name]}].name)")
        names[server.name] = index
        spec = server.ladder
        if spec.kv_max_tokens is not None and spec.kv_max_tokens < spec.kv_floor_tokens:
            raise ConfigError(f"{at}.ladder.kv_max_tokens",
                              f"impossible ladder: kv_max_tokens {spec.kv_max_tokens} is below "
                              f"kv_floor_tokens {spec.kv_floor_tokens}")
        if server.gate_listen is not None:
            host, port = parse_hostport(server.gate_listen)
            for (other_host, other_port), owner in binds.items():
                if port == other_port and port != 0 and (
                        host == other_host or _wildcard_host(host)
                        or _wildcard_host(other_host)):
                    raise ConfigError(f"{at}.gate_listen",
                                      f"{server.gate_listen} is also taken by {owner}")
            binds[(host, port)] = f"{at}.gate_listen"
    pairs = (("safeguards", config.safeguards.backoff_base_s, config.safeguards.backoff_max_s),
             ("control", config.control.busy_backoff_base_s, config.control.busy_backoff_max_s))
    for section, base, ceiling in pairs:
        prefix = "busy_" if section == "control" else ""
        if ceiling < base:
            raise ConfigError(f"{section}.{prefix}backoff_max_s",
                              f"{ceiling:g} is below {prefix}backoff_base_s {base:g}")


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

    `--policy`, `--gate`, the ladder-layout flags (`ladder`: LadderConfig key -> value) and
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
        except _Bad as exc:
            raise ConfigError("listen", f"{exc} (from the command line)") from None
    return {k: v for k, v in out.items() if v is not None}


# --------------------------------------------------------------------------------- output


def _dump(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if f.name in _SECRETS:
            value = None if value is None else REDACTED
        elif f.name == _OPTIONS:
            value = {k: REDACTED if _SECRET_OPTION.search(k) else v for k, v in value.items()}
        elif is_dataclass(value):
            value = _dump(value)
        out[f.name] = value
    return out


def to_json(config: DaemonConfig) -> dict[str, Any]:
    """The effective config as JSON-ready data, with api keys and tokens shown as "***"."""
    return {"servers": [_dump(s) for s in config.servers],
            **{name: _dump(getattr(config, name)) for name in _SECTIONS}}


def _leaves(doc: Mapping[str, Any], path: KeyPath) -> Iterator[tuple[KeyPath, Any]]:
    for key, value in doc.items():
        if isinstance(value, Mapping) and (key in _NESTED or key in _SECTIONS or key == _OPTIONS):
            yield from _leaves(value, (*path, key))
        else:
            yield (*path, key), value


def explain(config: DaemonConfig) -> str:
    """One line per key: `key = value  # source`, secrets redacted; backs `config check`."""
    doc = to_json(config)
    servers = doc.pop("servers")
    leaves = [leaf for i, s in enumerate(servers) for leaf in _leaves(s, ("servers", i))]
    leaves.extend(_leaves(doc, ()))
    rows = [(_label(p), json.dumps(v, default=str)) for p, v in leaves]
    width = max(len(f"{k} = {v}") for k, v in rows)
    lines = [f"{f'{k} = {v}':<{width}}  # {config.sources.get(k, 'default')}" for k, v in rows]
    return "\n".join(lines)

