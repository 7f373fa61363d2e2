"""Collective costs for a group of ranks placed on a cluster.

A group of ``size`` ranks ``stride`` apart (TP innermost: stride 1; DP: stride ``tp*cp``; PP:
stride ``tp*cp*dp``) has ``local`` members on each of ``nodes`` nodes. Members inside a node
talk over ``intra_node``; across nodes each member uses its own NIC, over ``inter_node`` or,
when the group spans more than one pod, the oversubscribed ``spine``. Bandwidths are scaled by
the profile's achieved fraction per tier. Inside a pod, a group spread over several leaf
switches (``inter_node.topology``, ``leaf_ports``) shares each leaf's uplinks, one
``oversubscription``-th of its ports, with the groups beside it running the same collective
(``leaf_slowdowns``); switches route ideally here, without full fidelity's ECMP collisions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from . import collectives as c
from .collective_algorithms import ALL, ALL_REDUCE, ALL_TO_ALL, Algorithm, load_time, usable_load
from .hardware import ClusterSpec
from .profile import Profile


@dataclass(frozen=True, slots=True)
class GroupLinks:
    """Where a group's members sit and what the two levels of its collectives achieve."""

    size: int
    local: int
    nodes: int
    intra: c.TierCost
    inter: c.TierCost  # rings and point-to-point across nodes
    tier: str  # the slowest tier crossed
    exchange: c.TierCost  # all-to-all across nodes: more of it leaves the leaf than a ring's


def group_links(cluster: ClusterSpec, profile: Profile, size: int, stride: int) -> GroupLinks:
    """Placement and achieved tier costs of a group of ``size`` ranks ``stride`` apart."""
    local, nodes = spread(cluster.gpus_per_node, size, stride)
    intra = _slowed(tier_cost(profile, "intra_node", cluster.intra_node),
                    cluster.fault_factor("nvlink"))
    span = size * stride if nodes > 1 else min(size * stride, cluster.gpus_per_node)
    tier, link = cluster.tier_of_span(span)
    inter = _slowed(tier_cost(profile, tier, link), cluster.fault_factor("nic"))
    if nodes == 1:
        return GroupLinks(size, local, nodes, intra, intra, tier, intra)
    ring, alltoall = leaf_slowdowns(cluster, size, stride) if tier == "inter_node" else (1, 1)
    return GroupLinks(size, local, nodes, intra, _slowed(inter, 1 / ring), tier,
                      _slowed(inter, 1 / alltoall))


def leaf_slowdowns(cluster: ClusterSpec, size: int, stride: int) -> tuple[float, float]:
    """How much slower a group's ring (or pipeline send) and all-to-all run across nodes when
    every group like it runs at once and the traffic leaving a leaf switch shares its uplinks.

    A leaf holds ``leaf_ports`` NICs: all of ``leaf_ports / gpus_per_node`` nodes (fat-tree)
    or rail ``i`` of ``leaf_ports`` nodes (rail-optimized); its uplinks carry ``1/r`` of that.
    A ring over nodes ``d`` apart with ``m = leaf nodes / d`` members per leaf sends ``1/m``
    of its NICs' flows up (all of them when ``d`` spans a leaf): ``max(1, r/m)``. An
    all-to-all spread over ``k`` leaves sends ``(k-1)/k`` of each member's bytes up, against
    the ``remote`` share its NIC carries: ``max(1, r (k-1)/k / remote)``. Rail-only pods have
    no uplinks: their cross-rail traffic takes NVLink to the destination rail's NIC.
    """
    net, per_node = cluster.inter_node, cluster.gpus_per_node
    r = net.oversubscription
    if net.topology == "rail-only" or r <= 1:
        return 1.0, 1.0
    leaf_nodes = max(1, net.leaf_ports // per_node) if net.topology == "fat-tree" \
        else net.leaf_ports
    node_stride = max(1, stride // per_node)
    local, nodes = spread(per_node, size, stride)
    if node_stride >= leaf_nodes:
        leaves, per_leaf = nodes, 1.0
    else:
        per_leaf = leaf_nodes / node_stride
        leaves = -(-nodes // int(per_leaf))
    if leaves <= 1:
        return 1.0, 1.0
    remote = (size - local) / size
    return max(1.0, r / per_leaf), max(1.0, r * (leaves - 1) / leaves / remote)


def spread(per_node: int, size: int, stride: int) -> tuple[int, int]:
    """(members per node, nodes) of a group of ``size`` ranks ``stride`` apart."""
    local = max(1, min(size, per_node // stride)) if stride < per_node else 1
    return local, -(-size // local)


def _slowed(cost: c.TierCost, factor: float) -> c.TierCost:
    """A tier at its slowest port: a collective runs at its slowest member's pace, and the
    step waits for its slowest group (``cluster.faults``)."""
    return cost if factor == 1.0 else c.TierCost(cost.bandwidth * factor, cost.latency,
                                                 cost.nvls * factor)


def tier_efficiency(profile: Profile, tier: str, link) -> float:
    """The fraction of a tier's line rate its collectives reach: measured on the cluster
    (``efficiency``) where given, else the profile's for the tier."""
    return getattr(link, "efficiency", None) or profile.comm_eff(tier)


def tier_cost(profile: Profile, tier: str, link) -> c.TierCost:
    """Achieved bandwidth (bytes/s) and latency of one tier (``tier_efficiency`` of its line
    rate); NVLS where the switch has it (``nvls: true``) and the profile says what it
    achieves (else not used)."""
    nvls = getattr(link, "nvls", False) and "nvls" in profile.comm_efficiency
    return c.TierCost(link.bandwidth * 1e9 * tier_efficiency(profile, tier, link),
                      profile.comm_latency(tier, link.latency),
                      link.bandwidth * 1e9 * profile.comm_eff("nvls") if nvls else 0.0)


def described_time(algorithms: Mapping[str, Algorithm], g: GroupLinks, nbytes: float) -> float:
    """A described collective over the group (``collective_algorithms.py``): the fastest of
    ``algorithms`` that can run on it, as NCCL's tuner picks. Across nodes, a ring or a tree
    rides ``g.inter``; pairwise sends ride ``g.exchange``, as more of them leave the leaf."""
    times = []
    for algorithm in algorithms.values():
        load = usable_load(algorithm, nbytes, g.local, g.nodes, g.size, g.intra)
        if load is not None:
            times.append(load_time(load, g.intra, g.exchange if load.peers == ALL else g.inter))
    return min(times)


def allreduce_time(g: GroupLinks, nbytes: float) -> float:
    """All-reduce of ``nbytes`` per rank: ring in a node, NCCL-style two-level across nodes,
    the fastest of ring, tree and NVLS (``collectives.hierarchical_allreduce_times``)."""
    return described_time(ALL_REDUCE, g, nbytes)


def allgather_time(g: GroupLinks, nbytes: float) -> float:
    """All-gather into ``nbytes`` per rank (reduce-scatter of ``nbytes`` costs the same)."""
    return c.hierarchical_allgather_time(nbytes, g.local, g.nodes, g.intra, g.inter)


def reduce_scatter_time(g: GroupLinks, nbytes: float) -> float:
    """Reduce-scatter of ``nbytes`` per rank: the mirror image of the all-gather."""
    return allgather_time(g, nbytes)


def alltoall_time(g: GroupLinks, nbytes: float) -> float:
    """All-to-all of ``nbytes`` per rank, pairwise (``collective_algorithms.Pairwise``): the
    share leaving the node rides the slower tier, all its steps at that tier's alpha."""
    return described_time({"pairwise": ALL_TO_ALL}, g, nbytes)


def forwarded_alltoall_time(g: GroupLinks, remote: float, local: float) -> float:
    """An all-to-all that sends each rank's ``remote`` bytes across nodes once per destination
    node, to the GPU of the same index, and forwards what arrives over NVLink (``local`` bytes
    a rank), both at once (DeepEP's normal kernels, deepseek-ai/DeepEP docs/legacy.md: 43-58
    GB/s of RDMA on a 50 GB/s NIC from EP 16 to 64): the slower of the two."""
    return max(c.p2p_time(remote, g.exchange.bandwidth, g.exchange.latency),
               c.p2p_time(local, g.intra.bandwidth, g.intra.latency))


def p2p_time(g: GroupLinks, nbytes: float) -> float:
    """One message between neighbours of the group, on its slowest tier."""
    return c.p2p_time(nbytes, g.inter.bandwidth, g.inter.latency)

