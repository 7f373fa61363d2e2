"""Where the command line lives (issue 25, item 3): each command ``clustersim --help`` lists is
one module of ``clustersim/cli/`` of the same name, whose function runs it, and the console
script and ``python -m clustersim`` both start that command line."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clustersim.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _commands() -> dict[str, argparse.ArgumentParser]:
    """The parser's own list of commands (the oracle: what ``--help`` shows the user)."""
    parser = build_parser()
    found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(found) == 1
    return dict(found[0].choices)


def test_each_command_runs_from_its_own_module():
    commands = _commands()
    assert {"simulate", "sweep", "plan", "report", "calibrate", "validate", "collective",
            "presets"} <= set(commands)
    for name, sub in commands.items():
        run = sub.get_default("run")
        assert run.__module__ == f"clustersim.cli.{name}", name
        assert (ROOT / "clustersim" / "cli" / f"{name}.py").is_file(), name


def test_the_console_script_starts_the_cli():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    target = config["project"]["scripts"]["clustersim"]
    module, _, function = target.partition(":")
    assert (module, function) == ("clustersim.cli", "main")


def test_python_m_clustersim_prints_the_same_help(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # argparse wraps to the terminal's width
    expected = build_parser().format_help()
    out = subprocess.run([sys.executable, "-m", "clustersim", "--help"], capture_output=True,
                         text=True, check=True, env={**os.environ, "COLUMNS": "80"}).stdout
    assert out == expected
    assert "simulate" in out and "presets" in out
