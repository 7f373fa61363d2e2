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
    found = {"clustersim"}
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
    """Dependency direction: reports -> validation -> simulator -> topologies."""
    for folder in ("simulator", "topologies"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            for banned in ("import torch", "matplotlib", "clustersim.reports",
                           "clustersim.validation"):
                assert banned not in text, f"{path.relative_to(ROOT)} imports {banned}"
