"""Each collective algorithm described once: what every member sends on each tier, to which
peers, and the latency steps it waits.

An algorithm is an object with ``load(nbytes, local, nodes, size)``: for a buffer of
``nbytes`` over ``size`` members, ``local`` on each of ``nodes`` nodes, the ``Load`` each
member carries, or ``None`` where the algorithm does not run on that shape (a tree over one
node, NVLS with one GPU a node). That one description is read twice: ``load_time`` turns it
into the alpha-beta closed form (both tiers at once, the slower sets the pace, then the
steps' alphas: NCCL's tuner, src/graph/tuning.cc), and ``simulator/network/fabric.py``
(``Fabric.run``) lays the same ``Load`` out as flows, so the two cannot drift apart. Where
NCCL holds several algorithms for one collective, its tuner runs the one whose closed form is
fastest (``fastest``); all-reduce's are ``ALL_REDUCE``.

Shipped: every ring (``Ring``: all-gather, reduce-scatter, all-reduce's ring), all-reduce's
double binary tree (``Tree``) and NVLink SHARP (``Nvls``), and the pairwise all-to-all
(``Pairwise``). ``bandwidth`` is bytes/s per GPU per direction, ``latency`` the per-step
alpha in seconds, ``nbytes`` the full buffer each rank holds (the all-reduce input, the
all-gather output, the reduce-scatter input, each rank's all-to-all buffer).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

RING, SWITCH, ALL = "ring", "switch", "all"  # how a Load's bytes are laid out (Load.peers)


@dataclass(frozen=True, slots=True)
class TierCost:
    """Achieved bandwidth (bytes/s per GPU per direction) and latency (s) of one tier; on an
    NVSwitch with NVLink SHARP, also what NVLS all-reduce achieves per byte it moves through
    a GPU's port (0: no NVLS)."""

    bandwidth: float
    latency: float
    nvls: float = 0.0


@dataclass(frozen=True, slots=True)
class Load:
    """What each member of a collective carries, all at once, after its latency steps.

    ``peers`` says to whom: ``"ring"``, ``nvlink`` bytes to its successor in its node's ring
    and ``nic`` bytes to its successor in the ring across nodes of its local position;
    ``"switch"``, ``nvlink`` bytes through its own NVSwitch port both ways (NVLink SHARP
    reduces and multicasts in the switch), at what NVLS achieves, beside the ``nic`` ring;
    ``"all"``, ``nvlink`` bytes spread evenly over its node's other members and ``nic`` bytes
    over the members of the other nodes (pairwise sends).
    """

    nvlink: float  # bytes each member sends over its NVLink port
    nic: float  # bytes each member sends over its NIC
    intra_steps: float  # latency steps at the node's alpha
    inter_steps: float  # latency steps at the alpha of the slowest tier across nodes
    peers: str = RING


class Algorithm(Protocol):
    """A collective algorithm: the ``Load`` of each member, ``None`` where it does not run."""

    def load(self, nbytes: float, local: int, nodes: int, size: int) -> Load | None: ...


def load_time(load: Load, intra: TierCost, inter: TierCost) -> float:
    """The closed form of a ``Load``: NVLink and NIC carry their bytes at once, the slower sets
    the pace (NCCL src/graph/tuning.cc: a ring's busBw is its bottleneck link's, not a sum over
    the links it crosses), then the steps' alphas, those across nodes at ``inter``'s
    (``(nsteps - nInterSteps) * intraLat + nInterSteps * interLat``). Through the switch
    (NVLS) the NVLink bytes move at what NVLS achieves (``intra.nvls``)."""
    rate = intra.nvls if load.peers == SWITCH else intra.bandwidth
    return (max(load.nvlink / rate, load.nic / inter.bandwidth)
            + load.intra_steps * intra.latency + load.inter_steps * inter.latency)


def usable_load(algorithm: Algorithm, nbytes: float, local: int, nodes: int, size: int,
                intra: TierCost) -> Load | None:
    """``algorithm``'s ``Load`` over ``size`` members, ``local`` on each of ``nodes`` nodes;
    ``None`` where it cannot run there: not on that shape, or through a switch without NVLS."""
    load = algorithm.load(nbytes, local, nodes, size)
    if load is None or (load.peers == SWITCH and intra.nvls <= 0):
        return None
    return load


def algorithm_time(algorithm: Algorithm, nbytes: float, local: int, nodes: int,
                   intra: TierCost, inter: TierCost, size: int | None = None) -> float | None:
    """``algorithm``'s closed form over ``size`` members (``local * nodes`` unless given),
    ``local`` on each of ``nodes`` nodes; ``None`` where it cannot run there."""
    load = usable_load(algorithm, nbytes, local, nodes, local * nodes if size is None else size,
                       intra)
    return None if load is None else load_time(load, intra, inter)


def algorithm_times(algorithms: Mapping[str, Algorithm], nbytes: float, local: int, nodes: int,
                    intra: TierCost, inter: TierCost, size: int | None = None
                    ) -> dict[str, float]:
    """The closed form of each algorithm that can run, by name, in ``algorithms``' order."""
    times = {name: algorithm_time(algorithm, nbytes, local, nodes, intra, inter, size)
             for name, algorithm in algorithms.items()}
    return {name: t for name, t in times.items() if t is not None}


def fastest(algorithms: Mapping[str, Algorithm], nbytes: float, local: int, nodes: int,
            intra: TierCost, inter: TierCost, size: int | None = None) -> str:
    """The name of the algorithm NCCL's tuner runs: it times every algorithm it enabled with
    its alpha-beta model (src/graph/tuning.cc) and runs the fastest; here the first listed
    wins a tie."""
    times = algorithm_times(algorithms, nbytes, local, nodes, intra, inter, size)
    return min(times, key=times.get)


def ring_load(sent: float, steps: float, inter_steps: float, local: int, nodes: int) -> Load:
    """A ring through ``local`` members on each of ``nodes`` nodes, each sending ``sent``
    bytes in ``steps`` steps, ``inter_steps`` of them across nodes: in one node all of it over
    NVLink; across nodes ``(local-1)/local`` over NVLink and ``1/local`` over its NIC, at
    once, as NCCL's channels each leave a node once, by the NIC of the rank where they leave."""
    if nodes == 1:
        return Load(sent, 0.0, steps, 0)
    return Load((local - 1) / local * sent, sent / local, steps - inter_steps, inter_steps)


@dataclass(frozen=True)
class Ring:
    """A collective as one pipelined ring through ``n`` members on ``nodes`` nodes, as NCCL's
    ring algorithm runs each of its collectives: what each member sends its successor and
    the latency steps (NCCL's ``nsteps`` and ``nInterSteps``)."""

    sent: Callable[[int], float]  # n -> bytes each member sends its successor, per byte of X
    steps: Callable[[int, int], float]  # (n, nodes) -> latency steps in all (NCCL's nsteps)
    inter_steps: Callable[[int, int], float]  # (n, nodes) -> those across nodes (nInterSteps)

    def load(self, nbytes: float, local: int, nodes: int, size: int = 0) -> Load:
        """Every member's ``sent(n) * nbytes`` around the ring (``ring_load``); nothing when
        the group is one rank."""
        n = local * nodes
        if n <= 1:
            return Load(0.0, 0.0, 0, 0)
        across = self.inter_steps(n, nodes) if nodes > 1 else 0
        return ring_load(self.sent(n) * nbytes, self.steps(n, nodes), across, local, nodes)


def tree_steps(nodes: int) -> int:
    """Latency steps of a double binary tree over ``nodes``: up and down its depth."""
    return 2 * math.ceil(math.log2(nodes))


@dataclass(frozen=True)
class Tree:
    """NCCL's all-reduce tree: a chain through the node's members (``2(local-1)/local X``
    over NVLink, ``2(local-1)`` steps) beside a double binary tree across nodes, each of its
    two trees carrying half the buffer up (reduce) and down (broadcast), pipelined: a node is
    an inner node of at most one tree, so its ``local`` NICs send ``2X`` between them, after
    ``2 ceil(log2 nodes)`` steps (Sanders, Speck & Träff 2009). Over one node NCCL runs no
    tree (its tuner disables it there)."""

    def load(self, nbytes: float, local: int, nodes: int, size: int = 0) -> Load | None:
        if nodes == 1:
            return None
        return Load(2 * (local - 1) / local * nbytes, 2 * nbytes / local, 2 * (local - 1),
                    tree_steps(nodes))


ALL_REDUCE_TREE = Tree()


@dataclass(frozen=True)
class Nvls:
    """NVLink SHARP all-reduce: the switch reduces as it reads (``multimem.ld_reduce``) and
    multicasts what it is given (``multimem.st``), so each GPU's port carries its ``X`` out to
    the reduction and ``X/local`` of reduced result out to the multicast, and as much in,
    after 2 steps; across nodes NCCL's NVLS_TREE runs the tree over the NICs beside it
    (``Tree``). Needs more than one GPU a node."""

    def load(self, nbytes: float, local: int, nodes: int, size: int = 0) -> Load | None:
        if local <= 1:
            return None
        tree = ALL_REDUCE_TREE.load(nbytes, local, nodes)  # across nodes; None on one node
        return Load((local + 1) / local * nbytes, tree.nic if tree else 0.0, 2,
                    tree.inter_steps if tree else 0, SWITCH)


@dataclass(frozen=True)
class Pairwise:
    """The all-to-all as NCCL's grouped sends and receives run it: every member sends
    ``nbytes / size`` to every other member, all at once, after ``size - 1`` steps, all of
    them at the slowest tier's alpha when the group spans nodes. Of its ``nbytes``, the share
    for the other nodes' members (``remote``) leaves by its NIC; ``(local-1)/local`` of the
    rest crosses NVLink."""

    def load(self, nbytes: float, local: int, nodes: int, size: int = 0) -> Load:
        size = size or local * nodes
        if nodes == 1:
            return Load((size - 1) / size * nbytes, 0.0, size - 1, 0, ALL)
        remote = (size - local) / size
        return Load((local - 1) / local * (nbytes * (1 - remote)), remote * nbytes, 0,
                    size - 1, ALL)


# NCCL src/graph/tuning.cc, ncclTopoTuneModel: all-gather and reduce-scatter send (n-1)/n of
# the buffer in nRanks - 1 steps, nNodes - 1 across nodes; all-reduce twice that (its
# reduce-scatter, then its all-gather), 2(nNodes - 1) across nodes (an earlier tuning.cc's
# count; later ones count 2 nNodes).
ALL_GATHER_RING = Ring(lambda n: (n - 1) / n, lambda n, nodes: n - 1,
                       lambda n, nodes: nodes - 1)
ALL_REDUCE_RING = Ring(lambda n: 2 * (n - 1) / n, lambda n, nodes: 2 * (n - 1),
                       lambda n, nodes: 2 * (nodes - 1))
ALL_REDUCE_NVLS = Nvls()
ALL_TO_ALL = Pairwise()
# NCCL's all-reduce algorithms (the first listed wins a tie).
ALL_REDUCE: dict[str, Algorithm] = {"ring": ALL_REDUCE_RING, "tree": ALL_REDUCE_TREE,
                                    "nvls": ALL_REDUCE_NVLS}


__all__ = ["ALL", "ALL_GATHER_RING", "ALL_REDUCE", "ALL_REDUCE_NVLS", "ALL_REDUCE_RING",
           "ALL_REDUCE_TREE", "ALL_TO_ALL", "RING", "SWITCH", "Algorithm", "Load", "Nvls",
           "Pairwise", "Ring", "Tree", "TierCost", "algorithm_time", "algorithm_times",
           "fastest", "load_time", "ring_load", "tree_steps", "usable_load"]
