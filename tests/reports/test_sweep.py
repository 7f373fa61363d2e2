"""Sweeps: every combination becomes a row, invalid ones with their reason; the table survives
being killed, resumes to the same result, and does not depend on where the points ran."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from clustersim.cli import main
from clustersim.reports.backends import local_runner, ray_runner
from clustersim.reports.sweep import Grid, read_table, run_sweep
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import build_scenario

BASE = {
    "model": {"preset": "llama2-7b", "seq_len": 2048},
    "cluster": {"preset": "dgx-a100-80gb", "gpus": 16},
    "training": {"global_batch": 64},
    "parallel": {"tp": 2, "pp": 2, "zero": 1},
}


def write_base(tmp_path: Path, raw: dict = BASE) -> Path:
    path = tmp_path / "base.yaml"
    path.write_text(json.dumps(raw))  # JSON is YAML
    return path


def test_grid_is_the_product_of_its_axes_in_order():
    grid = Grid.parse(["parallel.tp=1,2", "parallel.pp=1,2,4", "parallel.sequence_parallel=true"])
    assert grid.points() == [
        [f"parallel.tp={tp}", f"parallel.pp={pp}", "parallel.sequence_parallel=true"]
        for tp in (1, 2) for pp in (1, 2, 4)]


def test_every_point_is_a_row_and_invalid_ones_say_why():
    grid = Grid.parse(["parallel.tp=1,3,8", "parallel.pp=1,2"])
    df = run_sweep(BASE, grid, local_runner(1))
    assert len(df) == 6
    invalid = df[df["status"] == "invalid"]
    assert set(invalid["parallel.tp"]) == {3}  # 3 divides neither 32 heads nor 16 GPUs
    assert all("parallel.tp" in e for e in invalid["error"])
    ok = df[df["status"] == "ok"]
    assert (ok["tp"] * ok["pp"] * ok["dp"] == 16).all()  # dp re-derived for each split


def test_rows_carry_every_field_of_the_json_result_and_match_simulate():
    df = run_sweep(BASE, Grid.parse(["training.micro_batch=1,2"]), local_runner(1))
    row = df.iloc[1]
    result = simulate(build_scenario(json.loads(row["scenario"]))).to_json()
    for key in ("step_time_s", "tokens_per_s", "mfu", "model_tflops_per_gpu",
                "hardware_tflops_per_gpu", "time_to_train_s", "fidelity"):
        assert row[key] == result[key] or (row[key] is None and result[key] is None), key
    for cause, seconds in result["breakdown_s"].items():
        assert row[f"breakdown_s.{cause}"] == seconds
    assert row["memory.peak_bytes"] == result["memory"]["peak_bytes"]
    assert json.loads(row["memory.per_stage"]) == result["memory"]["per_stage"]


def test_local_processes_give_the_same_table_as_one_process():
    grid = Grid.parse(["parallel.tp=1,2,4", "parallel.pp=1,2"])
    one = run_sweep(BASE, grid, local_runner(1))
    two = run_sweep(BASE, grid, local_runner(2))
    pd.testing.assert_frame_equal(one, two)


def test_ray_backend_gives_the_same_table_as_local(tmp_path):
    pytest.importorskip("ray")
    grid = Grid.parse(["parallel.tp=1,2,4", "parallel.pp=1,2"])
    local = run_sweep(BASE, grid, local_runner(1), tmp_path / "local.csv")
    ray = run_sweep(BASE, grid, ray_runner(None, 2), tmp_path / "ray.csv")
    pd.testing.assert_frame_equal(local, ray)
    pd.testing.assert_frame_equal(read_table(tmp_path / "local.csv"),
                                  read_table(tmp_path / "ray.csv"))
    assert len(ray) == 6


def test_parquet_round_trips(tmp_path):
    pytest.importorskip("pyarrow")
    grid = Grid.parse(["parallel.tp=2,4"])
    df = run_sweep(BASE, grid, local_runner(1), tmp_path / "t.parquet")
    back = read_table(tmp_path / "t.parquet")
    assert list(back["step_time_s"]) == list(df["step_time_s"])


def test_a_killed_sweep_resumes_to_the_same_table(tmp_path):
    """SIGKILL mid-sweep leaves a whole table of finished points; rerunning the same command
    completes it, equal to an uninterrupted run."""
    # The table is written at most once a second (sweep.WRITE_EVERY_S), so the points must take
    # several seconds in all: 16 of 32-128 micro-batches each, 0.2-0.4 s a point at full fidelity
    # on a 2026 CI core (the first version, at 2 micro-batches, ran all 8 points inside a second).
    base = write_base(tmp_path, {**BASE, "cluster": {"preset": "dgx-a100-80gb", "gpus": 256},
                                 "training": {"global_batch": 4096}})
    grid = ["--grid", "parallel.tp=1,2,4,8", "--grid", "parallel.pp=2,4",
            "--grid", "training.micro_batch=1,2"]
    command = [sys.executable, "-m", "clustersim", "sweep", str(base), *grid, "--jobs", "1",
               "--fidelity", "full"]
    killed = tmp_path / "killed.csv"
    proc = subprocess.Popen([*command, "--out", str(killed)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not killed.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = read_table(killed)
    assert 0 < len(partial) < 16, "the sweep finished before it could be killed"
    subprocess.run([*command, "--out", str(killed)], check=True, capture_output=True)
    whole = tmp_path / "whole.csv"
    subprocess.run([*command, "--out", str(whole)], check=True, capture_output=True)
    pd.testing.assert_frame_equal(read_table(killed), read_table(whole))


def test_cli_sweep_writes_the_table_and_plots(capsys, tmp_path):
    base = write_base(tmp_path)
    out, plots = tmp_path / "s.csv", tmp_path / "plots"
    code = main(["sweep", str(base), "--grid", "parallel.tp=1,2,4", "--grid",
                 "cluster.gpus=8,16", "--out", str(out), "--plots", str(plots), "--jobs", "1"])
    printed = capsys.readouterr().out
    assert code == 0
    assert len(read_table(out)) == 6 and "Fastest of" in printed
    for name in ("breakdown", "pareto", "scaling", "memory", "timeline"):
        assert (plots / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (plots / f"{name}.svg").read_text().lstrip().startswith("<?xml")
        assert len(pd.read_csv(plots / f"{name}.csv")) > 0
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


@pytest.mark.parametrize("argv, field", [
    (["--grid", "parallel.tp"], "--grid"),
    (["--grid", "parallel.tp=1,2", "--grid", "parallel.tp=4"], "--grid"),
    (["--grid", "parallel.tp=1,2", "--out", "table.xlsx"], "--out"),
    (["--grid", "parallel.tp=1,2", "--jobs", "0"], "--jobs"),
    (["--grid", "parallel.tp=1,2", "--address", "ray://x:1"], "--address"),
    (["--grid", "parallel.tp=1,2", "--set", "parallel.zero=7"], "parallel.zero"),
])
def test_bad_sweep_arguments_are_one_error_line(capsys, tmp_path, argv, field):
    base = write_base(tmp_path)
    code = main(["sweep", str(base), *argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("error:") and field in err and err.count("\n") == 1


def test_report_writes_plots_and_one_html_page(capsys, tmp_path):
    grid = Grid.parse(["parallel.tp=1,2,3,4"])
    run_sweep(BASE, grid, local_runner(1), tmp_path / "s.csv")
    code = main(["report", str(tmp_path / "s.csv"), "--out", str(tmp_path / "r")])
    assert code == 0
    page = (tmp_path / "r" / "report.html").read_text()
    assert page.count("<img ") == len(list((tmp_path / "r").glob("*.png"))) >= 4
    assert page.count("</tr>") == 2 + 3 + 1  # two headers, 3 simulated rows, 1 skipped
    assert "parallel.tp=3" in page and "llama2-7b on 16 × a100-80gb" in page


@pytest.mark.parametrize("content", [None, "a,b\n1,2\n"])
def test_report_refuses_what_is_not_a_sweep_table(capsys, tmp_path, content):
    path = tmp_path / "t.csv"
    if content is not None:
        path.write_text(content)
    code = main(["report", str(path)])
    _, err = capsys.readouterr()
    assert code == 2 and err.startswith("error: RESULTS:") and err.count("\n") == 1
