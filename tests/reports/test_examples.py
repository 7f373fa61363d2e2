"""The README's example scripts run as written (outputs redirected to a temporary folder)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from clustersim.cli import main

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "examples").glob("*.sh"))


def commands(script: Path) -> list[list[str]]:
    """The ``clustersim`` command lines of a shell script, continuation lines joined."""
    text = script.read_text().replace("\\\n", " ")
    return [shlex.split(line)[1:] for line in text.splitlines()
            if line.strip().startswith("clustersim ")]


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_example_script_runs(script, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    found = commands(script)
    assert found, "the script runs no clustersim command"
    (tmp_path / "docs").mkdir()  # as the scripts' own mkdir -p does
    for argv in found:
        argv = [str(tmp_path / a) if a.startswith("docs/") else a for a in argv]
        assert main(argv) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert "wrote" in out  # its plots, which the README shows
    assert list(tmp_path.rglob("*.png"))
