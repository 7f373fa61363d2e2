"""The Python API: clustersim.simulate / plan / load_scenario give what the CLI prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import clustersim
from clustersim import ScenarioError
from clustersim.cli import main
from clustersim.simulator.inputs.scenario import Scenario

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples/gpt-18b-a100.yaml")
OOM = {"name": "oom", "model": {"preset": "llama3-70b"},
       "cluster": {"preset": "dgx-h100", "nodes": 8},
       "training": {"global_batch": 64, "micro_batch": 2},
       "parallel": {"tp": 8, "pp": 1, "zero": 0, "sequence_parallel": True}}


def _cli_json(capsys, *argv: str):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _same(value):
    """As the CLI's JSON would carry it (tuples become lists, floats print exactly)."""
    return json.loads(json.dumps(value))


def test_simulate_to_dict_equals_the_cli_json_with_fit_hints(capsys, tmp_path):
    path = tmp_path / "oom.yaml"
    path.write_text(yaml.safe_dump(OOM))
    cli = _cli_json(capsys, "simulate", str(path))
    api = clustersim.simulate(path).to_dict()
    assert cli["memory"]["fit_hints"]  # the comparison covers the hints
    assert _same(api) == cli


def test_keyword_overrides_are_set_flags(capsys):
    cli = _cli_json(capsys, "simulate", EXAMPLE, "--set", "parallel.tp=4",
                    "--set", "parallel.pp=2", "--fidelity", "analytic")
    api = clustersim.simulate(EXAMPLE, fidelity="analytic", parallel__tp=4, parallel__pp=2)
    assert _same(api.to_dict()) == cli
    assert api.scenario.parallel.dp == 256 // 8  # re-derived, as on the command line


def test_a_path_a_mapping_and_a_scenario_give_the_same_result():
    from_path = clustersim.simulate(EXAMPLE).to_dict()
    s = clustersim.load_scenario(EXAMPLE)
    assert isinstance(s, Scenario)
    assert clustersim.simulate(s).to_dict() == from_path
    with open(EXAMPLE) as f:
        assert clustersim.simulate(yaml.safe_load(f)).to_dict() == from_path


@pytest.mark.parametrize("call, field", [
    (lambda: clustersim.simulate(EXAMPLE, parallel__tp=5), "parallel.tp"),
    (lambda: clustersim.simulate(EXAMPLE, tp=4), "tp"),
    (lambda: clustersim.simulate(EXAMPLE, fidelity="exact"), "fidelity"),
    (lambda: clustersim.simulate(42), "scenario"),
    (lambda: clustersim.simulate(EXAMPLE, fidelity="analytic", trace="t.json"), "trace"),
    (lambda: clustersim.simulate("no-such-file.yaml"), "no-such-file.yaml"),
    (lambda: clustersim.load_scenario(EXAMPLE, training__global_batch=-1),
     "training.global_batch"),
    (lambda: clustersim.plan("llama2-7b", "dgx-a100-80gb", 16, fix={"parallel.tpp": 8}),
     "parallel.tpp"),
    (lambda: clustersim.plan("llama2-7b", "dgx-a100-80gb", 16, framework="fsdp",
                             fix={"training.framework": "deepspeed"}), "framework"),
])
def test_bad_input_raises_scenario_error_naming_the_field(call, field):
    with pytest.raises(ScenarioError) as err:
        call()
    assert err.value.field == field


def test_plan_to_list_equals_the_cli_json(capsys):
    cli = _cli_json(capsys, "plan", "--model", "llama2-7b", "--cluster", "dgx-a100-80gb",
                    "--gpus", "16", "--global-batch", "64", "--seq-len", "2048",
                    "--tokens", "1e11", "--top", "3", "--fix", "parallel.pp=2")
    found = clustersim.plan("llama2-7b", "dgx-a100-80gb", 16, global_batch=64, seq_len=2048,
                            tokens=1e11, top=3, fix={"parallel.pp": 2})
    assert _same(found.to_list()) == cli
    assert found.best.scenario.parallel.pp == 2


def test_plan_framework_is_the_cli_flag(capsys):
    cli = _cli_json(capsys, "plan", "--model", "llama2-7b", "--cluster", "dgx-a100-80gb",
                    "--gpus", "16", "--global-batch", "64", "--seq-len", "2048", "--top", "2",
                    "--framework", "fsdp")
    found = clustersim.plan("llama2-7b", "dgx-a100-80gb", 16, global_batch=64, seq_len=2048,
                            top=2, framework="fsdp")
    assert _same(found.to_list()) == cli
    assert {p["plan"]["launch"]["stack"] for p in cli} == {"torchtitan"}


def test_plan_on_ray_finds_the_plans_one_process_finds():
    """``backend="ray"`` is ``plan --backend ray``: the same plans as one process."""
    pytest.importorskip("ray")
    args = ("llama2-7b", "dgx-a100-80gb", 16)
    kw = {"global_batch": 64, "seq_len": 2048, "top": 2, "fix": {"parallel.pp": 2}}
    on_ray = clustersim.plan(*args, backend="ray", jobs=2, **kw)
    assert on_ray.to_list() == clustersim.plan(*args, jobs=1, **kw).to_list()


@pytest.mark.parametrize("options, field", [({"backend": "spark"}, "backend"),
                                            ({"address": "ray://head:10001"}, "address")])
def test_plan_backend_options_are_checked(options, field):
    with pytest.raises(ScenarioError) as err:
        clustersim.plan("llama2-7b", "dgx-a100-80gb", 16, global_batch=64, **options)
    assert err.value.field == field


def test_importing_clustersim_stays_light():
    heavy = ("pandas", "matplotlib", "torch", "simpy", "rich",
             "clustersim.simulator.discrete_event.engine")
    code = ("import sys, clustersim; "
            f"print([m for m in {heavy!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_the_api_pages_python_example_prints_what_it_shows(monkeypatch):
    import doctest

    monkeypatch.chdir(ROOT)  # the example's paths are relative to the repository
    page = (ROOT / "docs" / "api.md").read_text()
    example = page.split("```python", 1)[1].split("```", 1)[0]
    test = doctest.DocTestParser().get_doctest(example, {}, "docs/api.md", "docs/api.md", 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
