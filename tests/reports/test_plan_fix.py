"""plan --fix pins fields, the search covers tp_comm_overlap and breaks ties by headroom, and
--save-best writes a scenario that simulate reproduces; Megatron-LM arguments of a plan."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from clustersim.cli import main
from clustersim.reports.megatron import megatron_args, megatron_command_line
from clustersim.reports.plan import PlanRequest, candidates
from clustersim.simulator.inputs.scenario import build_scenario, load_scenario

PLAN = ["plan", "--model", "llama2-7b", "--cluster", "dgx-a100-80gb", "--gpus", "16",
        "--global-batch", "64", "--seq-len", "2048"]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _plan_json(capsys, *extra: str) -> list[dict]:
    assert main([*PLAN, *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_fixed_fields_hold_in_every_plan(capsys):
    out = _plan_json(capsys, "--fix", "parallel.tp=2", "--fix", "parallel.zero=1",
                     "--fix", "training.micro_batch=1")
    assert out
    for item in out:
        p, t = item["scenario"]["parallel"], item["scenario"]["training"]
        assert (p["tp"], p["zero"], t["micro_batch"]) == (2, 1, 1)


def test_a_fixed_value_outside_the_search_is_honoured(capsys):
    # The search keeps tp within a node and never tries GPipe or overlap_grad_reduce off.
    out = _plan_json(capsys, "--fix", "parallel.tp=16", "--fix", "parallel.schedule=gpipe",
                     "--fix", "parallel.overlap_grad_reduce=false", "--top", "2")
    assert out
    for item in out:
        p = item["scenario"]["parallel"]
        assert (p["tp"], p["dp"], p["schedule"], p["overlap_grad_reduce"]) == \
            (16, 1, "gpipe", False)


@pytest.mark.parametrize("fix, field", [
    ("parallel.tpp=8", "parallel.tpp: unknown key; did you mean 'tp'?"),
    ("parallel.tp=eight", "parallel.tp"),
    ("parallel.tp", "--fix: expected dotted.path=value"),
    ("cluster.gpus=8", "cluster.gpus: set by --gpus"),
    ("parallel.tp=5", "--fix: no split of 16 GPUs with parallel.tp=5"),
    ("parallel.virtual_stages=64", "parallel.pp: model.layers = 32 is fewer than"),
])
def test_a_bad_fix_is_one_error_line(capsys, fix, field):
    code = main([*PLAN, "--fix", fix])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith(f"error: {field}") and err.count("\n") == 1


def test_the_search_covers_tp_comm_overlap_only_with_sequence_parallelism():
    req = PlanRequest(model={"preset": "llama2-7b", "seq_len": 2048},
                      cluster={"preset": "dgx-a100-80gb", "gpus": 16}, global_batch=64)
    base = build_scenario({"model": req.model, "cluster": {**req.cluster, "gpus": 1},
                           "training": {"global_batch": 1}})
    splits = list(candidates(req, base))
    assert {s["tp_comm_overlap"] for s in splits if s["tp"] > 1} == {False, True}
    assert all(s["sequence_parallel"] for s in splits if s["tp_comm_overlap"])
    assert {s["tp_comm_overlap"] for s in splits if s["tp"] == 1} == {False}


def test_ties_in_step_time_go_to_the_plan_with_more_headroom(capsys):
    # One micro-batch per replica (dp 2, global batch 2): ZeRO-2 reduce-scatters exactly once,
    # as ZeRO-1 does, so the two cost the same step with different memory: a tie to break.
    out = _plan_json(capsys, "--fix", "parallel.tp=8", "--fix", "parallel.pp=1", "--fix",
                     "parallel.recompute=none", "--global-batch", "2", "--top", "10")
    keys = [(round(i["result"]["step_time_s"], 9), i["result"]["memory"]["peak_bytes"])
            for i in out]
    assert keys == sorted(keys)
    assert len({k[0] for k in keys}) < len(keys)


def test_plan_and_simulate_agree_on_the_saved_best(capsys, tmp_path):
    best = tmp_path / "best.yaml"
    out = _plan_json(capsys, "--tokens", "1e11", "--save-best", str(best))
    assert main(["simulate", str(best), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["step_time_s"] == pytest.approx(out[0]["result"]["step_time_s"], rel=1e-12)
    assert again["memory"]["peak_bytes"] == out[0]["result"]["memory"]["peak_bytes"]
    assert again["time_to_train_s"] == pytest.approx(out[0]["result"]["time_to_train_s"])
    header = best.read_text().splitlines()[1]
    assert header == ("# Megatron-LM arguments of this split: "
                      + megatron_command_line(load_scenario(best)))


def test_save_best_refuses_a_missing_folder_before_searching(capsys, tmp_path):
    code = main([*PLAN, "--save-best", str(tmp_path / "no" / "best.yaml")])
    assert code == 2 and capsys.readouterr().err.startswith("error: --save-best")


def test_save_best_writes_nothing_when_nothing_fits(capsys, tmp_path):
    target = tmp_path / "best.yaml"
    code = main(["plan", "--model", "llama3-405b", "--cluster", "dgx-h100", "--gpus", "8",
                 "--global-batch", "8", "--save-best", str(target)])
    assert code == 2 and "no split fits" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def _parse(args: list[str]) -> dict:
    """The flags as Megatron-LM's argparse would read them: name -> value (True if bare)."""
    tokens = shlex.split(" ".join(a for a in args if not a.startswith("#")))
    parsed, i = {}, 0
    while i < len(tokens):
        name = tokens[i].removeprefix("--").replace("-", "_")
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            parsed[name], i = tokens[i + 1], i + 2
        else:
            parsed[name], i = True, i + 1
    return parsed


def test_megatron_arguments_rebuild_the_same_split():
    s = load_scenario(EXAMPLES / "llama3-70b-h100.yaml")
    a = _parse(megatron_args(s))
    tp, pp = int(a["tensor_model_parallel_size"]), int(a["pipeline_model_parallel_size"])
    cp = int(a.get("context_parallel_size", 1))
    # Megatron-LM derives dp = world / (tp*pp*cp) and micro-batches = gbs / (mbs*dp).
    dp = s.cluster.gpus // (tp * pp * cp)
    assert (tp, pp, cp, dp) == (s.parallel.tp, s.parallel.pp, s.parallel.cp, s.parallel.dp)
    assert int(a["global_batch_size"]) // (int(a["micro_batch_size"]) * dp) == s.microbatches
    assert int(a["num_virtual_stages_per_pipeline_rank"]) == s.parallel.virtual_stages
    assert a["sequence_parallel"] and a["recompute_granularity"] == "selective"
    assert a["use_distributed_optimizer"] and a["overlap_param_gather"] and a["bf16"]


@pytest.mark.parametrize("asynchronous", [True, False])
def test_blocking_pipeline_sends_are_megatrons_no_overlap_flag(asynchronous):
    """Megatron-LM overlaps an interleaved schedule's sends unless told not to: the flag is
    printed only where the scenario's sends block."""
    s = load_scenario(EXAMPLES / "llama3-70b-h100.yaml",
                      [f"parallel.overlap_p2p_comm={str(asynchronous).lower()}"])
    assert s.parallel.schedule == "interleaved"
    a = _parse(megatron_args(s))
    assert a.get("no_overlap_p2p_communication", False) is (not asynchronous)


@pytest.mark.parametrize("global_batch, group", [(128, None), (80, 5), (96, 6), (160, 5), (208, 7)])
def test_an_interleaved_count_off_the_pp_grid_names_megatrons_group_size(global_batch, group):
    """Megatron-LM walks interleaved micro-batches in groups of pp unless told otherwise, and
    refuses a count whose last group is shorter than pp: off the grid the plan names the
    group it was simulated with (``interleaved.microbatch_group``)."""
    s = load_scenario(EXAMPLES / "llama3-70b-h100.yaml",
                      [f"training.global_batch={global_batch}"])
    m, pp = s.microbatches, s.parallel.pp
    a = _parse(megatron_args(s))
    named = a.get("microbatch_group_size_per_virtual_pipeline_stage")
    assert (named and int(named)) == group
    size = group or pp
    assert pp <= size <= m and (m % size == 0 or m % size >= pp)


def test_fp8_parameters_are_megatrons_fp8_param_gather():
    s = load_scenario(EXAMPLES / "llama3-70b-fp8-nemo-h100.yaml")
    a = _parse(megatron_args(s))
    assert a["fp8_format"] == "hybrid" and a["fp8_param_gather"] and a["use_distributed_optimizer"]
    plain = load_scenario(EXAMPLES / "llama3-70b-fp8-nemo-h100.yaml",
                          ["training.fp8_param_gather=false"])
    assert "fp8_param_gather" not in _parse(megatron_args(plain))


@pytest.mark.parametrize("sets, flags, note", [
    ([], {}, None),
    (["training.master_weights=remainders"], {"use_precision_aware_optimizer": True}, None),
    (["training.master_weights=remainders", "training.optimizer_moments=bf16"],
     {"use_precision_aware_optimizer": True, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"},
     None),
    (["training.optimizer_moments=bf16"],
     {"use_precision_aware_optimizer": True, "exp_avg_dtype": "bf16"}, "remainders"),
    (["training.master_weights=none"], {}, "keeps none"),
    (["training.optimizer=sgd", "training.optimizer_moments=bf16"], {}, "Adam's only")])
def test_an_optimizer_state_in_fewer_bits_is_megatrons_precision_aware_optimizer(sets, flags,
                                                                                 note):
    """Megatron-LM's --use-precision-aware-optimizer sets the moments' type and, over bf16
    weights, keeps the master as remainder bits; what it cannot run is a comment."""
    s = load_scenario(EXAMPLES / "llama3-70b-h100.yaml", sets)
    args = megatron_args(s)
    a = _parse(args)
    assert {k: a[k] for k in flags} == flags
    if not flags:
        assert "use_precision_aware_optimizer" not in a
    notes = [x for x in args if x.startswith("#")]
    assert (note is None and not notes) or (len(notes) == 1 and note in notes[0])


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_2_and_3_are_a_comment_not_a_flag(zero):
    s = load_scenario(EXAMPLES / "llama3-70b-h100.yaml", [f"parallel.zero={zero}"])
    args = megatron_args(s)
    notes = [a for a in args if a.startswith("#")]
    assert len(notes) == 1 and f"zero {zero}" in notes[0]
    assert "--use-distributed-optimizer" not in args
    assert "zero" not in megatron_command_line(s)


def test_full_recomputation_recomputes_every_layer():
    s = load_scenario(EXAMPLES / "gpt-18b-a100.yaml")
    a = _parse(megatron_args(s))
    assert (a["recompute_granularity"], a["recompute_method"], a["recompute_num_layers"]) == \
        ("full", "uniform", "1")


@pytest.mark.parametrize("v, schedules", [(1, {"1f1b"}), (4, {"interleaved"})])
def test_pinned_virtual_stages_pick_the_schedule(v, schedules):
    req = PlanRequest(model={"preset": "llama2-7b", "seq_len": 2048},
                      cluster={"preset": "dgx-a100-80gb", "gpus": 16}, global_batch=64,
                      fixed={"parallel.virtual_stages": v})
    base = build_scenario({"model": req.model, "cluster": {**req.cluster, "gpus": 1},
                           "training": {"global_batch": 1}})
    splits = list(candidates(req, base))
    assert {s["schedule"] for s in splits} == schedules
    assert {s["virtual_stages"] for s in splits} == {v}


def test_end_chunks_without_layers_are_megatron_cores_pipeline_split_flags():
    """A first chunk holding the embedding alone and a last holding the head alone are what
    --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split make."""
    layers = ",".join(["0"] + ["1"] * 126 + ["0"])
    s = load_scenario(EXAMPLES / "llama3-405b-8k-meta-h100.yaml",
                      ["parallel.virtual_stages=8", f"parallel.stage_layers=[{layers}]"])
    a = _parse(megatron_args(s))
    assert a["account_for_embedding_in_pipeline_split"] and a["account_for_loss_in_pipeline_split"]
    even = _parse(megatron_args(load_scenario(EXAMPLES / "llama3-405b-8k-meta-h100.yaml")))
    assert "account_for_embedding_in_pipeline_split" not in even


def test_torchtitans_op_level_checkpointing_is_a_comment_not_a_flag():
    s = load_scenario(EXAMPLES / "llama3-70b-h100.yaml", ["training.framework=fsdp"])
    args = megatron_args(s)
    assert s.parallel.recomputed == {"op_sac"}
    assert "recompute_granularity" not in _parse(args)
    assert any(a.startswith("# recompute op_sac") for a in args)
