"""Groups of ranks land on the cluster's tiers as Megatron-LM's rank order places them.

TP is innermost (stride 1), then CP, DP (stride tp*cp) and PP; a group of ``size`` ranks
``stride`` apart has ``gpus_per_node // stride`` members per node while stride < gpus_per_node.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clustersim.simulator.inputs.scenario import build_cluster
from clustersim.topologies import collectives as c
from clustersim.topologies import network as net
from clustersim.topologies.profile import Profile

COMM = {"intra_node": 0.8, "inter_node": 0.9, "spine": 0.5}


@pytest.fixture(scope="module")
def profile() -> Profile:
    return Profile(name="test", gpu="any", matmul_efficiency=[[1e6, 1.0]],
                   memory_efficiency=1.0, comm_efficiency=COMM)


def dgx_h100(gpus: int):
    return build_cluster({"preset": "dgx-h100", "gpus": gpus})


def test_tp8_group_fills_one_node_on_nvlink(profile):
    g = net.group_links(dgx_h100(64), profile, size=8, stride=1)
    assert (g.local, g.nodes, g.tier) == (8, 1, "intra_node")
    nvlink = 450e9 * COMM["intra_node"]
    assert net.allreduce_time(g, 1e8) == pytest.approx(c.ring_allreduce_time(1e8, 8, nvlink, 2e-6))


def test_dp_group_of_stride_tp8_has_one_member_per_node_on_infiniband(profile):
    """tp=8: the DP peers of a rank sit on different nodes, so their ring runs over the NICs."""
    g = net.group_links(dgx_h100(64), profile, size=8, stride=8)
    assert (g.local, g.nodes, g.tier) == (1, 8, "inter_node")
    ib = 50e9 * COMM["inter_node"]
    assert net.allreduce_time(g, 1e9) == pytest.approx(c.ring_allreduce_time(1e9, 8, ib, 5e-6))


def test_tp2_groups_stay_on_nvlink(profile):
    cluster = dgx_h100(64)
    tp = net.group_links(cluster, profile, size=2, stride=1)
    dp_in_node = net.group_links(cluster, profile, size=4, stride=2)
    assert (tp.local, tp.nodes, tp.tier) == (2, 1, "intra_node")
    assert (dp_in_node.local, dp_in_node.nodes, dp_in_node.tier) == (4, 1, "intra_node")


def test_dp_group_of_stride_tp2_across_nodes_is_hierarchical(profile):
    """tp=2, dp=32: four DP peers per node, eight nodes; NVLink inside, InfiniBand across."""
    g = net.group_links(dgx_h100(64), profile, size=32, stride=2)
    assert (g.local, g.nodes, g.tier) == (4, 8, "inter_node")
    expected = c.hierarchical_allreduce_time(
        1e9, 4, 8, c.TierCost(450e9 * 0.8, 2e-6), c.TierCost(50e9 * 0.9, 5e-6))
    assert net.allreduce_time(g, 1e9) == pytest.approx(expected)


def test_a_group_wider_than_a_pod_uses_the_spine(profile):
    """llama3-h100-roce: 3,072-GPU pods, 1:7 oversubscribed above them (Dubey et al. 2024)."""
    cluster = build_cluster({"preset": "llama3-h100-roce", "gpus": 8192})
    in_pod = net.group_links(cluster, profile, size=384, stride=8)  # spans 3,072 GPUs
    across = net.group_links(cluster, profile, size=512, stride=8)  # spans 4,096 GPUs
    assert in_pod.tier == "inter_node"
    assert across.tier == "spine"
    assert across.inter.bandwidth == pytest.approx(50e9 / 7 * COMM["spine"], rel=1e-6)
    assert net.allreduce_time(across, 1e9) > net.allreduce_time(in_pod, 1e9)


def test_profile_fractions_scale_the_bandwidth_term(profile):
    """Halving the achieved fraction doubles the bandwidth term of a zero-latency tier."""
    cluster = build_cluster({"preset": "dgx-h100", "gpus": 16,
                             "inter_node": {"bandwidth": 50, "latency": 0.0}})
    half = profile.model_copy(update={"comm_efficiency": {**COMM, "inter_node": 0.45}})
    full = net.group_links(cluster, profile, size=2, stride=8)
    slow = net.group_links(cluster, half, size=2, stride=8)
    assert net.allreduce_time(slow, 1e9) == pytest.approx(2 * net.allreduce_time(full, 1e9))


def test_p2p_rides_the_slowest_tier_of_the_pair(profile):
    cluster = dgx_h100(16)
    across = net.group_links(cluster, profile, size=2, stride=8)
    inside = net.group_links(cluster, profile, size=2, stride=1)
    assert net.p2p_time(across, 1e8) == pytest.approx(5e-6 + 1e8 / (50e9 * 0.9))
    assert net.p2p_time(inside, 1e8) == pytest.approx(2e-6 + 1e8 / (450e9 * 0.8))


def test_alltoall_inside_a_node_is_the_pairwise_form(profile):
    g = net.group_links(dgx_h100(8), profile, size=8, stride=1)
    assert net.alltoall_time(g, 8e8) == pytest.approx(
        c.alltoall_time(8e8, 8, 450e9 * 0.8, 2e-6))


def test_alltoall_across_nodes_sends_the_remote_share_over_the_nics(profile):
    """16 ranks on 2 nodes: each sends 7/16 of its bytes over NVLink and 8/16 over its NIC,
    concurrently, with 15 NIC latencies."""
    g = net.group_links(dgx_h100(16), profile, size=16, stride=1)
    assert net.alltoall_time(g, 8e8) == pytest.approx(
        max(7 / 16 * 8e8 / (450e9 * 0.8), 8 / 16 * 8e8 / (50e9 * 0.9)) + 15 * 5e-6)


def test_reduce_scatter_mirrors_all_gather(profile):
    g = net.group_links(dgx_h100(64), profile, size=32, stride=2)
    assert net.reduce_scatter_time(g, 1e9) == net.allgather_time(g, 1e9)
    assert net.allgather_time(g, 1e9) < net.allreduce_time(g, 1e9)


@given(log_stride=st.integers(0, 6), log_size=st.integers(0, 9))
def test_placement_covers_the_group(log_stride, log_size):
    """Members per node times nodes holds the group; one node (NVLink only) exactly when the
    group spans at most a node's GPUs."""
    profile = Profile(name="t", gpu="any", matmul_efficiency=[[1e6, 1.0]],
                      memory_efficiency=1.0, comm_efficiency=COMM)
    stride, size = 2**log_stride, 2**log_size
    g = net.group_links(dgx_h100(max(8, stride * size)), profile, size, stride)
    assert g.local * g.nodes >= size
    assert 1 <= g.local <= 8
    assert (g.nodes == 1) == (g.tier == "intra_node")
    assert (g.nodes == 1) == (size == 1 or stride * size <= 8)


def leafy(topology="fat-tree", ratio=8.0, leaf_ports=32, gpus=1024):
    return build_cluster({"preset": "dgx-h100", "gpus": gpus, "inter_node": {
        "bandwidth": 50, "latency": 5e-6, "topology": topology, "oversubscription": ratio,
        "leaf_ports": leaf_ports}})


def test_leaf_uplinks_slow_a_ring_by_the_share_of_its_flows_that_leave_the_leaf():
    """Fat-tree leaf of 32 NICs = 4 nodes, 8:1. A DP ring over consecutive nodes sends one
    flow in 4 up (8/4 = 2x); nodes a leaf apart send every flow up (8x); a group inside one
    leaf never leaves it; at 1:1 or without a spine (rail-only) nothing slows."""
    assert net.leaf_slowdowns(leafy(), size=32, stride=8)[0] == pytest.approx(2.0)
    assert net.leaf_slowdowns(leafy(), size=8, stride=32)[0] == pytest.approx(8.0)
    assert net.leaf_slowdowns(leafy(), size=4, stride=8) == (1.0, 1.0)
    assert net.leaf_slowdowns(leafy(ratio=1.0), size=32, stride=8) == (1.0, 1.0)
    assert net.leaf_slowdowns(leafy("rail-only"), size=32, stride=8) == (1.0, 1.0)
    # Rail-optimized: a rail leaf holds rail i of 32 nodes; 32 consecutive nodes stay on it.
    assert net.leaf_slowdowns(leafy("rail-optimized"), size=32, stride=8) == (1.0, 1.0)
    # 64 nodes: one flow in 32 goes up, a quarter of what 8:1 uplinks carry: no slowdown;
    # pipeline neighbours a leaf group apart (32 nodes) send everything up: 8x.
    assert net.leaf_slowdowns(leafy("rail-optimized"), size=64, stride=8)[0] == 1.0
    assert net.leaf_slowdowns(leafy("rail-optimized"), size=2, stride=256)[0] == 8.0


def test_an_alltoall_over_leaves_sends_all_but_its_own_leafs_share_up():
    """32 members one per node over 8 leaves: 7/8 of each member's bytes leave the leaf,
    against the 31/32 its NIC carries: 8 * (7/8) / (31/32) slower across nodes."""
    _, alltoall = net.leaf_slowdowns(leafy(), size=32, stride=8)
    assert alltoall == pytest.approx(8 * 7 / 8 / (31 / 32))


def test_group_links_charge_leaf_uplinks_only_inside_a_pod(profile):
    """The slowed tier is what the closed forms use: the all-to-all's remote share and the
    ring's inter-node steps run at the NIC's rate over the slowdown."""
    g = net.group_links(leafy(), profile, size=32, stride=8)
    nic = 50e9 * COMM["inter_node"]
    assert g.inter.bandwidth == pytest.approx(nic / 2)
    assert g.exchange.bandwidth == pytest.approx(nic / (8 * 7 / 8 / (31 / 32)))
    healthy = net.group_links(leafy(ratio=1.0), profile, size=32, stride=8)
    assert net.alltoall_time(g, 1e8) > net.alltoall_time(healthy, 1e8)
