"""Structured logs, as text or JSON, and how often a recurring line is worth printing.

Records carry their fields in `extra=`; the formatters print them after the message, so a log
line is both readable and parseable. Nothing here ever prints an API key: the client never
passes one to a log call.

A loop that polls every 2 s must not print every 2 s: a steady decision is logged when it
changes and then once every `repeat_s` (a heartbeat that says the daemon still decides), and a
warning that repeats (a down server) backs off, 0, 5, 15, 35 ... s apart up to `repeat_s`,
each line saying how many it stood for. `LogThrottle` decides that; time is passed in.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Literal

from ladder.knobs import check_knobs, knob
from ladder.parsers import choice, seconds

__all__ = ["LogSettings", "LogThrottle", "configure"]

_STANDARD = set(vars(logging.LogRecord("x", 0, "", 0, "", None, None))) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class _Text(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={json.dumps(v, default=str)}" for k, v in _fields(record).items())
        head = f"{self.formatTime(record)} {record.levelname.lower()} {record.name}: "
        return head + record.getMessage() + (f" {extra}" if extra else "")


class _Json(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"ts": self.formatTime(record), "level": record.levelname.lower(),
               "logger": record.name, "msg": record.getMessage(), **_fields(record)}
        return json.dumps(doc, default=str)


@dataclass(frozen=True, slots=True)
class LogSettings:
    """The `[log]` table of the config: how lines look and how often a recurring one prints."""

    format: Literal["text", "json"] = knob("text", choice("text", "json"),
                                           "`text` or `json` (one object per line).")
    level: Literal["debug", "info", "warning", "error"] = knob(
        "info", choice("debug", "info", "warning", "error"),
        "`debug`, `info`, `warning` or `error`.")
    repeat_s: float = knob(
        300.0, seconds(positive=True), "A decision is logged when its outcome changes, else "
        "once every `repeat_s` (a heartbeat); a repeated warning (a down server) is logged at "
        "once, then 5, 10, 20 ... s apart up to `repeat_s`, each line counting the ones it held "
        "back. Seconds, > 0.")

    def __post_init__(self) -> None:
        check_knobs(self)


def configure(fmt: str, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Json() if fmt == "json" else _Text())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


@dataclass(slots=True)
class _Line:
    signature: Hashable
    logged_s: float
    gap_s: float
    suppressed: int = 0


@dataclass(slots=True)
class LogThrottle:
    """Whether a recurring line (by key) is printed now; `None` means stay quiet.

    `state` lines (a decision) print when their signature changes, else every `repeat_s`;
    `warning` lines print at once, then with gaps doubling from `first_gap_s` up to
    `repeat_s`; a new signature prints at once. Both return how many lines were held back
    since the last one printed, for the line to say so."""

    repeat_s: float
    first_gap_s: float = 5.0
    _lines: dict[str, _Line] = field(default_factory=dict)

    def state(self, key: str, signature: Hashable, now_s: float) -> int | None:
        return self._admit(key, signature, now_s, backoff=False)

    def warning(self, key: str, signature: Hashable, now_s: float) -> int | None:
        return self._admit(key, signature, now_s, backoff=True)

    def clear(self, key: str) -> bool:
        """Forget `key` (the condition ended); True when a line for it had been printed."""
        return self._lines.pop(key, None) is not None

    def _admit(self, key: str, signature: Hashable, now_s: float, *,
               backoff: bool) -> int | None:
        line = self._lines.get(key)
        first_gap_s = min(self.first_gap_s, self.repeat_s) if backoff else self.repeat_s
        if line is None or line.signature != signature:
            self._lines[key] = _Line(signature, now_s, first_gap_s)
            return 0 if line is None else line.suppressed
        if now_s - line.logged_s < line.gap_s:
            line.suppressed += 1
            return None
        held = line.suppressed
        gap_s = min(self.repeat_s, line.gap_s * 2) if backoff else self.repeat_s
        self._lines[key] = _Line(signature, now_s, gap_s)
        return held
