"""Resuming a sweep only when its inputs are the same (issue 24, item 1).

The oracle is a fresh run: each changed input gives a different table from scratch, so resuming
the old one would have been a wrong answer; the rerun must refuse with one ``error:`` line that
names the change and ``--fresh``, leave the old table and its fingerprint untouched, and with
``--fresh`` give exactly the fresh run's table.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from clustersim.cli import main
from clustersim.errors import ScenarioError
from clustersim.reports import sweep_fingerprint
from clustersim.reports.backends import local_runner
from clustersim.reports.sweep import Grid, read_table, run_sweep
from clustersim.reports.sweep_fingerprint import sidecar

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama3-70b-h100.yaml"  # the scenario: 70B on 512 H100s
GRID = ["--grid", "parallel.tp=4,8", "--fidelity", "analytic", "--jobs", "1"]
BASE = {"model": {"preset": "llama2-7b", "seq_len": 2048},
        "cluster": {"preset": "dgx-a100-80gb", "gpus": 16},
        "training": {"global_batch": 64}, "parallel": {"tp": 2, "pp": 2, "zero": 1}}


def sweep(capsys, scenario: Path, out: Path, *extra: str) -> tuple[int, str]:
    """Run ``clustersim sweep`` in-process: (exit status, stderr)."""
    code = main(["sweep", str(scenario), *GRID, "--out", str(out), *extra])
    return code, capsys.readouterr().err


def saved(out: Path) -> tuple[bytes, bytes]:
    return out.read_bytes(), sidecar(out).read_bytes()


def assert_refused(code: int, err: str, *named: str) -> None:
    assert code == 2 and err.startswith("error: --out:") and err.count("\n") == 1, err
    for word in ("--fresh", *named):
        assert word in err, (word, err)


def no_temporaries(folder: Path) -> bool:
    return not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("change, named", [
    (["--set", "training.precision=fp8"], ["training.precision", "--set"]),
    (["--set", "cluster.nodes=32"], ["cluster.gpus: 512 -> 256"]),
    (["--grid", "parallel.pp=2,4"], ["--grid"]),
    (["--samples", "3"], ["--samples"]),
])
def test_a_changed_input_is_refused_and_fresh_gives_the_fresh_table(capsys, tmp_path, change,
                                                                     named):
    out = tmp_path / "s.csv"
    assert sweep(capsys, EXAMPLE, out)[0] == 0
    before = saved(out)
    fresh = tmp_path / "fresh.csv"
    assert sweep(capsys, EXAMPLE, fresh, *change)[0] == 0
    assert not read_table(fresh).equals(read_table(out)), "the change changes nothing"

    assert_refused(*sweep(capsys, EXAMPLE, out, *change), *named)
    assert saved(out) == before and no_temporaries(tmp_path)

    assert sweep(capsys, EXAMPLE, out, *change, "--fresh")[0] == 0
    pd.testing.assert_frame_equal(read_table(out), read_table(fresh))
    assert sidecar(out).read_bytes() == sidecar(fresh).read_bytes()


def test_an_edited_scenario_file_is_refused(capsys, tmp_path):
    scenario = tmp_path / "base.yaml"
    shutil.copy(EXAMPLE, scenario)
    out = tmp_path / "s.csv"
    assert sweep(capsys, scenario, out)[0] == 0
    scenario.write_text(EXAMPLE.read_text().replace("nodes: 64", "nodes: 32"))
    assert_refused(*sweep(capsys, scenario, out), "scenario changed", "cluster.gpus")


def test_changed_profile_contents_are_refused(capsys, tmp_path):
    """Same file name, other contents: the fingerprint holds what the profile says."""
    profile = tmp_path / "h100.json"
    shipped = json.loads((ROOT / "topologies" / "profiles" / "h100-sxm.json").read_text())
    profile.write_text(json.dumps(shipped))
    out = tmp_path / "s.csv"
    assert sweep(capsys, EXAMPLE, out, "--profile", str(profile))[0] == 0
    profile.write_text(json.dumps({**shipped, "memory_efficiency": 0.5}))
    assert_refused(*sweep(capsys, EXAMPLE, out, "--profile", str(profile)), "--profile")
    assert_refused(*sweep(capsys, EXAMPLE, out), "--profile", "the shipped profile")


@pytest.mark.parametrize("attribute, value, named", [
    ("__version__", "99.0", "clustersim version changed"),
    (None, "0" * 64, "clustersim's code or data changed"),
])
def test_another_clustersim_is_refused(tmp_path, monkeypatch, attribute, value, named):
    grid = Grid.parse(["parallel.tp=1,2"])
    out = tmp_path / "s.csv"
    run_sweep(BASE, grid, local_runner(1), out, fidelity="analytic")
    if attribute:
        monkeypatch.setattr(sweep_fingerprint.version, attribute, value)
    else:
        monkeypatch.setattr(sweep_fingerprint, "code_digest", lambda: value)
    with pytest.raises(ScenarioError, match=named):
        run_sweep(BASE, grid, local_runner(1), out, fidelity="analytic")


def test_the_same_sweep_resumes_without_simulating_again(tmp_path):
    grid = Grid.parse(["parallel.tp=1,2,4"])
    out = tmp_path / "s.csv"
    first = run_sweep(BASE, grid, local_runner(1), out, fidelity="analytic")
    asked: list[dict] = []

    def runner(jobs):
        asked.extend(jobs)
        return iter(())
    again = run_sweep(BASE, grid, runner, out, fidelity="analytic")
    assert asked == []
    assert list(again["point"]) == list(first["point"])
    assert list(again["step_time_s"]) == list(first["step_time_s"])


def test_a_table_without_its_fingerprint_is_refused(capsys, tmp_path):
    out = tmp_path / "s.csv"
    assert sweep(capsys, EXAMPLE, out)[0] == 0
    sidecar(out).unlink()  # a table from an older clustersim, or copied alone
    before = out.read_bytes()
    assert_refused(*sweep(capsys, EXAMPLE, out), "s.csv.fingerprint.json")
    assert out.read_bytes() == before and not sidecar(out).exists()


def test_fresh_needs_out(capsys, tmp_path):
    code = main(["sweep", str(EXAMPLE), *GRID, "--fresh"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --fresh:") and err.count("\n") == 1


def test_a_fresh_sweep_stopped_before_its_first_row_leaves_nothing(tmp_path):
    """--fresh drops the old table before the new fingerprint is written, so no table is ever
    paired with another sweep's fingerprint; stopped before a row, neither file is left."""
    grid = Grid.parse(["parallel.tp=1,2"])
    out = tmp_path / "s.csv"
    run_sweep(BASE, grid, local_runner(1), out, fidelity="analytic")

    def interrupted(jobs):
        assert sidecar(out).exists() and not out.exists()
        raise KeyboardInterrupt
        yield  # a generator, like the real runners

    with pytest.raises(KeyboardInterrupt):
        run_sweep(BASE, grid, interrupted, out, fidelity="full", fresh=True)
    assert not out.exists() and not sidecar(out).exists() and no_temporaries(tmp_path)


def test_the_table_stays_plain_csv(capsys, tmp_path):
    """The fingerprint lives beside the table: pandas reads the CSV with no options."""
    out = tmp_path / "s.csv"
    assert sweep(capsys, EXAMPLE, out)[0] == 0
    table = pd.read_csv(out)
    assert list(table["tp"]) == [4, 8] and table.columns[0] == "point"
    assert json.loads(sidecar(out).read_text())["grid"] == ["parallel.tp=4,8"]
