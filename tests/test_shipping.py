"""The wheel ships the product and no test tooling: every module of its packages is reached by
imports from an entry point, and none imports the test kit or the benchmarks.

Why: the fault proxy once lived in `ladder` and the demo lent private helpers to tests and
benches, so test tooling shipped in the wheel. A shipped module that no entry point reaches is
test tooling or dead code; either way it belongs in tests/kit or nowhere. Imports are read
from the source (lazy imports inside functions included), so the check needs no install.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGES: list[str] = PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
DEV_ONLY = ("tests", "bench")


def _modules() -> dict[str, Path]:
    """Every module the wheel ships, by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _imported(name: str, path: Path) -> Iterator[str]:
    """Every dotted name `name`'s source imports; `from a import b` yields `a` and `a.b`
    (b may be a submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _entry_modules() -> set[str]:
    project = PYPROJECT["project"]
    targets = list(project["scripts"].values())
    for group in project["entry-points"].values():
        targets.extend(group.values())
    return {target.partition(":")[0] for target in targets}


def _reached() -> set[str]:
    todo = sorted(_entry_modules())
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in MODULES:
            continue
        seen.add(name)
        for imported in _imported(name, MODULES[name]):
            parts = imported.split(".")
            # Importing a.b.c runs a/__init__ and a/b/__init__ too.
            todo.extend(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return seen


def test_the_wheel_packages_only_the_product() -> None:
    assert PACKAGES and not [p for p in PACKAGES if p.split("/")[0] in DEV_ONLY]
    assert {p.partition(":")[0].split(".")[0] for p in _entry_modules()} <= set(PACKAGES)


def test_every_shipped_module_is_reached_from_an_entry_point() -> None:
    unreached = sorted(set(MODULES) - _reached())
    assert not unreached, f"shipped but imported by no entry point (test tooling?): {unreached}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_shipped_module_imports_test_tooling(name: str) -> None:
    dev = {i for i in _imported(name, MODULES[name]) if i.split(".")[0] in DEV_ONLY}
    assert not dev, (name, sorted(dev))
