"""The daemon's configuration: defaults < TOML file < `LADDER_*` env < CLI flags.

Split by job, so each can be read alone: `schema` arranges the settings types into the tree
(every key is a knob declared once on the settings type that uses it, `ladder.knobs`, parsed
by `ladder.parsers`), `merge` gathers the four layers and builds the tree, `output` shows it
(`/status`, `config check`, docs/config.md's tables).

Why a provenance map: "which layer set this?" is the first question when a daemon misbehaves;
`explain` answers it for `ladder config check`, and the map is kept on the config itself
(`DaemonConfig.sources`, not compared) so it travels with the object that is being explained.
"""

from ladder.config.merge import cli_overrides, load, load_toml, merge
from ladder.config.output import explain, reference_tables, to_json
from ladder.config.schema import (
    REDACTED,
    ConfigError,
    ControlConfig,
    DaemonConfig,
    ListenConfig,
    ServerConfig,
    config_keys,
    env_name,
    flagged_keys,
)

__all__ = [
    "REDACTED",
    "ConfigError",
    "ControlConfig",
    "DaemonConfig",
    "ListenConfig",
    "ServerConfig",
    "cli_overrides",
    "config_keys",
    "env_name",
    "explain",
    "flagged_keys",
    "load",
    "load_toml",
    "merge",
    "reference_tables",
    "to_json",
]
