"""Collective costs for a group of ranks placed on a cluster.

A group of ``size`` ranks ``stride`` apart (TP innermost: stride 1; DP: stride ``tp*cp``; PP:
stride ``tp*cp*dp``) has ``local`` members on each of ``nodes`` nodes. Members inside a node
talk over ``intra_node``; across nodes each member uses its own NIC, over ``inter_node`` or,
when the group spans more than one pod, the oversubscribed ``spine``. Bandwidths are scaled by
the profile's achieved fraction per tier.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import collectives as c
from .hardware import ClusterSpec
from .profile import Profile


@dataclass(frozen=True, slots=True)
class GroupLinks:
    """Where a group's members sit and what the two levels of its collectives achieve."""

    size: int
    local: int
    nodes: int
    intra: c.TierCost
    inter: c.TierCost
    tier: str  # the slowest tier crossed


def group_links(cluster: ClusterSpec, profile: Profile, size: int, stride: int) -> GroupLinks:
    """Placement and achieved tier costs of a group of ``size`` ranks ``stride`` apart."""
    per_node = cluster.gpus_per_node
    local = max(1, min(size, per_node // stride)) if stride < per_node else 1
    nodes = -(-size // local)
    intra = _slowed(tier_cost(profile, "intra_node", cluster.intra_node),
                    cluster.fault_factor("nvlink"))
    span = size * stride if nodes > 1 else min(size * stride, per_node)
    tier, link = cluster.tier_of_span(span)
    inter = _slowed(tier_cost(profile, tier, link), cluster.fault_factor("nic"))
    return GroupLinks(size, local, nodes, intra, inter if nodes > 1 else intra, tier)


def _slowed(cost: c.TierCost, factor: float) -> c.TierCost:
    """A tier at its slowest port: a collective runs at its slowest member's pace, and the
    step waits for its slowest group (``cluster.faults``)."""
    return cost if factor == 1.0 else c.TierCost(cost.bandwidth * factor, cost.latency)


def tier_cost(profile: Profile, tier: str, link) -> c.TierCost:
    """Achieved bandwidth (bytes/s) and latency of one tier under the profile."""
    return c.TierCost(link.bandwidth * 1e9 * profile.comm_eff(tier),
                      profile.comm_latency(tier, link.latency))


def allreduce_time(g: GroupLinks, nbytes: float) -> float:
    """All-reduce of ``nbytes`` per rank: ring in a node, NCCL-style two-level across nodes."""
    return c.hierarchical_allreduce_time(nbytes, g.local, g.nodes, g.intra, g.inter)


def allgather_time(g: GroupLinks, nbytes: float) -> float:
    """All-gather into ``nbytes`` per rank (reduce-scatter of ``nbytes`` costs the same)."""
    return c.hierarchical_allgather_time(nbytes, g.local, g.nodes, g.intra, g.inter)


def reduce_scatter_time(g: GroupLinks, nbytes: float) -> float:
    """Reduce-scatter of ``nbytes`` per rank: the mirror image of the all-gather."""
    return allgather_time(g, nbytes)


def alltoall_time(g: GroupLinks, nbytes: float) -> float:
    """All-to-all of ``nbytes`` per rank; the share leaving the node rides the slower tier."""
    if g.nodes == 1:
        return c.alltoall_time(nbytes, g.size, g.intra.bandwidth, g.intra.latency)
    remote = (g.size - g.local) / g.size
    return max(c.alltoall_time(nbytes * (1 - remote), g.local, g.intra.bandwidth, 0.0),
               remote * nbytes / g.inter.bandwidth) + (g.size - 1) * g.inter.latency


def p2p_time(g: GroupLinks, nbytes: float) -> float:
    """One message between neighbours of the group, on its slowest tier."""
    return c.p2p_time(nbytes, g.inter.bandwidth, g.inter.latency)
