"""Finding a policy by name: the `moe_ladder.policies` entry points, or `module:attr`.

Resolving duplicate entry-point names is the consumer's job (PyPA spec); pkg_resources' "first
on sys.path wins" confused users, so two distributions offering one name is an error that
names both. A value with ":" is imported directly, without any install: handy while
developing a policy or in a bench script. Entry points exist only in installed metadata, so
the built-ins are also found through `BUILTINS` when no entry point has their name: `ladder
run` from a source checkout (`python -m ladder.cli`, no `pip install`) still finds `headroom`.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.api import Policy, PolicyFactory

__all__ = [
    "BUILTINS",
    "GROUP",
    "DuplicatePolicyError",
    "PolicyInfo",
    "PolicyLoadError",
    "UnknownPolicyError",
    "installed_policies",
    "load_factory",
    "load_policy",
]

GROUP = "moe_ladder.policies"
# The same table as pyproject's entry points (a test keeps them equal).
BUILTINS = {
    "headroom": "policies.headroom:Headroom",
    "pinned": "policies.pinned:Pinned",
    "throughput": "policies.throughput:Throughput",
}
BUILTIN_DISTRIBUTION = "built-in"


class PolicyLoadError(ValueError):
    """A policy spec that cannot be turned into a policy (a configuration error)."""


class UnknownPolicyError(PolicyLoadError):
    pass


class DuplicatePolicyError(PolicyLoadError):
    pass


@dataclass(frozen=True, slots=True)
class PolicyInfo:
    """One installed entry point, as `ladder policies list` prints it."""

    name: str
    value: str
    distribution: str | None
    version: str | None


def _entry_points() -> tuple[importlib.metadata.EntryPoint, ...]:
    """The discovery seam (tests replace it); sorted so listings and errors are stable."""
    return tuple(sorted(importlib.metadata.entry_points(group=GROUP),
                        key=lambda ep: (ep.name, ep.value)))


def _builtins_not_installed(
    eps: tuple[importlib.metadata.EntryPoint, ...],
) -> list[importlib.metadata.EntryPoint]:
    installed = {ep.name for ep in eps}
    return [importlib.metadata.EntryPoint(name=name, value=value, group=GROUP)
            for name, value in sorted(BUILTINS.items()) if name not in installed]


def _info(ep: importlib.metadata.EntryPoint) -> PolicyInfo:
    dist = ep.dist
    return PolicyInfo(ep.name, ep.value, None if dist is None else dist.name,
                      None if dist is None else dist.version)


def installed_policies() -> list[PolicyInfo]:
    """Every entry point in the group, duplicates included (a listing should show them), then
    the built-ins no installed metadata offers, with `distribution` "built-in"."""
    eps = _entry_points()
    builtins = [PolicyInfo(ep.name, ep.value, BUILTIN_DISTRIBUTION, None)
                for ep in _builtins_not_installed(eps)]
    return [_info(ep) for ep in eps] + builtins


def _provider(info: PolicyInfo) -> str:
    dist = info.distribution or "an unknown distribution"
    return f"{dist} {info.version or ''}".rstrip() + f" ({info.value})"


def _find(name: str) -> importlib.metadata.EntryPoint:
    eps = _entry_points()
    matches = [ep for ep in eps if ep.name == name]
    if not matches:
        matches = [ep for ep in _builtins_not_installed(eps) if ep.name == name]
    if not matches:
        names = sorted({ep.name for ep in eps} | set(BUILTINS))
        raise UnknownPolicyError(
            f"no policy named {name!r}; installed: {', '.join(names) or 'none'} "
            f"(or name one as module:attr)")
    # The same distribution seen twice on sys.path offers the same thing: not a conflict.
    distinct = {(_info(ep).distribution, ep.value): ep for ep in matches}
    if len(distinct) > 1:
        providers = "; ".join(sorted(_provider(_info(ep)) for ep in distinct.values()))
        raise DuplicatePolicyError(
            f"policy {name!r} is provided by more than one distribution: {providers}; "
            f"uninstall one or name the policy as module:attr")
    return matches[0]


def load_factory(spec: str) -> PolicyFactory:
    """The factory `spec` names: `module:attr` imported directly, else an entry point."""
    if ":" in spec:
        ep = importlib.metadata.EntryPoint(name=spec, value=spec, group=GROUP)
    else:
        ep = _find(spec)
    try:
        factory = ep.load()
    except (ImportError, AttributeError) as exc:
        raise PolicyLoadError(f"cannot load policy {spec!r} ({ep.value}): {exc}") from exc
    if not callable(factory):
        raise PolicyLoadError(f"policy {spec!r} ({ep.value}) is not callable: it must be a "
                              f"factory taking the policy's options")
    return factory  # type: ignore[no-any-return]


def load_policy(spec: str, options: Mapping[str, Any]) -> Policy:
    """A ready policy: the factory `spec` names, called with its `[policy.<name>]` table.

    Option errors come from the factory itself (a `ValueError` naming the unknown keys).
    """
    factory = load_factory(spec)
    policy = factory(**dict(options))
    if not isinstance(policy, Policy):
        raise PolicyLoadError(f"policy {spec!r} returned {type(policy).__name__}, which has "
                              f"no `name` and `decide(observation, ladder)`")
    return policy
