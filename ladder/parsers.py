"""Value parsers: what a TOML file, an env variable or a flag gave, in; the stored type, out.

Every knob (`ladder.knobs`) names one of these as its parser, which is also its validator and
says its unit, so "what is a valid `cooldown_s`" has one answer for the config file, the
environment, the flags and a settings object built in code. A parser raises `BadValue` with
"expected X, got Y" and nothing else: the caller adds the key path or flag and the source,
which a parser cannot know. Strings are accepted everywhere because env and flags only have
strings.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Mapping
from typing import Any

from ladder.units import parse_bytes, parse_count

__all__ = [
    "BadValue",
    "Parser",
    "byte_size",
    "choice",
    "describe",
    "hostport",
    "option_value",
    "optional",
    "parse_hostport",
    "ratio",
    "seconds",
    "secret",
    "server_url",
    "tcp_port",
    "text",
    "tokens",
    "whole",
]

Parser = Callable[[object], Any]


class BadValue(ValueError):
    """A value a parser refused; the caller adds the key path or flag and the source."""


def describe(value: object) -> str:
    """A refused value as an error shows it: its repr, or its TOML kind for a table or array."""
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list | tuple):
        return "an array"
    return repr(value)


def optional(parse: Parser) -> Parser:
    # TOML has no null: absence means None; from env an empty string unsets an optional key.
    def parse_optional(value: object) -> Any:
        if value is None or (isinstance(value, str) and value.strip() == ""):
            return None
        return parse(value)
    return parse_optional


def seconds(*, positive: bool = False, what: str = "a duration in seconds") -> Parser:
    def parse(value: object) -> float:
        if isinstance(value, bool):
            raise BadValue(f"expected {what}, got {value!r}")
        if isinstance(value, int | float):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                raise BadValue(f"expected {what}, got {value!r}") from None
        else:
            raise BadValue(f"expected {what}, got {describe(value)}")
        if not math.isfinite(number):
            raise BadValue(f"expected {what}, got {value!r}")
        if number < 0:
            raise BadValue(f"must not be negative, got {value!r}")
        if positive and number == 0:
            raise BadValue(f"must be greater than 0, got {value!r}")
        return number
    return parse


def whole(*, minimum: int = 0, what: str = "a whole number") -> Parser:
    def parse(value: object) -> int:
        if isinstance(value, bool):
            raise BadValue(f"expected {what}, got {value!r}")
        if isinstance(value, int):
            number = value
        elif isinstance(value, str):
            try:
                number = int(value.strip())
            except ValueError:
                raise BadValue(f"expected {what}, got {value!r}") from None
        else:
            raise BadValue(f"expected {what}, got {describe(value)}")
        if number < minimum:
            raise BadValue(f"must be at least {minimum}, got {value!r}")
        return number
    return parse


def _human(unit_parser: Callable[[str], int], what: str, *, minimum: int) -> Parser:
    def parse(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise BadValue(f"expected {what}, got {describe(value)}")
        if isinstance(value, int):
            number = value
        else:
            try:
                number = unit_parser(value)
            except ValueError:
                raise BadValue(f"expected {what}, got {value!r}") from None
        if number < minimum:
            raise BadValue(f"must be at least {minimum}, got {value!r}")
        return number
    return parse


def tokens(*, minimum: int = 1) -> Parser:
    return _human(parse_count, "a token count like 4096 or 64k", minimum=minimum)


def byte_size() -> Parser:
    return _human(parse_bytes, "a byte size like 1073741824 or 512MiB", minimum=0)


def ratio(*, low: float, high: float, low_open: bool, high_open: bool) -> Parser:
    left, right = "(" if low_open else "[", ")" if high_open else "]"
    span = f"{left}{low:g}, {high:g}{right}"
    as_float = seconds(what="a number")

    def parse(value: object) -> float:
        try:
            number: float = as_float(value)
        except BadValue:
            raise BadValue(f"expected a ratio in {span}, got {value!r}") from None
        if number <= low if low_open else number < low:
            bound = f"greater than {low:g}" if low_open else f"at least {low:g}"
        elif number >= high if high_open else number > high:
            bound = f"below {high:g}" if high_open else f"at most {high:g}"
        else:
            return number
        raise BadValue(f"must be {bound}, got {value!r} (a ratio in {span})")
    return parse


def choice(*options: str) -> Parser:
    def parse(value: object) -> str:
        if isinstance(value, str) and value.strip().lower() in options:
            return value.strip().lower()
        raise BadValue(f"expected one of {', '.join(options)}, got {describe(value)}")
    return parse


def text(pattern: str | None = None, what: str = "a string") -> Parser:
    compiled = re.compile(pattern) if pattern else None

    def parse(value: object) -> str:
        if not isinstance(value, str) or not value.strip():
            raise BadValue(f"expected {what}, got {describe(value)}")
        stripped = value.strip()
        if compiled is not None and not compiled.fullmatch(stripped):
            raise BadValue(f"expected {what}, got {value!r}")
        return stripped
    return parse


def secret(value: object) -> str:
    # Never echo a rejected secret back into a log line.
    if not isinstance(value, str) or not value:
        raise BadValue("expected a non-empty string")
    return value


def server_url(value: object) -> str:
    """An http(s) URL, or `HOST:PORT` as `ft ctl` users type it (read as http://HOST:PORT);
    ValueError naming what is wrong."""
    what = "an http:// or https:// URL, or HOST:PORT"
    url: str = text(what=what)(value)
    if "://" not in url and re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):\d{1,5}", url):
        parse_hostport(url)  # the port's range
        url = f"http://{url}"
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
        raise BadValue(f"expected {what}, got {value!r}")
    return url.rstrip("/")


def tcp_port(value: object) -> int:
    number: int = whole(what="a TCP port (0-65535)")(value)
    if number > 65535:
        raise BadValue(f"expected a TCP port (0-65535), got {value!r}")
    return number


def parse_hostport(value: object, *, any_port: bool = False) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::1]:9190`) -> (host, port); ValueError naming what is wrong.

    `any_port` admits port 0 ("any free port"), for the daemon's own listener."""
    if not isinstance(value, str):
        raise BadValue(f"expected HOST:PORT, got {describe(value)}")
    match = re.fullmatch(r"\s*(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]+):(\d{1,5})\s*", value)
    if not match:
        raise BadValue(f"expected HOST:PORT like 127.0.0.1:9191, got {value!r}")
    host, number = match.group(1).strip("[]"), int(match.group(2))
    if number < (0 if any_port else 1) or number > 65535:
        raise BadValue(f"port must be {0 if any_port else 1}-65535, got {value!r}")
    return host, number


def hostport(value: object) -> str:
    """`HOST:PORT`, normalised (IPv6 hosts in brackets); port 0 lets the kernel pick one as
    the listener binds (the daemon's status shows which)."""
    host, number = parse_hostport(value, any_port=True)
    return f"[{host}]:{number}" if ":" in host else f"{host}:{number}"


def option_value(value: str) -> Any:
    """A policy option typed as text (env, `--policy-option`): its TOML value when it is one
    (60 -> int, 0.5 -> float, true -> bool), else the string itself. Options are typed by the
    policy, not here."""
    try:
        return tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return value
