"""A knob: one setting declared once, as a field of the settings dataclass that uses it.

Why: a default written on the runtime dataclass and again in the config drifts, and a knob
the config forgot to mirror cannot be set at all (issue #19: `reads_to_recover`). So
`LadderSpec`, `SafeguardSettings`, `ApplySettings`, `ControlSettings`, `LogSettings` and the
daemon's own `ServerConfig`/`ListenConfig` declare each field with `knob(...)`: its default,
its parser (`ladder.parsers`, which is the validator and says the unit), a one-line meaning,
the config key where it differs from the field name, and the flag that sets it, if any. The
config tree, its env variables and `config check` (`ladder.config`), the flags (`ladder.cli`)
and the key tables of docs/config.md (checked by tests/ladder/test_config.py) are all read
off these fields.

`check_knobs` in a settings type's `__post_init__` runs every knob's parser over the values,
so a settings object built in code obeys the same rules as one read from a file.
"""

from __future__ import annotations

from dataclasses import Field, dataclass, field, fields
from typing import Any

from ladder.parsers import BadValue, Parser

__all__ = ["SPEC", "Knob", "KnobError", "check_knobs", "check_order", "knob", "knob_fields"]

# The metadata key of every config-relevant field: a Knob here, a nested table in ladder.config.
SPEC = "config"


@dataclass(frozen=True, slots=True)
class Knob:
    parse: Parser
    meaning: str  # one line for docs/config.md, with the unit and the valid range
    key: str | None = None  # the config key when it is not the field's name
    flag: str | None = None  # the command-line flag that sets it
    secret: bool = False  # never shown: "***" in `config check`, /status and repr
    shown: str | None = None  # how docs/config.md shows the default when its repr won't do


class KnobError(ValueError):
    """A settings object refused a value; `name` is the field, `message` says why."""

    def __init__(self, name: str, message: str) -> None:
        self.name = name
        self.message = message
        super().__init__(f"{name}: {message}")


def knob(default: Any, parse: Parser, meaning: str, *, key: str | None = None,
         flag: str | None = None, secret: bool = False, shown: str | None = None) -> Any:
    """A dataclass field that is a knob (see the module docstring)."""
    spec = Knob(parse, meaning, key=key, flag=flag, secret=secret, shown=shown)
    return field(default=default, repr=not secret, metadata={SPEC: spec})


def knob_fields(cls: Any) -> list[tuple[Field[Any], Knob]]:
    """The knobs of a settings dataclass (class or instance), in field order."""
    return [(f, f.metadata[SPEC]) for f in fields(cls) if isinstance(f.metadata.get(SPEC), Knob)]


def check_knobs(settings: object) -> None:
    """Every knob's value passes its own parser, else KnobError naming the field."""
    for f, spec in knob_fields(settings):
        try:
            spec.parse(getattr(settings, f.name))
        except BadValue as exc:
            raise KnobError(f.name, str(exc)) from None


def check_order(settings: object, low: str, high: str) -> None:
    """A ceiling not below its base (`backoff_max_s` >= `backoff_base_s`), else KnobError on
    the ceiling; the message names the base by its config key."""
    low_value, high_value = getattr(settings, low), getattr(settings, high)
    if high_value < low_value:
        spec = next(k for f, k in knob_fields(settings) if f.name == low)
        raise KnobError(high, f"{high_value:g} is below {spec.key or low} {low_value:g}")
