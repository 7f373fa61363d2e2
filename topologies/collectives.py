"""Alpha-beta costs of collectives, as closed forms.

``bandwidth`` is in bytes/s per GPU per direction (already scaled by the profile's achieved
fraction), ``latency`` is the per-step alpha in seconds, ``nbytes`` the size of the full buffer
each rank holds (the all-reduce input, the all-gather output, the reduce-scatter input).
Ring algorithms: Patarasuk & Yuan 2009; Thakur, Rabenseifner & Gropp 2005. Each algorithm
is described once, in ``collective_algorithms.py`` (a ``Ring``, ``Tree``, ``Nvls`` or
``Pairwise``: what each member sends on NVLink and on its NIC, to which peers, and its
latency steps). The forms here are those descriptions' closed forms: the flat ones over one
tier (the textbook formulas their docstrings give, which tests/topologies/test_collectives.py
checks them against), the ``hierarchical_*`` ones over a group spread over nodes; and
``simulator/network/fabric.py:Fabric.run`` lays the same descriptions out as flows.
"""

from __future__ import annotations

from .collective_algorithms import (
    ALL_GATHER_RING,
    ALL_REDUCE,
    ALL_REDUCE_NVLS,
    ALL_REDUCE_RING,
    ALL_REDUCE_TREE,
    ALL_TO_ALL,
    Algorithm,
    Ring,
    TierCost,
    algorithm_time,
    algorithm_times,
    fastest,
)

__all__ = ["ALL_GATHER_RING", "ALL_REDUCE_RING", "Ring", "TierCost", "allreduce_algorithm",
           "alltoall_time", "best_allreduce_time", "hierarchical_allgather_time",
           "hierarchical_allreduce_algorithm", "hierarchical_allreduce_time",
           "hierarchical_allreduce_times", "nvls_allreduce_time", "one_tier_time", "p2p_time",
           "ring_allgather_time", "ring_allreduce_time", "ring_reduce_scatter_time", "ring_time",
           "tree_allreduce_time"]


def one_tier_time(algorithm: Algorithm, nbytes: float, local: int, nodes: int,
                  bandwidth: float, latency: float) -> float:
    """``algorithm``'s closed form with both tiers alike, ``bandwidth`` and ``latency`` (and
    NVLS, if it is one, at ``bandwidth``); 0 for a group of one, where nothing moves."""
    if local * nodes <= 1:
        return 0.0
    tier = TierCost(bandwidth, latency, bandwidth)
    return algorithm_time(algorithm, nbytes, local, nodes, tier, tier)


def ring_allreduce_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring all-reduce: ``2(n-1)/n * X/B + 2(n-1)*alpha`` (reduce-scatter then all-gather)."""
    return one_tier_time(ALL_REDUCE_RING, nbytes, n, 1, bandwidth, latency)


def tree_allreduce_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Double binary tree all-reduce (NCCL) over ``n`` ranks, one a node: ``2 X/B + 2
    ceil(log2 n) alpha``.

    Each of two trees carries half the buffer up (reduce) and down (broadcast), pipelined; a rank
    is an inner node of at most one tree, so it sends about X each way. Fewer latency steps than
    the ring's ``2(n-1)``: the tree wins on small messages over many ranks (Sanders et al. 2009).
    """
    return one_tier_time(ALL_REDUCE_TREE, nbytes, 1, n, bandwidth, latency)


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
    return one_tier_time(ALL_GATHER_RING, nbytes, n, 1, bandwidth, latency)


def ring_allgather_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring all-gather into an ``nbytes`` output: ``(n-1)/n * X/B + (n-1)*alpha``."""
    return ring_reduce_scatter_time(nbytes, n, bandwidth, latency)


def alltoall_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Pairwise all-to-all: each rank sends ``(n-1)/n`` of its ``nbytes`` in ``n-1`` steps."""
    return one_tier_time(ALL_TO_ALL, nbytes, n, 1, bandwidth, latency)


def p2p_time(nbytes: float, bandwidth: float, latency: float) -> float:
    """One point-to-point message: ``alpha + X/B``."""
    return latency + nbytes / bandwidth


def nvls_allreduce_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """NVLink SHARP all-reduce of ``n`` GPUs on one NVSwitch: ``(n+1)/n * X/B + 2 alpha``.

    The switch reduces as it reads (``multimem.ld_reduce``) and multicasts what it is given
    (``multimem.st``): each GPU's port carries its ``X`` out to the reduction and ``X/n`` of
    reduced result out to the multicast, and as much in — against ``2(n-1)/n X`` each way for
    the ring. ``B`` is what NVLS achieves on those bytes, below the ring's copies (NCCL's tuner
    scales NVLS by its own ``nvlsEfficiency``, src/graph/tuning.cc).
    """
    return one_tier_time(ALL_REDUCE_NVLS, nbytes, n, 1, bandwidth, latency)


def hierarchical_allreduce_time(nbytes: float, local: int, nodes: int,
                                intra: TierCost, inter: TierCost) -> float:
    """NCCL's all-reduce of a group with ``local`` members on each of ``nodes`` nodes: the
    fastest of its ring, its tree and NVLS (``hierarchical_allreduce_times``)."""
    return min(hierarchical_allreduce_times(nbytes, local, nodes, intra, inter).values())


def hierarchical_allreduce_algorithm(nbytes: float, local: int, nodes: int,
                                     intra: TierCost, inter: TierCost) -> str:
    """``"ring"``, ``"tree"`` or ``"nvls"``: the one NCCL's tuner would pick for this group."""
    return fastest(ALL_REDUCE, nbytes, local, nodes, intra, inter)


def hierarchical_allreduce_times(nbytes: float, local: int, nodes: int,
                                 intra: TierCost, inter: TierCost) -> dict[str, float]:
    """Ring, tree (across nodes) and NVLS (on an NVLS switch) all-reduce of a group spread over
    nodes, each pipelined over both tiers, by name; an algorithm that cannot run on the group
    is left out (``collective_algorithms.ALL_REDUCE``).

    Ring: one ring through all ``n = local * nodes`` ranks; NCCL's channels each cross a node
    once, by the NIC of the rank where they leave, so of the ``2(n-1)/n X`` a rank sends,
    ``(local-1)/local`` go over NVLink and ``1/local`` over its NIC, both at once: the slower
    sets the pace, after ``2(n-1)`` steps, ``2(nodes-1)`` across nodes. Tree: a chain in the
    node (``2(local-1)/local X`` over NVLink) and a double binary tree across nodes (``2
    X/local`` over each NIC), pipelined too, after ``2(local-1)`` and ``2 ceil(log2 nodes)``
    steps. NVLS: the switch reduces in the node (``nvls_allreduce_time``); across nodes
    NCCL's NVLS_TREE runs the same tree over the NICs beside it. With one member per node
    these are the flat ring and tree; on one node, the ring in the node and NVLS.
    """
    return algorithm_times(ALL_REDUCE, nbytes, local, nodes, intra, inter)


def hierarchical_allgather_time(nbytes: float, local: int, nodes: int,
                                intra: TierCost, inter: TierCost) -> float:
    """All-gather into ``nbytes`` (reduce-scatter of ``nbytes`` costs the same) over a ring
    through all ``n = local * nodes`` ranks: ``(n-1)/n X`` sent, pipelined over NVLink and the
    NIC (``collective_algorithms.ring_load``). Latency as NCCL's ring pays it: ``n - 1``
    steps, ``nodes - 1`` of them across nodes, the other ``n - nodes`` on NVLink (NCCL
    src/graph/tuning.cc, ring: ``(nsteps - nInterSteps) * intraLat + nInterSteps *
    interLat``, ``nInterSteps = nNodes - 1`` for all-gather and reduce-scatter): with
    thousands of ranks and small messages, the latency is what an all-gather costs.
    """
    return ring_time(ALL_GATHER_RING, nbytes, local, nodes, intra, inter)


def ring_time(ring: Ring, nbytes: float, local: int, nodes: int, intra: TierCost,
              inter: TierCost) -> float:
    """A ring through ``local`` members on each of ``nodes`` nodes: its ``Ring``'s load
    (``collective_algorithms.ring_load``) as a closed form (``load_time``)."""
    return algorithm_time(ring, nbytes, local, nodes, intra, inter)
