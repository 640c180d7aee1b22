"""Layers import downward only: policies see neither HTTP nor torch, the engine never the
daemon, the ft serve model (engine.ftserve) neither I/O nor the reference engine, and the
pure logic modules no I/O library at all."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def forbidden_hits(path: Path, forbidden: tuple[str, ...]) -> set[str]:
    return {n for n in imported(path) if n.split(".")[0] in forbidden or n in forbidden}


@pytest.mark.parametrize("path", sorted((ROOT / "policies").glob("*.py")), ids=lambda p: p.name)
def test_policies_import_no_io(path: Path) -> None:
    assert not forbidden_hits(path, ("aiohttp", "torch", "ladder", "engine")), path


@pytest.mark.parametrize("path", sorted((ROOT / "engine").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_engine_never_imports_the_daemon(path: Path) -> None:
    assert not forbidden_hits(path, ("ladder", "policies")), path


IO = ("aiohttp", "torch", "numpy", "socket", "asyncio", "subprocess", "http", "urllib")


@pytest.mark.parametrize("path", sorted((ROOT / "engine" / "ftserve").glob("*.py")),
                         ids=lambda p: p.name)
def test_the_ftserve_model_is_pure(path: Path) -> None:
    """engine.ftserve says what ft serve is and prices transitions: no I/O, no torch, and
    nothing of the reference engine built on it."""
    hits = forbidden_hits(path, IO) | {n for n in imported(path)
                                       if n.startswith("engine.reference")}
    assert not hits, (path, hits)


PURE = ["engine/reference/routing.py", "engine/reference/tokenizer.py", "ladder/rungs.py",
        "ladder/units.py", "ladder/safeguards.py", "ladder/render.py", "ladder/sizing.py",
        "ladder/token_bound.py", "ladder/knobs.py", "ladder/parsers.py"]


@pytest.mark.parametrize("name", PURE)
def test_pure_modules_import_no_io(name: str) -> None:
    hits = forbidden_hits(ROOT / name, ("aiohttp", "torch", "socket", "asyncio", "subprocess"))
    assert not hits, (name, hits)


PACKAGES = sorted(p.parent for p in ROOT.glob("*/**/__init__.py")
                  if p.parent.parts[len(ROOT.parts)] in ("ladder", "engine", "policies"))


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_package_map_names_what_it_holds(package: Path) -> None:
    """The one-paragraph map in each package's __init__ names every module and subpackage
    in it, so `ls` and the map never disagree."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    held = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    held |= {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    missing = {name for name in held if f"`{name}`" not in doc and f"`{name}/`" not in doc}
    assert not missing, (package, sorted(missing))
