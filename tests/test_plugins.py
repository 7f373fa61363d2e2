"""An installed plugin's schedule and collective are seen by the plain ``clustersim`` command
(``clustersim/plugins.py``; docs/extending.md, "Registered from outside: where it is seen").

The plugin is a real distribution on the path of a fresh interpreter: a module and a
``.dist-info`` folder whose ``entry_points.txt`` names it under ``clustersim.plugins``, as
``pip install`` of a package declaring ``[project.entry-points."clustersim.plugins"]`` leaves
it. Nothing of clustersim's is edited or imported by the test for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

PLUGIN = '''
from clustersim.simulator.pipeline.schedules import (
    Action, Kind, PipelineSchedule, register_schedule)
from clustersim.topologies.collective_registry import Ring, register_collective, ring_collective


def last_in_first_out(pp, m, v=1):
    return {r: [Action(r, Kind.FORWARD, i) for i in range(m)]
            + [Action(r, Kind.BACKWARD, i) for i in reversed(range(m))] for r in range(pp)}


register_schedule(PipelineSchedule("plugin-lifo", last_in_first_out,
                                   held=lambda pp, m, v, stage: [m] * v))
register_collective(ring_collective(
    "plugin-broadcast", Ring(lambda n: 1.0, lambda n, nodes: n, lambda n, nodes: nodes),
    bus_factor=lambda n: 1.0))
'''
SCENARIO = {"model": {"preset": "llama3-8b"}, "cluster": {"preset": "dgx-h100", "gpus": 32},
            "training": {"global_batch": 32}, "parallel": {"tp": 8, "pp": 4}}


def install(site: Path, module: str, source: str) -> None:
    """``module`` as pip leaves an installed distribution: the module and its metadata."""
    site.mkdir(exist_ok=True)
    (site / f"{module}.py").write_text(source)
    info = site / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[clustersim.plugins]\n{module} = {module}\n")


def python(site: Path | None, *argv: str) -> subprocess.CompletedProcess:
    """A fresh interpreter with ``site`` (the plugin's install folder) first on its path."""
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env,
                          timeout=300)


def clustersim(site: Path | None, *argv: str) -> subprocess.CompletedProcess:
    return python(site, "-m", "clustersim", *argv)


@pytest.fixture
def scenario_file(tmp_path) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    return path


def test_the_command_runs_an_installed_plugins_schedule(tmp_path, scenario_file):
    """Its step is GPipe's: the same forwards and backwards, only the backwards' order
    differs, and on these equal stages the bubble does not depend on it."""
    install(tmp_path / "site", "toy_plugin", PLUGIN)
    ran = clustersim(tmp_path / "site", "simulate", str(scenario_file),
                     "--set", "parallel.schedule=plugin-lifo", "--json")
    assert ran.returncode == 0, ran.stderr
    gpipe = clustersim(None, "simulate", str(scenario_file), "--set", "parallel.schedule=gpipe",
                       "--json")
    assert json.loads(ran.stdout)["step_time_s"] == pytest.approx(
        json.loads(gpipe.stdout)["step_time_s"], rel=1e-3)


def test_the_python_api_sees_an_installed_plugins_schedule(tmp_path, scenario_file):
    install(tmp_path / "site", "toy_plugin", PLUGIN)
    code = ("import clustersim\n"
            f"print(clustersim.simulate({str(scenario_file)!r}, parallel__schedule='plugin-lifo')"
            ".result.step_time_s)")
    ran = python(tmp_path / "site", "-c", code)
    assert ran.returncode == 0, ran.stderr
    gpipe = clustersim(None, "simulate", str(scenario_file), "--set", "parallel.schedule=gpipe",
                       "--json")
    assert float(ran.stdout) == pytest.approx(json.loads(gpipe.stdout)["step_time_s"], rel=1e-3)


def test_the_command_times_an_installed_plugins_collective(tmp_path):
    install(tmp_path / "site", "toy_plugin", PLUGIN)
    ran = clustersim(tmp_path / "site", "collective", "plugin-broadcast", "--cluster",
                     "dgx-h100", "--gpus", "8", "--min-bytes", "1G", "--max-bytes", "1G",
                     "--json")
    assert ran.returncode == 0, ran.stderr
    row = json.loads(ran.stdout)["rows"][0]
    assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"])


def test_without_the_plugin_the_name_is_bad_input(scenario_file):
    ran = clustersim(None, "simulate", str(scenario_file),
                     "--set", "parallel.schedule=plugin-lifo")
    assert ran.returncode == 2
    assert ran.stderr.startswith("error: parallel.schedule") and "plugin-lifo" in ran.stderr


def test_a_plugin_that_fails_to_load_is_one_error_line_naming_it(tmp_path, scenario_file):
    install(tmp_path / "site", "broken_plugin", "raise ImportError('no module named foo')\n")
    ran = clustersim(tmp_path / "site", "simulate", str(scenario_file))
    assert ran.returncode == 2
    assert ran.stderr.strip().splitlines() == [
        "error: plugins: broken_plugin (broken_plugin) failed to load: ImportError: no "
        "module named foo"]


@pytest.mark.slow
def test_a_real_runs_spawned_ranks_run_an_installed_plugins_schedule(tmp_path):
    """``clustersim validate`` trains the toy's lists for real on two gloo ranks: each rank, a
    spawned process, loads the plugin before it builds its actions (``validation/launch.py``);
    without that it fails 'Unknown schedule name'."""
    pytest.importorskip("torch")
    install(tmp_path / "site", "toy_plugin", PLUGIN)
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump({
        "model": {"layers": 4, "hidden": 128, "heads": 4, "vocab": 256, "seq_len": 64},
        "cluster": {"preset": "localhost-gloo", "gpus": 2},
        "training": {"global_batch": 4, "micro_batch": 1},
        "parallel": {"pp": 2, "schedule": "plugin-lifo"}}))
    ran = clustersim(tmp_path / "site", "validate", str(path), "--steps", "2", "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["scenario"]["parallel"]["schedule"] == "plugin-lifo"


@pytest.mark.slow
def test_a_ray_sweeps_workers_run_an_installed_plugins_schedule(tmp_path, scenario_file):
    """Ray starts its workers bare: each loads the plugin before its first point
    (``reports/sweep.py:simulate_point``); the toy's step is GPipe's, as above."""
    pytest.importorskip("ray")
    pd = pytest.importorskip("pandas")
    install(tmp_path / "site", "toy_plugin", PLUGIN)
    out = tmp_path / "sweep.csv"
    ran = clustersim(tmp_path / "site", "sweep", str(scenario_file), "--grid",
                     "parallel.schedule=plugin-lifo,gpipe", "--backend", "ray", "--jobs", "2",
                     "--out", str(out))
    assert ran.returncode == 0, ran.stderr
    rows = pd.read_csv(out).set_index("parallel.schedule")
    assert list(rows["status"]) == ["ok", "ok"]
    assert rows.loc["plugin-lifo", "step_time_s"] == pytest.approx(
        rows.loc["gpipe", "step_time_s"], rel=1e-3)
