"""A plan that uses a feature of uncertain cost (tp_comm_overlap, a split backward, fp8) says so
beside its numbers, with the same split's step run without it, in the table and in --json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from clustersim.cli import main
from clustersim.reports.plan import Plan, PlanRequest, plan
from clustersim.reports.plan_caveats import moe_routing_note, uncertain_features, with_caveats
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import apply_values, build_scenario

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"

REQ = PlanRequest(model={"preset": "llama2-7b", "seq_len": 2048},
                  cluster={"preset": "dgx-a100-80gb", "gpus": 16}, global_batch=64)


def without(p, values: dict) -> float:
    """The engine's step of plan ``p``'s split with ``values`` set."""
    raw = apply_values(p.scenario.as_dict(), values)
    return simulate(build_scenario(raw)).step_time_s


WITHOUT = {"tp_comm_overlap": {"parallel.tp_comm_overlap": False},
           "split_backward": {"parallel.schedule": "1f1b"},
           "fp8": {"training.precision": "bf16"}}


# Transformer Engine runs no split backward with userbuffers (simulator/inputs/rules.py): two plans.
@pytest.mark.parametrize("fixed", [
    {"parallel.schedule": "zb-h1", "parallel.tp": 4, "parallel.tp_comm_overlap": False},
    {"parallel.schedule": "1f1b", "parallel.tp": 4, "parallel.tp_comm_overlap": True}])
def test_each_uncertain_feature_comes_with_the_step_without_it(fixed):
    plans, _, _ = plan(PlanRequest(**{**REQ.__dict__, "fixed": fixed,
                                      "cluster": {"preset": "dgx-h100", "gpus": 16},
                                      "training": {"precision": "fp8"}}), top=3)
    assert plans
    expected = {"fp8", "tp_comm_overlap" if fixed["parallel.tp_comm_overlap"] else
                "split_backward"}
    for i, p in enumerate(plans):
        caveats = {c.feature: c for c in p.caveats}
        assert set(caveats) == expected
        for feature in expected:
            c, values = caveats[feature], WITHOUT[feature]
            assert c.without.items() >= values.items()
            assert c.step_time_without_s == pytest.approx(without(p, values), rel=1e-12)
            nxt = plans[i + 1].result.step_time_s if i + 1 < len(plans) else None
            assert c.rests_on == (nxt is not None and c.step_time_without_s > nxt)


def test_a_plan_without_uncertain_features_has_no_caveats():
    fixed = {"parallel.schedule": "1f1b", "parallel.tp_comm_overlap": False}
    plans, _, _ = plan(PlanRequest(**{**REQ.__dict__, "fixed": fixed}), top=2)
    assert plans and all(p.caveats == () for p in plans)
    assert all(uncertain_features(p.scenario) == [] for p in plans)


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-h2", "zb-v", "dualpipev", "dualpipe"])
def test_every_split_backward_schedule_is_flagged(schedule):
    s = build_scenario({"model": {"preset": "llama2-7b"},
                        "cluster": {"preset": "dgx-a100-80gb", "gpus": 8},
                        "training": {"global_batch": 16},
                        "parallel": {"pp": 4, "dp": 2, "schedule": schedule,
                                     "virtual_stages": 1 if schedule.startswith("zb-h") else 2}})
    assert uncertain_features(s) == ["split_backward"]


def test_the_json_and_the_table_show_the_caveats(capsys):
    args = ["plan", "--model", "llama2-7b", "--cluster", "dgx-a100-80gb", "--gpus", "16",
            "--global-batch", "64", "--seq-len", "2048", "--top", "2",
            "--fix", "parallel.tp_comm_overlap=true", "--fix", "parallel.tp=8"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    caveat = out[0]["plan"]["caveats"][0]
    assert caveat["feature"] == "tp_comm_overlap" and caveat["step_time_without_s"] > 0
    assert set(caveat) == {"feature", "note", "without", "step_time_without_s", "rests_on"}
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "uncertain: step without" in table and "tp-overlap +" in table
    assert "rests on it" in table


def moe_scenario(capacity_factor: float | None, ep: int = 8):
    return build_scenario({"model": {"preset": "qwen3-30b-a3b", "seq_len": 4096,
                                     "capacity_factor": capacity_factor},
                           "cluster": {"preset": "dgx-h100", "gpus": 16},
                           "training": {"global_batch": 64},
                           "parallel": {"tp": 1, "pp": 1, "ep": ep}})


def test_a_plan_spreading_experts_over_ranks_says_how_the_published_moe_runs_came_out():
    # the note says how the plan routes and which way to read its step
    dropless = moe_routing_note(moe_scenario(None))
    dropping = moe_routing_note(moe_scenario(1.0))
    assert "dropless (capacity_factor null)" in dropless
    assert "dropping tokens (capacity_factor 1)" in dropping
    assert all("72-97%" in n and "38-46%" in n and "lower bound" in n
               and "128 experts of 768 columns over 8 expert-parallel ranks," in n
               for n in (dropless, dropping))


def test_the_notes_range_is_what_the_held_out_moe_runs_and_deepseeks_recipe_give():
    # heldout-h100-moe.yaml, heldout-b200-moe.yaml (benchmarks/moe_routing.py) and DeepSeek-V3's
    # 1,024-H100 recipe (benchmarks/deepseek_h100_recipe.py): published over predicted
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import deepseek_h100_recipe as recipe

    from clustersim.validation import published as pub
    from clustersim.validation.accuracy import predictor
    ratios, engine = {}, predictor("representative")
    for table in ("heldout-h100-moe.yaml", "heldout-b200-moe.yaml"):
        for row in pub.predict_rows(pub.load_table(DATA / table), predict=engine):
            ratios[row.case.id] = row.case.published / row.predicted
    slow = {k: r for k, r in ratios.items() if k.endswith(("-26.02", "-25.11"))
            and "qwen3-30b" in k and "tokendrop" not in k}
    rest = [r for k, r in ratios.items() if k not in slow]
    rest.append(recipe.PUBLISHED / recipe.tokens_per_gpu({})[0])
    assert (round(min(rest), 2), round(max(rest), 2)) == (0.72, 0.97)
    assert (round(min(slow.values()), 2), round(max(slow.values()), 2)) == (0.38, 0.46)
    # the patch release after them, the same split: 9,058 against 5,113 tokens/s per GPU
    assert round(9058 / 5113, 1) == 1.8


def test_an_expert_parallel_group_across_nodes_says_how_its_all_to_alls_are_charged():
    inside = moe_routing_note(moe_scenario(None, ep=8))
    across = moe_routing_note(moe_scenario(None, ep=16))
    assert "across" not in inside
    assert "across 2 nodes, as Megatron-Core's alltoall dispatcher sends them" in across
    deepep = moe_routing_note(build_scenario({
        "model": {"preset": "qwen3-30b-a3b", "seq_len": 4096}, "cluster": {"preset": "dgx-h100",
                                                                           "gpus": 16},
        "training": {"global_batch": 64},
        "parallel": {"tp": 1, "pp": 1, "ep": 16, "moe_dispatcher": "deepep"}}))
    assert "across 2 nodes, as DeepEP sends them" in deepep


def test_dense_plans_and_experts_on_every_rank_get_no_moe_note():
    assert moe_routing_note(moe_scenario(None, ep=1)) is None
    assert moe_routing_note(build_scenario({"model": {"preset": "llama2-7b"},
                                            "cluster": {"preset": "dgx-h100", "gpus": 8},
                                            "training": {"global_batch": 64}})) is None


def test_plan_prints_the_moe_note_under_its_table(capsys):
    assert main(["plan", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16",
                 "--seq-len", "4096", "--global-batch", "64", "--top", "1",
                 "--fix", "parallel.ep=8", "--fix", "model.capacity_factor=null"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "#1 spreads 128 experts of 768 columns over 8 expert-parallel ranks, dropless" in out
    assert main(["plan", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16",
                 "--seq-len", "4096", "--global-batch", "64", "--top", "1", "--json",
                 "--fix", "parallel.ep=8", "--fix", "model.capacity_factor=null"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)  # --json carries it as plan.moe_note
    assert entry["plan"]["moe_note"].startswith("this plan spreads 128 experts")


def test_simulate_prints_the_moe_note_for_an_moe_scenario_only(capsys):
    examples = Path(__file__).resolve().parents[2] / "examples"
    assert main(["simulate", str(examples / "mixtral-8x7b-h100.yaml")]) == 0
    err = " ".join(capsys.readouterr().err.split())  # on stderr, as the other notes are
    assert "note: this scenario spreads 8 experts of 14336 columns over 8 expert-parallel" in err
    assert main(["simulate", str(examples / "llama3-70b-h100.yaml")]) == 0
    assert "expert-parallel" not in capsys.readouterr().err


def test_combined_1f1bs_paired_all_to_alls_are_an_uncertain_feature_run_without_as_interleaved():
    s = build_scenario({"model": {"preset": "mixtral-8x7b", "seq_len": 4096, "layers": 8},
                        "cluster": {"preset": "dgx-h100", "gpus": 32},
                        "training": {"global_batch": 128},
                        "parallel": {"pp": 2, "ep": 8, "schedule": "combined-1f1b",
                                     "virtual_stages": 2}})
    assert uncertain_features(s) == ["a2a_overlap"]
    [caveat] = with_caveats([Plan(s, simulate(s), None)], 0.0)[0].caveats
    assert caveat.without == {"parallel.schedule": "interleaved", "parallel.virtual_stages": 2}
    assert caveat.step_time_without_s > simulate(s).step_time_s  # the pairs hide all-to-alls
    assert "a2a-overlap +" in caveat.label(simulate(s).step_time_s)
    dense = apply_values(s.as_dict(), {"parallel.ep": 1})
    assert "a2a_overlap" not in uncertain_features(build_scenario(dense))
