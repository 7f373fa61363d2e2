"""Every output path is checked before the work: one ``error:`` line naming the option, exit
status 2, nothing simulated and nothing written."""

from __future__ import annotations

import pytest

from clustersim.cli import main

SCENARIO = "examples/gpt-18b-a100.yaml"


def _one_error_line(capsys, argv, field):
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {field}"), captured
    assert captured.out == ""  # refused before simulating: no result printed


def test_simulate_trace_into_an_existing_folder_is_refused_before_simulating(capsys, tmp_path):
    _one_error_line(capsys, ["simulate", SCENARIO, "--trace", str(tmp_path)], "--trace")


def test_sweep_out_that_is_a_folder_is_refused_before_simulating(capsys, tmp_path):
    (tmp_path / "taken.csv").mkdir()
    _one_error_line(capsys, ["sweep", SCENARIO, "--grid", "training.micro_batch=1,2",
                             "--out", str(tmp_path / "taken.csv")], "--out")


@pytest.mark.parametrize("command", [
    ["sweep", SCENARIO, "--grid", "training.micro_batch=1,2"],
    ["plan", "--model", "llama2-7b", "--cluster", "dgx-a100-80gb", "--gpus", "16"]])
def test_plots_onto_a_file_is_refused_before_the_work(capsys, tmp_path, command):
    target = tmp_path / "plots"
    target.write_text("a file, not a folder")
    _one_error_line(capsys, [*command, "--plots", str(target)], "--plots")


def test_report_out_onto_a_file_is_refused(capsys, tmp_path):
    table = tmp_path / "sweep.csv"
    assert main(["sweep", SCENARIO, "--grid", "training.micro_batch=1,2", "--fidelity",
                 "analytic", "--out", str(table)]) == 0
    capsys.readouterr()
    target = tmp_path / "report"
    target.write_text("")
    _one_error_line(capsys, ["report", str(table), "--out", str(target)], "--out")
    assert target.read_text() == ""
