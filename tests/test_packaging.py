"""The four top folders install under the ``clustersim`` namespace (DESIGN.md, "Import names")."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
TOP_FOLDERS = ("simulator", "topologies", "validation", "reports")


def _declared_packages() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(config["tool"]["setuptools"]["packages"])


def _packages_on_disk() -> set[str]:
    found = {".".join(("clustersim", *init.parent.relative_to(ROOT / "clustersim").parts))
             for init in (ROOT / "clustersim").rglob("__init__.py")}
    for top in TOP_FOLDERS:
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top).parts
            found.add(".".join(("clustersim", top, *rel)))
    return found


def test_every_subpackage_is_declared():
    """A package missing from pyproject's list would silently not install."""
    assert _declared_packages() == _packages_on_disk()


def test_top_folders_map_to_the_namespace():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dir = config["tool"]["setuptools"]["package-dir"]
    for top in TOP_FOLDERS:
        assert package_dir[f"clustersim.{top}"] == top


def test_shipped_data_is_importable_as_package_resources():
    from importlib.resources import files

    assert files("clustersim.topologies").joinpath("gpus.yaml").is_file()
    assert files("clustersim.topologies").joinpath("clusters.yaml").is_file()
    assert files("clustersim.simulator").joinpath("presets/models.yaml").is_file()


def test_simulator_does_not_import_torch_matplotlib_or_the_cli():
    """Dependency direction: cli -> reports -> validation -> simulator -> topologies."""
    for folder in ("simulator", "topologies"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            for banned in ("import torch", "matplotlib", "clustersim.reports",
                           "clustersim.validation", "clustersim.cli"):
                assert banned not in text, f"{path.relative_to(ROOT)} imports {banned}"


def _imports_the_cli(path: Path) -> bool:
    """Whether a module imports the command line, absolutely or (inside it) relatively."""
    lines = path.read_text().splitlines()
    return any(line.lstrip().startswith(("from clustersim.cli", "import clustersim.cli",
                                         "from clustersim import cli"))
               for line in lines)


def test_only_the_entry_points_import_the_command_line():
    """The command line sits on top: the library (reports/, validation/, the Python API) never
    imports it, so a command is one module that can be read, moved or dropped alone."""
    library = [*(ROOT / "reports").rglob("*.py"), *(ROOT / "validation").rglob("*.py"),
               *(p for p in (ROOT / "clustersim").glob("*.py") if p.name != "__main__.py")]
    assert library, "no library modules found"
    offenders = [str(p.relative_to(ROOT)) for p in library if _imports_the_cli(p)]
    assert offenders == []
    assert _imports_the_cli(ROOT / "clustersim" / "__main__.py")  # the probe sees one
