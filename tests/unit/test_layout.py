"""The layering of framebatch's packages, read from the source with ``ast`` (nothing is imported).

What counts as an import: every ``import a.b``, ``from a import b`` and ``from . import b``
anywhere in a module (at module level, inside functions and methods, under ``try``), and
``importlib.import_module("a.b")`` with a literal name.  Each is resolved to the most specific
project module it runs: ``from pkg import name`` is ``pkg.name`` when that is a submodule, else
``pkg`` (its ``__init__``).

**No import cycles** (among ``pipeline``, ``streams``, ``detectors``, ``framebatch_tools``,
``samples``): a cycle is modules that import each other, directly or through others, where an
edge is an import as resolved above.  A function-level import is an edge too: deferring an import
into a function hides a cycle from the interpreter, not from the design.  Two things are not
edges, on purpose:

- the parent packages Python initialises on the way to a submodule: ``import pkg.sub`` runs
  ``pkg/__init__.py`` first, but a package's ``__init__`` always finishes before or without its
  submodules depending on it, so a package ``__init__`` that imports (re-exports) its submodules
  is no cycle with them.  It is one when a submodule imports a name from its package's
  ``__init__`` back (``from pkg import Name`` in ``pkg/sub.py``): then ``pkg -> pkg.sub -> pkg``,
  and the submodule sees a half-initialised package depending on import order.  A submodule
  imports its siblings by their own module path instead.
- imports under ``if TYPE_CHECKING:``: they never run, and they are how a type is named without
  an import cycle.  They still count for the layering rules below: naming another layer's
  type is depending on it.

**Layering**: the runtime packages (``pipeline``, ``streams``, ``detectors``) never import
``framebatch_tools`` (benchmarks, chaos and simulation tooling live in their own top-level
package); ``streams`` never imports ``detectors`` or ``pipeline``; ``detectors`` never imports
``redis``, ``streams`` or ``pipeline`` (STYLE.md 2: sources know nothing about models, models
nothing about Redis).
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "streams", "detectors", "framebatch_tools", "samples")


@dataclass(frozen=True)
class Import:
    """One import in ``importer``'s source: the dotted name as written (made absolute) and the
    project module it runs (``None`` outside the project)."""

    importer: str
    line: int
    name: str
    module: str | None
    type_only: bool  # under ``if TYPE_CHECKING:``

    def where(self) -> str:
        path = module_paths()[self.importer].relative_to(ROOT)
        return f"{path}:{self.line}"


@cache
def module_paths() -> Mapping[str, Path]:
    """Every project module by dotted name; a package's ``__init__.py`` is the package."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def resolve(name: str, modules: Mapping[str, object]) -> str | None:
    """The most specific project module ``name`` (``pkg.sub.attr``...) runs, if any."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _dynamic_import(node: ast.Call) -> str | None:
    """The literal absolute name of an ``importlib.import_module("...")`` call."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called != "import_module" or not node.args:
        return None
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return None if first.value.startswith(".") else first.value
    return None


def imports_in(
    source: str, importer: str, *, is_package: bool, modules: Mapping[str, object]
) -> Iterator[Import]:
    """Every import in ``source`` (the module ``importer``), resolved against ``modules``."""
    tree = ast.parse(source)
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            type_only.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    package = importer if is_package else importer.rpartition(".")[0]
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: max(0, package.count(".") + 1 - (node.level - 1))]
                base = ".".join([*up, *([node.module] if node.module else [])])
            names = [base if alias.name == "*" else f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call) and (dynamic := _dynamic_import(node)):
            names = [dynamic]
        for name in names:
            yield Import(importer, node.lineno, name, resolve(name, modules), id(node) in type_only)


@cache
def project_imports() -> tuple[Import, ...]:
    modules = module_paths()
    found: list[Import] = []
    for module, path in modules.items():
        source = path.read_text(encoding="utf-8")
        is_package = path.name == "__init__.py"
        found += imports_in(source, module, is_package=is_package, modules=modules)
    return tuple(found)


def import_cycles(edges: Mapping[str, Mapping[str, Import]]) -> list[list[str]]:
    """The shortest cycle through each module that is on one, each once (``[a, b, a]``)."""
    cycles: dict[tuple[str, ...], list[str]] = {}
    for start in sorted(edges):
        previous: dict[str, str] = {}
        queue = deque([start])
        while queue:  # breadth first: the first way back to ``start`` is a shortest one
            node = queue.popleft()
            if start in edges.get(node, {}):
                path = [start]
                while node != start:
                    path.insert(1, node)
                    node = previous[node]
                first = path.index(min(path))  # the same cycle seen from any of its modules
                cycle = (*path[first:], *path[:first])
                cycles.setdefault(cycle, [*cycle, cycle[0]])
                break
            for target in sorted(edges.get(node, {})):
                if target not in previous and target != start:
                    previous[target] = node
                    queue.append(target)
    return sorted(cycles.values())


def describe_cycle(cycle: list[str], edges: Mapping[str, Mapping[str, Import]]) -> str:
    steps = [edges[a][b] for a, b in zip(cycle, cycle[1:], strict=False)]
    where = "; ".join(f"{step.where()} imports {step.name}" for step in steps)
    return f"{' -> '.join(cycle)}   ({where})"


@pytest.mark.parametrize(
    ("source", "importer", "is_package", "expected"),
    [
        ("import streams.keys", "pipeline.daemon", False, "streams.keys"),
        ("from streams.keys import StreamKeys", "pipeline.daemon", False, "streams.keys"),
        ("from pipeline import config", "pipeline.daemon", False, "pipeline.config"),  # a module
        ("from pipeline.config import Name", "pipeline.daemon", False, "pipeline.config"),
        ("from . import keys", "streams.consumer", False, "streams.keys"),
        ("from .keys import StreamKeys", "streams.consumer", False, "streams.keys"),
        ("from .keys import StreamKeys", "streams", True, "streams.keys"),  # in __init__.py
        ("from .. import config", "pipeline.cli.commands", False, "pipeline.config"),
        ("def f():\n    import streams.keys", "pipeline.daemon", False, "streams.keys"),
        ("import importlib\nimportlib.import_module('streams.keys')", "x.y", False, "streams.keys"),
        ("import redis.cluster", "streams.keys", False, None),  # not a project module
    ],
)
def test_imports_resolve_to_the_module_they_run(
    source: str, importer: str, is_package: bool, expected: str | None
) -> None:
    modules = dict.fromkeys(
        ["pipeline", "pipeline.config", "pipeline.daemon", "pipeline.cli", "streams"]
        + ["pipeline.cli.commands", "streams.keys", "streams.consumer"]
    )
    found = list(imports_in(source, importer, is_package=is_package, modules=modules))
    assert [i.module for i in found if i.name != "importlib"] == [expected]


def test_type_checking_imports_are_marked() -> None:
    source = (
        "if TYPE_CHECKING:\n    import a\nelse:\n    import b\n"
        "if typing.TYPE_CHECKING:\n    import c\n"
    )
    found = {i.name: i.type_only for i in imports_in(source, "m", is_package=False, modules={})}
    assert found == {"a": True, "b": False, "c": True}


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": ["b"], "b": ["c"]}, []),
        ({"a": ["b"], "b": ["a"]}, [["a", "b", "a"]]),
        ({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}, [["a", "b", "c", "a"]]),
        ({"a": ["b", "c"], "b": ["a"], "c": ["a"]}, [["a", "b", "a"], ["a", "c", "a"]]),
        ({"p": ["p.sub"], "p.sub": ["p.other"], "p.other": []}, []),  # __init__ re-exports
        ({"p": ["p.sub"], "p.sub": ["p"]}, [["p", "p.sub", "p"]]),  # a name imported back
    ],
)
def test_cycles_are_found_once_each(edges: dict[str, list[str]], expected: list[list[str]]) -> None:
    graph = {a: {b: Import(a, 1, b, b, type_only=False) for b in bs} for a, bs in edges.items()}
    assert import_cycles(graph) == expected


def test_no_import_cycles() -> None:
    edges: dict[str, dict[str, Import]] = {}
    for found in project_imports():
        if found.module and found.module != found.importer and not found.type_only:
            edges.setdefault(found.importer, {}).setdefault(found.module, found)
    cycles = import_cycles(edges)
    assert not cycles, "import cycles:\n" + "\n".join(describe_cycle(c, edges) for c in cycles)


LAYERING = [
    ("pipeline", "framebatch_tools", "tooling is its own package; the runtime never imports it"),
    ("streams", "framebatch_tools", "tooling is its own package; the runtime never imports it"),
    ("detectors", "framebatch_tools", "tooling is its own package; the runtime never imports it"),
    ("streams", "detectors", "sources know nothing about models"),
    ("streams", "pipeline", "streams is a layer below the pipeline"),
    ("detectors", "redis", "models know nothing about Redis"),
    ("detectors", "streams", "models know nothing about sources or Redis"),
    ("detectors", "pipeline", "detectors is a layer below the pipeline"),
]


@pytest.mark.parametrize(
    ("package", "forbidden", "why"), LAYERING, ids=[f"{p}-not-{f}" for p, f, _ in LAYERING]
)
def test_layering(package: str, forbidden: str, why: str) -> None:
    violations = [
        f"{found.where()}: imports {found.name}" + (" (TYPE_CHECKING)" if found.type_only else "")
        for found in project_imports()
        if (found.importer == package or found.importer.startswith(package + "."))
        and (found.name == forbidden or found.name.startswith(forbidden + "."))
    ]
    assert not violations, f"{package} imports {forbidden} ({why}):\n" + "\n".join(violations)
