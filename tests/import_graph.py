"""The import graph of the installed clustersim package, read statically with ``ast``, and
its cycles: what tests/test_import_cycles.py and tests/test_simulator_layers.py check."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
# The installed top packages (pyproject.toml's package-dir); subpackages below them are found
# on disk, so a new one is walked without editing this list.
TOP_PACKAGES = (
    "clustersim",
    "clustersim.simulator",
    "clustersim.topologies",
    "clustersim.reports",
    "clustersim.validation",
)


def _package_dir(package: str) -> Path:
    """Where the installed package's modules are (its import spec's search location)."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, f"{package} is not installed"
    return Path(next(iter(spec.submodule_search_locations)))


def _modules_of(package: str, folder: Path) -> dict[str, Path]:
    """Every module of a package and of its subpackages (folders with ``__init__.py``)."""
    found = {package: folder / "__init__.py"}
    for path in sorted(folder.glob("*.py")):
        if path.name != "__init__.py":
            found[f"{package}.{path.stem}"] = path
    for sub in sorted(folder.iterdir()):
        if sub.is_dir() and (sub / "__init__.py").is_file():
            found.update(_modules_of(f"{package}.{sub.name}", sub))
    return found


def installed_modules() -> dict[str, Path]:
    """Every clustersim module, by dotted name, with its source file."""
    modules: dict[str, Path] = {}
    for package in TOP_PACKAGES:
        modules.update(_modules_of(package, _package_dir(package)))
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _runtime_imports(tree: ast.AST):
    """Every Import/ImportFrom node that can run: all of them but the bodies of
    ``if TYPE_CHECKING:`` (their ``else`` branches do run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from`` import names, relative levels resolved."""
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(module: str, is_package: bool, node, known: set[str]) -> set[str]:
    """The clustersim modules one import statement loads by name: ``from pkg import mod``
    names the submodule ``pkg.mod``, ``from mod import name`` the module ``mod``."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & known
    source = _absolute(module, is_package, node)
    found = set()
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        found.add(sub if sub in known else source)
    return found & known


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module -> the clustersim modules its runtime imports name."""
    known = set(modules)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in _runtime_imports(tree):
            edges |= _targets(name, is_package, node, known)
        graph[name] = edges
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative, so deep graphs do not recurse)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def one_loop(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest import loop from the component's first module back to itself."""
    members, start = set(component), component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    return paths[node] + [start]
                if child not in paths:
                    paths[child] = paths[node] + [child]
                    nxt.append(child)
        frontier = nxt
    return [start, start]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The components that are cycles: two or more modules, or one that imports itself."""
    return [c for c in strongly_connected(graph)
            if len(c) > 1 or c[0] in graph[c[0]]]
