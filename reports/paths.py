"""Output paths checked before any work: a simulation or sweep must never end in a traceback
because the file it was asked to write cannot be written (one ``error:`` line, exit 2)."""

from __future__ import annotations

import os
from pathlib import Path

from clustersim.errors import ScenarioError


def check_file_output(field: str, path: str | Path) -> Path:
    """A file we will create or replace: not a folder, in a folder that exists and is
    writable."""
    path = Path(path)
    if path.is_dir():
        raise ScenarioError(field, f"{str(path)!r} is a folder; give a file name")
    folder = path.resolve().parent
    if not folder.is_dir():
        raise ScenarioError(field, f"folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise ScenarioError(field, f"folder {str(folder)!r} is not writable")
    if path.exists() and not os.access(path, os.W_OK):
        raise ScenarioError(field, f"{str(path)!r} is not writable")
    return path


def check_folder_output(field: str, path: str | Path) -> Path:
    """A folder we will create (with its parents) or write into: not an existing file, and
    its nearest existing ancestor is a writable folder."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ScenarioError(field, f"{str(path)!r} is a file, not a folder")
    existing = path.resolve()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ScenarioError(field, f"{str(existing)!r} is a file, not a folder")
    if not os.access(existing, os.W_OK):
        raise ScenarioError(field, f"folder {str(existing)!r} is not writable")
    return path
