"""Finding policies: the real entry points, module:attr, and loud errors for the rest."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest

from policies import registry
from policies.api import Decision, LadderView, Observation, Policy
from policies.headroom import Headroom
from policies.pinned import Pinned
from policies.registry import (
    GROUP,
    DuplicatePolicyError,
    PolicyInfo,
    PolicyLoadError,
    UnknownPolicyError,
    installed_policies,
    load_factory,
    load_policy,
)
from policies.throughput import Throughput


class NotAPolicy:
    def __init__(self, **options: Any) -> None:
        self.options = options


class Echo:
    """A third-party-style policy: holds whatever rung it was given."""

    name = "echo"

    def __init__(self, **options: Any) -> None:
        self.options = options

    def decide(self, observation: Observation, ladder: LadderView) -> Decision:
        return Decision(observation.rung or 0, "echo")


NOT_CALLABLE = 42


def test_builtins_are_found_through_the_installed_entry_points() -> None:
    infos = {i.name: i for i in installed_policies()}
    assert infos["headroom"] == PolicyInfo("headroom", "policies.headroom:Headroom",
                                           "moe-ladder", importlib.metadata.version("moe-ladder"))
    assert infos["throughput"].value == "policies.throughput:Throughput"
    assert infos["pinned"].distribution == "moe-ladder"
    assert isinstance(load_policy("headroom", {}), Headroom)
    assert isinstance(load_policy("throughput", {"payback_factor": 3}), Throughput)
    pinned = load_policy("pinned", {"rung": 2})
    assert isinstance(pinned, Pinned) and pinned.rung == 2


def test_module_attr_is_imported_directly() -> None:
    p = load_policy("tests.policies.test_registry:Echo", {"x": 1})
    assert isinstance(p, Echo) and p.options == {"x": 1}
    assert isinstance(p, Policy)
    assert load_factory("policies.headroom:Headroom") is Headroom


def test_unknown_name_lists_the_installed_ones() -> None:
    with pytest.raises(UnknownPolicyError, match=r"no policy named 'hysteresis'; installed: "
                                                 r".*headroom, pinned, throughput") as err:
        load_policy("hysteresis", {})
    assert isinstance(err.value, ValueError)


def test_unknown_option_is_rejected_with_its_name() -> None:
    with pytest.raises(ValueError, match=r"unknown option.*window_s"):
        load_policy("headroom", {"window_s": 10})


@pytest.mark.parametrize(("spec", "match"), [
    ("no_such_module_xyz:Thing", "cannot load policy"),
    ("policies.headroom:NoSuchThing", "cannot load policy"),
    ("tests.policies.test_registry:NOT_CALLABLE", "not callable"),
    ("tests.policies.test_registry:NotAPolicy", "returned NotAPolicy"),
])
def test_bad_module_attr_specs(spec: str, match: str) -> None:
    with pytest.raises(PolicyLoadError, match=match):
        load_policy(spec, {})


class FakeDistribution(importlib.metadata.Distribution):
    """An installed distribution in memory: its METADATA and entry_points.txt, nothing else."""

    def __init__(self, name: str, version: str, entry_points: dict[str, str]) -> None:
        self._files = {
            "METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
            "entry_points.txt": f"[{GROUP}]\n" + "".join(
                f"{k} = {v}\n" for k, v in entry_points.items()),
        }

    def read_text(self, filename: str) -> str | None:
        return self._files.get(filename)

    def locate_file(self, path: Any) -> Any:
        raise NotImplementedError


def fake_ep(name: str, value: str, dist: str | None, version: str = "1.0",
            ) -> importlib.metadata.EntryPoint:
    if dist is None:
        return importlib.metadata.EntryPoint(name=name, value=value, group=GROUP)
    (ep,) = FakeDistribution(dist, version, {name: value}).entry_points
    return ep


def test_duplicate_names_from_two_distributions_fail_naming_both(
        monkeypatch: pytest.MonkeyPatch) -> None:
    eps = (fake_ep("headroom", "policies.headroom:Headroom", "moe-ladder", "0.1.0"),
           fake_ep("headroom", "other_pkg.policy:Headroom", "other-ladder-policies", "2.0"),
           fake_ep("pinned", "policies.pinned:Pinned", "moe-ladder", "0.1.0"))
    monkeypatch.setattr(registry, "_entry_points", lambda: eps)
    with pytest.raises(DuplicatePolicyError,
                       match=r"moe-ladder 0\.1\.0 \(policies\.headroom:Headroom\); "
                             r"other-ladder-policies 2\.0 \(other_pkg\.policy:Headroom\)"):
        load_policy("headroom", {})
    # Other names still load, and the listing shows both rows.
    assert isinstance(load_policy("pinned", {"rung": 0}), Pinned)
    assert [i.distribution for i in installed_policies() if i.name == "headroom"] == [
        "moe-ladder", "other-ladder-policies"]


def test_the_same_distribution_seen_twice_is_not_a_duplicate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    eps = (fake_ep("headroom", "policies.headroom:Headroom", "moe-ladder"),
           fake_ep("headroom", "policies.headroom:Headroom", "moe-ladder"))
    monkeypatch.setattr(registry, "_entry_points", lambda: eps)
    assert isinstance(load_policy("headroom", {}), Headroom)


def test_entry_point_without_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    eps = (fake_ep("echo", "tests.policies.test_registry:Echo", None),)
    monkeypatch.setattr(registry, "_entry_points", lambda: eps)
    assert installed_policies()[0] == PolicyInfo("echo", "tests.policies.test_registry:Echo",
                                                 None, None)
    assert isinstance(load_policy("echo", {}), Echo)


def test_builtins_resolve_without_installed_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    # A source checkout run as `python -m ladder.cli`: no entry points at all.
    monkeypatch.setattr(registry, "_entry_points", lambda: ())
    assert isinstance(load_policy("headroom", {}), Headroom)
    assert isinstance(load_policy("throughput", {}), Throughput)
    assert isinstance(load_policy("pinned", {"rung": 1}), Pinned)
    assert installed_policies() == [
        PolicyInfo(name, value, "built-in", None) for name, value in sorted(
            registry.BUILTINS.items())]
    with pytest.raises(UnknownPolicyError,
                       match=r"installed: headroom, pinned, throughput \(or name"):
        load_policy("nosuch", {})


def test_an_installed_entry_point_wins_over_the_builtin_table(
        monkeypatch: pytest.MonkeyPatch) -> None:
    eps = (fake_ep("headroom", "tests.policies.test_registry:Echo", "my-policies"),)
    monkeypatch.setattr(registry, "_entry_points", lambda: eps)
    assert isinstance(load_policy("headroom", {}), Echo)
    assert [i.distribution for i in installed_policies()] == ["my-policies", "built-in",
                                                               "built-in"]


def test_the_builtin_table_is_pyprojects_entry_points() -> None:
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"][GROUP] == registry.BUILTINS
