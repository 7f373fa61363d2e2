"""The planner: what it prints is valid, fits, is ranked by the engine, and is what an
exhaustive engine search over the same space finds."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from clustersim.cli import main
from clustersim.errors import ScenarioError
from clustersim.reports.plan import PlanRequest, _fits, _raw, candidates, plan
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import build_scenario

REQ = PlanRequest(model={"preset": "llama2-7b", "seq_len": 2048},
                  cluster={"preset": "dgx-a100-80gb", "gpus": 16}, global_batch=64,
                  tokens=1e11)


def test_plans_are_valid_fit_and_come_fastest_first():
    plans, valid, fitting = plan(REQ, top=5)
    assert len(plans) == 5 and 0 < fitting <= valid
    times = [p.result.step_time_s for p in plans]
    assert times == sorted(times)
    for p in plans:
        again = build_scenario(p.scenario.as_dict())  # valid, as a scenario file would be
        result = simulate(again)
        assert result.step_time_s == pytest.approx(p.result.step_time_s, rel=1e-12)
        assert result.peak_bytes <= 0.95 * result.capacity_bytes
        assert p.gpu_hours == pytest.approx(result.time_to_train_s * 16 / 3600)


def test_pruning_keeps_the_optimum_of_an_exhaustive_engine_search():
    # 8 GPUs and 32 sequences: every split the planner tries, simulated by the engine (1,746
    # of them; on REQ's 16 GPUs the micro-batches up to 64 would make it 3,700)
    req = replace(REQ, cluster={**REQ.cluster, "gpus": 8}, global_batch=32)
    base = build_scenario({"model": req.model, "cluster": {**req.cluster, "gpus": 1},
                           "training": {"global_batch": 1}})
    best = float("inf")
    for split in candidates(req, base):
        try:
            s = build_scenario(_raw(req, split))
        except ScenarioError:
            continue
        r = simulate(s)
        if _fits(r, req.memory_reserve):
            best = min(best, r.step_time_s)
    plans, _, _ = plan(req, top=1)
    assert plans[0].result.step_time_s == pytest.approx(best, rel=1e-12)


def test_the_search_covers_every_dimension():
    base = build_scenario({"model": REQ.model, "cluster": {**REQ.cluster, "gpus": 1},
                           "training": {"global_batch": 1}})
    seen = {key: set() for key in ("tp", "pp", "dp", "micro_batch", "schedule",
                                   "virtual_stages", "zero", "recompute", "sequence_parallel")}
    for split in candidates(REQ, base):
        for key in seen:
            seen[key].add(split[key])
    assert seen["tp"] == {1, 2, 4, 8} and seen["pp"] >= {1, 2, 4, 8, 16}
    assert seen["schedule"] == {"1f1b", "zb-h1", "zb-h2", "zb-v", "dualpipev", "dualpipe",
                                "interleaved"}
    assert seen["virtual_stages"] >= {2, 4, 8}
    assert seen["zero"] == {0, 1, 2, 3} and seen["recompute"] == {"none", "full"}
    assert seen["sequence_parallel"] == {True, False}


def test_plan_json_is_an_array_of_scenario_and_result(capsys):
    code = main(["plan", "--model", "llama2-7b", "--cluster", "dgx-a100-80gb", "--gpus", "16",
                 "--global-batch", "64", "--seq-len", "2048", "--tokens", "1e11",
                 "--mtbf-hours", "50000", "--top", "3", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and len(out) == 3
    for item in out:
        assert {"scenario", "result"} <= set(item)
        assert item["result"]["gpus"] == 16
        checkpoint = item["plan"]["checkpoint"]
        assert 0 < checkpoint["goodput"] < 1 and checkpoint["interval_s"] > 0
    steps = [item["result"]["step_time_s"] for item in out]
    assert steps == sorted(steps)


def test_plan_table_and_plots(capsys, tmp_path):
    code = main(["plan", "--model", "llama2-7b", "--cluster", "dgx-a100-80gb", "--gpus", "16",
                 "--global-batch", "64", "--seq-len", "2048", "--tokens", "1e11",
                 "--plots", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and "train days" in out and "GPU-hours" in out
    assert (tmp_path / "breakdown.png").exists() and (tmp_path / "timeline.png").exists()


@pytest.mark.parametrize("argv, field", [
    (["--gpus", "0"], "--gpus"),
    (["--gpus", "16", "--tokens", "-1"], "--tokens"),
    (["--gpus", "16", "--memory-reserve", "1.5"], "--memory-reserve"),
    (["--gpus", "16", "--model", "gpt-9"], "model"),
    (["--gpus", "12"], "gpus (12) must be a multiple of gpus_per_node (8)"),
    (["--gpus", "16", "--global-batch", "0"], "--global-batch"),
])
def test_bad_plan_arguments_are_one_error_line(capsys, argv, field):
    args = ["plan", "--model", "llama2-7b", "--cluster", "dgx-a100-80gb", *argv]
    if argv[-2] == "--model":
        args = ["plan", "--cluster", "dgx-a100-80gb", *argv]
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("error:") and field in err and err.count("\n") == 1


def test_a_model_file_importing_a_hf_config_reads_it_beside_the_file(tmp_path, monkeypatch):
    """``plan --model FILE``: a relative ``hf_config`` in FILE is found next to FILE, as in a
    scenario, whatever the working directory."""
    import shutil
    from pathlib import Path

    from clustersim.reports.plan_request import section
    from clustersim.simulator.inputs.hf_config import import_model

    folder = tmp_path / "models"
    folder.mkdir()
    source = Path(__file__).parents[1] / "data" / "hf" / "llama3-8b.json"
    shutil.copy(source, folder / source.name)
    (folder / "llama.yaml").write_text("model: {hf_config: llama3-8b.json, seq_len: 4096}\n")
    monkeypatch.chdir(tmp_path)  # the config is not here
    found = section(str(folder / "llama.yaml"), "model")
    expected = import_model({"hf_config": str(source), "seq_len": 4096})
    assert import_model(found) == expected
