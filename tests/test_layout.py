"""The floor plan, read from the code: a shared layer at the bottom, components above it.

``inferwatch/`` holds only what two or more components share (its top-level modules,
``serving/`` and ``mixin/``); every other folder is one component. Arrows point down: the
shared layer imports no component, and components never import each other in a cycle.
Each shared module names its face in ``__all__``, and components import nothing else.
"""

from __future__ import annotations

import ast
import graphlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
#: the top-level folders installed as ``inferwatch.<name>`` (pyproject's package-dir)
MAPPED = ("exporters", "probes", "dashboards", "alerts", "runbooks")
#: the shared layer's packages; inferwatch/'s other subpackages are components
SHARED_PACKAGES = ("serving", "mixin", "config")
#: shared modules that are entry points rather than a face for components
ENTRY_POINTS = ("inferwatch", "inferwatch.__main__", "inferwatch.cli")

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class Import:
    importer: str
    module: str
    names: tuple[str, ...]


def _module_name(path: Path) -> str:
    relative = path.relative_to(REPO).with_suffix("")
    parts = list(relative.parts)
    if parts[0] in MAPPED:
        parts.insert(0, "inferwatch")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    found = {}
    for root in ("inferwatch", *MAPPED):
        for path in sorted((REPO / root).rglob("*.py")):
            if "generated" not in path.parts:
                found[_module_name(path)] = path
    return found


SOURCES = _sources()


def _imports() -> list[Import]:
    """Every import of an ``inferwatch`` module, lazy ones inside functions included."""
    found = []
    for name, path in SOURCES.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found += [Import(name, alias.name, ()) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join([*base, *([module] if module else [])])
                names = tuple(alias.name for alias in node.names)
                found.append(Import(name, module, names))
    return [i for i in found if i.module.split(".")[0] == "inferwatch"]


IMPORTS = _imports()


def _resolve(item: Import) -> list[tuple[str, tuple[str, ...]]]:
    """(module, names taken from it): ``from pkg import mod`` names the module ``pkg.mod``."""
    if not item.names:
        return [(item.module, ())]
    modules = [(f"{item.module}.{n}", ()) for n in item.names if f"{item.module}.{n}" in SOURCES]
    names = tuple(n for n in item.names if f"{item.module}.{n}" not in SOURCES)
    return modules + ([(item.module, names)] if names or not modules else [])


def unit(module: str) -> str:
    """The folder a module belongs to: ``shared`` or the component's name."""
    parts = module.split(".")
    if len(parts) == 1 or (len(parts) == 2 and f"inferwatch.{parts[1]}" in SOURCES
                           and SOURCES[f"inferwatch.{parts[1]}"].name != "__init__.py"):
        return "shared"
    if parts[1] in SHARED_PACKAGES:
        return "shared"
    return parts[1]


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for item in IMPORTS:
        for module, _ in _resolve(item):
            source, target = unit(item.importer), unit(module)
            if source != target:
                edges[source].add(target)
    return edges


def test_the_shared_layer_imports_no_component() -> None:
    upward = sorted(
        f"{item.importer} -> {module}"
        for item in IMPORTS
        for module, _ in _resolve(item)
        if unit(item.importer) == "shared" and unit(module) != "shared"
    )
    assert upward == []


def test_components_import_each_other_without_a_cycle() -> None:
    graph = {source: targets - {"shared"} for source, targets in _edges().items()}
    try:
        order = list(graph_order(graph))
    except graphlib.CycleError as exc:
        pytest.fail(f"folder-level import cycle: {' -> '.join(exc.args[1])}")
    assert set(graph) <= set(order)


def graph_order(graph: dict[str, set[str]]) -> tuple[str, ...]:
    return tuple(graphlib.TopologicalSorter(graph).static_order())


def test_every_component_is_a_folder_of_its_own() -> None:
    """inferwatch/ holds no loose feature: a top-level module there is shared by two or more
    components (or is the console script)."""
    users: dict[str, set[str]] = defaultdict(set)
    for item in IMPORTS:
        for module, _ in _resolve(item):
            if unit(module) == "shared" and unit(item.importer) != "shared":
                users[module].add(unit(item.importer))
    loose = {
        name: sorted(users[name])
        for name in SOURCES
        if name.count(".") == 1 and unit(name) == "shared" and name not in ENTRY_POINTS
        and SOURCES[name].name != "__init__.py" and len(users[name]) < 2
    }
    assert loose == {}


SHARED_FACES = sorted(
    name for name in SOURCES
    if unit(name) == "shared" and name not in ENTRY_POINTS
    and SOURCES[name].name != "__init__.py"
)


@pytest.mark.parametrize("module", SHARED_FACES)
def test_a_shared_module_names_its_face(module: str) -> None:
    tree = ast.parse(SOURCES[module].read_text(encoding="utf-8"))
    declared = _declared_all(tree)
    assert declared is not None, f"{module} has no __all__"
    defined = _top_level_names(tree)
    assert sorted(set(declared) - defined) == [], "names in __all__ that the module lacks"
    taken = {
        name
        for item in IMPORTS
        if unit(item.importer) != "shared"
        for target, names in _resolve(item)
        if target == module
        for name in names
    }
    assert sorted(taken - set(declared)) == [], "names components import beyond __all__"


def _declared_all(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                assert isinstance(node.value, ast.List | ast.Tuple)
                return [ast.literal_eval(element) for element in node.value.elts]
    return None


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names
