"""A collective defined here, outside the package, and registered with one
``register_collective`` call is timed through every entry point a shipped one is: the closed
form (representative fidelity), flows on the full-fidelity fabric, both engine communicators,
nccl-tests' bus bandwidth and ``clustersim collective`` (docs/extending.md, "A collective").
Nothing else in clustersim is edited for it: this file is the whole of the collective.

The toy is NCCL's ring broadcast: the root's buffer is pipelined around the ring, so each
member forwards the whole ``X`` to its successor, in ``n`` latency steps, ``nodes`` of them
across nodes (nccl src/graph/tuning.cc, ``ncclTopoTuneModel``: ``nsteps = nRanks``,
``nInterSteps = nNodes`` for every collective but all-reduce, all-gather and reduce-scatter),
and nccl-tests reports its bus bandwidth equal to its algorithm bandwidth
(nccl-tests doc/PERFORMANCE.md, "Broadcast").
"""

from __future__ import annotations

import json

import pytest
import simpy
from cli_helpers import run
from sim_helpers import flat_fabric, flat_profile, scenario

from clustersim.simulator.costs.cost_model import CostModel
from clustersim.simulator.costs.stage_costs import StageCosts
from clustersim.simulator.discrete_event.comm import ClosedFormComm, FabricComm
from clustersim.simulator.inputs.scenario import build_cluster
from clustersim.simulator.network.bus_bandwidth import bus_bandwidth, collective_seconds
from clustersim.topologies.collective_registry import (
    Ring,
    register_collective,
    ring_collective,
    unregister_collective,
)
from clustersim.topologies.profile import profile_for_gpu

NAME = "toy-broadcast"
GIB = 2**30
NVLINK, NIC = (400e9, 3e-6), (40e9, 9e-6)  # bytes/s and alpha of each tier, at line rate

BROADCAST = Ring(sent=lambda n: 1.0, steps=lambda n, nodes: n,
                 inter_steps=lambda n, nodes: nodes)


@pytest.fixture
def toy():
    yield register_collective(ring_collective(NAME, BROADCAST, bus_factor=lambda n: 1.0))
    unregister_collective(NAME)


def broadcast_seconds(nbytes: float, local: int, nodes: int) -> float:
    """The pipelined ring broadcast by hand: every member forwards X; in one node over NVLink,
    across nodes 1/local of it over each NIC beside the rest over NVLink (each of NCCL's
    channels leaves a node by one NIC); n steps, nodes of them across nodes."""
    n = local * nodes
    if nodes == 1:
        return nbytes / NVLINK[0] + n * NVLINK[1]
    bandwidth = max((local - 1) / local * nbytes / NVLINK[0], nbytes / local / NIC[0])
    return bandwidth + (n - nodes) * NVLINK[1] + nodes * NIC[1]


def dgx(gpus: int):
    """A DGX-H100 cluster whose tiers run at NVLINK and NIC under the flat profile."""
    return build_cluster({"preset": "dgx-h100", "gpus": max(gpus, 8),
                          "intra_node": {"bandwidth": NVLINK[0] / 1e9, "latency": NVLINK[1]},
                          "inter_node": {"bandwidth": NIC[0] / 1e9, "latency": NIC[1]}})


def test_an_unregistered_collective_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown collective 'toy-broadcast'.*allreduce"):
        collective_seconds(dgx(8), flat_profile(), NAME, 8, GIB)


@pytest.mark.parametrize("fidelity", ["representative", "full"])
@pytest.mark.parametrize("local, nodes", [(8, 1), (4, 1), (8, 4), (1, 4)])
def test_the_toy_takes_its_closed_form_at_both_fidelities(toy, fidelity, local, nodes):
    """Alone on the fabric, its flows take the time the hand formula gives, as its closed
    form does: both derive from the one ``Ring``. One member per node: 4 GPUs 8 apart."""
    gpus = local * nodes
    cluster = dgx(gpus if local > 1 else 8 * nodes)
    if local > 1:
        seconds = collective_seconds(cluster, flat_profile(), NAME, gpus, GIB, fidelity)
    else:  # a group with one member per node: time it through the engine's communicators
        seconds = communicator_seconds(fidelity, nodes)
    assert seconds == pytest.approx(broadcast_seconds(GIB, local, nodes), rel=1e-6)


def communicator_seconds(fidelity: str, nodes: int) -> float:
    """The toy over the data-parallel group of a tp = 8 split, one replica per node, as the
    engine's communicator of that fidelity issues it for each member."""
    s = scenario(tp=8, dp=nodes, cluster={
        "intra_node": {"bandwidth": NVLINK[0] / 1e9, "latency": NVLINK[1]},
        "inter_node": {"bandwidth": NIC[0] / 1e9, "latency": NIC[1]}})
    cm, env = CostModel(s, flat_profile()), simpy.Environment()
    if fidelity == "full":
        comm = FabricComm(env, cm, cm.placement)
    else:
        comm = ClosedFormComm(env, StageCosts(s, flat_profile()), cm.placement.strides["pp"])
    members = [cm.placement.rank(tp=0, cp=0, dp=d, pp=0) for d in range(nodes)]
    for rank in members if fidelity == "full" else members[:1]:
        env.process(comm.collective(rank, "dp", NAME, GIB))
    env.run()
    return env.now


def test_its_bus_bandwidth_is_the_nvlink_rate_nccl_reaches_on_non_allreduce_operations(toy):
    """NVIDIA/nccl-tests#212 (sjeaugey): 'NCCL can get an effective NVLink bandwidth of
    370GB/s, which you can observe as BusBw when running non-allreduce operations' on 8 H100
    (the shipped profile's NVLink fraction was set from it, through all-gather: tests/data/
    nccl-tests.yaml). The broadcast, whose bus factor is 1, shows it within 2%."""
    cluster = build_cluster({"preset": "dgx-h100", "gpus": 8})
    busbw = bus_bandwidth(cluster, profile_for_gpu("h100-sxm"), NAME, 8, 8 * GIB)
    assert busbw / 1e9 == pytest.approx(370, rel=0.02)


def test_the_command_line_times_the_toy(toy, capsys):
    code, out, err = run(capsys, "collective", NAME, "--cluster", "dgx-h100", "--gpus", "16",
                         "--min-bytes", "1G", "--max-bytes", "1G", "--json")
    assert code == 0, err
    row = json.loads(out)["rows"][0]
    cluster = build_cluster({"preset": "dgx-h100", "gpus": 16})
    seconds = collective_seconds(cluster, profile_for_gpu("h100-sxm"), NAME, 16, GIB)
    assert row["time_us"] == pytest.approx(seconds * 1e6, rel=1e-9)
    assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"])


def test_a_ring_runs_as_flows_on_a_bare_fabric():
    """``Fabric.ring`` without the registry: 8 GPUs in one node, X each over NVLink."""
    env, fabric = flat_fabric(8, NVLINK, NIC)
    env.process(fabric.ring(BROADCAST, range(8), GIB))
    env.run()
    assert env.now == pytest.approx(broadcast_seconds(GIB, 8, 1), rel=1e-6)
