"""Every command, fuzzed (issue 24, item 9): argument lists for ``simulate``, ``plan``,
``sweep``, ``report``, ``collective`` and ``validate --dry-run``, drawn by hypothesis from the
shipped examples and presets and their mutations, each end with exit status 0, 1 or 2, never a
traceback, an ``error:`` line for status 2, strict JSON for ``--json``, and nothing written
outside the paths given. The quick mode here draws a few dozen cases from a fixed seed; the
long mode is ``python benchmarks/fuzz.py --cases 10000`` (docs/fuzzing.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUICK_CASES = 60  # about 30 s on a shared 2-core machine (a case averages well under 1 s)


def _fuzz_module():
    """benchmarks/fuzz.py, which is a script rather than an installed module."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("fuzz", ROOT / "benchmarks" / "fuzz.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz"] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


fuzz = _fuzz_module()


@pytest.fixture
def runner(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    return fuzz.Runner(tmp_path)


def test_quick_fuzz_gives_no_traceback_and_writes_only_where_told(monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    outcomes = fuzz.run_cases(QUICK_CASES, seed=2024, progress_every=10**9)
    assert len(outcomes) == QUICK_CASES
    failed = [o for o in outcomes if o.problems]
    assert not failed, fuzz.summary(failed, 0)
    # the draw reaches past argument parsing: some cases succeed and some are refused
    statuses = {o.status for o in outcomes}
    assert {0, 2} <= statuses, statuses


# The oracles of the property: each check fails on the outcome it is there to catch.

def test_an_escaped_exception_is_a_failure(runner, monkeypatch):
    import clustersim.reports.cli as cli

    def boom(argv):
        raise KeyError("x")
    monkeypatch.setattr(cli, "main", boom)
    outcome = runner.run(["simulate", "good.yaml"])
    assert outcome.status is None and "KeyError" in outcome.problems[0]


def test_status_2_without_an_error_line_is_a_failure():
    assert fuzz.check_outputs(["simulate"], 2, "", "something went wrong\n")
    assert not fuzz.check_outputs(["simulate"], 2, "", "note: x\nerror: parallel.tp: bad\n")
    assert fuzz.check_outputs(["simulate"], 3, "", "")


def test_json_with_infinity_is_a_failure():
    assert fuzz.check_outputs(["simulate", "--json"], 0, '{"step": Infinity}', "")
    assert not fuzz.check_outputs(["simulate", "--json"], 0, '{"step": 1.5}', "")


def test_a_file_written_beside_the_output_is_a_failure(runner, monkeypatch):
    import clustersim.reports.cli as cli

    def writes_stray(argv):
        Path("stray.txt").write_text("x")
        Path("out.csv").write_text("x")
        return 0
    monkeypatch.setattr(cli, "main", writes_stray)
    outcome = runner.run(["sweep", "good.yaml", "--out", "out.csv"])
    assert len(outcome.problems) == 1 and "stray.txt" in outcome.problems[0]
    assert "out.csv'" not in outcome.problems[0]


def test_an_input_changed_is_a_failure(runner, monkeypatch):
    import clustersim.reports.cli as cli

    def rewrites_input(argv):
        Path("table.csv").write_text("overwritten")
        return 0
    monkeypatch.setattr(cli, "main", rewrites_input)
    outcome = runner.run(["report", "table.csv", "--out", "rep"])
    assert "table.csv" in outcome.problems[0]


def test_validate_dry_run_trains_nothing_and_names_the_run(capsys, monkeypatch, tmp_path):
    """``validate --dry-run`` checks its inputs and predicts, but never starts ranks nor
    writes its --out folder."""
    from clustersim.reports.cli import main
    from clustersim.validation import launch

    def no_ranks(*args, **kwargs):
        raise AssertionError("a dry run started real ranks")
    monkeypatch.setattr(launch, "run_ranks", no_ranks)
    code = main(["validate", str(ROOT / "examples" / "validate-gpt-60m.yaml"),
                 "--dry-run", "--nproc", "2", "--json", "--out", str(tmp_path / "v")])
    assert not (tmp_path / "v").exists()
    out = capsys.readouterr().out
    assert code == 0
    run = fuzz.json.loads(out)
    assert run["dry_run"] is True and run["nproc"] == 2 and run["backend"] == "gloo"
    assert run["predicted"]["step_time_s"] > 0


def test_sweep_plots_with_no_point_run_say_so(capsys, tmp_path):
    """Found by the fuzz: every point refused (``--samples`` on a cluster of pools), then
    ``--plots`` raised KeyError 'memory.fits' from a table with no result columns."""
    from clustersim.reports.cli import main

    code = main(["sweep", str(ROOT / "examples" / "mixed-h100-a100.yaml"), "--grid",
                 "parallel.tp=4,8", "--jobs", "1", "--samples", "2",
                 "--plots", str(tmp_path / "plots")])
    err = capsys.readouterr().err
    assert code == 0 and "no plots: no point of the sweep ran" in err
    assert not list(tmp_path.rglob("*.png"))


def test_report_of_a_table_where_no_point_ran(capsys, tmp_path):
    """Found by the fuzz: ``report`` on a table whose points all failed raised KeyError
    'step_time_s'; it writes the page listing them, and refuses rows that ran but lost
    their result columns."""
    from clustersim.reports.cli import main

    tables = fuzz.fuzz_cases.table_fixtures(tmp_path / "made")
    (tmp_path / "failed.csv").write_text(tables["failed.csv"])
    (tmp_path / "noresult.csv").write_text(tables["noresult.csv"])
    assert main(["report", str(tmp_path / "failed.csv")]) == 0
    page = (tmp_path / "failed-report" / "report.html").read_text()
    assert "0 simulated" in page and "ScenarioError: x: refused" in page
    capsys.readouterr()
    assert main(["report", str(tmp_path / "noresult.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: RESULTS: ") and "step_time_s" in err


def test_plan_json_with_plots_prints_only_json(capsys, tmp_path):
    """Found by the fuzz: ``plan --json --plots DIR`` printed 'wrote ...' lines after the
    JSON on stdout; they go to stderr, so stdout is one JSON value."""
    from clustersim.reports.cli import main

    code = main(["plan", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--gpus", "8",
                 "--fix", "parallel.tp=2", "--fix", "parallel.pp=2", "--fix", "parallel.zero=0",
                 "--fix", "parallel.schedule=1f1b", "--fix", "training.micro_batch=2",
                 "--plots", str(tmp_path / "plots"), "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and fuzz.strict_json_problem(out) is None
    assert "wrote" in err and list((tmp_path / "plots").glob("*.png"))


def test_sweep_error_bars_where_the_bar_lies_outside_the_interval(capsys, tmp_path):
    """Found by the fuzz: ``sweep --samples 2 --plots`` at analytic fidelity raised
    "'xerr' must not contain negative values" when a bar's end (the breakdown's sum) lay
    outside the sampled 90% interval; the interval is drawn about its own middle."""
    from clustersim.reports.cli import main

    code = main(["sweep", str(ROOT / "examples" / "llama3.1-405b-128k-gb200.yaml"),
                 "--grid", "parallel.recompute=selective,full", "--grid",
                 "training.global_batch=512,8,64", "--jobs", "1", "--fidelity", "analytic",
                 "--samples", "2", "--plots", str(tmp_path / "plots")])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "plots" / "breakdown.png").is_file()


def test_a_parquet_sweep_whose_grid_mixes_text_and_numbers(capsys, tmp_path):
    """Found by the fuzz: a grid axis given text and numbers (the text point refused) made
    pyarrow raise ArrowTypeError writing ``--out s.parquet``; the column is written as text,
    and the table reads back with every point."""
    pytest.importorskip("pyarrow")
    from clustersim.reports.cli import main
    from clustersim.reports.sweep import read_table

    out = tmp_path / "s.parquet"
    code = main(["sweep", str(ROOT / "examples" / "stragglers-llama3-70b.yaml"), "--grid",
                 "parallel.zero=abc,0.55,3", "--jobs", "1", "--fidelity", "analytic",
                 "--out", str(out)])
    capsys.readouterr()
    assert code == 0
    table = read_table(out)
    assert sorted(table["parallel.zero"].astype(str)) == ["0.55", "3", "abc"]
    assert (table["status"] == "ok").sum() == 1
