"""Which GPUs full fidelity must simulate: one per tensor-parallel group, when its peers agree.

The peers of a tensor-parallel group inside one node do the same work at the same moments,
and their data-parallel and pipeline traffic are mirror images: peer ``t`` of one node talks
to peer ``t`` of another, over its own NVLink port and NIC (its own rail). Simulating peer 0
alone, with every link a single GPU or a single rail owns unchanged and every link the peers
share (a pod's spine links, a fat-tree leaf's uplinks) carrying ``1/tp`` of its capacity for
this one flow standing for ``tp`` identical ones, gives every flow the max-min rate it has
with all peers running: each shared link's fair share is the same, only counted ``tp`` times
fewer. This is what lets a 16,384-GPU job run in full fidelity on a laptop.

It stops being exact, and every GPU is simulated, when peers can differ: per-port faults or
bandwidth jitter. (Adaptive routing spreads every flow over all spines alike, and rail-optimized
fabrics hash on the node pair, the same on every rail plane, so both keep it.)

A fat-tree whose spine each NIC's flows pick by their own ECMP hash is folded another way,
where the group fills its node (``mirrored``): the simulated peer issues every peer's flows
itself, each over its own NIC and the spine its own hash picks, on links at their full
capacity, and its collective ends with the slowest of them. That is the fabric every GPU's
simulation loads, less one thing: there each peer's collectives end when its own flows do and
the peers drift apart until their next TP collective, here they wait for one another, as the
TP collectives every layer make real peers do. On ``examples/fabric-llama3-70b.yaml`` the two
steps differ by under 0.1% (``tests/simulator/test_symmetry.py``); the NVLink ports stay the
simulated peer's alone, which is exact when the group fills the node (nothing else uses them).
Per-GPU compute spread does not stop it: the group's collectives every layer make it
compute at its slowest member's pace, so the simulated peer takes the group's largest factor.
"""

from __future__ import annotations

from clustersim.topologies.hardware import ClusterSpec

from ..inputs.placement import parse_order
from ..inputs.scenario import Scenario


def tp_width(s: Scenario) -> int:
    """How many GPUs each simulated rank stands for in full fidelity: ``tp`` when the tensor-
    parallel group is innermost and inside a node and its peers cannot differ, else 1."""
    p, c = s.parallel, s.cluster
    if p.tp == 1 or parse_order(p.order)[0] != "tp" or c.gpus_per_node % p.tp:
        return 1
    return p.tp if peers_alike(c) or mirrored(s) else 1


def mirrored(s: Scenario) -> bool:
    """Whether each simulated rank issues its peers' flows itself (``tp_width`` ranks stand
    for a group, no link is shared ``1/tp``): the group fills its node, the tensor-parallel
    dimension innermost, and its peers differ only by the spines their ECMP hashes pick."""
    p, c = s.parallel, s.cluster
    return (p.tp > 1 and p.tp == c.gpus_per_node and parse_order(p.order)[0] == "tp"
            and _ports_alike(c) and not peers_alike(c))


def peers_alike(c: ClusterSpec) -> bool:
    """No per-port differences (faults, link jitter) and no per-NIC ECMP choice of spine."""
    if not _ports_alike(c):
        return False
    net = c.inter_node
    return not (net.topology == "fat-tree" and net.spines > 1 and net.routing == "ecmp")


def _ports_alike(c: ClusterSpec) -> bool:
    """No port of one GPU differs from its peers' (faults, link jitter)."""
    return not (c.faults or (c.variability is not None and c.variability.link_sigma > 0))
