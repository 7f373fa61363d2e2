"""Alpha-beta costs of collectives, as closed forms.

``bandwidth`` is in bytes/s per GPU per direction (already scaled by the profile's achieved
fraction), ``latency`` is the per-step alpha in seconds, ``nbytes`` the size of the full buffer
each rank holds (the all-reduce input, the all-gather output, the reduce-scatter input).
Ring algorithms: Patarasuk & Yuan 2009; Thakur, Rabenseifner & Gropp 2005.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def ring_allreduce_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring all-reduce: ``2(n-1)/n * X/B + 2(n-1)*alpha`` (reduce-scatter then all-gather)."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * latency


def tree_allreduce_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Double binary tree all-reduce (NCCL): ``2 X/B + 2 ceil(log2 n) alpha``.

    Each of two trees carries half the buffer up (reduce) and down (broadcast), pipelined; a rank
    is an inner node of at most one tree, so it sends about X each way. Fewer latency steps than
    the ring's ``2(n-1)``: the tree wins on small messages over many ranks (Sanders et al. 2009).
    """
    if n <= 1:
        return 0.0
    return 2 * nbytes / bandwidth + 2 * math.ceil(math.log2(n)) * latency


def allreduce_algorithm(nbytes: float, n: int, bandwidth: float, latency: float) -> str:
    """``"ring"`` or ``"tree"``, whichever is faster for this message, as NCCL's tuner picks."""
    ring = ring_allreduce_time(nbytes, n, bandwidth, latency)
    return "tree" if tree_allreduce_time(nbytes, n, bandwidth, latency) < ring else "ring"


def best_allreduce_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """The faster of the ring and the double binary tree."""
    return min(ring_allreduce_time(nbytes, n, bandwidth, latency),
               tree_allreduce_time(nbytes, n, bandwidth, latency))


def ring_reduce_scatter_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring reduce-scatter of an ``nbytes`` input: ``(n-1)/n * X/B + (n-1)*alpha``."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / bandwidth + (n - 1) * latency


def ring_allgather_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring all-gather into an ``nbytes`` output: ``(n-1)/n * X/B + (n-1)*alpha``."""
    return ring_reduce_scatter_time(nbytes, n, bandwidth, latency)


def alltoall_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Pairwise all-to-all: each rank sends ``(n-1)/n`` of its ``nbytes`` in ``n-1`` steps."""
    return ring_reduce_scatter_time(nbytes, n, bandwidth, latency)


def p2p_time(nbytes: float, bandwidth: float, latency: float) -> float:
    """One point-to-point message: ``alpha + X/B``."""
    return latency + nbytes / bandwidth


@dataclass(frozen=True, slots=True)
class TierCost:
    """Achieved bandwidth (bytes/s per GPU per direction) and latency (s) of one tier."""

    bandwidth: float
    latency: float


def hierarchical_allreduce_time(nbytes: float, local: int, nodes: int,
                                intra: TierCost, inter: TierCost) -> float:
    """NCCL-style two-level all-reduce of a group with ``local`` members on each of ``nodes``.

    Reduce-scatter inside the node, all-reduce of each ``1/local`` shard across nodes (the
    ``local`` shards travel in parallel over their own NICs; ring or tree, whichever is faster),
    all-gather inside the node. With ``nodes == 1`` it is the ring all-reduce in the node.
    """
    inside = ring_reduce_scatter_time(nbytes, local, intra.bandwidth, intra.latency)
    across = best_allreduce_time(nbytes / local, nodes, inter.bandwidth, inter.latency)
    return 2 * inside + across


def hierarchical_allgather_time(nbytes: float, local: int, nodes: int,
                                intra: TierCost, inter: TierCost) -> float:
    """Two-level all-gather: across nodes on ``1/local`` shards, then inside the node.

    Bandwidth as the two levels; latency as NCCL's one ring through all ``n = local * nodes``
    ranks pays it: ``n - 1`` steps, ``nodes - 1`` of them across nodes, the other ``n - nodes``
    on NVLink (NCCL src/graph/tuning.cc, ring: ``(nsteps - nInterSteps) * intraLat +
    nInterSteps * interLat`` with ``nInterSteps = nNodes - 1`` for all-gather and
    reduce-scatter). The node's own ring counts ``local - 1`` of them; the chunks every other
    node's shards add cost ``(local - 1)(nodes - 1)`` more: with thousands of ranks and small
    messages, the latency is what an all-gather costs.
    """
    across = ring_allgather_time(nbytes / local, nodes, inter.bandwidth, inter.latency)
    inside = ring_allgather_time(nbytes, local, intra.bandwidth, intra.latency)
    return across + inside + ring_steps_beyond_the_node(local, nodes) * intra.latency


def ring_steps_beyond_the_node(local: int, nodes: int) -> int:
    """NVLink steps of an ``local * nodes`` all-gather ring beyond the node's own ``local - 1``
    (``n - nodes`` in all, see ``hierarchical_allgather_time``)."""
    return (local - 1) * (nodes - 1) if local > 1 and nodes > 1 else 0
