"""Each collective is described once (issue 25, item 2): its closed form and its flows read one
description (``topologies/collective_algorithms.py``), so alone on an idle fabric the flows of
every algorithm take its closed form's time, on every shape of group.

The two sides share only the ``Load`` (what each member sends on NVLink and on its NIC, to which
peers, after how many steps): the closed form is ``max(NVLink bytes / B_nvlink, NIC bytes /
B_nic) + steps * alpha``; the fabric runs one fluid flow per peer over every GPU's ports at
max-min fair rates (``flows.FlowNetwork``) and knows nothing of that formula. A description
whose bytes the fabric laid out differently from what the formula charges (a flow to the
wrong peer, a tier's bytes counted twice) fails here.
"""

from __future__ import annotations

import pytest
import simpy
from sim_helpers import flat_profile

from clustersim.simulator.inputs.scenario import build_cluster
from clustersim.simulator.network.bus_bandwidth import collective_seconds
from clustersim.simulator.network.fabric import Fabric
from clustersim.topologies import network as net
from clustersim.topologies.collective_algorithms import (
    ALL_GATHER_RING,
    ALL_REDUCE_NVLS,
    ALL_REDUCE_RING,
    ALL_REDUCE_TREE,
    ALL_TO_ALL,
    algorithm_time,
)
from clustersim.topologies.collective_registry import COLLECTIVES

PER_NODE = 8
NVLINK, NIC = (400e9, 3e-6), (40e9, 9e-6)  # bytes/s and alpha at line rate
NVLS_EFF = 0.6  # what NVLS achieves of NVLink's line here: below the ring's copies, as shipped
X = 2**30

ALGORITHMS = {"allgather ring": ALL_GATHER_RING, "allreduce ring": ALL_REDUCE_RING,
              "allreduce tree": ALL_REDUCE_TREE, "allreduce nvls": ALL_REDUCE_NVLS,
              "alltoall pairwise": ALL_TO_ALL}
# (members a node, nodes): one node, part of one, one member a node, and both tiers at once.
SHAPES = [(8, 1), (3, 1), (1, 4), (8, 2), (4, 4), (2, 8), (8, 5)]


def fabric(nodes: int, topology: str) -> tuple[simpy.Environment, Fabric]:
    """An idle fabric of ``nodes`` DGX-H100-shaped nodes with NVLink SHARP, its tiers at NVLINK
    and NIC, NVLS at NVLS_EFF of NVLink."""
    cluster = build_cluster({
        "preset": "dgx-h100", "gpus": PER_NODE * max(nodes, 1),
        "intra_node": {"bandwidth": NVLINK[0] / 1e9, "latency": NVLINK[1], "nvls": True},
        "inter_node": {"bandwidth": NIC[0] / 1e9, "latency": NIC[1], "topology": topology}})
    profile = flat_profile().model_copy(update={"comm_efficiency": {
        "intra_node": 1.0, "inter_node": 1.0, "spine": 1.0, "nvls": NVLS_EFF}})
    env = simpy.Environment()
    return env, Fabric(env, cluster, profile)


def members(local: int, nodes: int) -> list[int]:
    """The first ``local`` GPUs of each of ``nodes`` nodes (rails 0 .. local-1)."""
    return [node * PER_NODE + i for node in range(nodes) for i in range(local)]


@pytest.mark.parametrize("topology", ["rail-optimized", "fat-tree"])
@pytest.mark.parametrize("local, nodes", SHAPES)
@pytest.mark.parametrize("name", ALGORITHMS)
def test_alone_its_flows_take_its_closed_form(name, local, nodes, topology):
    algorithm = ALGORITHMS[name]
    env, f = fabric(nodes, topology)
    closed = algorithm_time(algorithm, X, local, nodes, f.tiers["intra_node"],
                            f.tiers["inter_node"])
    if closed is None:  # NCCL runs no tree over one node, and no NVLS with one GPU a node
        assert (name == "allreduce tree" and nodes == 1) or (name == "allreduce nvls"
                                                              and local == 1)
        return
    env.process(f.run({name: algorithm}, members(local, nodes), X))
    env.run()
    assert env.now == pytest.approx(closed, rel=1e-9)
    assert closed > 0


@pytest.mark.parametrize("local, nodes", [(8, 1), (8, 2), (1, 4), (8, 64)])
@pytest.mark.parametrize("nbytes", [2**16, 2**30])
def test_the_fabric_runs_the_algorithm_the_closed_form_finds_fastest(local, nodes, nbytes):
    """All-reduce over both fidelities: the fabric runs whichever of ring, tree and NVLS the
    closed form picks (small messages over many nodes: the tree), and takes its time."""
    env, f = fabric(nodes, "rail-optimized")
    intra, inter = f.tiers["intra_node"], f.tiers["inter_node"]
    best = min(t for a in (ALL_REDUCE_RING, ALL_REDUCE_TREE, ALL_REDUCE_NVLS)
               if (t := algorithm_time(a, nbytes, local, nodes, intra, inter)) is not None)
    env.process(f.allreduce(members(local, nodes), nbytes))
    env.run()
    assert env.now == pytest.approx(best, rel=1e-9)


def test_every_shipped_collective_is_declared_by_its_algorithms():
    """None keeps a closed form or flows of its own: each names the algorithms both read."""
    for name in ("allreduce", "allgather", "reduce_scatter", "alltoall"):
        assert COLLECTIVES[name].algorithms, name


@pytest.mark.parametrize("op", ["allreduce", "allgather", "reduce_scatter", "alltoall"])
@pytest.mark.parametrize("gpus", [8, 16, 64])
def test_both_fidelities_of_each_registered_collective_agree(op, gpus):
    """Through the registry, as ``clustersim collective`` runs it: the representative closed
    form over the placed group and the full fabric's flows agree to rounding, on a fabric
    whose leaves' uplinks are not oversubscribed (the preset's), so that neither slows."""
    env, f = fabric(gpus // PER_NODE, "rail-optimized")
    cluster, profile = f.cluster, flat_profile().model_copy(update={"comm_efficiency": {
        "intra_node": 1.0, "inter_node": 1.0, "spine": 1.0, "nvls": NVLS_EFF}})
    closed = COLLECTIVES[op].time(net.group_links(cluster, profile, gpus, 1), X)
    flows = collective_seconds(cluster, profile, op, gpus, X, "full")
    assert flows == pytest.approx(closed, rel=1e-9)
