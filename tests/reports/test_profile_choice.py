"""``--profile NAME|FILE`` in every command that takes one, and a profile measured on another
device than the cluster's GPU refused unless ``--force-profile`` (issue 24, item 4).

The oracle for "which device": the profile file's own ``gpu`` field and the catalogue GPU of
the scenario's cluster preset (``topologies/clusters.yaml``), both read here independently.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from cli_helpers import run

import clustersim
from clustersim.errors import ScenarioError
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import load_scenario
from clustersim.topologies.hardware import cluster_presets
from clustersim.topologies.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "topologies" / "profiles"
GOOD = """\
model: {preset: gpt-1.7b}
cluster: {preset: dgx-h100, gpus: 16}
training: {global_batch: 64, micro_batch: 1}
parallel: {tp: 2, pp: 1, dp: 8}
"""


@pytest.fixture
def good(tmp_path) -> Path:
    path = tmp_path / "good.yaml"
    path.write_text(GOOD)
    return path


def _device_of(profile_file: Path) -> str:
    return json.loads(profile_file.read_text())["gpu"]


def _one_error_line(code: int, out: str, err: str) -> str:
    lines = err.splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith("error: --profile")
    return lines[0]


def test_a_cpu_profile_on_h100s_is_refused_naming_both_devices(capsys):
    """The issue's own case: a CPU core's calibration on the H100 example."""
    example = ROOT / "examples" / "llama3-70b-h100.yaml"
    cpu = SHIPPED / "cpu-core.json"
    gpu = cluster_presets()["dgx-h100"]["gpu"]
    line = _one_error_line(*run(capsys, "simulate", str(example), "--profile", str(cpu),
                                "--json"))
    assert _device_of(cpu) in line and gpu in line and "--force-profile" in line


@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_every_command_with_profile_refuses_another_devices_profile(capsys, good, command):
    grid = ["--grid", "parallel.tp=1,2"] if command == "sweep" else []
    line = _one_error_line(*run(capsys, command, str(good), *grid, "--profile", "a100-80gb"))
    assert "a100-80gb" in line and "h100-sxm" in line


def test_force_profile_applies_it_and_changes_nothing_else(capsys, good):
    """Forced, the CPU profile prices the step exactly as the engine does when handed that
    profile directly: the flag lifts the refusal and nothing more."""
    code, out, err = run(capsys, "simulate", str(good), "--profile", "cpu-core",
                         "--force-profile", "--json")
    assert code == 0, err
    direct = simulate(load_scenario(str(good)), profile=load_profile(SHIPPED / "cpu-core.json"))
    assert json.loads(out)["step_time_s"] == pytest.approx(direct.step_time_s, rel=1e-12)


def test_a_name_and_its_file_give_the_same_prediction(capsys, good):
    """``--profile h100-sxm`` is the shipped file, which is also the default for an H100."""
    results = []
    for argv in (["--profile", "h100-sxm"], ["--profile", str(SHIPPED / "h100-sxm.json")], []):
        code, out, err = run(capsys, "simulate", str(good), *argv, "--json")
        assert code == 0, err
        results.append(json.loads(out)["step_time_s"])
    assert results[0] == results[1] == results[2]


def test_the_generic_profile_applies_to_any_gpu(capsys, good):
    assert _device_of(SHIPPED / "default.json") == "any"
    code, _, err = run(capsys, "simulate", str(good), "--profile", "default", "--json")
    assert code == 0, err


def test_an_unknown_profile_name_lists_the_shipped_ones(capsys, good):
    line = _one_error_line(*run(capsys, "simulate", str(good), "--profile", "h100"))
    assert "'h100'" in line
    assert all(p.stem in line for p in SHIPPED.glob("*.json"))


def test_sweep_takes_a_name_and_marks_points_of_another_gpu_invalid(capsys, good, tmp_path):
    """A grid over the cluster preset: the H100 point runs with the named H100 profile, the
    A100 point is invalid with the reason; the base's GPU matched, so the sweep ran."""
    out = tmp_path / "s.csv"
    code, _, err = run(capsys, "sweep", str(good), "--grid",
                       "cluster.preset=dgx-h100,dgx-a100-80gb", "--profile", "h100-sxm",
                       "--jobs", "1", "--out", str(out))
    assert code == 0, err
    rows = {r["cluster.preset"]: r for r in pd.read_csv(out).to_dict("records")}
    assert rows["dgx-h100"]["status"] == "ok"
    assert rows["dgx-a100-80gb"]["status"] == "invalid"
    assert "h100-sxm" in rows["dgx-a100-80gb"]["error"]
    assert "a100-80gb" in rows["dgx-a100-80gb"]["error"]


def test_the_python_api_refuses_too_and_takes_force_profile(good):
    with pytest.raises(ScenarioError, match="measured on cpu-core"):
        clustersim.simulate(str(good), profile="cpu-core")
    forced = clustersim.simulate(str(good), profile="cpu-core", force_profile=True)
    default = clustersim.simulate(str(good))
    assert forced.result.step_time_s > default.result.step_time_s


def test_a_pooled_cluster_takes_the_profile_of_one_of_its_pools(capsys):
    """Pools apply a profile to the pools of its GPU only; one that matches no pool is refused
    even when forced (forcing cannot make it apply to another pool)."""
    mixed = str(ROOT / "examples" / "mixed-h100-a100.yaml")
    code, _, err = run(capsys, "simulate", mixed, "--profile", "a100-80gb", "--fidelity",
                       "analytic", "--json")
    assert code == 0, err
    line = _one_error_line(*run(capsys, "simulate", mixed, "--profile", "cpu-core",
                                "--force-profile", "--fidelity", "analytic"))
    assert "cpu-core" in line and "a100-80gb" in line and "h100-sxm" in line
