"""The MoE token all-to-all as flows in full fidelity (issue 13, item 3): alone it is the
pairwise closed form, it shares a NIC with whatever else crosses it, and in a training step it
competes with the data-parallel rings for the NICs."""

from __future__ import annotations

import pytest
import simpy
from sim_helpers import elapsed, flat_fabric, flat_profile, scenario

from clustersim.simulator.closed_form.analytic import CostModel
from clustersim.simulator.discrete_event.comm import FabricComm
from clustersim.simulator.discrete_event.engine import Engine
from clustersim.simulator.inputs.placement import Placement

NV, NIC = 100e9, 25e9  # bytes/s
NV_ALPHA, NIC_ALPHA = 2e-6, 5e-6
X = 8e8  # bytes each member exchanges


def fabric(gpus, per_node):
    return flat_fabric(gpus, (NV, NV_ALPHA), (NIC, NIC_ALPHA), gpus_per_node=per_node)


def test_inside_a_node_it_is_the_pairwise_form():
    """Each of n members sends X/n to each other: (n-1)/n X/B + (n-1) alpha."""
    env, f = fabric(8, per_node=8)
    expected = 7 / 8 * X / NV + 7 * NV_ALPHA
    assert elapsed(env, f.alltoall(range(8), X)) == pytest.approx(expected, rel=1e-9)


def test_across_nodes_the_remote_share_rides_the_nic():
    """Two nodes of four: half of each member's X leaves its node, through its own NIC, while
    three eighths cross NVLink; the NIC's half sets the pace (network.alltoall_time)."""
    env, f = fabric(8, per_node=4)
    expected = max(3 / 8 * X / NV, 4 / 8 * X / NIC) + 7 * NIC_ALPHA
    assert elapsed(env, f.alltoall(range(8), X)) == pytest.approx(expected, rel=1e-9)


def test_rounds_run_back_to_back():
    env, f = fabric(8, per_node=4)
    expected = 3 * (4 / 8 * X / NIC + 7 * NIC_ALPHA)
    assert elapsed(env, f.alltoall(range(8), X, rounds=3)) == pytest.approx(expected, rel=1e-9)


def test_a_flow_sharing_a_members_nic_slows_the_exchange_by_its_share():
    """Member 0's NIC carries its 4 remote flows and one long flow to GPU 12 (a third node):
    5 flows at NIC/5 each, so the exchange takes 5/4 of its time alone."""
    env, f = fabric(12, per_node=4)

    def bystander():
        yield f.flow(0, 12, 10 * X)
    alone = 4 / 8 * X / NIC + 7 * NIC_ALPHA
    shared = 5 * (X / 8) / NIC + 7 * NIC_ALPHA
    done = {}

    def exchange():
        yield from f.alltoall(range(8), X)
        done["at"] = env.now
    elapsed(env, exchange(), bystander())
    assert done["at"] == pytest.approx(shared, rel=1e-9)
    assert done["at"] / alone == pytest.approx(1.25, rel=0.01)


def test_expert_parallel_groups_are_ep_consecutive_replicas():
    s = scenario(layers=2, dp=8, ep=4, model={"experts": 8, "top_k": 2})
    comm = FabricComm(simpy.Environment(), CostModel(s, flat_profile()),
                      Placement.of(1, 1, 8, 1))
    assert comm.members(5, "ep") == (4, 5, 6, 7)
    assert comm.members(5, "edp") == (1, 5)


MOE = {"experts": 8, "top_k": 2, "hidden": 1024, "heads": 16}
LINKS = {"gpus_per_node": 4, "intra_node": {"bandwidth": 100.0, "latency": NV_ALPHA},
         "inter_node": {"bandwidth": 5.0, "latency": NIC_ALPHA}}


def moe(**parallel):
    return scenario(layers=4, micro_batches=4, model=MOE, cluster=LINKS, dp=8, ep=8,
                    **parallel)


def test_alone_in_a_step_full_matches_the_closed_form():
    """Gradients reduced after the last backward (no overlap): nothing shares the NICs with
    the all-to-alls, so full and representative agree within 2%."""
    s = moe(overlap_grad_reduce=False)
    full = Engine(s, "full", flat_profile(0.5)).run()
    rep = Engine(s, "representative", flat_profile(0.5)).run()
    assert full.breakdown.exposed_comm > 0.2 * full.step_time_s
    assert full.step_time_s == pytest.approx(rep.step_time_s, rel=0.02)


def test_gradient_rings_in_flight_slow_the_token_exchange():
    """With the gradient buckets reduced during the backward, the data-parallel rings and the
    expert all-to-alls cross the same NICs at once: full is slower than the closed forms,
    which charge each alone; one NIC's worth of bandwidth can only be shared."""
    s = moe(overlap_grad_reduce=True)
    full = Engine(s, "full", flat_profile(0.5)).run()
    rep = Engine(s, "representative", flat_profile(0.5)).run()
    assert full.step_time_s > 1.01 * rep.step_time_s
