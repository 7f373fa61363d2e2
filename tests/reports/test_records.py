"""A plan that promises more than the best published run of its kind says so, and what the
model credits for the difference (reports/records.py, reports/published_records.yaml)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from clustersim.cli import main
from clustersim.reports.records import credits, record_for, record_note, records
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.model.workload import model_flops_per_step

DATA = Path(__file__).resolve().parents[1] / "data"
SPLIT = ("tp", "pp", "dp", "schedule", "virtual_stages", "recompute")


def _case(file: str, case_id: str) -> dict:
    return next(c for c in yaml.safe_load((DATA / file).read_text())
                if c["id"] == case_id)


@pytest.mark.parametrize("record", records(), ids=lambda r: f"{r.model}-{r.gpu}-{r.precision}")
def test_each_record_is_the_published_case_it_cites(record):
    """Figure, GPUs, batch and split as in the held-out or development case (its own file
    keeps the citation and how the run became a scenario)."""
    text = yaml.safe_load(Path(__file__).resolve().parents[2].joinpath(
        "reports", "published_records.yaml").read_text())
    file, case_id = next(r["case"] for r in text if r["source"] == record.source)
    case = _case(file, case_id)
    s = build_scenario(record.scenario)
    if file == "published-dev.yaml":  # the development set's own schema
        p, hw = case["parallelism"], case["hardware"]
        assert record.value == case["measured"]["mfu_percent"]
        assert (s.cluster.gpus, s.training.global_batch, s.parallel.tp, s.parallel.pp,
                s.parallel.virtual_stages) == (hw["num_gpus"], p["global_batch_size"], p["tp"],
                                               p["pp"], p["vpp"])
        return
    assert record.value == case["published"][f"{record.metric}_percent"
                                             if record.metric == "mfu" else record.metric]
    theirs = build_scenario(case["scenario"])
    assert (s.cluster.gpus, s.training.global_batch, s.training.micro_batch,
            s.training.precision) == (theirs.cluster.gpus, theirs.training.global_batch,
                                      theirs.training.micro_batch, theirs.training.precision)
    assert [getattr(s.parallel, k) for k in SPLIT] == [getattr(theirs.parallel, k) for k in SPLIT]


@pytest.mark.parametrize("record", [r for r in records() if r.metric == "tokens_per_s"],
                         ids=lambda r: r.model)
def test_a_throughput_record_counts_model_flops_as_the_plans_do(record):
    """MFU = tokens/s x model FLOPs per token / (GPUs x bf16 peak), FLOPs as clustersim's MFU
    counts them (``workload.model_flops_per_step``)."""
    s = build_scenario(record.scenario)
    per_token = model_flops_per_step(s) / (s.training.global_batch * s.model.seq_len)
    peak = s.cluster.gpu.peak_flops["bf16"]
    assert record.mfu() == pytest.approx(record.value * per_token / (s.cluster.gpus * peak),
                                         rel=1e-9)


def test_the_walk_starts_at_the_published_run_and_ends_at_the_plan():
    record = records()[0]  # GPT-3 175B on A100: Korthikanti et al.'s run
    plan = build_scenario({**record.scenario,
                           "cluster": {"preset": "dgx-a100-80gb", "gpus": 128},
                           "training": {**record.scenario["training"], "global_batch": 128,
                                        "flash_attention": True},
                           "parallel": {**record.scenario["parallel"], "dp": 2, "zero": 1}})
    assert record_for(plan) is record
    walk = credits(record, plan)
    assert walk[0].mfu == simulate(build_scenario(record.scenario)).mfu
    assert walk[-1].mfu == simulate(plan).mfu
    changes = [c.change for c in walk[1:]]
    assert changes[0] == "fused attention (flash_attention True)"
    assert any(c.startswith("cluster and global batch (128 GPUs") for c in changes)
    assert changes[-1] == "ZeRO stage (zero 1)"


def test_only_plans_above_the_record_are_noted():
    record = records()[0]
    below = build_scenario(record.scenario)  # as published: the model puts it under 51.4%
    above = build_scenario({**record.scenario,
                            "training": {**record.scenario["training"],
                                         "flash_attention": True}})
    mfus = [simulate(above).mfu, simulate(below).mfu]
    assert mfus[0] > record.mfu() > mfus[1]
    note = record_note([above, below], mfus)
    assert note.above == (0,) and note.walk[-1].mfu == mfus[0]
    assert note.lines()[0].startswith("#1 promise more than the best published run of "
                                      "gpt3-175b on a100-80gb (bf16)")
    assert record_note([below], mfus[1:]) is None
    other_gpu = build_scenario({**record.scenario,
                                "cluster": {"preset": "dgx-h100", "gpus": 64}})
    assert record_for(other_gpu) is None  # no bf16 GPT-3 175B record on H100


def test_plan_json_marks_the_plans_above_the_record(capsys):
    assert main(["plan", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--gpus", "64",
                 "--seq-len", "2048", "--global-batch", "64", "--top", "2", "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)
    record = records()[0].mfu()
    for p in plans:
        above = p["plan"].get("above_record")
        assert (above is not None) == (p["result"]["mfu"] > record)
    first = plans[0]["plan"]["above_record"]
    assert first["mfu"] == pytest.approx(0.514)
    assert first["credits"][-1]["mfu"] == pytest.approx(plans[0]["result"]["mfu"], rel=1e-12)


def test_a_group_that_cannot_run_alone_joins_the_next():
    """96 GPUs do not split as the record's tp 8 x pp 8: the cluster step runs together with
    the plan's tp 4, and the walk still ends at the plan."""
    record = records()[0]
    plan = build_scenario({**record.scenario,
                           "cluster": {"preset": "dgx-a100-80gb", "gpus": 96},
                           "training": {**record.scenario["training"], "global_batch": 96},
                           "parallel": {**record.scenario["parallel"], "tp": 4, "dp": 3}})
    walk = credits(record, plan)
    assert [c.change for c in walk[1:]] == [
        "cluster and global batch (96 GPUs, global_batch 96) + "
        "tensor, sequence and context parallelism (tp 4)"]
    assert walk[-1].mfu == simulate(plan).mfu


def test_each_record_is_the_best_held_out_run_of_its_kind():
    """Every held-out case of a model preset has a record of its kind, and none beats it
    (MFU as ``Record.mfu`` counts it), so "the best published run we know" holds for the
    runs the repository knows."""
    kinds = [(r.model, r.gpu, r.precision) for r in records()]
    assert len(kinds) == len(set(kinds))
    for path in sorted(DATA.glob("heldout-*.yaml")):
        for case in yaml.safe_load(path.read_text()):
            if "preset" not in case["scenario"].get("model", {}) or case["metric"] not in (
                    "mfu", "tokens_per_s"):
                continue
            s = build_scenario(case["scenario"])
            record = record_for(s)
            assert record is not None, case["id"]
            published = case["published"]
            if case["metric"] == "mfu":
                mfu = published["mfu_percent"] / 100
            else:
                r = simulate(s)
                mfu = r.mfu * published["tokens_per_s"] / r.tokens_per_s
            assert mfu <= record.mfu() + 1e-9, case["id"]
