"""A port below its rated bandwidth (``cluster.faults``): full fidelity slows the flows through
it; representative runs every collective of the tier at the slowest port's pace, as a
synchronous step waits for its slowest group."""

from __future__ import annotations

import pytest
import simpy
from sim_helpers import flat_profile, scenario

from clustersim.errors import ScenarioError
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import build_cluster
from clustersim.simulator.network.fabric import Fabric
from clustersim.topologies import collectives as c

NVLINK = {"bandwidth": 100.0, "latency": 2e-6}
NIC = {"bandwidth": 25.0, "latency": 5e-6}


def cluster(faults, gpus=32):
    return build_cluster({"preset": "dgx-h100", "gpus": gpus, "intra_node": NVLINK,
                          "inter_node": NIC, "faults": faults})


def elapsed(fabric_body) -> float:
    env, body = fabric_body
    env.process(body)
    env.run()
    return env.now


def allreduce(faults, x=4e8):
    env = simpy.Environment()
    f = Fabric(env, cluster(faults), flat_profile())
    return env, f.allreduce(range(32), x)


def test_one_nic_at_half_speed_doubles_the_cross_node_phase():
    """32 GPUs on 4 nodes: the cross-node rings run at their slowest link, so with GPU 9's NIC
    at half speed the all-reduce is the closed form with the inter-node bandwidth halved (the
    in-node phases untouched)."""
    intra, inter = c.TierCost(100e9, 2e-6), c.TierCost(25e9, 5e-6)
    healthy = elapsed(allreduce([]))
    degraded = elapsed(allreduce([{"gpu": 9, "port": "nic", "bandwidth_factor": 0.5}]))
    assert healthy == pytest.approx(c.hierarchical_allreduce_time(4e8, 8, 4, intra, inter),
                                    rel=0.01)
    half = c.TierCost(12.5e9, 5e-6)
    assert degraded == pytest.approx(c.hierarchical_allreduce_time(4e8, 8, 4, intra, half),
                                     rel=0.01)


def test_a_slow_nvlink_port_slows_the_in_node_phases():
    degraded = elapsed(allreduce([{"gpu": 3, "port": "nvlink", "bandwidth_factor": 0.25}]))
    intra, inter = c.TierCost(25e9, 2e-6), c.TierCost(25e9, 5e-6)
    assert degraded == pytest.approx(c.hierarchical_allreduce_time(4e8, 8, 4, intra, inter),
                                     rel=0.01)


def test_a_step_with_a_degraded_nic_is_slower_and_representative_charges_it_everywhere():
    """dp 16 over two nodes: full slows the rings through GPU 9; representative, every ring
    and send on the tier. Both slower than healthy, representative not faster than full."""
    base = dict(layers=4, micro_batches=4, dp=16,
                cluster={"intra_node": NVLINK, "inter_node": NIC})
    fault = [{"gpu": 9, "port": "nic", "bandwidth_factor": 0.25}]
    healthy = scenario(**base)
    faulty = scenario(**{**base, "cluster": {**base["cluster"], "faults": fault}})
    profile = flat_profile()
    full = simulate(faulty, "full", profile).step_time_s
    representative = simulate(faulty, "representative", profile).step_time_s
    assert full > simulate(healthy, "full", profile).step_time_s
    assert representative >= full * (1 - 1e-9)


@pytest.mark.parametrize(("fault", "message"), [
    ({"gpu": 99, "port": "nic", "bandwidth_factor": 0.5}, "gpu 99 is not in a 32-GPU"),
    ({"gpu": 1, "port": "nic", "bandwidth_factor": 0.0}, "bandwidth_factor"),
    ({"gpu": 1, "port": "pcie", "bandwidth_factor": 0.5}, "port"),
])
def test_bad_faults_are_one_error_naming_the_field(fault, message):
    with pytest.raises(ScenarioError, match=f"faults.*{message}|{message}"):
        cluster([fault])
