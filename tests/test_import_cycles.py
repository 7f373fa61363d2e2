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

from pathlib import Path

import pytest
from import_graph import cycles, import_graph, installed_modules, one_loop

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
