"""Per-port bandwidth jitter (``cluster.variability.link_sigma``): full fidelity draws each
GPU port's divisor; representative runs every tier at its expected slowest port."""

from __future__ import annotations

import math
import statistics

import pytest
import simpy
from sim_helpers import flat_profile

from clustersim.simulator.inputs.scenario import build_cluster
from clustersim.simulator.inputs.variability import port_factor, with_link_jitter
from clustersim.simulator.network.fabric import Fabric
from clustersim.topologies.hardware import Variability

NIC = {"bandwidth": 25.0, "latency": 0.0}


def cluster(gpus: int, sigma: float, seed: int = 0, per_node: int = 1):
    return build_cluster({"preset": "dgx-h100", "gpus": gpus, "gpus_per_node": per_node,
                          "inter_node": NIC,
                          "variability": {"link_sigma": sigma, "seed": seed}})


def test_representative_divides_each_tier_by_the_expected_slowest_of_two_ports():
    """Two GPUs: E[max of two lognormal(0, s)] = 2 exp(s^2/2) Phi(s / sqrt 2), a closed form."""
    sigma = 0.1
    slowest = 2 * math.exp(sigma ** 2 / 2) * 0.5 * math.erfc(-(sigma / math.sqrt(2)) / math.sqrt(2))
    jittered = with_link_jitter(cluster(2, sigma))
    assert jittered.inter_node.bandwidth == pytest.approx(25.0 / slowest, rel=1e-5)
    assert with_link_jitter(cluster(2, 0.0)).inter_node.bandwidth == 25.0


def test_draws_agree_with_the_order_statistic_on_average():
    """Mean over 400 seeds of the slowest of 16 drawn ports, against the quadrature."""
    sigma, n = 0.05, 16
    worst = [max(port_factor(Variability(link_sigma=sigma, seed=s), g, "nic") for g in range(n))
             for s in range(400)]
    expected = 25.0 / with_link_jitter(cluster(n, sigma)).inter_node.bandwidth
    assert statistics.fmean(worst) == pytest.approx(expected, rel=0.01)


def test_a_flow_runs_at_its_slower_ports_draw():
    c = cluster(2, 0.2, seed=7)
    env = simpy.Environment()
    f = Fabric(env, c, flat_profile())
    env.process((lambda: (yield f.flow(0, 1, 1e8)))())
    env.run()
    worst = max(port_factor(c.variability, g, "nic") for g in (0, 1))
    assert env.now == pytest.approx(1e8 * worst / 25e9, rel=1e-9)
