"""docs/modelling.md's fabric what-if tables are what examples/fabric-whatif.py and
examples/roce-vs-infiniband.py print today.

The scripts run about 30 full-fidelity simulations (four minutes on two cores), too long to
rerun in every test run. Each printed table has a column (or a sentence) in `representative`
fidelity, a second or two to recompute, written by the same run as the full-fidelity numbers
beside it: when the model's answers change, those move, and the test names the script to
rerun. The oracle is the scripts' own ``step`` functions."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "modelling.md").read_text(encoding="utf-8")
RERUN = "rerun python3 examples/{} and copy its numbers into docs/modelling.md"


def script(name: str):
    path = ROOT / "examples" / name
    spec = importlib.util.spec_from_file_location(path.stem.replace("-", "_"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def roce_rows() -> list[tuple[str, float, float]]:
    """(job, oversubscription, representative seconds) of every row of the RoCE table."""
    rows, job = [], None
    for line in DOC.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not re.fullmatch(r"\d+:1", cells[1]):
            continue
        job = cells[0] or job
        rows.append((job, float(cells[1].split(":")[0]), float(cells[4])))
    return rows


def test_the_roce_table_is_what_the_script_prints():
    roce = script("roce-vs-infiniband.py")
    rows = roce_rows()
    assert len(rows) == len(roce.JOBS) * len(roce.RATIOS)
    for job, ratio, quoted in rows:
        scenario, ports = next(v for k, v in roce.JOBS.items() if job.startswith(k))
        now = roce.step(scenario, "representative", leaf_ports=ports, oversubscription=ratio)
        assert round(now, 3) == pytest.approx(quoted, abs=1e-9), (
            f"{job} {ratio:.0f}:1: {now:.3f} s today; " + RERUN.format("roce-vs-infiniband.py"))


def test_the_fabric_whatif_figures_are_what_the_script_prints():
    """The degraded-port paragraph's healthy representative step (the script's last line)."""
    whatif = script("fabric-whatif.py")
    quoted = re.search(r"healthy, ([0-9.]+) s representative", " ".join(DOC.split()))
    assert quoted, "docs/modelling.md lost the degraded-port sentence"
    now = whatif.step("representative", topology="rail-optimized")
    assert f"{now:.3f}" == quoted.group(1), (
        f"{now:.3f} s today; " + RERUN.format("fabric-whatif.py"))
