"""One file map: each package's `__init__` docstring lists its modules, and this checks it.

The map of the source is the package docstrings themselves (docs/architecture.md links to them
rather than keeping a copy that drifts). For every package under `flexmarl/` and `runtime/`
(those two included, nested ones such as flexmarl/rollout/balance too), this checks both ways:

- every module of the package, `name.py` (`__init__.py` aside), and every direct subpackage,
  `name/`, is named in its `__init__` docstring;
- every `name.py` the docstring names without a folder before it (`rollout/pool.py` points
  elsewhere and is not checked) is a module of that package, so a moved or removed module
  cannot stay on the map.

A name that the docstring means as another place's module goes in ELSEWHERE, per package.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP = ("flexmarl", "runtime")
MODULE_TOKEN = re.compile(r"(?<![\w/.])([A-Za-z_][A-Za-z0-9_]*\.py)\b")
# package (path relative to the repository) -> names in its docstring that are modules elsewhere
ELSEWHERE: dict[str, set[str]] = {}


def _packages() -> list[Path]:
    return sorted(init.parent for top in TOP for init in (ROOT / top).rglob("__init__.py"))


PACKAGES = _packages()


def _name(package: Path) -> str:
    return package.relative_to(ROOT).as_posix()


def _docstring(package: Path) -> str:
    tree = ast.parse((package / "__init__.py").read_text(encoding="utf-8"))
    return ast.get_docstring(tree) or ""


def _entries(package: Path) -> set[str]:
    """The package's direct modules (`x.py`) and subpackages (`sub/`)."""
    modules = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    subpackages = {f"{p.name}/" for p in package.iterdir()
                   if p.is_dir() and (p / "__init__.py").is_file()}
    return modules | subpackages


def _named(entry: str, doc: str) -> bool:
    return re.search(r"(?<![\w/.])" + re.escape(entry) + (r"" if entry.endswith("/") else r"\b"),
                     doc) is not None


def test_packages_found():
    names = {_name(p) for p in PACKAGES}
    assert {"flexmarl", "runtime", "flexmarl/rollout/balance"} <= names
    assert set(ELSEWHERE) <= names, "an exception names a package that is gone"


@pytest.mark.parametrize("package", PACKAGES, ids=_name)
def test_every_module_is_on_the_map(package: Path):
    doc = _docstring(package)
    missing = sorted(e for e in _entries(package) if not _named(e, doc))
    assert not missing, (f"{_name(package)}/__init__.py's docstring does not name {missing}: "
                         "add a line for each (what it does, in a few words)")


@pytest.mark.parametrize("package", PACKAGES, ids=_name)
def test_every_name_on_the_map_exists(package: Path):
    doc = _docstring(package)
    entries = _entries(package)
    allowed = ELSEWHERE.get(_name(package), set())
    stale = sorted({m for m in MODULE_TOKEN.findall(doc)} - entries - allowed)
    assert not stale, (f"{_name(package)}/__init__.py's docstring names {stale}, which are not "
                       "modules of this package: remove them, or write the folder they are in")
    unused = sorted(allowed - set(MODULE_TOKEN.findall(doc)))
    assert not unused, f"ELSEWHERE[{_name(package)!r}] lists {unused}, no longer in the docstring"
