"""The command line: JSON result contract, tables, presets, and bad input as one error line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run

from clustersim.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
GOOD = """\
model: {preset: gpt-1.7b}
cluster: {preset: dgx-a100-80gb, gpus: 32}
training: {global_batch: 512, micro_batch: 1, tokens: 3.0e11}
parallel: {tp: 1, pp: 1, dp: 32}
"""
RESULT_FIELDS = {"name", "gpus", "step_time_s", "tokens_per_s", "model_tflops_per_gpu",
                 "hardware_tflops_per_gpu", "mfu", "breakdown_s", "memory", "time_to_train_s"}


@pytest.fixture
def good(tmp_path) -> Path:
    path = tmp_path / "good.yaml"
    path.write_text(GOOD)
    return path


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_prints_the_json_result_of_the_contract(capsys, example):
    code, out, err = run(capsys, "simulate", str(example), "--json")
    assert code == 0, err
    result = json.loads(out)
    assert set(result) >= RESULT_FIELDS
    assert set(result["breakdown_s"]) == {"compute", "exposed_comm", "bubble", "optimizer"}
    assert sum(result["breakdown_s"].values()) == pytest.approx(result["step_time_s"], rel=1e-9)
    memory = result["memory"]
    assert {"capacity_bytes", "peak_bytes", "fits", "per_stage"} <= set(memory)
    assert memory["peak_bytes"] == max(s["peak_bytes"] for s in memory["per_stage"])
    for stage in memory["per_stage"]:
        parts = ("params", "grads", "optimizer", "activations", "buffers")
        assert abs(sum(stage[k] for k in parts) - stage["peak_bytes"]) <= 5
    assert result["tokens_per_s"] * result["step_time_s"] > 0


def test_llama3_405b_on_8192_h100_works_as_shipped(capsys):
    code, out, _ = run(capsys, "simulate", str(ROOT / "examples/llama3-405b-h100.yaml"), "--json")
    result = json.loads(out)
    assert code == 0 and result["gpus"] == 8192
    assert len(result["memory"]["per_stage"]) == 16
    assert result["memory"]["fits"] is True
    assert 0.2 < result["mfu"] < 0.6  # Meta reports 38-43% BF16 MFU (Llama 3, Table 4)
    assert result["time_to_train_s"] == pytest.approx(15.6e12 / result["tokens_per_s"])


@pytest.mark.parametrize("fidelity", ["representative", "full", "analytic"])
def test_each_fidelity_is_named_in_the_result(capsys, good, fidelity):
    code, out, err = run(capsys, "simulate", str(good), "--json", "--fidelity", fidelity)
    assert code == 0, err
    assert json.loads(out)["fidelity"] == fidelity


def test_engine_is_the_default_and_stays_near_the_analytic_estimate(capsys, good):
    _, engine, _ = run(capsys, "simulate", str(good), "--json")
    _, closed, _ = run(capsys, "simulate", str(good), "--json", "--fidelity", "analytic")
    engine, closed = json.loads(engine), json.loads(closed)
    assert engine["fidelity"] == "representative"
    assert engine["step_time_s"] == pytest.approx(closed["step_time_s"], rel=0.05)


def test_trace_writes_chrome_trace_json(capsys, good, tmp_path):
    trace = tmp_path / "step.json"
    code, _, err = run(capsys, "simulate", str(good), "--trace", str(trace),
                       "--set", "parallel.pp=2", "--set", "parallel.dp=16")
    assert code == 0, err
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["ph"] for e in events} == {"M", "X"}
    assert {e["pid"] for e in events if e["ph"] == "X"} == {0, 16}  # one pipeline: ranks 0, 16
    assert sorted(tmp_path.iterdir()) == sorted([trace, good])  # no temporary file left


@pytest.mark.parametrize("argv, field", [
    (["--fidelity", "analytic"], "--trace"),
    (["--fidelity", "exact"], "--fidelity"),
])
def test_trace_and_fidelity_mistakes_are_one_error_line(capsys, good, tmp_path, argv, field):
    code, out, err = run(capsys, "simulate", str(good), "--trace", str(tmp_path / "t.json"),
                         *argv)
    assert code == 2 and out == ""
    assert err.startswith("error:") and field in err and err.count("\n") == 1
    assert not (tmp_path / "t.json").exists()


def test_trace_into_a_missing_folder_is_refused_before_simulating(capsys, good, tmp_path):
    code, _, err = run(capsys, "simulate", str(good), "--trace", str(tmp_path / "no" / "t.json"))
    assert code == 2 and err.startswith("error: --trace:")


def test_timeline_draws_the_pipeline_with_split_backwards(capsys, tmp_path):
    """``--timeline``: a PNG of the step; ZB-H1's input and weight halves in its legend."""
    from clustersim.reports import plots
    from clustersim.simulator.discrete_event.engine import Engine
    from clustersim.simulator.inputs.scenario import build_scenario, raw_scenario

    example = Path(__file__).parents[2] / "examples" / "zero-bubble-h1.yaml"
    picture = tmp_path / "zb.png"
    code, out, err = run(capsys, "simulate", str(example), "--timeline", str(picture))
    assert code == 0, err
    assert picture.read_bytes().startswith(b"\x89PNG") and f"wrote {picture}" in out
    engine = Engine(build_scenario(*raw_scenario(str(example), [])), record=True)
    engine.run()
    _, data = plots.pipeline_gantt(engine.timeline.spans, engine.timeline.rank_labels, "zb")
    assert {"forward", "input grad", "weight grad"} <= set(data["op"])
    assert "backward" not in set(data["op"])


@pytest.mark.parametrize("argv, name", [(["--fidelity", "analytic"], "t.png"), ([], "t.txt")])
def test_timeline_mistakes_are_one_error_line(capsys, good, tmp_path, argv, name):
    code, out, err = run(capsys, "simulate", str(good), "--timeline", str(tmp_path / name),
                         *argv)
    assert code == 2 and out == "" and err.startswith("error: --timeline:")
    assert not (tmp_path / name).exists()


def test_table_output_names_the_result(capsys, good):
    code, out, _ = run(capsys, "simulate", str(good))
    assert code == 0
    for text in ("step time", "MFU", "compute", "bubble", "activations", "fits"):
        assert text in out


def test_set_changes_the_result(capsys, good):
    _, one, _ = run(capsys, "simulate", str(good), "--json")
    _, two, _ = run(capsys, "simulate", str(good), "--json", "--set", "parallel.tp=2",
                    "--set", "parallel.dp=16")
    assert json.loads(one)["step_time_s"] != json.loads(two)["step_time_s"]


def test_presets_lists_models_gpus_and_clusters(capsys):
    code, out, _ = run(capsys, "presets", "--json")
    rows = json.loads(out)
    assert code == 0
    assert "llama3-405b" in {m["name"] for m in rows["models"]}
    assert "h100-sxm" in {g["name"] for g in rows["gpus"]}
    assert "dgx-h100" in {c["name"] for c in rows["clusters"]}
    code, out, _ = run(capsys, "presets")
    assert code == 0 and "mixtral-8x7b" in out and "pcie-ethernet" in out


@pytest.mark.parametrize("command", [[], ["simulate"], ["sweep"], ["plan"], ["report"],
                                     ["presets"]])
def test_help_works_for_every_subcommand(capsys, command):
    with pytest.raises(SystemExit) as info:
        main([*command, "--help"])
    assert info.value.code == 0
    assert "usage" in capsys.readouterr().out


BAD_SCENARIOS = {
    "malformed-yaml": ("model: {preset: gpt-1.7b\n", [], "good.yaml"),
    "duplicate-key": (GOOD + "parallel: {tp: 2}\n", [], "parallel"),
    "unknown-key": (GOOD.replace("tp: 1,", "tpp: 1,"), [], "parallel.tpp"),
    "unknown-model-preset": (GOOD.replace("gpt-1.7b", "gpt-9z"), [], "model.preset"),
    "unknown-cluster-preset": (GOOD.replace("dgx-a100-80gb", "dgx-q"), [], "cluster.preset"),
    "negative-size": (GOOD, ["parallel.tp=-3"], "parallel.tp"),
    "non-numeric": (GOOD.replace("global_batch: 512", "global_batch: many"), [],
                    "training.global_batch"),
    "tp-not-dividing-heads": (GOOD, ["parallel.tp=16", "parallel.dp=2"], "parallel.tp"),
    "split-not-gpu-count": (GOOD, ["parallel.dp=16"], "parallel.dp"),
    "batch-not-divisible": (GOOD, ["training.global_batch=100"], "training.global_batch"),
    "too-few-layers": (GOOD, ["parallel.pp=32", "parallel.dp=1"], "parallel.pp"),
    "stage-layers-sum": (GOOD, ["parallel.pp=2", "parallel.dp=16",
                                "parallel.stage_layers=[12, 11]"], "parallel.stage_layers"),
    "kv-heads-vs-tp": (GOOD, ["model.kv_heads=3", "parallel.tp=2", "parallel.dp=16"],
                       "parallel.tp"),
    "virtual-stages-without-interleaving": (GOOD, ["parallel.virtual_stages=2"], "parallel"),
    "dp-shard-not-dividing-dp": (GOOD, ["parallel.zero=1", "parallel.dp_shard=3"],
                                 "parallel.dp_shard"),
    "bad-set-syntax": (GOOD, ["parallel.tp"], "--set"),
    "not-a-mapping": ("- just\n- a list\n", [], "good.yaml"),
}


@pytest.mark.parametrize("kind", sorted(BAD_SCENARIOS))
def test_bad_scenario_gives_one_error_line_and_exit_2(capsys, tmp_path, kind):
    text, sets, field = BAD_SCENARIOS[kind]
    path = tmp_path / "good.yaml"
    path.write_text(text)
    argv = ["simulate", str(path), "--json"] + [a for s in sets for a in ("--set", s)]
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert field in lines[0]


def test_missing_file_is_bad_input(capsys, tmp_path):
    code, out, err = run(capsys, "simulate", str(tmp_path / "absent.yaml"))
    assert (code, out) == (2, "") and err.startswith("error: ") and "absent.yaml" in err


def test_unknown_option_is_one_error_line(capsys, good):
    code, _, err = run(capsys, "simulate", str(good), "--fidelity", "psychic")
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: ")


def test_console_script_exits_2_without_traceback(tmp_path):
    """The installed entry point, not just main(): the exit status reaches the shell."""
    exe = shutil.which("clustersim")
    argv = [exe] if exe else [sys.executable, "-m", "clustersim"]
    path = tmp_path / "s.yaml"
    path.write_text(GOOD)
    proc = subprocess.run([*argv, "simulate", str(path), "--set", "parallel.tp=-3"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: parallel.tp") and "Traceback" not in proc.stderr


def test_full_fidelity_notes_a_large_simulation_by_the_ranks_it_simulates(capsys):
    """16,384 GPUs at tp 8 is 2,048 simulated ranks (one per TP group): no note, on ECMP-
    hashed fat-tree leaves too (each simulated rank issues its peers' flows); at tp 4 there,
    where the groups share their nodes, every GPU is simulated, and the note says so."""
    from clustersim.cli.simulate import _note_full_size
    from clustersim.simulator.inputs.scenario import build_scenario

    raw = {"model": {"preset": "llama3-405b"},
           "cluster": {"preset": "dgx-h100", "gpus": 16384},
           "training": {"global_batch": 2048},
           "parallel": {"tp": 8, "pp": 16, "dp": 128}}
    _note_full_size(build_scenario(raw))
    assert capsys.readouterr().err == ""
    raw["cluster"]["inter_node"] = {"topology": "fat-tree", "spines": 8}
    _note_full_size(build_scenario(raw))
    assert capsys.readouterr().err == ""
    raw["parallel"] = {"tp": 4, "pp": 32, "dp": 128}
    _note_full_size(build_scenario(raw))
    assert "simulates 16384 ranks of 16384 GPUs" in capsys.readouterr().err


def test_a_gpu_priced_by_the_generic_profile_is_said_so_and_profiled_ones_are_not(capsys):
    """MI300X has no shipped profile: the generic one's 60%-of-peak GEMMs are above the 51% its
    best measured matmul reaches, so simulate and plan say on stderr that the times are a
    shape; an H100 scenario, and one run under an explicit --profile, say nothing."""
    mi300x = str(ROOT / "examples" / "mixtral-8x22b-mi300x.yaml")
    code, out, err = run(capsys, "simulate", mi300x)
    assert code == 0 and "note: mi300x has no profile of its own" in err
    assert "note:" not in out
    code, _, err = run(capsys, "plan", "--model", "mixtral-8x7b", "--cluster", "mi300x-roce",
                       "--gpus", "16", "--seq-len", "2048", "--global-batch", "64",
                       "--top", "1")
    assert code == 0 and "mi300x has no profile of its own" in err
    for argv in (["simulate", str(ROOT / "examples" / "llama3-70b-h100.yaml")],
                 ["simulate", mi300x, "--profile", "h100-sxm", "--force-profile"]):
        code, _, err = run(capsys, *argv)
        assert code == 0 and "no profile of its own" not in err, argv
