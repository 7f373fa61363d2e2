"""A breakdown that points at the real bottleneck (issue 24, item 6): ``simulate`` shows each
stage's time by cause and names the stage and resource that set the step, and expert-parallel
traffic is labelled ``ep`` (not ``tp``) in the trace, the timeline and its legend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run

from clustersim.reports import plots
from clustersim.simulator.discrete_event.engine import Engine
from clustersim.simulator.inputs.scenario import build_scenario

ROOT = Path(__file__).resolve().parents[2]
DEEPSEEK = ROOT / "examples" / "deepseek-v3-h800.yaml"
# The command (the example's recompute_modules belong to its selective recompute).
# Megatron-Core's pairwise all-to-all, every routed copy over InfiniBand: the all-to-alls set
# the step (the example itself sends them as DeepSeek did, moe_dispatcher: deepep)
ONE_F_ONE_B = ("--set", "parallel.schedule=1f1b", "--set", "parallel.virtual_stages=1",
               "--set", "parallel.recompute=full", "--set", "parallel.recompute_modules=null",
               "--set", "parallel.moe_dispatcher=alltoall", "--set", "parallel.stage_layers=null",
               "--set", "model.mtp_layers=0")  # no MTP module weighing on the last stage


@pytest.mark.parametrize("fidelity", ["representative", "analytic"])
def test_deepseek_1f1b_names_the_middle_stages_all_to_alls(capsys, fidelity):
    """DeepSeek-V3 under plain 1F1B: the last rank to finish is stage 0, whose critical path
    is mostly bubble (waiting for the others); the stage that sets the step is a middle one,
    whose MoE layers (stage 0 holds the 3 dense first layers, stage 15 the output layer and
    fewer MoE layers) spend most of their busy time in exposed expert all-to-alls."""
    code, out, err = run(capsys, "simulate", str(DEEPSEEK), *ONE_F_ONE_B, "--json",
                         "--fidelity", fidelity)
    assert code == 0, err
    r = json.loads(out)
    stages = r["breakdown_per_stage"]
    assert len(stages) == 16
    assert r["breakdown_s"]["bubble"] > 0.5 * r["step_time_s"]  # what the old output blamed
    critical = r["bottleneck"]
    assert 0 < critical["stage"] < 15 and critical["resource"] == "ep"
    middle = stages[critical["stage"]]
    assert middle["exposed_comm_by_kind"]["ep"] > 0.5 * critical["busy_s"]
    assert middle["exposed_comm_by_kind"]["tp"] == 0  # tp = 1: nothing is tensor-parallel
    assert middle["bubble"] < stages[0]["bubble"]
    for stage in stages:
        parts = (stage["compute"], stage["exposed_comm"], stage["bubble"], stage["optimizer"])
        assert sum(parts) == pytest.approx(r["step_time_s"], rel=1e-9)
        assert sum(stage["exposed_comm_by_kind"].values()) == pytest.approx(
            stage["exposed_comm"], rel=1e-12)


def test_overlapped_pairs_keep_every_second_of_exposed_comm(capsys):
    """DualPipeV (the example's own schedule) shares what an overlapped pair exposes among its
    groups: each stage's kinds still sum to its exposed comm and its parts to the step, and
    the stage that finishes last reports its breakdown_s."""
    code, out, _ = run(capsys, "simulate", str(DEEPSEEK), "--json")
    assert code == 0
    r = json.loads(out)
    for stage in r["breakdown_per_stage"]:
        assert sum(stage["exposed_comm_by_kind"].values()) == pytest.approx(
            stage["exposed_comm"], rel=1e-9)
        assert stage["bubble"] >= 0
        assert stage["compute"] + stage["exposed_comm"] + stage["bubble"] + stage[
            "optimizer"] == pytest.approx(r["step_time_s"], rel=1e-9)
    assert any(stage["exposed_comm"] == pytest.approx(r["breakdown_s"]["exposed_comm"],
                                                      rel=1e-9)
               and stage["compute"] == pytest.approx(r["breakdown_s"]["compute"], rel=1e-9)
               for stage in r["breakdown_per_stage"])


def test_simulate_prints_the_stage_table_and_the_bottleneck_line(capsys):
    code, out, _ = run(capsys, "simulate", str(DEEPSEEK), *ONE_F_ONE_B)
    assert code == 0
    assert "Breakdown per stage" in out
    line = next(line for line in out.splitlines() if line.startswith("Bottleneck:"))
    assert "ep all-to-alls" in line
    # one of the identical middle stages (they share a row): which one wins the tie is rounding
    assert 1 <= int(line.split("stage ")[1].split(",")[0]) <= 12, line
    assert " 1-12 " in out


MOE = {"hidden": 512, "heads": 8, "ffn_hidden": 256, "vocab": 64, "seq_len": 256,
       "experts": 8, "top_k": 2, "capacity_factor": None, "layers": 4}


def moe(tp: int = 1):
    """Two stages of an MoE model with ep 2 (and optionally tp 2), over slow links."""
    return build_scenario({
        "model": MOE,
        "cluster": {"preset": "dgx-h100", "gpus": 4 * tp, "gpus_per_node": 4,
                    "inter_node": {"bandwidth": 5, "latency": 5e-6}},
        "training": {"global_batch": 8},
        "parallel": {"tp": tp, "pp": 2, "dp": 2, "ep": 2, "schedule": "1f1b",
                     "sequence_parallel": tp > 1}})


@pytest.mark.parametrize("fidelity", ["representative", "full"])
def test_expert_all_to_alls_are_ep_in_the_trace(tmp_path, fidelity):
    """The all-to-alls run on the main thread, exposed (full: as flows, representative: in
    closed form): their spans sit on the trace's ``ep`` thread, and with tp = 1 nothing is
    on ``tp``; their seconds are the ``ep`` of the stage breakdown."""
    from clustersim.simulator.discrete_event.engine import simulate
    out = tmp_path / "step.json"
    r = simulate(moe(), fidelity, trace=str(out))
    events = json.loads(out.read_text())["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["name"] == "thread_name"}
    spans = [e for e in events if e["ph"] == "X"]
    on = {name: [e for e in spans if threads[e["pid"], e["tid"]] == name]
          for name in ("tp", "ep")}
    assert on["ep"] and not on["tp"]
    assert all(e["cat"] == "ep" for e in on["ep"])
    stage_of = {e["pid"]: int(e["args"]["name"].split("stage ")[1].split(",")[0])
                for e in events if e["name"] == "process_name"}
    waited: dict[int, list[float]] = {}  # per stage, each rank's seconds on its ep thread
    for pid, stage in stage_of.items():
        seconds = sum(e["dur"] for e in on["ep"] if e["pid"] == pid) / 1e6
        waited.setdefault(stage, []).append(seconds)
    for b in r.stages:  # the stage's entry is one of its ranks (the busiest): its ep waits
        assert any(x == pytest.approx(b.comm["ep"], rel=1e-6) for x in waited[b.stage])
        assert b.comm["ep"] > 0


def test_the_timeline_legend_says_ep_and_tp_apart():
    """With tp 2 and ep 2 the timeline picture's legend lists both, from their own spans."""
    engine = Engine(moe(tp=2), record=True)
    engine.run()
    _, data = plots.pipeline_gantt(engine.timeline.spans, engine.timeline.rank_labels, "moe")
    ops = set(data["op"])
    assert {"tp", "ep"} <= ops
    ep_names = set(data[data["op"] == "ep"]["name"])
    tp_names = set(data[data["op"] == "tp"]["name"])
    assert ep_names and tp_names
