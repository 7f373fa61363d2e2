"""Collective costs are the alpha-beta closed forms (Thakur, Rabenseifner & Gropp 2005).

X is the buffer each rank holds, B the achieved bandwidth per GPU per direction, alpha the
per-step latency, n the group size.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clustersim.topologies import collectives as c

sizes = st.floats(1.0, 1e11)
groups = st.integers(2, 4096)
bandwidths = st.floats(1e8, 1e13)
latencies = st.floats(0.0, 1e-4)


@given(x=sizes, n=groups, b=bandwidths, alpha=latencies)
def test_ring_allreduce_is_the_textbook_form(x, n, b, alpha):
    """Ring all-reduce: 2(n-1)/n * X/B + 2(n-1)*alpha."""
    expected = 2 * (n - 1) / n * x / b + 2 * (n - 1) * alpha
    assert c.ring_allreduce_time(x, n, b, alpha) == pytest.approx(expected, rel=1e-12)


@given(x=sizes, n=groups, b=bandwidths, alpha=latencies)
def test_reduce_scatter_and_all_gather_are_half_an_all_reduce(x, n, b, alpha):
    """Reduce-scatter and all-gather: (n-1)/n * X/B + (n-1)*alpha; together one all-reduce."""
    expected = (n - 1) / n * x / b + (n - 1) * alpha
    rs = c.ring_reduce_scatter_time(x, n, b, alpha)
    ag = c.ring_allgather_time(x, n, b, alpha)
    assert rs == pytest.approx(expected, rel=1e-12)
    assert ag == pytest.approx(expected, rel=1e-12)
    assert rs + ag == pytest.approx(c.ring_allreduce_time(x, n, b, alpha), rel=1e-12)


@pytest.mark.parametrize("collective", [c.ring_allreduce_time, c.ring_reduce_scatter_time,
                                        c.ring_allgather_time, c.alltoall_time])
def test_a_group_of_one_communicates_nothing(collective):
    assert collective(1e9, 1, 1e9, 1e-5) == 0.0


def test_ring_allreduce_bandwidth_term_approaches_twice_the_buffer():
    """As n grows, each rank sends and receives 2X: the bus-bandwidth convention of nccl-tests."""
    assert c.ring_allreduce_time(1e9, 1024, 1e9, 0.0) == pytest.approx(2.0, rel=1e-3)


def test_alltoall_and_p2p():
    """All-to-all sends (n-1)/n of the buffer in n-1 steps; a message costs alpha + X/B."""
    assert c.alltoall_time(8e9, 8, 1e9, 1e-6) == pytest.approx(7.0 + 7e-6)
    assert c.p2p_time(1e9, 1e10, 5e-6) == pytest.approx(0.1 + 5e-6)


@given(x=sizes, n=st.integers(1, 64), b=bandwidths, alpha=latencies)
def test_hierarchical_allreduce_on_one_node_is_the_ring(x, n, b, alpha):
    intra = c.TierCost(b, alpha)
    inter = c.TierCost(b / 10, alpha * 3)
    assert c.hierarchical_allreduce_time(x, n, 1, intra, inter) == pytest.approx(
        c.ring_allreduce_time(x, n, b, alpha), rel=1e-12)


@given(x=sizes, nodes=st.integers(1, 512), b=bandwidths, alpha=latencies)
def test_hierarchical_allreduce_with_one_member_per_node_is_the_best_flat_one(x, nodes, b,
                                                                               alpha):
    intra = c.TierCost(b * 10, alpha / 3)
    inter = c.TierCost(b, alpha)
    flat = min(c.ring_allreduce_time(x, nodes, b, alpha), c.tree_allreduce_time(x, nodes, b, alpha))
    assert c.hierarchical_allreduce_time(x, 1, nodes, intra, inter) == pytest.approx(
        flat, rel=1e-12)


@given(x=sizes, n=groups, b=bandwidths, alpha=latencies)
def test_tree_allreduce_is_two_passes_of_log_depth(x, n, b, alpha):
    """Double binary tree: 2 X/B + 2 ceil(log2 n) alpha."""
    import math
    expected = 2 * x / b + 2 * math.ceil(math.log2(n)) * alpha
    assert c.tree_allreduce_time(x, n, b, alpha) == pytest.approx(expected, rel=1e-12)


def test_tree_wins_small_messages_on_many_ranks_and_ring_wins_large_ones():
    b, alpha = 25e9, 5e-6
    assert c.allreduce_algorithm(1e6, 1024, b, alpha) == "tree"
    assert c.allreduce_algorithm(1e9, 8, b, alpha) == "ring"
    assert c.allreduce_algorithm(1e6, 2, b, alpha) == "ring"


def test_a_ring_across_nodes_is_paced_by_its_slower_link_not_the_sum():
    """NCCL's ring through 4 nodes of 8: each rank sends S = 2(n-1)/n X, 7/8 of it over
    NVLink and 1/8 over its NIC at once; here the NIC is the bottleneck (S/8/25 GB/s against
    7S/8/200 GB/s), plus 2(n-1) steps, 2(N-1) of them across nodes."""
    x, local, nodes = 8e9, 8, 4
    intra, inter = c.TierCost(200e9, 2e-6), c.TierCost(25e9, 5e-6)
    sent = 2 * 31 / 32 * x
    expected = sent / 8 / 25e9 + 2 * (32 - 4) * 2e-6 + 2 * 3 * 5e-6
    assert c.hierarchical_allreduce_times(x, local, nodes, intra, inter)["ring"] == \
        pytest.approx(expected)
    assert c.hierarchical_allreduce_time(x, local, nodes, intra, inter) == pytest.approx(expected)


def test_nvlink_paces_the_ring_when_the_nics_are_many_and_fast():
    """Two nodes of 8 with 100 GB/s NICs: NVLink's 7S/8 at 200 GB/s outlasts the NIC's S/8."""
    intra, inter = c.TierCost(200e9, 0.0), c.TierCost(100e9, 0.0)
    sent = 2 * 15 / 16 * 8e9
    assert c.hierarchical_allreduce_times(8e9, 8, 2, intra, inter)["ring"] == \
        pytest.approx(7 / 8 * sent / 200e9)


def test_the_tree_wins_small_messages_over_many_nodes():
    """1 MB over 512 nodes of 8: 2 ceil(log2 512) = 18 steps across nodes against the ring's
    1,022: NCCL's tuner picks the tree, and so does the closed form."""
    intra, inter = c.TierCost(200e9, 2e-6), c.TierCost(25e9, 5e-6)
    times = c.hierarchical_allreduce_times(1e6, 8, 512, intra, inter)
    assert times["tree"] < times["ring"]
    assert c.hierarchical_allreduce_algorithm(1e6, 8, 512, intra, inter) == "tree"
    assert c.hierarchical_allreduce_algorithm(8e9, 8, 4, intra, inter) == "ring"


def test_hierarchical_allgather_is_one_pipelined_ring():
    x, local, nodes = 8e9, 8, 4
    intra, inter = c.TierCost(200e9, 0.0), c.TierCost(25e9, 0.0)
    sent = 31 / 32 * x
    expected = max(7 / 8 * sent / 200e9, sent / 8 / 25e9)
    assert c.hierarchical_allgather_time(x, local, nodes, intra, inter) == pytest.approx(expected)


def test_hierarchical_beats_a_flat_ring_over_the_slow_tier():
    """Keeping 7/8 of the traffic on NVLink (each channel leaves a node once) is why NCCL's
    rings run at the node's NICs' joint rate, not one NIC's."""
    intra, inter = c.TierCost(200e9, 2e-6), c.TierCost(25e9, 5e-6)
    flat = c.ring_allreduce_time(1e9, 32, inter.bandwidth, inter.latency)
    assert c.hierarchical_allreduce_time(1e9, 8, 4, intra, inter) < flat / 4


@pytest.mark.parametrize("local, nodes", [(8, 1), (1, 16), (8, 4), (8, 512)])
def test_allgather_latency_is_nccls_ring_through_every_rank(local, nodes):
    """n - 1 steps: nodes - 1 across nodes, n - nodes over NVLink (NCCL's tuning.cc ring)."""
    intra, inter = c.TierCost(1e30, 2e-6), c.TierCost(1e30, 5e-6)
    n = local * nodes
    expected = (nodes - 1) * 5e-6 + (n - nodes) * 2e-6
    assert c.hierarchical_allgather_time(8e9, local, nodes, intra, inter) == pytest.approx(
        expected)
