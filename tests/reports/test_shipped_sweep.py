"""The shipped sweep table is what its script computes today (issue 24: it was stale by up to
24% and its script resumed from it).

``examples/sweep-llama3-70b-512.sh`` regenerates docs/sweep-llama3-70b-512.csv, its
fingerprint and its plots. The oracle is a real run: the script's own sweep command, rerun
here into a scratch file (36 points, about 8 s on one core). The plots are drawn from the
table and are not compared.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pandas as pd
import pytest

from clustersim.cli import main
from clustersim.reports.sweep import read_table
from clustersim.reports.sweep_fingerprint import sidecar

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "sweep-llama3-70b-512.sh"
SHIPPED = ROOT / "docs" / "sweep-llama3-70b-512.csv"
REGENERATE = f"stale: run sh {SCRIPT.relative_to(ROOT)} from the repository's root"


def script_sweep_arguments() -> list[str]:
    """The arguments of the script's ``clustersim sweep`` command, less where it writes."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    line = next(x for x in text.splitlines() if x.strip().startswith("clustersim sweep"))
    args = shlex.split(line)[2:]
    for flag in ("--out", "--plots"):
        at = args.index(flag)
        del args[at:at + 2]
    args.remove("--fresh")
    return args


def differing_columns(shipped: pd.DataFrame, fresh: pd.DataFrame) -> list[str]:
    """Columns whose values differ (numbers beyond a relative 1e-9, text at all), or that
    only one table has."""
    if len(shipped) != len(fresh):
        return [f"(rows: {len(shipped)} shipped, {len(fresh)} today)"]
    if list(shipped.columns) != list(fresh.columns):
        return sorted(set(shipped.columns) ^ set(fresh.columns)) or ["(column order)"]
    out = []
    for column in shipped.columns:
        try:
            pd.testing.assert_series_equal(shipped[column], fresh[column], check_exact=False,
                                           rtol=1e-9, check_dtype=False)
        except AssertionError:
            out.append(column)
    return out


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shipped") / "sweep.csv"
    args = script_sweep_arguments()
    args[0] = str(ROOT / args[0])  # the scenario, relative to the root in the script
    assert main(["sweep", *args, "--out", str(out), "--jobs", "1"]) == 0
    return out


def test_the_shipped_table_is_what_the_script_computes_today(fresh):
    stale = differing_columns(read_table(SHIPPED), read_table(fresh))
    assert not stale, f"{SHIPPED.name}: {', '.join(stale[:5])} differ; {REGENERATE}"


def test_the_shipped_fingerprint_records_the_scripts_inputs(fresh):
    """Every part but the code digest, which changes with any commit: the comparison above
    is what says whether a code change changed the table."""
    shipped = json.loads(sidecar(SHIPPED).read_text())
    today = json.loads(sidecar(fresh).read_text())
    shipped["clustersim"].pop("code")
    today["clustersim"].pop("code")
    assert shipped == today, REGENERATE


def test_a_changed_value_is_found(fresh):
    """The check above can fail: one step time off by a millionth is reported."""
    table = read_table(fresh)
    edited = table.copy()
    edited.loc[3, "step_time_s"] *= 1 + 1e-6
    assert differing_columns(table, table) == []
    assert differing_columns(edited, table) == ["step_time_s"]
