"""Alpha-beta costs of collectives, as closed forms.

``bandwidth`` is in bytes/s per GPU per direction (already scaled by the profile's achieved
fraction), ``latency`` is the per-step alpha in seconds, ``nbytes`` the size of the full buffer
each rank holds (the all-reduce input, the all-gather output, the reduce-scatter input).
Ring algorithms: Patarasuk & Yuan 2009; Thakur, Rabenseifner & Gropp 2005. A ring collective
is described once, as a ``Ring`` (what each member sends its successor, the latency steps);
``ring_time`` is its closed form and ``simulator/network/fabric.py:Fabric.ring`` runs the same
description as flows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
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
    """Achieved bandwidth (bytes/s per GPU per direction) and latency (s) of one tier; on an
    NVSwitch with NVLink SHARP, also what NVLS all-reduce achieves per byte it moves through
    a GPU's port (0: no NVLS)."""

    bandwidth: float
    latency: float
    nvls: float = 0.0


def nvls_allreduce_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """NVLink SHARP all-reduce of ``n`` GPUs on one NVSwitch: ``(n+1)/n * X/B + 2 alpha``.

    The switch reduces as it reads (``multimem.ld_reduce``) and multicasts what it is given
    (``multimem.st``): each GPU's port carries its ``X`` out to the reduction and ``X/n`` of
    reduced result out to the multicast, and as much in — against ``2(n-1)/n X`` each way for
    the ring. ``B`` is what NVLS achieves on those bytes, below the ring's copies (NCCL's tuner
    scales NVLS by its own ``nvlsEfficiency``, src/graph/tuning.cc).
    """
    if n <= 1:
        return 0.0
    return (n + 1) / n * nbytes / bandwidth + 2 * latency


def hierarchical_allreduce_time(nbytes: float, local: int, nodes: int,
                                intra: TierCost, inter: TierCost) -> float:
    """NCCL's all-reduce of a group with ``local`` members on each of ``nodes`` nodes: the
    fastest of its ring, its tree and NVLS (``hierarchical_allreduce_times``)."""
    return min(hierarchical_allreduce_times(nbytes, local, nodes, intra, inter).values())


def hierarchical_allreduce_algorithm(nbytes: float, local: int, nodes: int,
                                     intra: TierCost, inter: TierCost) -> str:
    """``"ring"``, ``"tree"`` or ``"nvls"``: the one NCCL's tuner would pick for this group."""
    times = hierarchical_allreduce_times(nbytes, local, nodes, intra, inter)
    return min(times, key=times.get)


def hierarchical_allreduce_times(nbytes: float, local: int, nodes: int,
                                 intra: TierCost, inter: TierCost) -> dict[str, float]:
    """Ring, tree and (on an NVLS switch) NVLS all-reduce of a group spread over nodes, each
    pipelined over both tiers.

    Ring: one ring through all ``n = local * nodes`` ranks; NCCL's channels each cross a node
    once, by the NIC of the rank where they leave, so of the ``2(n-1)/n X`` a rank sends,
    ``(local-1)/local`` go over NVLink and ``1/local`` over its NIC, both at once: the slower
    sets the pace (``pipelined_ring_time``), after ``2(n-1)`` steps, ``2(nodes-1)`` across
    nodes. Tree: a chain in the node (``2(local-1)/local X`` over NVLink) and a double binary
    tree across nodes (``2 X/local`` over each NIC), pipelined too, after ``2(local-1)`` and
    ``2 ceil(log2 nodes)`` steps. NVLS: the switch reduces in the node
    (``nvls_allreduce_time``); across nodes NCCL's NVLS_TREE runs the same tree over the NICs
    beside it. With one member per node these are the flat ring and tree; on one node, the ring
    in the node and NVLS.
    """
    times = {"ring": ring_time(ALL_REDUCE_RING, nbytes, local, nodes, intra, inter),
             "tree": math.inf}
    nvls = intra.nvls > 0 and local > 1
    if nvls:
        times["nvls"] = nvls_allreduce_time(nbytes, local, intra.nvls, intra.latency)
    if nodes == 1:
        return times
    across = 2 * nbytes / local / inter.bandwidth  # each NIC's share of the tree
    tree_alpha = 2 * math.ceil(math.log2(nodes)) * inter.latency
    times["tree"] = (max(2 * (local - 1) / local * nbytes / intra.bandwidth, across)
                     + 2 * (local - 1) * intra.latency + tree_alpha)
    if nvls:
        times["nvls"] = (max((local + 1) / local * nbytes / intra.nvls, across)
                         + 2 * intra.latency + tree_alpha)
    return times


def pipelined_ring_time(sent: float, local: int, intra: TierCost, inter: TierCost) -> float:
    """Bandwidth term of a ring through ``local`` ranks on each of several nodes, each rank
    sending ``sent`` bytes: ``(local-1)/local`` of them over NVLink and ``1/local`` over its
    NIC at the same time (NCCL src/graph/tuning.cc: a ring's busBw is nChannels times its
    bottleneck link's per-channel bandwidth, not a sum over the links it crosses)."""
    return max((local - 1) / local * sent / intra.bandwidth, sent / local / inter.bandwidth)


def hierarchical_allgather_time(nbytes: float, local: int, nodes: int,
                                intra: TierCost, inter: TierCost) -> float:
    """All-gather into ``nbytes`` (reduce-scatter of ``nbytes`` costs the same) over a ring
    through all ``n = local * nodes`` ranks: ``(n-1)/n X`` sent, pipelined over NVLink and the
    NIC (``pipelined_ring_time``). Latency as NCCL's ring pays it: ``n - 1`` steps, ``nodes -
    1`` of them across nodes, the other ``n - nodes`` on NVLink (NCCL src/graph/tuning.cc,
    ring: ``(nsteps - nInterSteps) * intraLat + nInterSteps * interLat``, ``nInterSteps =
    nNodes - 1`` for all-gather and reduce-scatter): with thousands of ranks and small
    messages, the latency is what an all-gather costs.
    """
    return ring_time(ALL_GATHER_RING, nbytes, local, nodes, intra, inter)


@dataclass(frozen=True)
class Ring:
    """A collective as one pipelined ring through ``n`` members on ``nodes`` nodes, as NCCL's
    ring algorithm runs each of its collectives: what each member sends its successor and
    the latency steps. Its closed form (``ring_time``) and its flows (``Fabric.ring``) both
    read this one description."""

    sent: Callable[[int], float]  # n -> bytes each member sends its successor, per byte of X
    steps: Callable[[int, int], float]  # (n, nodes) -> latency steps in all (NCCL's nsteps)
    inter_steps: Callable[[int, int], float]  # (n, nodes) -> those across nodes (nInterSteps)


def ring_time(ring: Ring, nbytes: float, local: int, nodes: int, intra: TierCost,
              inter: TierCost) -> float:
    """A ring through ``local`` members on each of ``nodes`` nodes: each member's ``sent``
    bytes, over NVLink in one node, else pipelined over NVLink and its NIC at once
    (``pipelined_ring_time``); then its steps' alphas, those across nodes at ``inter``'s
    (NCCL src/graph/tuning.cc, ring: ``(nsteps - nInterSteps) * intraLat + nInterSteps *
    interLat``)."""
    n = local * nodes
    if n <= 1:
        return 0.0
    sent, steps = ring.sent(n) * nbytes, ring.steps(n, nodes)
    if nodes == 1:
        return sent / intra.bandwidth + steps * intra.latency
    across = ring.inter_steps(n, nodes)
    return (pipelined_ring_time(sent, local, intra, inter)
            + (steps - across) * intra.latency + across * inter.latency)


# NCCL src/graph/tuning.cc, ncclTopoTuneModel: all-gather and reduce-scatter send (n-1)/n of
# the buffer in nRanks - 1 steps, nNodes - 1 across nodes; all-reduce twice that (its
# reduce-scatter, then its all-gather), 2(nNodes - 1) across nodes (an earlier tuning.cc's
# count; later ones count 2 nNodes).
ALL_GATHER_RING = Ring(lambda n: (n - 1) / n, lambda n, nodes: n - 1,
                       lambda n, nodes: nodes - 1)
ALL_REDUCE_RING = Ring(lambda n: 2 * (n - 1) / n, lambda n, nodes: 2 * (n - 1),
                       lambda n, nodes: 2 * (nodes - 1))
