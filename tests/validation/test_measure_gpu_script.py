"""``benchmarks/measure_gpu.sh``: a lent GPU's session is shorter than the whole script, so
``STEPS`` picks the steps to run; anything else is refused before a file is written."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "measure_gpu.sh"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run(tmp_path: Path, steps: str) -> subprocess.CompletedProcess:
    # PYTHON=echo: each step "runs" by printing its command into its log
    env = {**os.environ, "STEPS": steps, "PYTHON": "echo", "RESULTS": str(tmp_path / "r")}
    env.pop("OUT", None)
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_only_the_named_steps_run(tmp_path):
    done = _run(tmp_path, "sizes clocks validate")
    assert done.returncode == 0, done.stderr
    logs = sorted(p.name for p in (tmp_path / "r").glob("*.log"))
    assert logs == ["clocks.log", "sizes.log", "validate-gpt-1.3b.log", "validate-gpt-2.7b.log",
                    "validate-gpt-6.7b.log"]
    assert "clustersim.validation.layer_sizes" in (tmp_path / "r" / "sizes.log").read_text()


def test_an_unknown_step_is_one_error_line_and_nothing_written(tmp_path):
    done = _run(tmp_path, "sizes clock")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: STEPS: unknown step 'clock' (kernels layers sizes clocks calibrate validate)"]
    assert not (tmp_path / "r").exists()
