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
    import clustersim.cli as cli

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
    import clustersim.cli as cli

    def writes_stray(argv):
        Path("stray.txt").write_text("x")
        Path("out.csv").write_text("x")
        return 0
    monkeypatch.setattr(cli, "main", writes_stray)
    outcome = runner.run(["sweep", "good.yaml", "--out", "out.csv"])
    assert len(outcome.problems) == 1 and "stray.txt" in outcome.problems[0]
    assert "out.csv'" not in outcome.problems[0]


def test_an_input_changed_is_a_failure(runner, monkeypatch):
    import clustersim.cli as cli

    def rewrites_input(argv):
        Path("table.csv").write_text("overwritten")
        return 0
    monkeypatch.setattr(cli, "main", rewrites_input)
    outcome = runner.run(["report", "table.csv", "--out", "rep"])
    assert "table.csv" in outcome.problems[0]


def test_validate_dry_run_trains_nothing_and_names_the_run(capsys, monkeypatch, tmp_path):
    """``validate --dry-run`` checks its inputs and predicts, but never starts ranks nor
    writes its --out folder."""
    from clustersim.cli import main
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
    from clustersim.cli import main

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
    from clustersim.cli import main

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
    from clustersim.cli import main

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
    from clustersim.cli import main

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
    from clustersim.cli import main
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


def test_an_output_option_naming_the_working_folder_may_add_files_there(runner, monkeypatch):
    """A false alarm of the ``--seed 2`` run: ``report table.csv --out .`` writes its page
    into ``.``, the folder it was given. New files there are allowed; an input it changes
    still is a failure, and so is a new file when no option names the folder."""
    import clustersim.cli as cli

    def writes_page(argv):
        Path("report.html").write_text("x")
        Path("plots").mkdir()
        Path("plots", "pareto.png").write_text("x")
        return 0
    monkeypatch.setattr(cli, "main", writes_page)
    for out in (".", "./", "sub/.."):
        assert runner.run(["report", "table.csv", "--out", out]).problems == [], out
    assert "report.html" in runner.run(["report", "table.csv", "--out", "rep"]).problems[0]

    def rewrites_input(argv):
        Path("table.csv").write_text("overwritten")
        return 0
    monkeypatch.setattr(cli, "main", rewrites_input)
    outcome = runner.run(["report", "table.csv", "--out", "."])
    assert len(outcome.problems) == 1 and "table.csv" in outcome.problems[0]


def test_an_empty_output_path_names_no_folder():
    assert fuzz.outside_writes(["report", "t.csv", "--out", ""], ["new.html"]) == ["new.html"]
    assert fuzz.outside_writes(["report", "t.csv", "--out", "."], ["new.html"]) == []


def _mixtral(experts: int):
    """Mixtral 8x7B (ep 8) with ``experts`` routed experts, ``experts / 8`` on each rank, and
    its cost model; TP collectives not overlapped, so no GEMM is cut into pieces."""
    from clustersim.simulator.closed_form import analytic
    from clustersim.simulator.inputs.scenario import load_scenario

    s = load_scenario(ROOT / "examples" / "mixtral-8x7b-h100.yaml",
                      [f"model.experts={experts}", "parallel.tp_comm_overlap=false"])
    return analytic.CostModel(s)


def test_a_layer_costs_what_its_expert_launches_cost_one_by_one():
    """Costing each GEMM shape once and counting its launches gives the layer's time as the
    sum over every launch (8 local experts: 2 attention projections and 3 x 8 expert
    matrices), forward and backward."""
    from clustersim.simulator.costs import compute
    from clustersim.simulator.model import workload as wl

    cm = _mixtral(64)
    k = wl.layer_kernels(cm.s)
    assert len(k.gemms) == 2 + 3 * 8
    forward, backward = compute.layer_pass_times(cm)
    assert forward.gemms == pytest.approx(
        sum(compute.weight_gemm_time(cm, g, k.tokens) for g in k.gemms), rel=1e-12)
    assert backward.gemms == pytest.approx(
        sum(compute.weight_gemm_time(cm, g.dgrad(), k.tokens)
            + compute.weight_gemm_time(cm, g.wgrad(), k.tokens) for g in k.gemms), rel=1e-12)


def test_costing_a_layer_does_not_grow_with_the_expert_count(monkeypatch):
    """Found by the fuzz: ``--set model.experts=1000000`` ran past its 60 s limit, costing
    each of the million experts' identical GEMMs one by one (1.3 ms an expert). A layer of
    8 local experts and one of 8,192 are costed with as many GEMM evaluations."""
    from clustersim.simulator.costs import compute

    calls = []
    real = compute.gemm_time
    monkeypatch.setattr(compute, "gemm_time", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    counts = []
    for experts in (64, 64 * 1024):
        calls.clear()
        cm = _mixtral(experts)
        compute.layer_pass_times(cm)
        compute.weight_gradient_times(cm)
        compute.column_backward_times(cm)
        counts.append(len(calls))
    assert counts[0] == counts[1] > 0


def test_a_million_experts_simulate_within_the_fuzz_limit(runner):
    """The fuzz's own case (a million experts, as in He 2024, "Mixture of A Million
    Experts", arXiv:2407.04202) runs to an answer instead of its 60 s limit."""
    outcome = runner.run(["simulate", str(ROOT / "examples" / "llama3-70b-h100.yaml"),
                          "--set", "model.experts=1000000", "--fidelity", "representative",
                          "--trace", "sub/trace.json"])
    assert outcome.problems == [] and outcome.status == 0, outcome


def test_layers_beyond_the_deepest_transformer_are_one_error_line(capsys):
    """Found probing every field at the fuzz's 10**6: a million layers ran for over 20
    minutes (the simulator steps through every layer). Layers are bounded at 10x DeepNet's
    1,000 (Wang et al. 2022, arXiv 2203.00555), the deepest transformer trained; DeepNet's own
    depth still simulates."""
    from clustersim.cli import main
    from clustersim.errors import ScenarioError
    from clustersim.simulator.inputs.scenario import load_scenario

    mixtral = str(ROOT / "examples" / "mixtral-8x7b-h100.yaml")
    with pytest.raises(ScenarioError) as info:  # refused before anything runs
        load_scenario(mixtral, ["model.layers=1000000"])
    assert info.value.field == "model.layers"
    assert main(["simulate", mixtral, "--set", "model.layers=1000000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: model.layers: must be at most 10,000")
    assert main(["simulate", mixtral, "--set", "model.layers=1000", "--fidelity",
                 "analytic", "--json"]) == 0
    assert fuzz.json.loads(capsys.readouterr().out)["step_time_s"] > 0


def test_the_case_limit_counts_cpu_time_not_waiting(runner, monkeypatch):
    """A case that computes past the limit is a hang; one that only waits as long (a loaded
    machine) is not: the first --seed 3 run failed 7 cases of under 10 s CPU at 60 s wall."""
    import time

    import clustersim.cli as cli

    monkeypatch.setattr(fuzz, "CASE_LIMIT_S", 1)

    def spins(argv):
        while True:
            pass
    monkeypatch.setattr(cli, "main", spins)
    outcome = runner.run(["simulate", "good.yaml"])
    assert "ran past 1 s of CPU time" in outcome.problems[0]

    def waits(argv):
        time.sleep(1.5)
        return 0
    monkeypatch.setattr(cli, "main", waits)
    outcome = runner.run(["simulate", "good.yaml"])
    assert outcome.problems == [] and outcome.seconds > 1.5
