"""Hybrid sharding (``parallel.dp_shard``): ZeRO's states shard over part of the data-parallel
ranks, each such group holds a whole copy, and the copies all-reduce their shards' gradients.

Oracles: the ZeRO paper's model-state memory, ``(2 + 2 + K) psi / N_d`` (Rajbhandari et al.
2020, sec. 5), with ``N_d`` the ranks one copy spans; the collectives FSDP's ``HYBRID_SHARD``
and Megatron-Core's ``num_distributed_optimizer_instances`` issue (reduce-scatter within the
copy, all-reduce of the shard across copies, all-gather within the copy); ring shares of
those collectives for the bytes a rank sends; the rank numbering (tp innermost, then cp, dp),
for which ranks form each group.
"""

from __future__ import annotations

import pytest
import simpy
from sim_helpers import flat_profile, scenario

from clustersim.errors import ScenarioError
from clustersim.simulator.costs import dp_reduction as dp
from clustersim.simulator.costs import traffic
from clustersim.simulator.costs.cost_model import CostModel
from clustersim.simulator.costs.memory import stage_model_states, stage_params_per_rank
from clustersim.simulator.discrete_event.comm import FabricComm
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.placement import Placement
from clustersim.topologies import network as net

PARAMS = 1_000_000
SIZES = {"dps": 8, "dpr": 4, "dp": 32, "edp": 32}.get
LINKS = {"bandwidth": 100.0, "latency": 1e-6}  # GB/s: traffic that takes time


def test_a_copy_reduce_scatters_then_all_reduces_its_shard_across_copies():
    s = scenario(dp=32, zero=1, dp_shard=8)
    assert dp.reduction(s, PARAMS, 0, SIZES) == [
        dp.DpCollective("dps", "reduce_scatter", 4 * PARAMS),  # fp32 main gradients
        dp.DpCollective("dpr", "allreduce", 4 * PARAMS / 8)]
    assert dp.gather(s, PARAMS, 0, SIZES) == [dp.DpCollective("dps", "allgather", 2 * PARAMS)]


def test_one_shard_per_rank_leaves_the_all_reduce_alone_as_ddp():
    s = scenario(dp=32, zero=1, dp_shard=1)
    one = {"dps": 1, "dpr": 32}.get
    assert dp.reduction(s, PARAMS, 0, one) == [dp.DpCollective("dpr", "allreduce", 4 * PARAMS)]
    assert dp.gather(s, PARAMS, 0, one) == []


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_dp_shard_equal_to_dp_is_plain_zero(zero):
    plain, same = scenario(dp=8, zero=zero), scenario(dp=8, zero=zero, dp_shard=8)
    assert not same.parallel.hybrid_sharded
    assert simulate(same).step_time_s == simulate(plain).step_time_s
    assert stage_model_states(same, 0) == stage_model_states(plain, 0)


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_each_copy_holds_the_states_zero_would_hold_over_its_own_ranks(zero):
    """ZeRO paper: ``(2 + 2 + 12) psi / N_d`` at stage 3, with N_d = dp_shard (times cp)."""
    hybrid = scenario(dp=32, zero=zero, dp_shard=8)
    over_eight = scenario(dp=8, zero=zero)
    assert stage_model_states(hybrid, 0) == pytest.approx(stage_model_states(over_eight, 0))
    if zero == 3:
        psi = sum(stage_params_per_rank(hybrid, 0))
        assert sum(stage_model_states(hybrid, 0)) == pytest.approx((2 + 4 + 12) * psi / 8)


def test_context_parallel_ranks_join_the_copy():
    s = scenario(dp=8, cp=2, zero=1, dp_shard=2, model={"seq_len": 512})
    assert (s.parallel.state_shards, s.parallel.state_copies) == (4, 4)


def test_a_rank_sends_the_ring_shares_of_its_three_collectives():
    k, copies = 8, 4
    s = scenario(dp=k * copies, zero=1, dp_shard=k)
    psi = sum(stage_params_per_rank(s, 0))
    expected = ((k - 1) / k * psi * 4  # reduce-scatter of fp32 gradients in the copy
                + 2 * (copies - 1) / copies * psi / k * 4  # all-reduce of the shard across
                + (k - 1) / k * psi * 2)  # all-gather of bf16 weights in the copy
    assert traffic.dp_bytes(s, 0) == pytest.approx(expected)


def test_a_copy_fills_a_node_and_its_shards_meet_one_rank_a_node():
    """tp 2 and dp_shard 4 on 8-GPU nodes: one copy is one node's 4 replicas; the ranks
    holding the same shard sit one a node, dp_shard replicas apart."""
    s = scenario(tp=2, dp=16, zero=1, dp_shard=4, model={"heads": 8})
    cm = CostModel(s, flat_profile())
    assert (cm.dps.size, cm.dps.nodes, cm.dps.tier) == (4, 1, "intra_node")
    assert (cm.dpr.size, cm.dpr.local, cm.dpr.nodes) == (4, 1, 4)
    comm = FabricComm(simpy.Environment(), cm, Placement.of(2, 1, 16, 1))
    assert comm.members(2, "dps") == (0, 2, 4, 6)
    assert comm.members(2, "dpr") == (2, 10, 18, 26)
    assert comm.members(27, "dpr") == (3, 11, 19, 27)


def test_the_step_pays_the_copy_s_collectives_on_their_own_links():
    """Nothing overlapped (reduction after the backward, gather after the step): the step
    exposes the three collectives' closed forms on the links each group spans."""
    fixed = {"overlap_grad_reduce": False, "overlap_param_gather": False}
    cluster = {"intra_node": LINKS, "inter_node": {"bandwidth": 10.0, "latency": 5e-6}}
    s = scenario(dp=32, zero=1, dp_shard=8, cluster=cluster, **fixed)
    cm = CostModel(s, flat_profile())
    psi = sum(stage_params_per_rank(s, 0))
    expected = (net.reduce_scatter_time(cm.dps, 4 * psi) + net.allreduce_time(cm.dpr, 4 * psi / 8)
                + net.allgather_time(cm.dps, 2 * psi))
    exposed = simulate(s, profile=flat_profile()).stages[0].comm["dp"]
    assert exposed == pytest.approx(expected, rel=1e-6)


def test_full_fidelity_agrees_with_the_closed_forms():
    cluster = {"intra_node": LINKS, "inter_node": {"bandwidth": 10.0, "latency": 5e-6}}
    s = scenario(dp=32, zero=3, dp_shard=8, cluster=cluster)
    full = simulate(s, "full", profile=flat_profile()).step_time_s
    assert full == pytest.approx(simulate(s, profile=flat_profile()).step_time_s, rel=0.03)


@pytest.mark.parametrize(("parallel", "why"), [
    ({"dp": 8, "zero": 1, "dp_shard": 3}, "must divide dp = 8"),
    ({"dp": 8, "zero": 1, "dp_shard": 16}, "must divide dp = 8"),
    ({"dp": 8, "zero": 0, "dp_shard": 4}, "set parallel.zero"),
    ({"dp": 8, "zero": 1, "dp_shard": 4, "ep": 2}, "expert parallelism"),
])
def test_impossible_hybrid_sharding_names_the_field(parallel, why):
    model = {"experts": 4, "top_k": 1} if parallel.get("ep", 1) > 1 else None
    with pytest.raises(ScenarioError, match=why) as raised:
        scenario(model=model, **parallel)
    assert raised.value.field == "parallel.dp_shard"
