"""Where calibrations live: the user's data folder, never the installed package.

``calibrate`` writes ``<device>-<UTC time>.json`` (and its ``.raw.csv``) into
``$CLUSTERSIM_DATA_DIR/profiles``, or the platform's user data folder (``platformdirs``:
``~/.local/share/clustersim/profiles`` on Linux). ``validate`` reads the newest calibration of
its device there that is not a ``--quick`` one, else the profile shipped in
``topologies/profiles``.
"""

from __future__ import annotations

import json
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


def is_quick(path: Path) -> bool:
    """Whether ``path`` holds a ``calibrate --quick`` profile (``"quick": true``). A file that
    cannot be read is not quick: picked, it fails on loading with a line naming it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # ValueError: malformed JSON, or not UTF-8
        return False
    return isinstance(data, dict) and data.get("quick") is True


def default_profile(device: str) -> tuple[Path, str]:
    """(path, where) of the profile validate uses: the newest user calibration that is not a
    quick one (a smoke test, issue 24), else the shipped one; ``where`` says which, and how
    many newer quick calibrations were passed over, for the user."""
    mine = user_calibrations(device)
    full = [path for path in mine if not is_quick(path)]
    newest = full[-1] if full else None
    passed = sum(path not in full and (newest is None or path > newest) for path in mine)
    note = (f"; {passed} newer --quick calibration{'s' * (passed > 1)} passed over: name one "
            "with --profile to use it") if passed else ""
    if newest is not None:
        return newest, f"newest user calibration{note}"
    return shipped_folder() / f"{device}.json", f"shipped profile{note}"


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
    shipped = sorted(p.stem for p in shipped_folder().glob("*.json"))
    raise ScenarioError("--profile", f"no profile {name_or_path!r}: not a file, nor a name in "
                                     f"{str(user_folder())!r} or the shipped profiles "
                                     f"({', '.join(shipped)})")


def load_named_profile(name_or_path: str, cluster=None, force: bool = False):
    """``--profile``'s profile, loaded; with ``cluster``, refused when measured on another
    GPU than the cluster's unless ``force`` (``--force-profile``, ``check_device``)."""
    from clustersim.topologies.profile import check_device, load_profile

    profile = load_profile(find_profile(name_or_path))
    if cluster is not None:
        check_device(profile, cluster, force)
    return profile


def is_shipped(path: Path) -> bool:
    return path.resolve().parent == shipped_folder().resolve()
