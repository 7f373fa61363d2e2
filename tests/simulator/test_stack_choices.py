"""What each training stack runs, and that the planner searches nothing else under it
(simulator/inputs/stack_choices.py; docs/frameworks.md, "What the planner searches")."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim.errors import ScenarioError
from clustersim.reports.plan import PlanRequest
from clustersim.reports.plan_parallel import search_splits
from clustersim.reports.plan_search import candidates
from clustersim.simulator.inputs import frameworks, stack_choices
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.pipeline.schedules import SCHEDULES

DOCS = Path(__file__).resolve().parents[2] / "docs" / "frameworks.md"


def _splits(stack: str, **training) -> list[dict]:
    req = PlanRequest(model={"preset": "llama2-7b", "seq_len": 2048},
                      cluster={"preset": "dgx-a100-80gb", "gpus": 32}, global_batch=64,
                      training={"framework": stack, **training})
    base = build_scenario({"model": req.model, "cluster": {**req.cluster, "gpus": 1},
                           "training": {"global_batch": 1, **req.training}})
    return list(candidates(req, base))


def test_megatron_searches_every_schedule_and_the_tp_overlap():
    splits = _splits("megatron")
    searched = {name for name, s in SCHEDULES.items() if s.searched}
    assert {s["schedule"] for s in splits} == searched
    assert any(s["tp_comm_overlap"] for s in splits)
    assert {s["zero"] for s in splits if s["pp"] > 1} == {0, 1, 3}


def test_deepspeed_runs_its_pipeline_engines_schedules_and_no_tp_overlap():
    """TrainSchedule (1F1B) or ZB-H1 (--enable-zbh1-pipeline, refused with sequence
    parallelism); ZeRO-2/3 only without a pipeline; under bf16 stage 0 is the BF16_Optimizer,
    which shards like stage 1: searched once."""
    splits = _splits("deepspeed")
    assert {s["schedule"] for s in splits if s["pp"] > 1} == {"1f1b", "zb-h1"}
    assert not any(s["schedule"] == "zb-h1" and s["sequence_parallel"] for s in splits)
    assert not any(s["tp_comm_overlap"] for s in splits)
    assert {s["zero"] for s in splits if s["pp"] > 1} == {1}
    assert {s["zero"] for s in splits if s["pp"] == 1 and s["dp"] > 1} == {1, 2, 3}
    fp16 = _splits("deepspeed", precision="fp16")
    assert {s["zero"] for s in fp16 if s["pp"] > 1 and s["dp"] > 1} == {0, 1}


def test_fsdp_runs_torchtitans_schedules_with_fsdp2s_sharding():
    splits = _splits("fsdp")
    assert {s["schedule"] for s in splits if s["pp"] > 1} == {
        "1f1b", "interleaved", "zb-v", "dualpipev"}  # GPipe runs, but is never searched
    assert not any(s["tp_comm_overlap"] for s in splits)
    many = [s for s in splits if s["dp"] > 1]
    assert {s["zero"] for s in many} == {0, 2, 3}  # FSDP2 has no ZeRO-1


def test_fsdp_under_a_pipeline_searches_zero_2_not_zero_3():
    """torchtitan keeps the weights gathered under a pipeline by default, and PyTorch's
    pipelining holds whole gradients until after the last backward: ZeRO-3 saves nothing
    there, while the model's per-micro-batch ZeRO-3 would promise it shards' memory."""
    pipelined = [s for s in _splits("fsdp") if s["pp"] > 1 and s["dp"] > 1]
    assert {s["zero"] for s in pipelined} == {0, 2}
    assert stack_choices.zero_stages("fsdp", True, "bf16") == (0, 2)
    assert stack_choices.zero_stages("fsdp", False, "bf16") == (0, 2, 3)


def test_op_level_selective_recomputation_is_searched_beside_fused_attention():
    """Megatron-LM's selective recomputation drops the attention core, which fused attention
    does not keep: nothing to search. torchtitan's op-level checkpointing re-runs half the
    matmuls and the element-wise ops: a trade of its own."""
    assert "selective" not in {s["recompute"] for s in _splits("megatron")}
    assert "selective" in {s["recompute"] for s in _splits("fsdp")}
    unfused = _splits("megatron", flash_attention=False)
    assert "selective" in {s["recompute"] for s in unfused}


@pytest.mark.parametrize("stack", frameworks.FRAMEWORKS)
def test_no_searched_split_is_one_its_stack_refuses(stack):
    """The choices agree with the stack's rules (``frameworks.resolve`` refuses what DeepSpeed
    cannot run) and are not rewritten by them: each split builds with the ZeRO stage it was
    searched with, or fails a rule of the split's shape (batch, layers), never the stack's."""
    built = 0
    for split in _splits(stack)[::7]:
        parallel = {k: split[k] for k in ("tp", "pp", "dp", "schedule", "virtual_stages", "zero",
                                          "recompute", "sequence_parallel", "tp_comm_overlap")}
        try:
            s = build_scenario({"model": {"preset": "llama2-7b", "seq_len": 2048},
                                "cluster": {"preset": "dgx-a100-80gb", "gpus": 32},
                                "training": {"global_batch": 64, "framework": stack,
                                             "micro_batch": split["micro_batch"]},
                                "parallel": parallel})
        except ScenarioError as e:
            assert "DeepSpeed" not in e.message, e  # frameworks._check: the stack refuses
            continue
        assert s.parallel.zero == split["zero"]
        built += 1
    assert built > 20


def test_the_docs_print_the_choices():
    assert stack_choices.markdown_table() in DOCS.read_text()


@pytest.mark.parametrize("pp, m, runs", [(4, 8, True), (4, 10, True), (4, 13, False),
                                         (4, 26, False), (2, 3, True), (2, 25, False)])
def test_torch_walks_interleaved_micro_batches_in_equal_rounds(pp, m, runs):
    """torch's ScheduleInterleaved1F1B runs ``m // pp`` rounds of equal size and refuses a count
    they do not divide (``number_of_rounds``); Megatron-LM runs any count of at least pp in
    its groups, and other schedules are not held to rounds."""
    assert stack_choices.microbatches_run("fsdp", "interleaved", pp, m) is runs
    assert stack_choices.microbatches_run("megatron", "interleaved", pp, m)
    assert stack_choices.microbatches_run("fsdp", "1f1b", pp, m)


def test_a_torchtitan_plan_holds_no_interleaved_count_torch_refuses():
    """llama2-7b on 32 A100s, global batch 26: four stages leave 13 or 26 micro-batches a
    pipeline, which Megatron-LM runs interleaved in its groups and torch does not."""
    def refused(s) -> bool:
        m, pp = s.microbatches, s.parallel.pp
        return s.parallel.schedule == "interleaved" and m % max(1, m // pp) != 0

    for stack, found in (("megatron", True), ("fsdp", False)):
        req = PlanRequest(model={"preset": "llama2-7b", "seq_len": 2048},
                          cluster={"preset": "dgx-a100-80gb", "gpus": 32}, global_batch=26,
                          training={"framework": stack})
        search = search_splits(req, keep=10, prune=False)  # every split that fits is estimated
        assert any(refused(s) for _, s in search.fitting) is found, stack
