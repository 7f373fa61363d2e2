"""Which GPUs full fidelity must simulate: one per tensor-parallel group, when its peers agree.

The peers of a tensor-parallel group inside one node do the same work at the same moments,
and their data-parallel and pipeline traffic are mirror images: peer ``t`` of one node talks
to peer ``t`` of another, over its own NVLink port and NIC (its own rail). Simulating peer 0
alone, with every link a single GPU or a single rail owns unchanged and every link the peers
share (a pod's spine links, a fat-tree leaf's uplinks) carrying ``1/tp`` of its capacity for
this one flow standing for ``tp`` identical ones, gives every flow the max-min rate it has
with all peers running: each shared link's fair share is the same, only counted ``tp`` times
fewer. This is what lets a 16,384-GPU job run in full fidelity on a laptop.

It stops being exact when peers can differ: per-port faults or bandwidth jitter, or a
fat-tree whose spine each NIC's flows pick by their own ECMP hash. (Adaptive routing spreads
every flow over all spines alike, and rail-optimized fabrics hash on the node pair, the same
on every rail plane, so both keep it.)

Where only the peers' NICs differ (ECMP's spines, a degraded NIC) and the group fills its node,
it folds another way (``mirrored``): the simulated peer issues every peer's flows itself, each
over that peer's NIC and the spine its own hash picks, on links at their full capacity, and its
collectives and sends end with the slowest of them. That is the load every GPU simulated puts
on the fabric; there, a peer whose transfer ends first starts its next one before its peers
until their next TP ring, which waits for every member (``comm.FabricComm.join_ring``), here
they wait for one another at once. The steps agree to 1e-9 on most tests, within 1.5% on
deep NIC-bound ones whose peers drift (``tests/simulator/test_symmetry.py``). The NVLink ports stay
the simulated peer's alone: exact when the group fills its node, as nothing else uses them,
and where only an NVLink port differs, the simulated one runs at the group's slowest (the
group's rings end with it). Otherwise (per-port jitter, or both a NIC and an NVLink port
differing) every GPU is simulated.

Per-GPU compute spread does not stop either fold: the group's collectives every layer make it
compute at its slowest member's pace, so the simulated peer takes the group's largest factor.
"""

from __future__ import annotations

from clustersim.topologies.hardware import ClusterSpec

from ..inputs.placement import parse_order
from ..inputs.scenario import Scenario


def tp_width(s: Scenario) -> int:
    """How many GPUs each simulated rank stands for in full fidelity: ``tp`` when the tensor-
    parallel group is innermost and inside a node and its peers cannot differ, else 1 (also
    where experts fold over the TP ranks, ``expert_tp`` 1: their all-to-alls join TP peers)."""
    p, c = s.parallel, s.cluster
    if p.tp == 1 or parse_order(p.order)[0] != "tp" or c.gpus_per_node % p.tp or p.folded:
        return 1
    return p.tp if peers_alike(c) or mirrored(s) else 1


def mirrored(s: Scenario) -> bool:
    """Whether each simulated rank issues its peers' flows itself (``tp_width`` ranks stand
    for a group, no link is shared ``1/tp``): the group fills its node, the tensor-parallel
    dimension innermost, and its peers differ on one side only: outside the node, by the
    spines their ECMP hashes pick or a degraded NIC, or inside it, by a degraded NVLink port
    (``links.FabricLinks._port_link`` runs the simulated one at its group's slowest)."""
    p, c = s.parallel, s.cluster
    if p.tp == 1 or p.tp != c.gpus_per_node or parse_order(p.order)[0] != "tp":
        return False
    # One side only: where both a peer's NIC and another's NVLink port differ, the slowest
    # peer of one phase is not the slowest of the next, and the group's pace is the slowest
    # sum of phases (every GPU simulated), not the sum of each phase's slowest (tested: 0.8%)
    nvlink = any(f.port == "nvlink" for f in c.faults)
    nics = _hashed(c) or any(f.port == "nic" for f in c.faults)
    return not _jitter(c) and nvlink != nics


def peers_alike(c: ClusterSpec) -> bool:
    """No per-port differences (faults, link jitter) and no per-NIC ECMP choice of spine."""
    if not _ports_alike(c):
        return False
    return not _hashed(c)


def _hashed(c: ClusterSpec) -> bool:
    """Fat-tree leaves whose every NIC hashes its own spine (static ECMP)."""
    net = c.inter_node
    return net.topology == "fat-tree" and net.spines > 1 and net.routing == "ecmp"


def _ports_alike(c: ClusterSpec) -> bool:
    """No port of one GPU differs from its peers' (faults, link jitter)."""
    return not (c.faults or _jitter(c))


def _jitter(c: ClusterSpec) -> bool:
    return c.variability is not None and c.variability.link_sigma > 0
