"""A collective that is not a ring, described here by its own ``load`` and registered with one
``described_collective`` call from outside the package, is timed through the closed form, the
full-fidelity fabric's flows and ``clustersim collective`` as the shipped ones are
(docs/extending.md, "A collective"). Nothing else in clustersim is edited for it.

The toy is TensorRT-LLM's one-shot all-reduce (NVIDIA/TensorRT-LLM,
cpp/tensorrt_llm/kernels/customAllReduceKernels.cu, ``oneShotAllReduceKernel``): inside one
node, after one barrier, each GPU pulls every peer's whole buffer over NVLink and sums it, so
each port carries ``(n-1) X`` out and in, in one step, against NCCL's ring's ``2(n-1)/n X``
in ``2(n-1)`` steps; it does not run across nodes. Declared beside NCCL's ring as candidates,
the one-shot wins small messages (one alpha against ``2(n-1)``) and the ring large ones,
which is why TensorRT-LLM keeps it for small messages only.
"""

from __future__ import annotations

import json

import pytest
from cli_helpers import run
from sim_helpers import flat_profile

from clustersim.simulator.inputs.scenario import build_cluster
from clustersim.simulator.network.bus_bandwidth import collective_seconds
from clustersim.topologies.collective_algorithms import ALL_REDUCE_RING
from clustersim.topologies.collective_registry import (
    Load,
    described_collective,
    register_collective,
    unregister_collective,
)
from clustersim.topologies.profile import profile_for_gpu

NAME = "toy-one-shot-allreduce"
NVLINK, NIC = (400e9, 3e-6), (40e9, 9e-6)  # bytes/s and alpha of each tier, at line rate
SMALL, LARGE = 2**16, 2**30


class OneShot:
    """Every member sends its whole buffer to each other member of its node, in one step."""

    def load(self, nbytes: float, local: int, nodes: int, size: int) -> Load | None:
        if nodes > 1:
            return None
        return Load((size - 1) * nbytes, 0.0, 1 if size > 1 else 0, 0, peers="all")


@pytest.fixture
def toy():
    algorithms = {"one-shot": OneShot(), "ring": ALL_REDUCE_RING}
    yield register_collective(described_collective(NAME, algorithms,
                                                   bus_factor=lambda n: 2 * (n - 1) / n))
    unregister_collective(NAME)


def cluster(gpus: int):
    """DGX-H100-shaped nodes whose tiers run at NVLINK and NIC under the flat profile."""
    return build_cluster({"preset": "dgx-h100", "gpus": max(gpus, 8),
                          "intra_node": {"bandwidth": NVLINK[0] / 1e9, "latency": NVLINK[1]},
                          "inter_node": {"bandwidth": NIC[0] / 1e9, "latency": NIC[1]}})


def one_shot_seconds(nbytes: float, n: int) -> float:
    """By hand: (n-1) X through each NVLink port, one alpha."""
    return (n - 1) * nbytes / NVLINK[0] + NVLINK[1]


def ring_seconds(nbytes: float, local: int, nodes: int) -> float:
    """NCCL's ring all-reduce by hand: 2(n-1)/n X, 1/local of it over each NIC beside the rest
    over NVLink; 2(n-1) alphas, 2(nodes-1) of them across nodes."""
    n = local * nodes
    sent = 2 * (n - 1) / n * nbytes
    if nodes == 1:
        return sent / NVLINK[0] + 2 * (n - 1) * NVLINK[1]
    return (max((local - 1) / local * sent / NVLINK[0], sent / local / NIC[0])
            + 2 * (n - nodes) * NVLINK[1] + 2 * (nodes - 1) * NIC[1])


@pytest.mark.parametrize("fidelity", ["representative", "full"])
def test_in_a_node_the_one_shot_wins_small_messages_and_the_ring_large_ones(toy, fidelity):
    small = collective_seconds(cluster(8), flat_profile(), NAME, 8, SMALL, fidelity)
    large = collective_seconds(cluster(8), flat_profile(), NAME, 8, LARGE, fidelity)
    assert one_shot_seconds(SMALL, 8) < ring_seconds(SMALL, 8, 1)
    assert small == pytest.approx(one_shot_seconds(SMALL, 8), rel=1e-9)
    assert ring_seconds(LARGE, 8, 1) < one_shot_seconds(LARGE, 8)
    assert large == pytest.approx(ring_seconds(LARGE, 8, 1), rel=1e-9)


@pytest.mark.parametrize("fidelity", ["representative", "full"])
@pytest.mark.parametrize("nbytes", [SMALL, LARGE])
def test_across_nodes_only_the_ring_runs(toy, fidelity, nbytes):
    seconds = collective_seconds(cluster(16), flat_profile(), NAME, 16, nbytes, fidelity)
    assert seconds == pytest.approx(ring_seconds(nbytes, 8, 2), rel=1e-9)


def test_the_command_line_times_the_toy(toy, capsys):
    code, out, err = run(capsys, "collective", NAME, "--cluster", "dgx-h100", "--gpus", "8",
                         "--min-bytes", "64K", "--max-bytes", "64K", "--json")
    assert code == 0, err
    row = json.loads(out)["rows"][0]
    seconds = collective_seconds(build_cluster({"preset": "dgx-h100", "gpus": 8}),
                                 profile_for_gpu("h100-sxm"), NAME, 8, SMALL)
    assert row["time_us"] == pytest.approx(seconds * 1e6, rel=1e-9)
