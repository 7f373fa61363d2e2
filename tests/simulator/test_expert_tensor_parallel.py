"""``parallel.expert_tp: 1``: MoE parallel folding (Megatron-Core's
``--expert-tensor-parallel-size 1``; Liu et al. 2025, arXiv 2504.14960). The routed experts stay
whole and the expert-parallel group is drawn from all of a stage's ``tp * cp * dp`` ranks, so
each rank dispatches its own sequence shard and nothing is gathered over TP around the
experts. Oracles: one layer's expert FLOPs, parameters, groups and saved tensors counted by
hand, and the unfolded split they must match or differ from."""

from __future__ import annotations

import pytest
import simpy

from clustersim.errors import ScenarioError
from clustersim.reports.labels import config_label, split_columns
from clustersim.reports.megatron import megatron_args
from clustersim.reports.torchtitan_args import torchtitan_args
from clustersim.simulator.closed_form import analytic
from clustersim.simulator.costs import memory as mem
from clustersim.simulator.costs.cost_model import CostModel
from clustersim.simulator.costs.layer_comm import tp_collectives
from clustersim.simulator.discrete_event.comm import FabricComm
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.placement import expert_levels
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.model import activations as act
from clustersim.simulator.model import workload as wl
from clustersim.simulator.model.param_counts import layer_params_per_rank

E, K, F, H = 128, 8, 768, 2048  # Qwen3-30B-A3B: experts, top_k, expert width, hidden


def moe(expert_tp: int | None = 1, tp: int = 2, ep: int = 8, gpus: int = 16, batch: int = 16,
        **parallel):
    return build_scenario({
        "model": {"preset": "qwen3-30b-a3b", "seq_len": 4096, "layers": 4},
        "cluster": {"preset": "dgx-h100", "gpus": gpus},
        "training": {"global_batch": batch, "precision": "bf16"},
        "parallel": {"tp": tp, "pp": 1, "ep": ep, "sequence_parallel": True, "zero": 1,
                     "expert_tp": expert_tp, **parallel}})


def expert_flops(s) -> float:
    runs = wl.layer_kernels(s).gemm_runs
    roles = wl.gemm_roles(s)
    return sum(2 * g.m * g.n * g.k * g.batch * n for (g, n), r in zip(runs, roles, strict=True)
               if r == "expert")


def test_a_rank_runs_whole_experts_on_its_own_sequence_shard():
    folded, split = moe(1), moe(None)
    tokens = 4096 // 2  # its sequence shard under tp 2
    by_hand = 2 * 3 * tokens * K * H * F  # gate, up and down over its tokens' 8 copies
    assert expert_flops(folded) == pytest.approx(by_hand, rel=1e-12)
    # the same work as the unfolded rank's half-width experts on every token
    assert expert_flops(split) == pytest.approx(by_hand, rel=1e-12)
    gemm = next(g for (g, _), r in zip(wl.layer_kernels(folded).gemm_runs, wl.gemm_roles(folded),
                                       strict=True) if r == "expert")
    assert (gemm.m, gemm.n) == (tokens * K / (E / 8), F)  # 16 local experts, whole width


def test_parameters_and_their_states_are_whole_experts_sharded_over_the_expert_dp_ranks():
    s = moe(1)
    _, experts = layer_params_per_rank(s.model, 2, 8, 1)
    assert experts == pytest.approx(E / 8 * 3 * H * F)  # 16 whole experts, no biases
    _, unfolded = layer_params_per_rank(s.model, 2, 8)
    assert unfolded == pytest.approx(experts / 2)
    # tp 2 x dp 8 = 16 ranks, 8 of them hold all the experts: 2 copies of each
    assert s.parallel.expert_dp == 2 and moe(None).parallel.expert_dp == 1
    _, shard = mem.optimizer_shard(s, 0)
    assert shard == pytest.approx(4 * experts / 2)  # 4 layers' experts over 2 ranks


def test_the_ep_group_is_consecutive_ranks_of_one_node():
    # folded: ranks 0-7, one DGX; unfolded: every second rank (same TP rank), two nodes
    assert expert_levels(moe(1)) == (8, 1)
    assert expert_levels(moe(None)) == (4, 2)
    cm = CostModel(moe(1))
    assert (cm.ep.size, cm.ep.nodes, cm.edp.size) == (8, 1, 2)


def test_full_fidelity_groups_follow_megatrons_expert_numbering():
    s = moe(1, gpus=32, batch=32)  # 32 ranks in one stage
    cm = CostModel(s)
    comm = FabricComm(simpy.Environment(), cm, cm.placement)
    assert comm.members(11, "ep") == tuple(range(8, 16))
    assert comm.members(11, "edp") == (3, 11, 19, 27)


def test_nothing_is_gathered_over_tp_around_whole_experts():
    folded, split = moe(1), moe(None)
    x = wl.expert_dispatch_bytes(folded)
    assert x == pytest.approx(4096 / 2 * K * H * 2)  # its own shard's 8 copies, bf16
    assert x == wl.expert_dispatch_bytes(split)
    kinds = lambda s: [(c.kind, c.nbytes) for c in tp_collectives(s)]  # noqa: E731
    probs = 2 * wl.expert_probs_bytes(split)  # fp32, one a routed copy, the tp ranks' together
    assert probs == pytest.approx(2 * 4096 / 2 * K * 4)
    assert [k for k in kinds(split) if k not in kinds(folded)] == [
        ("allgather", 2 * x), ("reduce_scatter", 2 * x),  # the tokens, and the probabilities
        ("allgather", probs), ("reduce_scatter", probs)]  # (MoEAlltoAllTokenDispatcher)


def test_the_expert_inputs_kept_for_backward_are_the_ranks_own_tokens_copies():
    def tensors(s):
        return act.layer_tensors(s.model, 1, 2, 1, True, "none", True, "bf16", 8,
                                 expert_tp=s.parallel.etp)
    folded, split = tensors(moe(1)), tensors(moe(None))
    assert folded["expert_inputs"] == pytest.approx(2 * 4096 / 2 * K * H)
    assert split["expert_inputs"] == pytest.approx(2 * folded["expert_inputs"])
    # rows x width: half the rows at twice the width
    assert folded["expert_activation_input"] == pytest.approx(split["expert_activation_input"])


def test_both_estimators_and_both_fidelities_agree():
    s = moe(1, batch=256)  # 16 micro-batches a rank: the step's tail is a small part
    representative = simulate(s).step_time_s
    assert analytic.estimate(s).step_time_s == pytest.approx(representative, rel=0.01)
    assert simulate(s, "full").step_time_s == pytest.approx(representative, rel=0.03)


def test_folding_keeps_a_tp2_ep8_group_in_one_node_and_is_faster():
    # unfolded, EP 8 over dp strides of 2 spans two nodes; folded, one
    assert simulate(moe(1, batch=64)).step_time_s < simulate(moe(None, batch=64)).step_time_s


def test_arguments_and_labels_name_it():
    s = moe(1)
    assert "--expert-tensor-parallel-size 1" in megatron_args(s)
    assert "--expert-tensor-parallel-size 1" not in megatron_args(moe(None))
    assert "--parallelism.expert_tensor_parallel_degree 1" in torchtitan_args(s)
    assert "--parallelism.expert_tensor_parallel_degree 2" in torchtitan_args(moe(None))
    assert "ep8-etp1" in config_label(split_columns(s))
    assert "expert_tp" not in split_columns(moe(None))


@pytest.mark.parametrize("change, message", [
    ({"expert_tp": 4}, "expert_tp = 4: 1 \\(whole experts\\) or tp = 2"),
    ({"ep": 32}, "ep = 32 must divide tp\\*dp\\*cp = 16"),
    ({"order": "tp-pp-cp-dp"}, "order must start with tp and end with pp"),
    ({"expert_tp": None, "ep": 16}, "ep = 16 must divide dp\\*cp = 8 .*expert_tp: 1"),
])
def test_splits_it_cannot_run_are_bad_input(change, message):
    with pytest.raises(ScenarioError, match=message):
        moe(**{"expert_tp": 1, **change})


def test_a_dense_model_has_no_experts_to_fold():
    with pytest.raises(ScenarioError, match="parallel.expert_tp: expert_tp splits the routed"):
        build_scenario({"model": {"preset": "llama3-8b"}, "cluster": {"preset": "dgx-h100",
                        "gpus": 8}, "training": {"global_batch": 8},
                        "parallel": {"tp": 2, "sequence_parallel": True, "expert_tp": 1}})
