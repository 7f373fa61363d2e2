"""Where calibrations live: the user's data folder, never the installed package.

``calibrate`` writes ``<device>-<UTC time>.json`` (and its ``.raw.csv``) into
``$CLUSTERSIM_DATA_DIR/profiles``, or the platform's user data folder (``platformdirs``:
``~/.local/share/clustersim/profiles`` on Linux). ``validate`` reads the newest calibration of
its device there, else the profile shipped in ``topologies/profiles``.
"""

from __future__ import annotations

import os
import time
from importlib.resources import files
from pathlib import Path

import platformdirs

from clustersim.errors import ScenarioError

DATA_DIR_ENV = "CLUSTERSIM_DATA_DIR"


def shipped_folder() -> Path:
    """The package's own profiles: read, never written."""
    return Path(str(files("clustersim.topologies").joinpath("profiles")))


def user_folder() -> Path:
    """Calibrations of this user (the folder may not exist yet)."""
    root = os.environ.get(DATA_DIR_ENV) or platformdirs.user_data_dir("clustersim")
    return Path(root) / "profiles"


def device_name(backend: str, gpu_id: str | None = None) -> str:
    """``cpu-core`` for gloo, ``<gpu>-measured`` for a GPU: the shipped profile's name."""
    return "cpu-core" if backend == "gloo" else f"{gpu_id}-measured"


def new_calibration_path(device: str) -> Path:
    """A fresh file in the user folder, named by device and UTC time, so none is overwritten."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return user_folder() / f"{device}-{stamp}.json"


def user_calibrations(device: str) -> list[Path]:
    """This device's calibrations in the user folder, oldest first (by their time stamps)."""
    folder = user_folder()
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob(f"{device}-*.json")
                  if p.stem[len(device) + 1:].replace("-", "").isdigit())


def default_profile(device: str) -> tuple[Path, str]:
    """(path, where) of the profile validate uses: the newest user calibration, else the
    shipped one; ``where`` says which, for the user."""
    mine = user_calibrations(device)
    if mine:
        return mine[-1], "newest user calibration"
    return shipped_folder() / f"{device}.json", "shipped profile"


def find_profile(name_or_path: str) -> Path:
    """``--profile``: a file path, else a name (with or without .json) in the user folder,
    then among the shipped profiles."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    name = name_or_path if name_or_path.endswith(".json") else f"{name_or_path}.json"
    for folder in (user_folder(), shipped_folder()):
        if (folder / name).is_file():
            return folder / name
    raise ScenarioError("--profile", f"no profile {name_or_path!r}: not a file, nor a name in "
                                     f"{str(user_folder())!r} or the shipped profiles")


def is_shipped(path: Path) -> bool:
    return path.resolve().parent == shipped_folder().resolve()
