"""What the planner searches (pipeline depths that divide the layers, micro-batches up to what
memory allows) and that its two shortcuts (skipping larger micro-batches once a split is out of
memory; skipping the estimate of a split a bound shows too slow) never change its answer."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest

from clustersim.errors import ScenarioError
from clustersim.reports.plan import PlanRequest, plan
from clustersim.reports.plan_bound import compute_floor_s, end_stages_floor_s, step_floor_s
from clustersim.reports.plan_parallel import search_splits
from clustersim.reports.plan_search import (
    _raw,
    _split_key,
    candidates,
    context_parallel_candidates,
    fits_in_memory,
    micro_batch_candidates,
    pipeline_depth_candidates,
    stages_to_check,
)
from clustersim.simulator.costs import memory as mem
from clustersim.simulator.costs.split_backward import splits_backward
from clustersim.simulator.costs.stage_costs import StageCosts
from clustersim.simulator.inputs.scenario import build_scenario

# A small problem with both shortcuts at work: llama2-13b at 4K tokens on 16 A100 40GB, where
# large micro-batches run out of memory.
SMALL = PlanRequest(model={"preset": "llama2-13b", "seq_len": 4096},
                    cluster={"preset": "dgx-a100-40gb", "gpus": 16}, global_batch=64)


def _base(req: PlanRequest):
    return build_scenario({"model": req.model, "cluster": {**req.cluster, "gpus": 1},
                           "training": {"global_batch": 1}})


def _divisors(n: int) -> set[int]:
    return {d for d in range(1, n + 1) if n % d == 0}


def test_pipeline_depths_are_the_powers_of_two_and_the_divisors_of_the_layers():
    # 96 layers (GPT-3): 6, 12 and 24 as GPT-3-class runs use; 70 layers (BLOOM-176B): 12,
    # a divisor of 70 + 2, as BLOOM ran; never deeper than the layers or the GPUs.
    assert {3, 6, 12, 24, 48, 96} <= set(pipeline_depth_candidates(96, 1536))
    assert set(pipeline_depth_candidates(70, 384)) == (
        {1, 2, 4, 8, 16, 32, 64} | _divisors(70) | (_divisors(72) - {72}))
    assert max(pipeline_depth_candidates(96, 16)) == 16


def test_gpt3_on_1536_gpus_is_searched_at_pp_6_12_and_24():
    req = PlanRequest(model={"preset": "gpt3-175b", "seq_len": 2048},
                      cluster={"preset": "dgx-a100-80gb", "gpus": 1536}, global_batch=1536)
    depths = {split["pp"] for split in candidates(req, _base(req)) if split["tp"] == 8}
    assert {6, 12, 24} <= depths
    # on 1,024 GPUs a depth must divide them: only powers of two are left
    req = PlanRequest(model=req.model, cluster={**req.cluster, "gpus": 1024}, global_batch=1536)
    depths = {split["pp"] for split in candidates(req, _base(req))}
    assert depths == {1, 2, 4, 8, 16, 32, 64}


def test_micro_batches_go_up_to_a_replicas_share_of_the_batch():
    assert micro_batch_candidates(1536, 32) == [1, 2, 4, 8, 16]  # 48 sequences per replica
    assert micro_batch_candidates(64, 1) == [1, 2, 4, 8, 16, 32, 64]
    assert micro_batch_candidates(64, 3) == []  # the batch does not split over 3 replicas


def test_micro_batch_8_and_more_is_planned_where_memory_allows():
    # llama2-7b at 2K tokens on 8 A100 80GB: with tp 8 and no recomputation a GPU holds 32
    # sequences' activations (64 run out), so micro-batches 8, 16 and 32 are all estimated;
    # other splits stop earlier, some at 8.
    req = PlanRequest(model={"preset": "llama2-7b", "seq_len": 2048},
                      cluster={"preset": "dgx-a100-80gb", "gpus": 8}, global_batch=128)
    search = search_splits(req, keep=10, prune=False)  # every split that fits is estimated
    assert {8, 16, 32} <= {s.training.micro_batch for _, s in search.fitting}
    split = {"tp": 8, "pp": 1, "recompute": "none", "zero": 0, "tp_comm_overlap": False}
    first_out = [mb for key, mb in search.out_of_memory.items()
                 if split.items() <= dict(key[:-2]).items()]
    assert first_out == [64]
    assert 8 in search.out_of_memory.values()


def _fits_by_micro_batch(req: PlanRequest) -> dict[tuple, list[tuple[int, bool, str]]]:
    """Every valid split of ``req``: per split, (micro-batch, fits, schedule) in order."""
    base = _base(req)
    verdicts: dict[tuple, list[tuple[int, bool, str]]] = defaultdict(list)
    for split in candidates(req, base):
        try:
            s = build_scenario(_raw(req, split))
        except ScenarioError:
            continue
        verdicts[_split_key(split, s)].append(
            (split["micro_batch"], fits_in_memory(s, req.memory_reserve), s.parallel.schedule))
    return {key: sorted(runs) for key, runs in verdicts.items()}


def test_memory_never_shrinks_as_the_micro_batch_grows():
    """The assumption the micro-batch shortcut rests on, checked on every split of the small
    problem whose schedule runs whole backwards: along its micro-batches, fitting is a
    prefix. A split backward breaks it (ZB-V with full recomputation defers 2p - 1 weight
    halves, each its GEMMs' operands, once m >= 2p, one when m = p), and is not pruned."""
    changed = 0
    for runs in _fits_by_micro_batch(SMALL).values():
        fits = [ok for _, ok, _ in runs]
        if splits_backward(runs[0][2]):
            continue
        assert fits == sorted(fits, reverse=True)  # True... then False...
        changed += True in fits and False in fits
    assert changed > 10  # the small problem does run out of memory along many splits


def test_a_split_backward_can_fit_at_a_larger_micro_batch_only():
    zb_v = [runs for runs in _fits_by_micro_batch(SMALL).values() if runs[0][2] == "zb-v"]
    assert any([ok for _, ok, _ in runs] != sorted([ok for _, ok, _ in runs], reverse=True)
               for runs in zb_v)


# Deep pipelines near the 40 GB limit: llama2-13b (40 layers) at 4K tokens on 64 A100 40GB.
DEEP = PlanRequest(model={"preset": "llama2-13b", "seq_len": 4096},
                   cluster={"preset": "dgx-a100-40gb", "gpus": 64}, global_batch=256)


@pytest.fixture(scope="module")
def deep_splits() -> list[tuple]:
    """Every valid split of the deep problem with each stage's peak bytes."""
    out = []
    for split in candidates(DEEP, _base(DEEP)):
        try:
            s = build_scenario(_raw(DEEP, split))
        except ScenarioError:
            continue
        out.append((s, [m.peak_bytes for m in mem.memory_per_stage(s)]))
    return out


@pytest.mark.parametrize("reserve", [0.0, 0.05, 0.3])
def test_checking_the_busiest_of_alike_stages_decides_as_checking_every_stage(deep_splits,
                                                                               reserve):
    """The memory shortcut: of middle stages alike but for their micro-batches in flight only
    the one holding the most is checked; on every split of the deep problem (every schedule,
    depth and micro-batch) the answer is the one every stage's memory gives."""
    skipped = outcomes = 0
    for s, peaks in deep_splits:
        every = all(peak <= (1 - reserve) * s.cluster.gpu.tensor_memory_bytes for peak in peaks)
        assert fits_in_memory(s, reserve) == every, s.name
        skipped += len(stages_to_check(s)) < s.parallel.pp
        outcomes |= 1 << every
    assert skipped > 100 and outcomes == 3  # the shortcut was taken; both answers occurred


def test_the_shortcuts_never_change_the_plans():
    pruned = search_splits(SMALL, keep=20, prune=True)
    exhaustive = search_splits(SMALL, keep=20, prune=False)
    assert pruned.skipped_memory > 0 and pruned.skipped_slow > 0  # both shortcuts were taken
    assert exhaustive.skipped_memory == exhaustive.skipped_slow == 0
    assert (pruned.valid, pruned.fit) == (exhaustive.valid, exhaustive.fit)

    def best(search) -> list[tuple[float, str]]:
        return sorted((step, s.name) for step, s in search.fitting)[:20]

    assert best(pruned) == best(exhaustive)  # the same shortlist reaches the engine
    fast, _, _ = plan(SMALL, top=3)
    slow, _, _ = plan(SMALL, top=3, prune=False)
    assert [p.scenario.name for p in fast] == [p.scenario.name for p in slow]
    assert [p.result.step_time_s for p in fast] == pytest.approx(
        [p.result.step_time_s for p in slow], rel=1e-12)


def test_best_first_estimates_only_the_splits_whose_bound_beats_the_keep_th():
    """The second pass (``plan_rank.py``) estimates the splits that fit best bound first and
    stops at the first bound that cannot beat the ``keep``-th estimate. Oracle: the
    exhaustive search's estimate of every split that fits, in the order considered; a split
    must be estimated exactly when its bound (the tighter of the two floors), with its place
    in the order, comes before the exhaustive ``keep``-th (step, place): no fewer, or the
    shortlist could change, and no more, or best first saves nothing."""
    keep = 20
    exhaustive = search_splits(SMALL, keep, prune=False)
    pruned = search_splits(SMALL, keep, prune=True)
    every = exhaustive.fitting  # (step, scenario), in the order considered
    kth = sorted((step, i) for i, (step, _) in enumerate(every))[keep - 1]
    floor = compute_floor_s(every[0][1])
    needed = [s.name for i, (_, s) in enumerate(every)
              if (max(step_floor_s(s, floor), end_stages_floor_s(s, StageCosts(s))), i) <= kth]
    assert [s.name for _, s in pruned.fitting] == needed
    assert len(needed) < len(every) / 2  # the bounds did skip most
    assert pruned.skipped_slow == len(every) - len(needed)



@pytest.mark.parametrize("seq_len, sizes", [
    (8192, [1]), (16384, [1, 2, 4, 8]), (32768, [1, 2, 4, 8]),
    (131072, [1, 2, 4, 8, 16, 32]),  # Llama 3 405B's 128K tokens ran on cp 16
    (1048576, [1, 2, 4, 8, 16, 32, 64, 128, 256])])  # NeMo's 1M tokens on cp 32
def test_context_parallelism_grows_with_the_sequence_down_to_4k_tokens_a_rank(seq_len, sizes):
    assert context_parallel_candidates(seq_len) == sizes


@pytest.mark.parametrize("framework, exchanges", [
    ("megatron", {"p2p", "allgather", "a2a", "a2a+p2p"}), ("deepspeed", {"a2a"}),
    ("fsdp", {"allgather", "p2p"})])
def test_context_parallel_splits_come_with_each_exchange_the_stack_runs(framework, exchanges):
    """A long sequence: every cp > 1 split is tried with each ``cp_comm`` the stack offers
    (Megatron-Core's --cp-comm-type, DeepSpeed's Ulysses, torchtitan's two rotations); a cp 1
    split has none to choose; a pinned one is the only one."""
    req = PlanRequest(model={"preset": "llama3-8b", "seq_len": 65536},
                      cluster={"preset": "dgx-h100", "gpus": 32}, global_batch=32,
                      training={"framework": framework})
    base = build_scenario({"model": req.model, "cluster": {**req.cluster, "gpus": 1},
                           "training": {"global_batch": 1, "framework": framework}})
    splits = list(candidates(req, base))
    by_shape = defaultdict(set)
    for s in splits:
        by_shape[(s["tp"], s["cp"], s["pp"])].add(s.get("cp_comm"))
    assert {shape[1] for shape in by_shape} == {1, 2, 4, 8, 16}
    for (_, cp, _), found in by_shape.items():
        assert found == ({None} if cp == 1 else exchanges)
    pinned = dataclasses.replace(req, fixed={"parallel.cp_comm": "a2a"})
    assert {s.get("cp_comm") for s in candidates(pinned, base) if s["cp"] > 1} == {"a2a"}


def test_fsdp_searches_one_sharded_copy_a_node_beside_fsdp_over_every_rank():
    """torchtitan's HSDP: FSDP over a node's data-parallel ranks (8 / tp), replicated across
    nodes, only under the fsdp stack and only where the replicas span nodes; Megatron-LM's
    search keeps plain ZeRO (its instances are pinned with --fix parallel.dp_shard)."""
    req = PlanRequest(model={"preset": "llama2-7b"}, cluster={"preset": "dgx-h100", "gpus": 64},
                      global_batch=256, training={"framework": "fsdp"})
    base = build_scenario({"model": req.model, "cluster": {**req.cluster, "gpus": 1},
                           "training": {"global_batch": 1, "framework": "fsdp"}})
    found = {(s["tp"], s["zero"], s.get("dp_shard")) for s in candidates(req, base)
             if s["pp"] == 1 and s["cp"] == 1}
    assert {(1, 3, 8), (1, 3, None), (2, 2, 4), (4, 3, 2)} <= found
    assert not any(sh for tp, _, sh in found if tp == 8)  # tp 8: one replica a node
    assert not any(sh for _, z, sh in found if z == 0)  # ZeRO-0 shards nothing
    megatron = PlanRequest(model=req.model, cluster=req.cluster, global_batch=256)
    assert not any(s.get("dp_shard") for s in candidates(megatron, _base(megatron)))


def test_hsdp_is_the_plan_where_fsdp_over_every_rank_would_gather_across_nodes():
    """docs/planner.md: llama2-7b on 4,096 H100 at 4 sequences a GPU: one copy a node."""
    req = PlanRequest(model={"preset": "llama2-7b"}, cluster={"preset": "dgx-h100", "gpus": 4096},
                      global_batch=16384, training={"framework": "fsdp"})
    plans = plan(req, top=5)[0]
    shapes = [(b.scenario.parallel.tp, b.scenario.parallel.dp, b.scenario.parallel.zero,
               b.scenario.parallel.dp_shard, b.scenario.training.micro_batch) for b in plans]
    assert shapes[:2] == [(1, 4096, 2, 8, 2), (1, 4096, 3, 8, 2)]  # z2-shard8, then z3-shard8
    assert [round(b.result.mfu, 3) for b in plans[:2]] == [0.442, 0.438]
    flat = next(b for b, shape in zip(plans, shapes, strict=True) if shape[3] is None)  # every rank
    assert round(flat.result.mfu, 3) == 0.420


MOE = PlanRequest(model={"preset": "mixtral-8x7b", "seq_len": 4096},
                  cluster={"preset": "dgx-h100", "gpus": 16}, global_batch=64)


def _shapes(req: PlanRequest) -> set[tuple]:
    return {(d["tp"], d["dp"], d["ep"], d.get("expert_tp")) for d in candidates(req, _base(req))}


def test_moe_experts_are_searched_folded_over_tp_where_ep_divides_the_stage():
    shapes = _shapes(MOE)
    # unfolded, ep divides dp; folded (expert_tp 1), ep divides tp * dp, ep > 1 and tp > 1
    assert all(dp % ep == 0 for tp, dp, ep, etp in shapes if etp is None)
    folded = {(tp, dp, ep) for tp, dp, ep, etp in shapes if etp == 1}
    assert folded and all(tp > 1 and ep > 1 and (tp * dp) % ep == 0 for tp, dp, ep in folded)
    assert (8, 2, 8) in folded and (8, 2, 8, None) not in shapes  # EP 8 over a node's TP 8
    assert all(etp in (None, 1) for *_, etp in shapes)


def test_a_pinned_expert_tp_is_the_only_one_searched():
    folded = _shapes(dataclasses.replace(MOE, fixed={"parallel.expert_tp": 1}))
    # at tp 1 the experts are whole anyway; above it, whole experts even without EP
    assert {etp for tp, *_, etp in folded if tp > 1} == {1}
    assert any(ep == 1 and tp > 1 for tp, _, ep, _ in folded)
    unfolded = _shapes(dataclasses.replace(MOE, fixed={"parallel.expert_tp": None}))
    assert {etp for *_, etp in unfolded} == {None}
