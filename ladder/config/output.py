"""The config shown: as JSON (/status), as `config check` lines, as docs/config.md's tables.

All three walk the same declarations the merge reads (`config_keys`), so a key cannot be
settable but unshown, or shown under another name than the one a file uses. Secrets (knobs
declared `secret`, and policy options whose name ends in key, token, secret or password) are
"***" everywhere here; the config object itself keeps them, for use.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from ladder.config.schema import (
    REDACTED,
    DaemonConfig,
    KeyPath,
    Options,
    ServerConfig,
    Table,
    config_keys,
    label,
)

__all__ = ["explain", "reference_tables", "to_json"]

_SECRET_OPTION = re.compile(r"(key|token|secret|password)$", re.IGNORECASE)


def _value(obj: object, attrs: tuple[str, ...]) -> Any:
    for attr in attrs:
        obj = getattr(obj, attr)
    return obj


def _dump(obj: object) -> dict[str, Any]:
    cls: type = type(obj)
    out: dict[str, Any] = {}
    for name, key in config_keys(cls).items():
        value = _value(obj, key.attrs)
        if isinstance(key.spec, Table):
            value = _dump(value)
        elif isinstance(key.spec, Options):
            value = {k: REDACTED if _SECRET_OPTION.search(k) else v for k, v in value.items()}
        elif key.spec.secret:
            value = None if value is None else REDACTED
        out[name] = value
    return out


def to_json(config: DaemonConfig) -> dict[str, Any]:
    """The effective config as JSON-ready data, with api keys and tokens shown as "***"."""
    return {"servers": [_dump(s) for s in config.servers], **_dump(config)}


def _leaves(cls: type, doc: Mapping[str, Any], path: KeyPath) -> Iterator[tuple[KeyPath, Any]]:
    for name, key in config_keys(cls).items():
        if isinstance(key.spec, Table):
            yield from _leaves(key.spec.cls, doc[name], (*path, name))
        elif isinstance(key.spec, Options):
            yield from (((*path, name, option), v) for option, v in doc[name].items())
        else:
            yield (*path, name), doc[name]


def explain(config: DaemonConfig) -> str:
    """One line per key: `key = value  # source`, secrets redacted; backs `config check`."""
    doc = to_json(config)
    leaves = [leaf for i, s in enumerate(doc["servers"])
              for leaf in _leaves(ServerConfig, s, ("servers", i))]
    leaves.extend(_leaves(DaemonConfig, doc, ()))
    rows = [(label(p), json.dumps(v, default=str)) for p, v in leaves]
    width = max(len(f"{k} = {v}") for k, v in rows)
    lines = [f"{f'{k} = {v}':<{width}}  # {config.sources.get(k, 'default')}" for k, v in rows]
    return "\n".join(lines)


def _shown(default: object) -> str:
    if default is None:
        return "unset"
    if isinstance(default, Mapping):
        return f"`{json.dumps(dict(default))}`"
    return f"`{default}`"


def _table_rows(cls: type, prefix: str) -> list[tuple[str, str, str]]:
    defaults = _dump(cls())
    rows = []
    for name, key in config_keys(cls).items():
        if isinstance(key.spec, Table):
            continue  # a table of its own
        shown = None if isinstance(key.spec, Options) else key.spec.shown
        rows.append((f"`{prefix}{name}`", shown or _shown(defaults[name]), key.spec.meaning))
    return rows


def _markdown(rows: list[tuple[str, str, str]]) -> str:
    key_w = max(len("key"), *(len(r[0]) for r in rows))
    default_w = max(len("default"), *(len(r[1]) for r in rows))
    lines = [f"| {'key':<{key_w}} | {'default':<{default_w}} | meaning |",
             f"|{'-' * (key_w + 2)}|{'-' * (default_w + 2)}|---------|"]
    lines.extend(f"| {k:<{key_w}} | {d:<{default_w}} | {m} |" for k, d, m in rows)
    return "\n".join(lines)


def reference_tables() -> dict[str, str]:
    """docs/config.md's key tables, by TOML table, from the declarations: key, default and
    meaning of every key (tests/ladder/test_config.py checks the page holds each verbatim)."""
    tables = {"[[servers]]": _markdown(_table_rows(ServerConfig, ""))}
    for name, key in config_keys(ServerConfig).items():
        if isinstance(key.spec, Table):
            tables[f"[servers.{name}]"] = _markdown(_table_rows(key.spec.cls, f"{name}."))
    for name, key in config_keys(DaemonConfig).items():
        if isinstance(key.spec, Table):
            tables[f"[{name}]"] = _markdown(_table_rows(key.spec.cls, f"{name}."))
    return tables
