"""Structured logs: one line per decision and per step, as text or JSON.

Records carry their fields in `extra=`; the formatters print them after the message, so a log
line is both readable and parseable. Nothing here ever prints an API key: the client never
passes one to a log call.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

__all__ = ["configure"]

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


def configure(fmt: str = "text", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Json() if fmt == "json" else _Text())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
