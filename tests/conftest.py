"""Every test keeps its calibrations in a temporary folder, never the user's real data
folder (``CLUSTERSIM_DATA_DIR``, validation/profiles.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_data_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CLUSTERSIM_DATA_DIR", str(tmp_path_factory.mktemp("data")))
