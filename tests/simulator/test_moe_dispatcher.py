"""``parallel.moe_dispatcher: deepep``: DeepEP's forwarded token dispatch (DeepSeek-V3 report
arXiv 2412.19437 sec. 3.2.2; deepseek-ai/DeepEP). A token crosses to each other node holding
one of its experts once, to the GPU of the same index, and fans out over NVLink there; the
combine sums a node's copies before sending back. Oracles: the expected number of nodes
counted by enumerating every routing, the two tiers' closed forms, and the pairwise
all-to-all it replaces inside a node."""

from __future__ import annotations

from itertools import combinations

import pytest

from clustersim.errors import ScenarioError
from clustersim.reports.megatron import megatron_args
from clustersim.simulator.closed_form import analytic
from clustersim.simulator.costs import token_dispatch
from clustersim.simulator.costs.cost_model import CostModel
from clustersim.simulator.costs.traffic import ep_layer_bytes
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.model import routing
from clustersim.simulator.model import workload as wl
from clustersim.topologies import collectives as c


def moe(ep: int, gpus: int, dispatcher: str = "deepep", batch: int = 16, **model):
    return build_scenario({
        "model": {"preset": "qwen3-30b-a3b", "seq_len": 4096, "layers": 4, **model},
        "cluster": {"preset": "dgx-h100", "gpus": gpus},
        "training": {"global_batch": batch},
        "parallel": {"tp": 1, "pp": 2, "ep": ep, "moe_dispatcher": dispatcher}})


@pytest.mark.parametrize("experts, top_k, ep, local", [(8, 2, 4, 2), (16, 4, 8, 2), (8, 3, 8, 4)])
def test_other_nodes_reached_are_counted_over_every_routing(experts, top_k, ep, local):
    m = moe(2, 16, experts=experts, top_k=top_k).model
    nodes, per_node = ep // local, experts // (ep // local)
    routings = list(combinations(range(experts), top_k))  # uniform, balanced routing
    # from node 0's view: how many other nodes hold one of the token's experts
    reached = sum(len({e // per_node for e in r} - {0}) for r in routings)
    assert routing.remote_nodes_per_token(m, local, ep) == pytest.approx(
        reached / len(routings), rel=1e-12)
    assert nodes > 1


@pytest.mark.parametrize("experts, top_k, groups, per_token, ep, local", [
    (8, 2, 2, 1, 4, 2), (16, 3, 4, 2, 8, 2), (16, 4, 2, 1, 8, 2)])
def test_group_limited_routing_is_counted_over_every_routing_too(experts, top_k, groups,
                                                                 per_token, ep, local):
    # DeepSeek's group-limited routing: the token's best per_token groups, then its top_k
    # experts among theirs; groups of whole nodes, each group and expert set equally likely
    m = moe(2, 16, experts=experts, top_k=top_k, expert_groups=groups,
            expert_groups_per_token=per_token).model
    per_node, per_group = experts // (ep // local), experts // groups
    routings = [r for chosen in combinations(range(groups), per_token)
                for r in combinations([e for g in chosen
                                       for e in range(g * per_group, (g + 1) * per_group)], top_k)]
    reached = sum(len({e // per_node for e in r} - {0}) for r in routings)
    assert routing.remote_nodes_per_token(m, local, ep) == pytest.approx(
        reached / len(routings), rel=1e-12)


def test_deepseek_v3_on_eight_nodes_sends_under_half_the_alltoalls_copies_across():
    # 256 experts over 8 nodes of 8 ranks, top 8: 7 (1 - C(224, 8)/C(256, 8)) = 4.63 other
    # nodes a token under uniform routing; from its best 4 of 8 groups (a node each), 7 x 4/8
    # (1 - C(96, 8)/C(128, 8)) = 3.17; a pairwise all-to-all sends 7 of its 8 copies across
    m = build_scenario({"model": {"preset": "deepseek-v3"}, "cluster": {"preset": "dgx-h100",
                        "gpus": 64}, "training": {"global_batch": 64}}).model
    assert routing.remote_nodes_per_token(m, local=8, ep=64) == pytest.approx(3.17, abs=0.01)
    uniform = m.model_copy(update={"expert_groups": None, "expert_groups_per_token": None})
    assert routing.remote_nodes_per_token(uniform, local=8, ep=64) == pytest.approx(4.63,
                                                                                  abs=0.01)


def test_across_nodes_the_slower_of_the_nic_and_the_nvlink_fan_out_sets_the_pace():
    s = moe(ep=16, gpus=32)  # dp 16 ranks over two nodes of 8
    cm = CostModel(s)
    g = cm.ep
    assert g.nodes > 1
    x = wl.expert_dispatch_bytes(s)
    remote = x / s.model.top_k * routing.remote_nodes_per_token(s.model, g.local, g.size)
    fan_out = x * (g.local - 1) / g.local
    assert token_dispatch.expert_dispatch_time(cm) == pytest.approx(max(
        c.p2p_time(remote, g.exchange.bandwidth, g.exchange.latency),
        c.p2p_time(fan_out, g.intra.bandwidth, g.intra.latency)), rel=1e-12)
    assert token_dispatch.expert_dispatch_time(cm) < token_dispatch.expert_dispatch_time(
        CostModel(moe(ep=16, gpus=32, dispatcher="alltoall")))


def test_inside_one_node_it_is_the_pairwise_all_to_all():
    inside, pairwise = moe(ep=8, gpus=16), moe(ep=8, gpus=16, dispatcher="alltoall")
    assert CostModel(inside).ep.nodes == 1
    assert token_dispatch.expert_dispatch_time(CostModel(inside)) == \
        token_dispatch.expert_dispatch_time(CostModel(pairwise))
    # the same tokens; the alltoall dispatcher also sends the fp32 probabilities apart, each
    # way (DeepEP's dispatch carries them): 4 bytes a routed copy, 7/8 of them leaving
    probs = wl.expert_dispatch_bytes(inside) / (inside.model.hidden * 2) * 4 * 7 / 8
    assert ep_layer_bytes(pairwise) == pytest.approx(ep_layer_bytes(inside) + 2 * probs)


def test_both_estimators_and_both_fidelities_charge_the_forwarded_form():
    s = moe(ep=16, gpus=32, batch=256)  # 16 micro-batches a pipeline: the bubble is small
    representative = simulate(s).step_time_s
    assert analytic.estimate(s).step_time_s == pytest.approx(representative, rel=0.01)
    assert simulate(s, "full").step_time_s == pytest.approx(representative, rel=0.03)
    pairwise = moe(ep=16, gpus=32, dispatcher="alltoall", batch=256)
    assert representative < simulate(pairwise).step_time_s


def test_traffic_counts_one_copy_a_node_reached_and_the_fan_out():
    s = moe(ep=16, gpus=32)
    g = CostModel(s).ep
    x = wl.expert_dispatch_bytes(s)
    per_dispatch = (x / s.model.top_k * routing.remote_nodes_per_token(s.model, g.local, 16)
                    + x * (g.local - 1) / g.local)
    assert ep_layer_bytes(s) == pytest.approx(4 * per_dispatch, rel=1e-12)  # 2 each way


def test_megatron_arguments_name_the_flex_dispatcher():
    assert "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep" in \
        " ".join(megatron_args(moe(ep=16, gpus=32)))
    assert "--moe-token-dispatcher-type alltoall" in \
        " ".join(megatron_args(moe(ep=16, gpus=32, dispatcher="alltoall")))


@pytest.mark.parametrize("groups, message", [
    ({"expert_groups": 8}, "expert_groups and expert_groups_per_token go together"),
    ({"expert_groups": 5, "expert_groups_per_token": 2}, "must divide experts"),
    ({"expert_groups": 8, "expert_groups_per_token": 9}, "must be at most expert_groups"),
    ({"expert_groups": 64, "expert_groups_per_token": 1}, "hold top_k"),
])
def test_expert_groups_that_cannot_route_are_bad_input(groups, message):
    with pytest.raises(ScenarioError, match=message):
        moe(8, 16, **groups)


def test_on_a_cluster_of_pools_it_is_refused():
    with pytest.raises(ScenarioError, match="parallel.moe_dispatcher: deepep on a cluster of"):
        build_scenario({"model": {"preset": "mixtral-8x7b", "layers": 4},
                        "cluster": {"pools": [{"preset": "dgx-h100", "nodes": 1},
                                              {"preset": "dgx-a100-80gb", "nodes": 1}]},
                        "training": {"global_batch": 16},
                        "parallel": {"pp": 2, "ep": 8, "moe_dispatcher": "deepep"}})
