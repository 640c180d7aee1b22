"""Strict readers for the fields of ft serve's JSON documents, and the one error they raise.

`/v1/cache/status` (`geometry`) and the other control-plane documents (`wire`) are read by the
same rules: a field that is missing or of the wrong type raises `DocumentError` naming it by its
dotted path, and nothing else is ever raised, so a caller catches one exception whatever the
input. JSON has no int/float split, so an integer is accepted as 12.0 but never as True or 1.5.
Missing means unknown, not zero: the `opt_*` readers return `None` for an absent or null field.

`path` is the dotted prefix of `key` in messages ("", "kv.", "entries[2].").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "DocumentError",
    "mapping",
    "opt_float",
    "opt_int",
    "opt_section",
    "opt_str",
    "req_bool",
    "req_float",
    "req_int",
    "req_str",
    "required",
]


class DocumentError(ValueError):
    """An ft serve document that cannot be used; the message is "field: problem"."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def mapping(value: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise DocumentError(field or "document", f"expected an object, got {type(value).__name__}")
    return value


def required(doc: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in doc:
        raise DocumentError(path + key, "missing")
    return doc[key]


def _as_int(value: Any, field: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DocumentError(field, f"expected an integer, got {type(value).__name__}")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise DocumentError(field, f"expected an integer, got {value!r}")
        value = int(value)
    if value < minimum:
        raise DocumentError(field, f"must be >= {minimum}, got {value}")
    return int(value)


def _as_float(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DocumentError(field, f"expected a number, got {type(value).__name__}")
    result = float(value)
    if not math.isfinite(result) or result < 0:
        raise DocumentError(field, f"expected a finite number >= 0, got {value!r}")
    return result


def _as_str(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise DocumentError(field, f"expected a string, got {type(value).__name__}")
    return value


def req_int(doc: Mapping[str, Any], key: str, path: str, *, minimum: int = 0) -> int:
    return _as_int(required(doc, key, path), path + key, minimum=minimum)


def req_float(doc: Mapping[str, Any], key: str, path: str) -> float:
    return _as_float(required(doc, key, path), path + key)


def req_str(doc: Mapping[str, Any], key: str, path: str) -> str:
    return _as_str(required(doc, key, path), path + key)


def req_bool(doc: Mapping[str, Any], key: str, path: str) -> bool:
    value = required(doc, key, path)
    if not isinstance(value, bool):
        raise DocumentError(path + key, f"expected a boolean, got {type(value).__name__}")
    return value


def opt_int(doc: Mapping[str, Any], key: str, path: str) -> int | None:
    value = doc.get(key)
    return None if value is None else _as_int(value, path + key)


def opt_float(doc: Mapping[str, Any], key: str, path: str) -> float | None:
    value = doc.get(key)
    return None if value is None else _as_float(value, path + key)


def opt_str(doc: Mapping[str, Any], key: str, path: str) -> str | None:
    value = doc.get(key)
    return None if value is None else _as_str(value, path + key)


def opt_section(doc: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any] | None:
    value = doc.get(key)
    return None if value is None else mapping(value, path + key)
