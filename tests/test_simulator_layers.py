"""The simulator's own layers (docs/architecture.md, "Layers inside the simulator"; issue 25):
one subpackage per layer, every module listed in the table, and imports only from a module's
own layer or lower levels, never from a peer layer of the same level."""

from __future__ import annotations

import re

import pytest
from import_graph import ARCHITECTURE, import_graph, installed_modules


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(installed_modules())


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
