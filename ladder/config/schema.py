"""The config tree: which settings types sit under which TOML table, and the key paths.

Each key is declared once, as a knob of the settings type that uses it (`ladder.knobs`); this
module only arranges those types into the tree a file, `LADDER_*` variables and flags address:
`[[servers]]` (`ServerConfig`, with its `[servers.ladder]` table, the runtime `LadderSpec`),
`[safeguards]` (`SafeguardSettings`), `[control]` (one table in TOML, two types at run time:
`ControlSettings` for the loop and `ApplySettings` for one transition), `[listen]` and `[log]`
(`LogSettings`). So the daemon hands each controller the very objects the config built, and a
new knob on a settings type is a new key, with its env variable, `config check` line and
docs row, without a line here.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cache
from types import MappingProxyType
from typing import Any

from ladder.controller import ControlSettings
from ladder.executor import ApplySettings
from ladder.knobs import SPEC, Knob, check_knobs, knob
from ladder.logs import LogSettings
from ladder.parsers import hostport, optional, seconds, secret, server_url, tcp_port, text
from ladder.rungs import LadderSpec
from ladder.safeguards import SafeguardSettings

__all__ = [
    "ENV_PREFIX",
    "REDACTED",
    "ConfigError",
    "ControlConfig",
    "DaemonConfig",
    "Key",
    "KeyPath",
    "ListenConfig",
    "Options",
    "ServerConfig",
    "Source",
    "Table",
    "config_keys",
    "env_name",
    "flagged_keys",
    "label",
    "table",
    "unknown_key",
]

ENV_PREFIX = "LADDER_"
ENV_DELIMITER = "__"
REDACTED = "***"

Source = str  # "default" | "file" | "env LADDER_..." | "cli"
# A path is a tuple like ("servers", 0, "ladder", "kv_floor_tokens"); its label is the form
# errors and `explain` print: "servers[0].ladder.kv_floor_tokens".
KeyPath = tuple[str | int, ...]


class ConfigError(ValueError):
    """A config the daemon must not start with; `str()` is one line that names the key path."""

    def __init__(self, key: str | None, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}" if key else message)


@dataclass(frozen=True, slots=True)
class Table:
    """A field holding a settings type: a TOML table named by the field, or with `flat` its
    keys in the enclosing table (how `[control]` holds two types)."""

    cls: type
    flat: bool = False


@dataclass(frozen=True, slots=True)
class Options:
    """A free-form table passed on whole (`policy_options`): its owner validates it."""

    meaning: str


def table(cls: type, *, flat: bool = False) -> Any:
    """A dataclass field holding a settings type as a table (see `Table`)."""
    return field(default_factory=cls, metadata={SPEC: Table(cls, flat)})


@dataclass(frozen=True, slots=True)
class Key:
    """One key of a table: a knob, a nested table or a free-form options table."""

    attrs: tuple[str, ...]  # where its value sits in the object ("apply", "poll_s")
    spec: Knob | Table | Options


@cache
def config_keys(cls: type) -> Mapping[str, Key]:
    """The keys of a table type by name, in declaration order, flat tables flattened."""
    out: dict[str, Key] = {}
    for f in fields(cls):
        spec = f.metadata.get(SPEC)
        if isinstance(spec, Table) and spec.flat:
            for name, inner in config_keys(spec.cls).items():
                out[name] = Key((f.name, *inner.attrs), inner.spec)
        elif isinstance(spec, Knob):
            out[spec.key or f.name] = Key((f.name,), spec)
        elif isinstance(spec, Table | Options):
            out[f.name] = Key((f.name,), spec)
    return MappingProxyType(out)


_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
# An entry-point name (`headroom`) or `module.path:attr` (policies/api.py).
_POLICY = r"[A-Za-z_][\w.-]*(:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*)?"
_ENV_VAR = r"[A-Za-z_][A-Za-z0-9_]*"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """One `ft serve` the daemon steers; several `[[servers]]` may share one daemon."""

    name: str = knob("default", text(_NAME, "a name of letters, digits, '.', '_' or '-'"),
                     "Label in logs, metrics and `/status`; letters, digits, `.`, `_`, `-`. "
                     "Required and unique when there are several servers.")
    url: str = knob("http://127.0.0.1:1919", server_url, "Base URL of the server's HTTP API "
                    "(`http://` or `https://`; a trailing `/` is dropped).", flag="--server")
    api_key: str | None = knob(None, optional(secret), "Bearer key for ft serve. Prefer "
                               "`api_key_env`: a key in a file is a key in backups. Shown as "
                               "`***`.", flag="--api-key", secret=True)
    api_key_env: str | None = knob(
        None, optional(text(_ENV_VAR, "an environment variable name")), "Name of an "
        "environment variable holding the key; read at start, an error if unset. A higher "
        "layer's `api_key` replaces it.")
    timeout_s: float = knob(10.0, seconds(positive=True), "Per-request HTTP timeout, seconds, "
                            "> 0.")
    policy: str = knob("pinned", text(_POLICY, "a policy name or module:attr"), "The policy: "
                       "an entry-point name in `moe_ladder.policies` or `module.path:attr`.",
                       flag="--policy")
    # Free-form: the policy's factory validates its own options (policies/api.py). Not in
    # repr: an option may be a credential, and configs end up in log lines.
    policy_options: Mapping[str, Any] = field(
        default_factory=lambda: MappingProxyType({}), hash=False, repr=False, metadata={
            SPEC: Options("Table passed to the policy's factory, which validates it: `config "
                          "check` builds every policy with its options, so an unknown option "
                          "or a bad value fails there, not at `ladder run`. `headroom` takes "
                          "`margin`, `growth_tokens`, `dwell_s` (README, Policies). Keys "
                          "ending in `key`, `token`, `secret` or `password` are shown as "
                          "`***`.")})
    gate_listen: str | None = knob(None, optional(hostport), "`HOST:PORT` where the admission "
                                   "gate for this server listens.", flag="--gate",
                                   shown="unset (no gate)")
    ladder: LadderSpec = table(LadderSpec)
    tokenizer_path: str | None = knob(None, optional(text(what="a file path")), "Tokenizer "
                                      "file used to size waiting prompts; unset: estimate from "
                                      "bytes.")

    def __post_init__(self) -> None:
        check_knobs(self)


@dataclass(frozen=True, slots=True)
class ControlConfig:
    """`[control]`: the loop's knobs and one transition's, one table in TOML."""

    loop: ControlSettings = table(ControlSettings, flat=True)
    apply: ApplySettings = table(ApplySettings, flat=True)


@dataclass(frozen=True, slots=True)
class ListenConfig:
    """The daemon's own HTTP endpoint (/status, /metrics); `token` guards mutating calls."""

    host: str = knob("127.0.0.1", text(r"[^\s:\[\]]+|[0-9A-Fa-f:.]+", "a host name or address"),
                     "Address to bind.", flag="--listen")
    port: int = knob(9190, tcp_port, "TCP port, 0-65535 (0: any free port).", flag="--listen")
    token: str | None = knob(None, optional(secret), "Bearer token required for mutating "
                             "endpoints; shown as `***`.", secret=True)

    def __post_init__(self) -> None:
        check_knobs(self)


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    servers: tuple[ServerConfig, ...] = (ServerConfig(),)
    safeguards: SafeguardSettings = table(SafeguardSettings)
    control: ControlConfig = table(ControlConfig)
    listen: ListenConfig = table(ListenConfig)
    log: LogSettings = table(LogSettings)
    # Key path ("servers[0].url") -> where its value came from; not part of equality.
    sources: Mapping[str, Source] = field(default_factory=lambda: MappingProxyType({}),
                                          compare=False, repr=False)

    def server(self, name: str) -> ServerConfig:
        for server in self.servers:
            if server.name == name:
                return server
        raise KeyError(name)


def flagged_keys() -> list[tuple[KeyPath, str]]:
    """Every key a `ladder run` flag sets, with the flag; servers' keys under ("servers",)."""
    out: list[tuple[KeyPath, str]] = []

    def walk(cls: type, path: KeyPath) -> None:
        for name, key in config_keys(cls).items():
            if isinstance(key.spec, Table):
                walk(key.spec.cls, (*path, name))
            elif isinstance(key.spec, Knob) and key.spec.flag:
                out.append(((*path, name), key.spec.flag))

    walk(ServerConfig, ("servers",))
    walk(DaemonConfig, ())
    return out


def label(path: Sequence[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def env_name(path: Sequence[str | int]) -> str:
    """The env variable for a key path: ("servers", 0, "url") -> LADDER_SERVERS__0__URL."""
    return ENV_PREFIX + ENV_DELIMITER.join(str(p).upper() for p in path)


def unknown_key(path: Sequence[str | int], key: str, known: Sequence[str],
                origin: str) -> ConfigError:
    close = difflib.get_close_matches(key.lower(), known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
    return ConfigError(label([*path, key]), f"unknown key{origin}{hint}")
