"""No prediction moves while the code is rearranged (issue 25, item 6).

``tests/data/goldens/`` holds, recorded before the simulator was split into subpackages, the
``clustersim simulate FILE --json`` output of every shipped ``examples/*.yaml`` and the stdout of
``python3 benchmarks/accuracy.py`` (the published-run tables). A move that changes a single byte of
a prediction fails here. A change that is meant to move predictions regenerates the files
(``tests/data/goldens/README.md`` says how) and explains each difference in its commit.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run

ROOT = Path(__file__).resolve().parents[1]
GOLDENS = ROOT / "tests" / "data" / "goldens"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def test_every_example_has_a_golden():
    """A new example gets a golden too (and a removed one loses it), so none goes unchecked."""
    examples = {path.stem for path in EXAMPLES}
    goldens = {path.stem for path in GOLDENS.glob("*.json")}
    assert examples == goldens


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.stem)
def test_simulate_json_is_byte_identical_to_its_golden(example, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, out, err = run(capsys, "simulate", str(example.relative_to(ROOT)), "--json")
    assert code == 0, err
    assert out == (GOLDENS / f"{example.stem}.json").read_text("utf-8")


@pytest.mark.slow
def test_accuracy_tables_are_byte_identical_to_their_golden():
    """The published-run tables (about 35 s: every run of the development set and the tables)."""
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "accuracy.py")],
                            cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout == (GOLDENS / "accuracy.txt").read_text("utf-8")
