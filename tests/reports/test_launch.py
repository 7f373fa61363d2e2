"""A plan as its training stack launches it: torchtitan's options, Megatron-DeepSpeed's
arguments and DeepSpeed configuration (reports/launch.py)."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest

from clustersim.cli import main
from clustersim.reports.deepspeed_args import deepspeed_config
from clustersim.reports.launch import launch
from clustersim.simulator.inputs.scenario import load_scenario

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _flags(args: list[str]) -> dict[str, str | bool]:
    """The flags as an argparse-style reader takes them: name -> value (True if bare)."""
    tokens = shlex.split(" ".join(a for a in args if not a.startswith("#")))
    parsed, i = {}, 0
    while i < len(tokens):
        name = tokens[i].removeprefix("--")
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            parsed[name], i = tokens[i + 1], i + 2
        else:
            parsed[name], i = True, i + 1
    return parsed


def _scenario(stack: str, *sets: str):
    return load_scenario(EXAMPLES / "llama3-70b-h100.yaml", [
        f"training.framework={stack}", "parallel.tp_comm_overlap=false", *sets])


@pytest.mark.parametrize("sets", [(), ("parallel.zero=3",), ("parallel.pp=1", "parallel.tp=8",
                                                            "parallel.virtual_stages=1"),
                                  ("parallel.zero=3", "parallel.dp_shard=4")])
def test_torchtitan_options_rebuild_the_same_split(sets):
    """torchtitan's ParallelDims: dp_replicate x dp_shard x cp x tp x pp = world size; tokens
    per step = tokens per micro-batch x pipeline micro-batches x dp (TrainingConfig)."""
    s = _scenario("fsdp", *sets)
    a = _flags(launch(s).args)
    degree = {k: int(a.get(f"parallelism.{k}_degree", 1)) for k in (
        "data_parallel_replicate", "data_parallel_shard", "tensor_parallel",
        "pipeline_parallel", "context_parallel")}
    assert math.prod(degree.values()) == s.cluster.gpus
    assert degree["tensor_parallel"] == s.parallel.tp
    assert degree["pipeline_parallel"] == s.parallel.pp
    dp = degree["data_parallel_replicate"] * degree["data_parallel_shard"]
    per_step = int(a["training.num_tokens_per_train_step"])
    per_micro = int(a["training.num_tokens_per_microbatch_per_dp_rank"])
    assert per_step == s.training.global_batch * s.model.seq_len
    assert per_step // (per_micro * dp) == s.microbatches
    if s.parallel.pp > 1:
        assert int(a["parallelism.num_pp_microbatches"]) == s.microbatches


@pytest.mark.parametrize("zero, pp, resharded", [(3, 1, True), (2, 1, False), (3, 4, True),
                                                 (2, 4, False)])
def test_torchtitans_reshard_policy_is_the_zero_stage(zero, pp, resharded):
    """``get_fsdp_reshard_after_forward_policy`` (torchtitan/distributed/fsdp.py): always,
    never, or default (reshard unless there is a pipeline)."""
    s = _scenario("fsdp", f"parallel.zero={zero}", f"parallel.pp={pp}",
                  "parallel.virtual_stages=1", f"parallel.dp={512 // (8 * pp)}")
    policy = _flags(launch(s).args)["parallelism.fsdp_reshard_after_forward"]
    assert {"always": True, "never": False, "default": pp == 1}[policy] == resharded


@pytest.mark.parametrize("split, weight", [("ends_as_layers", 1), ("even", 0)])
def test_torchtitan_makes_the_interleaved_chunks_of_the_split(split, weight):
    """torchtitan's stage count: ceil((layers + the end stages' weights) / layers per stage)
    (``get_pipeline_metadata``), weights 1 by default (``layer_split: ends_as_layers``, framework
    fsdp's) or 0; two stages per rank need no option."""
    s = _scenario("fsdp", "parallel.virtual_stages=3", f"parallel.layer_split={split}")
    a = _flags(launch(s).args)
    per_stage = int(a["parallelism.pipeline_parallel_layers_per_stage"])
    weights = int(a.get("parallelism.pipeline_parallel_first_stage_less_layers", 1)) + int(
        a.get("parallelism.pipeline_parallel_last_stage_less_layers", 1))
    assert weights == 2 * weight
    assert math.ceil((s.model.layers + weights) / per_stage) == s.parallel.pp * 3
    assert a["parallelism.pipeline_parallel_schedule"] == "Interleaved1F1B"
    two = _flags(launch(_scenario("fsdp", "parallel.virtual_stages=2")).args)
    assert "parallelism.pipeline_parallel_layers_per_stage" not in two


@pytest.mark.parametrize("global_batch, note", [
    (128, None),
    (160, "runs 2 rounds of 5; simulated as Megatron-LM's groups of 5"),
    (208, "refuses a count that is no multiple of its 3 rounds; simulated as Megatron-LM's "
          "groups of 7")])
def test_torchtitan_says_how_torch_walks_an_interleaved_count_off_the_pp_grid(global_batch,
                                                                               note):
    """torch's ScheduleInterleaved1F1B runs ``m // pp`` equal rounds and refuses a count they do
    not divide (``number_of_rounds``); on the grid there is nothing to say."""
    s = _scenario("fsdp", f"training.global_batch={global_batch}")
    comments = [a for a in launch(s).args if "ScheduleInterleaved1F1B" in a]
    assert [c.split(": torch's ScheduleInterleaved1F1B ")[1] for c in comments] == \
        ([note] if note else [])


def test_deepspeed_arguments_and_config_rebuild_the_same_split():
    s = _scenario("deepspeed", "parallel.zero=1", "parallel.virtual_stages=1")
    a = _flags(launch(s).args)
    tp, pp = int(a["tensor-model-parallel-size"]), int(a["pipeline-model-parallel-size"])
    assert (tp, pp) == (s.parallel.tp, s.parallel.pp)
    config = launch(s).config
    dp = s.cluster.gpus // (tp * pp)
    assert config["train_batch_size"] // (config["train_micro_batch_size_per_gpu"] * dp) == \
        s.microbatches
    assert config["zero_optimization"]["stage"] == int(a["zero-stage"]) == 1
    assert config["bf16"] == {"enabled": True} and "data_types" not in config


def test_hybrid_sharding_is_each_stacks_own_setting():
    """Megatron-LM: copies of the distributed optimizer (--num-distributed-optimizer-
    instances); torchtitan: the replicate and shard degrees (checked above); DeepSpeed:
    MiCS's ``mics_shard_size`` under ZeRO-3, and a comment below it, where it has none."""
    megatron = _flags(launch(_scenario("megatron", "parallel.dp_shard=4")).args)
    assert megatron["use-distributed-optimizer"] is True
    assert megatron["num-distributed-optimizer-instances"] == "4"  # dp 16 over 4 copies
    whole = ("parallel.pp=1", "parallel.virtual_stages=1", "parallel.schedule=1f1b")
    zero3 = launch(_scenario("deepspeed", "parallel.zero=3", "parallel.dp_shard=8", *whole))
    assert zero3.config["zero_optimization"] == {"stage": 3, "mics_shard_size": 8}
    zero1 = launch(_scenario("deepspeed", "parallel.zero=1", "parallel.dp_shard=8", *whole))
    assert "mics_shard_size" not in zero1.config["zero_optimization"]
    assert any(a.startswith("# dp_shard 8") for a in zero1.args)


def test_deepspeed_config_says_what_differs_from_deepspeeds_defaults():
    """Under ZeRO DeepSpeed accumulates bf16 gradients; fp32 ones must be asked for
    (``data_types.grad_accum_dtype``), as an overlap its stage does not default to must."""
    s = _scenario("deepspeed", "parallel.zero=1", "parallel.virtual_stages=1",
                  "training.grad_dtype=fp32", "parallel.overlap_grad_reduce=true")
    config = deepspeed_config(s)
    assert config["data_types"] == {"grad_accum_dtype": "fp32"}
    assert config["zero_optimization"]["overlap_comm"] is True


def test_deepspeeds_zero_bubble_is_megatron_deepspeeds_flag():
    s = _scenario("deepspeed", "parallel.zero=1", "parallel.schedule=zb-h1",
                  "parallel.virtual_stages=1", "parallel.sequence_parallel=false")
    assert _flags(launch(s).args)["enable-zbh1-pipeline"] is True


def test_plan_prints_the_stacks_own_arguments(capsys):
    code = main(["plan", "--model", "llama2-7b", "--cluster", "dgx-a100-80gb", "--gpus", "16",
                 "--seq-len", "2048", "--global-batch", "64", "--top", "2",
                 "--framework", "fsdp"])
    out = capsys.readouterr().out
    assert code == 0 and "torchtitan arguments of #1: --parallelism." in out
    assert "Megatron-LM arguments" not in out
    assert main(["plan", "--model", "llama2-7b", "--cluster", "dgx-a100-80gb", "--gpus", "16",
                 "--seq-len", "2048", "--global-batch", "64", "--top", "2", "--json",
                 "--fix", "training.framework=deepspeed"]) == 0
    plans = json.loads(capsys.readouterr().out)
    assert {p["plan"]["launch"]["stack"] for p in plans} == {"Megatron-DeepSpeed"}
    assert all(p["plan"]["launch"]["config"]["train_batch_size"] == 64 for p in plans)


def test_framework_flag_and_a_pin_that_disagree_are_one_error(capsys):
    code = main(["plan", "--model", "llama2-7b", "--cluster", "dgx-a100-80gb", "--gpus", "16",
                 "--framework", "fsdp", "--fix", "training.framework=deepspeed"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --framework:") and err.count("\n") == 1


def test_chunks_torchtitan_cannot_count_out_are_a_comment():
    """80 layers + 2 in 20 chunks: no layers per stage makes torchtitan count 20."""
    args = launch(_scenario("fsdp", "parallel.virtual_stages=5")).args
    assert not any("layers_per_stage" in a for a in args)
    assert any(a.startswith("# chunks of [4, 5, 4") for a in args)


@pytest.mark.parametrize("stack, zero", [("deepspeed", 1), ("fsdp", 3)])
def test_an_optimizer_state_the_stack_does_not_keep_is_a_comment(stack, zero):
    """DeepSpeed's and torch.optim's Adam keep fp32 moments beside a whole master: bf16
    moments (DeepSeek-V3's) have no flag there, so the launch says so instead."""
    sets = ("parallel.virtual_stages=1", f"parallel.zero={zero}")
    plain = launch(_scenario(stack, *sets))
    lean = launch(_scenario(stack, *sets, "training.optimizer_moments=bf16"))
    assert lean.command_line() == plain.command_line()
    added = [n for n in lean.notes() if n not in plain.notes()]
    assert len(added) == 1 and "optimizer_moments bf16" in added[0]


def test_a_backward_overlap_megatron_deepspeed_turns_off_is_a_comment():
    """Megatron-DeepSpeed sets ``async_tensor_model_parallel_allreduce = False`` whenever
    DeepSpeed runs: its default (off without sequence parallelism) launches as is, an overlap
    asked for has no flag and says so."""
    sets = ("parallel.virtual_stages=1", "parallel.zero=1", "parallel.sequence_parallel=false")
    default = launch(_scenario("deepspeed", *sets))
    asked = launch(_scenario("deepspeed", *sets, "parallel.tp_backward_overlap=true"))
    assert asked.command_line() == default.command_line()
    added = [n for n in asked.notes() if n not in default.notes()]
    assert len(added) == 1 and "tp_backward_overlap" in added[0]


@pytest.mark.parametrize("stack, cp_comm, flag", [
    ("megatron", "p2p", None), ("megatron", "allgather", ("cp-comm-type", "allgather")),
    ("megatron", "a2a", ("cp-comm-type", "a2a")),
    ("fsdp", "allgather", None),  # torchtitan's default rotation
    ("fsdp", "p2p", ("parallelism.context_parallel_rotate_method", "alltoall")),
    ("deepspeed", "a2a", ("ds-sequence-parallel-size", "2")),
])
def test_each_stack_names_its_context_parallel_exchange(stack, cp_comm, flag):
    """Megatron-LM's --cp-comm-type (p2p its default), torchtitan's rotate method (allgather
    its default; alltoall passes shards round the ring), Megatron-DeepSpeed's Ulysses degree."""
    sets = ["parallel.cp=2", "parallel.tp=4", f"parallel.cp_comm={cp_comm}"]
    if stack == "deepspeed":
        sets.append("parallel.virtual_stages=1")
    args = launch(_scenario(stack, *sets)).args
    a = _flags(args)
    named = {k: v for k, v in a.items() if k in ("cp-comm-type", "ds-sequence-parallel-size",
                                                  "parallelism.context_parallel_rotate_method")}
    assert named == (dict([flag]) if flag else {})


def test_an_exchange_the_stack_lacks_is_a_comment():
    """torchtitan has no head all-to-all; Megatron-DeepSpeed's only CP is Ulysses'."""
    titan = launch(_scenario("fsdp", "parallel.cp=2", "parallel.tp=4", "parallel.cp_comm=a2a"))
    assert any(a.startswith("# cp_comm a2a: torchtitan") for a in titan.args)
    ds = launch(_scenario("deepspeed", "parallel.cp=2", "parallel.tp=4",
                          "parallel.virtual_stages=1", "parallel.cp_comm=p2p"))
    assert any(a.startswith("# cp_comm p2p: DeepSpeed") for a in ds.args)
    assert "ds-sequence-parallel-size" not in _flags(ds.args)


@pytest.mark.parametrize("tp, cp, sizes", [(1, 16, "8 2"), (2, 8, "4 2"), (8, 2, "1 2")])
def test_hierarchical_cp_names_its_levels(tp, cp, sizes):
    """--hierarchical-context-parallel-sizes: the all-to-all over a node's CP ranks, the ring
    over the nodes (8 GPUs a node, CP ranks tp apart)."""
    s = _scenario("megatron", f"parallel.tp={tp}", f"parallel.cp={cp}", "parallel.pp=1",
                  "parallel.virtual_stages=1", "parallel.cp_comm=a2a+p2p",
                  "model.seq_len=32768")
    args = launch(s).args
    assert _flags(args)["cp-comm-type"] == "a2a+p2p"
    assert f"--hierarchical-context-parallel-sizes {sizes}" in args  # nargs='+'

