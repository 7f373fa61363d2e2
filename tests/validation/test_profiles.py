"""Calibrations go to the user's data folder, never into the installed package; validate
finds them by name and uses the newest for its device, saying which."""

from __future__ import annotations

import hashlib
import os

import pytest

from clustersim.errors import ScenarioError
from clustersim.validation import profiles


def _write(path, text="{}"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_user_folder_follows_the_environment_override(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERSIM_DATA_DIR", str(tmp_path))
    assert profiles.user_folder() == tmp_path / "profiles"
    assert profiles.new_calibration_path("cpu-core").parent == tmp_path / "profiles"


def test_validate_default_is_the_newest_user_calibration_else_the_shipped_profile(tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setenv("CLUSTERSIM_DATA_DIR", str(tmp_path))
    path, where = profiles.default_profile("cpu-core")
    assert path == profiles.shipped_folder() / "cpu-core.json" and path.is_file()
    assert where == "shipped profile"
    folder = tmp_path / "profiles"
    _write(folder / "cpu-core-20260101-120000.json")
    newest = _write(folder / "cpu-core-20261123-090000.json")
    _write(folder / "h100-sxm-measured-20271231-000000.json")  # another device
    _write(folder / "cpu-core-notes.json")  # not a calibration's name
    assert profiles.default_profile("cpu-core") == (newest, "newest user calibration")


def test_profile_by_name_finds_user_calibrations_then_shipped_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERSIM_DATA_DIR", str(tmp_path))
    mine = _write(tmp_path / "profiles" / "cpu-core-20261123-090000.json")
    assert profiles.find_profile("cpu-core-20261123-090000") == mine
    assert profiles.find_profile("cpu-core-20261123-090000.json") == mine
    assert profiles.find_profile("cpu-core") == profiles.shipped_folder() / "cpu-core.json"
    assert profiles.find_profile(str(mine)) == mine
    with pytest.raises(ScenarioError, match="--profile"):
        profiles.find_profile("no-such-profile")


def _package_data_digest() -> dict[str, str]:
    folder = profiles.shipped_folder()
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.is_file()}


def test_calibrate_quick_leaves_the_package_data_unchanged_and_is_never_the_default(
        tmp_path, monkeypatch, capsys):
    """Issue 24: validate picked a --quick smoke test as the newest calibration (-52% error).
    The quick profile is marked, passed over by default, and still usable by its name."""
    pytest.importorskip("torch")
    from clustersim.cli import main
    from clustersim.topologies.profile import load_profile

    monkeypatch.setenv("CLUSTERSIM_DATA_DIR", str(tmp_path))
    before = _package_data_digest()
    assert main(["calibrate", "--quick"]) == 0
    assert _package_data_digest() == before
    written = profiles.user_calibrations("cpu-core")
    assert len(written) == 1 and written[0].with_name(written[0].stem + ".raw.csv").is_file()
    assert f"--profile {written[0].stem}" in capsys.readouterr().out
    quick = load_profile(written[0])
    assert quick.quick and "--quick" in quick.source
    path, where = profiles.default_profile("cpu-core")
    assert path == profiles.shipped_folder() / "cpu-core.json"
    assert "1 newer --quick calibration passed over" in where
    assert profiles.find_profile(written[0].stem) == written[0]


QUICK = '{"quick": true}'


@pytest.mark.parametrize("files, chosen, passed_over", [
    # (file stamps oldest first, quick or not), the stamp chosen (None: shipped), quick skipped
    ([("20260101-120000", False), ("20261123-090000", True)], "20260101-120000", 1),
    ([("20260101-120000", True), ("20261123-090000", False)], "20261123-090000", 0),
    ([("20260101-120000", True), ("20261123-090000", True)], None, 2),
    ([("20260101-120000", False), ("20261123-090000", False)], "20261123-090000", 0),
])
def test_the_default_is_the_newest_calibration_that_is_not_quick(tmp_path, monkeypatch, files,
                                                                  chosen, passed_over):
    monkeypatch.setenv("CLUSTERSIM_DATA_DIR", str(tmp_path))
    folder = tmp_path / "profiles"
    for stamp, quick in files:
        _write(folder / f"cpu-core-{stamp}.json", QUICK if quick else '{"quick": false}')
    path, where = profiles.default_profile("cpu-core")
    expected = (folder / f"cpu-core-{chosen}.json" if chosen
                else profiles.shipped_folder() / "cpu-core.json")
    assert path == expected
    assert where.startswith("newest user calibration" if chosen else "shipped profile")
    assert (f"{passed_over} newer --quick" in where) == (passed_over > 0)


def test_an_unreadable_calibration_is_not_taken_for_a_quick_one(tmp_path, monkeypatch):
    """Picked, it fails on loading with a line naming it, rather than being silently skipped."""
    monkeypatch.setenv("CLUSTERSIM_DATA_DIR", str(tmp_path))
    broken = _write(tmp_path / "profiles" / "cpu-core-20261123-090000.json", "{not json")
    assert profiles.default_profile("cpu-core")[0] == broken


def test_calibrate_refuses_to_write_into_the_package(capsys):
    pytest.importorskip("torch")
    from clustersim.cli import main

    target = profiles.shipped_folder() / "cpu-core.json"
    if not os.access(target.parent, os.W_OK):
        pytest.skip("the package folder is read-only here anyway")
    before = target.read_bytes()
    assert main(["calibrate", "--quick", "--out", str(target)]) == 2
    assert capsys.readouterr().err.startswith("error: --out")
    assert target.read_bytes() == before
