"""No import cycles among clustersim's modules, and imports that point the one way
docs/architecture.md says ("Packages and the one-way rule"; issue 25).

The import graph is read statically with ``ast`` from the source of every module of the
installed package: each ``import`` and ``from ... import`` that names a clustersim module is an
edge, wherever it stands — at the top of the module or inside a function. A lazy import inside
a function still runs and still ties the two modules together: moving an import into a function
to dodge a cycle hides it from Python's loader, not from this test. Only imports under
``if TYPE_CHECKING:`` are left out, since they never run.

A cycle is a strongly connected component of more than one module (or a module importing
itself); the test names every module of each one and one import loop through it. The layers
are checked on the same graph: no import from a lower package into a higher one, and the two
estimators (analytic and engine) as peers, neither reaching the other.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

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


# --- the checker checks itself on small graphs whose cycles are known by hand ---------------

def test_finds_a_two_module_cycle_and_a_self_import():
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": set(), "d": {"d"}}
    assert sorted(cycles(graph)) == [["a", "b"], ["d"]]


def test_a_chain_and_a_diamond_are_not_cycles():
    graph = {"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}
    assert cycles(graph) == []


def test_the_loop_named_goes_round_the_component():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "x": {"a"}}
    [component] = cycles(graph)
    assert component == ["a", "b", "c"]
    assert one_loop(graph, component) == ["a", "b", "c", "a"]


def _graph_of(tmp_path: Path, sources: dict[str, str]) -> dict[str, set[str]]:
    modules = {}
    for name, text in sources.items():
        path = tmp_path / (name.replace(".", "_") + ".py")
        if name == "pkg":
            path = tmp_path / "pkg_init" / "__init__.py"
            path.parent.mkdir()
        path.write_text(text)
        modules[name] = path
    return import_graph(modules)


def test_a_lazy_import_in_a_function_is_an_edge_and_type_checking_is_not(tmp_path):
    graph = _graph_of(tmp_path, {
        "pkg": "",
        "pkg.a": "def f():\n    from pkg import b\n    return b\n",
        "pkg.b": ("from typing import TYPE_CHECKING\n"
                  "if TYPE_CHECKING:\n    from pkg.a import f\n"
                  "else:\n    import pkg.c\n"),
        "pkg.c": "from .a import f\n",
    })
    assert graph["pkg.a"] == {"pkg.b"}
    assert graph["pkg.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


# --- the package itself ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(installed_modules())


def test_every_installed_package_is_walked(graph):
    """The walk reaches each top package's modules (so an empty graph cannot pass)."""
    for module in ("clustersim.api", "clustersim.simulator.discrete_event.engine",
                   "clustersim.topologies.collectives", "clustersim.reports.plan",
                   "clustersim.validation.compare"):
        assert module in graph
    assert "clustersim.simulator.inputs.specs" in graph["clustersim.simulator.inputs.scenario"]


def test_no_import_cycles(graph):
    found = cycles(graph)
    report = "\n".join(f"cycle of {len(c)}: {', '.join(c)}\n  e.g. "
                       + " -> ".join(one_loop(graph, c)) for c in found)
    assert not found, f"{len(found)} import cycle(s):\n{report}"


# The packages from the bottom up (docs/architecture.md): the shared plumbing, the hardware,
# the simulator, real runs, the reports; the front door (``clustersim``'s API, ``__main__`` and
# whatever else the top package holds) over all of them. A module may import its own layer
# and those below it.
BASE = {"clustersim.errors", "clustersim.fields", "clustersim.plugins", "clustersim.version",
        "clustersim.yamlio"}
LAYERS = ("base", "clustersim.topologies", "clustersim.simulator", "clustersim.validation",
          "clustersim.reports", "front door")


def layer_of(module: str) -> int:
    """The index in ``LAYERS`` of a module's layer."""
    if module in BASE:
        return 0
    for i, package in enumerate(LAYERS[1:-1], start=1):
        if module == package or module.startswith(package + "."):
            return i
    return len(LAYERS) - 1


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a higher layer, as ``a -> b``."""
    return [f"{a} -> {b}" for a in sorted(graph) for b in sorted(graph[a])
            if layer_of(b) > layer_of(a)]


def reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    stack = [start]
    while stack:
        for child in graph[stack.pop()] - seen:
            seen.add(child)
            stack.append(child)
    return seen


def test_layers_of_known_modules():
    assert [layer_of(m) for m in ("clustersim.errors", "clustersim.topologies.network",
                                  "clustersim.simulator.discrete_event.engine",
                                  "clustersim.validation.compare",
                                  "clustersim.reports.plan", "clustersim.api", "clustersim")
            ] == [0, 1, 2, 3, 4, 5, 5]
    assert upward_imports({"clustersim.simulator.a": {"clustersim.reports.b"},
                           "clustersim.reports.b": {"clustersim.errors"}}) == [
        "clustersim.simulator.a -> clustersim.reports.b"]


def test_imports_point_down_the_layers(graph):
    wrong = upward_imports(graph)
    assert not wrong, "imports from a higher layer (docs/architecture.md):\n" + "\n".join(wrong)


def test_the_two_estimators_are_peers(graph):
    """The analytic estimator and the engine share the cost model; neither imports the other."""
    analytic = "clustersim.simulator.closed_form.analytic"
    engine = "clustersim.simulator.discrete_event.engine"
    assert engine not in reaches(graph, analytic)
    assert analytic not in reaches(graph, engine)
    cost_model = "clustersim.simulator.costs.cost_model"
    assert cost_model in reaches(graph, analytic) & reaches(graph, engine)


# --- the simulator's own layers, as docs/architecture.md's table lists them ------------------

SIMULATOR = "clustersim.simulator"


def simulator_layers(text: str) -> dict[str, tuple[int, str]]:
    """Each simulator module's (level, layer name) from the table under "Layers inside the
    simulator": lines ``<level> <layer> <folder>/ <module> <module> ...`` in the first code
    block. ``<folder>/`` names the subpackage the modules after it are in (``__init__`` the
    package itself); a module before any folder is in ``simulator/`` itself."""
    section = text.split("### Layers inside the simulator", 1)[1]
    block = section.split("```", 2)[1]
    layers = {}
    for line in block.splitlines():
        match = re.match(r"\s*(\d+)\s+(\w+)\s+(.+)", line)
        if match:
            level, name, package = int(match[1]), match[2], SIMULATOR
            for token in match[3].split():
                if token.endswith("/"):
                    package = f"{SIMULATOR}.{token.rstrip('/').replace('/', '.')}"
                    continue
                key = package if token == "__init__" else f"{package}.{token}"
                assert key not in layers, f"{key} is listed twice"
                layers[key] = (level, name)
    return layers


def test_the_table_reads_folders_and_the_packages_themselves():
    text = ("### Layers inside the simulator\n```\n0 top  __init__\n"
            "2 costs  costs/ __init__ memory\n1 schedules  pipeline/ stages\n```\n")
    assert simulator_layers(text) == {
        SIMULATOR: (0, "top"), f"{SIMULATOR}.costs": (2, "costs"),
        f"{SIMULATOR}.costs.memory": (2, "costs"), f"{SIMULATOR}.pipeline.stages": (1, "schedules")}


def misplaced_imports(graph: dict[str, set[str]], layers: dict[str, tuple[int, str]]
                      ) -> list[str]:
    """Imports inside the simulator that go up a level, or across to a peer layer."""
    wrong = []
    for a in sorted(layers):
        for b in sorted(graph[a] & set(layers)):
            (level_a, name_a), (level_b, name_b) = layers[a], layers[b]
            if level_b > level_a or (level_b == level_a and name_b != name_a):
                wrong.append(f"{a} ({name_a}) -> {b} ({name_b})")
    return wrong


def test_peers_and_higher_levels_are_refused():
    layers = {"s.a": (2, "engine"), "s.b": (2, "analytic"), "s.c": (1, "costs")}
    graph = {"s.a": {"s.b", "s.c"}, "s.b": set(), "s.c": {"s.a"}}
    assert misplaced_imports(graph, layers) == ["s.a (engine) -> s.b (analytic)",
                                                "s.c (costs) -> s.a (engine)"]


@pytest.fixture(scope="module")
def layers() -> dict[str, tuple[int, str]]:
    return simulator_layers(ARCHITECTURE.read_text())


def test_the_layer_table_lists_every_simulator_module(graph, layers):
    modules = {m for m in graph if m == SIMULATOR or m.startswith(SIMULATOR + ".")}
    missing, gone = sorted(modules - set(layers)), sorted(set(layers) - modules)
    assert not missing, f"add these to docs/architecture.md's simulator layers: {missing}"
    assert not gone, f"docs/architecture.md lists modules that are not there: {gone}"


def test_every_simulator_module_is_in_a_layer_subpackage(layers):
    """``simulator/`` holds its subpackages and nothing else: one folder per layer, and no
    layer spread over two folders."""
    table = ARCHITECTURE.read_text().split("### Layers inside the simulator", 1)[1]
    packages = {f"{SIMULATOR}.{folder}"
                for folder in re.findall(r"(\w+)/", table.split("```", 2)[1])}
    flat = [m for m in layers if m.count(".") == 2 and m not in packages]
    assert flat == [], f"modules outside a layer's subpackage: {flat}"
    folders: dict[str, set[str]] = {}
    for module, (_, name) in layers.items():
        if module != SIMULATOR:
            folders.setdefault(name, set()).add(module.split(".")[2])
    assert all(len(found) == 1 for found in folders.values()), folders
    assert len({f for found in folders.values() for f in found}) == len(folders)


def test_simulator_imports_follow_the_layer_table(graph, layers):
    wrong = misplaced_imports(graph, layers)
    assert not wrong, ("imports against docs/architecture.md's simulator layers:\n"
                       + "\n".join(wrong))
