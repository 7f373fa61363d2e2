"""The full-fidelity network: collectives run as flows reproduce their closed forms when alone,
share bandwidth when not, and start only when the whole group has joined."""

from __future__ import annotations

import pytest
import simpy
from sim_helpers import elapsed, flat_fabric, flat_profile, scenario

from clustersim.simulator.closed_form.analytic import CostModel
from clustersim.simulator.discrete_event.comm import FabricComm
from clustersim.simulator.inputs.placement import Placement
from clustersim.simulator.network.fabric import Fabric
from clustersim.topologies import collectives as c

NVLINK = {"bandwidth": 100.0, "latency": 2e-6}


def fabric(gpus, per_node=8, spine=None):
    return flat_fabric(gpus, (100e9, 2e-6), (25e9, 5e-6), gpus_per_node=per_node,
                       **({"spine": spine} if spine else {}))


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("x", [1e6, 1e9])
def test_ring_allreduce_in_one_node_is_the_textbook_form(n, x):
    """2(n-1)/n X/B + 2(n-1) alpha, on NVLink."""
    env, f = fabric(n, per_node=n)
    expected = 2 * (n - 1) / n * x / 100e9 + 2 * (n - 1) * 2e-6
    assert elapsed(env, f.allreduce(range(n), x)) == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("nodes, x", [(4, 1e9), (64, 1e6), (64, 1e9)])
def test_one_gpu_per_node_uses_ring_or_tree_whichever_is_faster(nodes, x):
    env, f = fabric(nodes, per_node=1)
    expected = min(c.ring_allreduce_time(x, nodes, 25e9, 5e-6),
                   c.tree_allreduce_time(x, nodes, 25e9, 5e-6))
    assert elapsed(env, f.allreduce(range(nodes), x)) == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("op, closed", [
    ("allreduce", c.hierarchical_allreduce_time),
    ("allgather", c.hierarchical_allgather_time),
    ("reduce_scatter", c.hierarchical_allgather_time),
])
def test_hierarchical_collectives_match_their_closed_forms(op, closed):
    env, f = fabric(32)
    intra, inter = c.TierCost(100e9, 2e-6), c.TierCost(25e9, 5e-6)
    expected = closed(4e8, 8, 4, intra, inter)
    assert elapsed(env, getattr(f, op)(range(32), 4e8)) == pytest.approx(expected, rel=0.01)


def test_two_concurrent_allreduces_on_the_same_gpus_share_the_links():
    env, f = fabric(8)
    env.process(f.allreduce(range(8), 1e9))
    alone = 2 * 7 / 8 * 1e9 / 100e9
    assert elapsed(env, f.allreduce(range(8), 1e9)) == pytest.approx(2 * alone, rel=0.01)


SPINE = {"bandwidth": 5.0, "latency": 1e-5, "pod_nodes": 1}  # 1:5 under 25 GB/s NICs


def test_one_flow_leaving_the_pod_runs_at_its_nics_rate():
    """Two pods of one 8-GPU node, uplinks of 8 x 5 GB/s: a lone message is NIC-bound."""
    env, f = fabric(16, spine=SPINE)
    assert f.tier(0, 8) == "spine"
    assert elapsed(env, f.p2p(0, 8, 1e8)) == pytest.approx(1e-5 + 1e8 / 25e9, rel=1e-6)


def test_when_the_whole_pod_sends_across_each_gpu_gets_the_spines_share():
    """All eight GPUs of pod 0 send to pod 1 at once: the 40 GB/s uplink gives each its
    oversubscribed 5 GB/s, the spine's per-GPU figure."""
    env, f = fabric(16, spine=SPINE)

    def all_across():
        yield simpy.AllOf(env, [f.flow(g, 8 + g, 1e8) for g in range(8)])

    assert elapsed(env, all_across()) == pytest.approx(1e8 / 5e9, rel=1e-6)


def test_two_senders_into_one_gpu_share_its_ingress():
    """The hotspot: GPUs 0 and 1 both send to GPU 8 in the next node; its NIC's way in
    carries both, so they take twice as long as one."""
    env, f = fabric(16)

    def into_one():
        yield simpy.AllOf(env, [f.flow(0, 8, 1e8), f.flow(1, 8, 1e8)])

    assert elapsed(env, into_one()) == pytest.approx(2 * 1e8 / 25e9, rel=1e-6)
    env, f = fabric(16)

    def to_two():
        yield simpy.AllOf(env, [f.flow(0, 8, 1e8), f.flow(1, 9, 1e8)])

    assert elapsed(env, to_two()) == pytest.approx(1e8 / 25e9, rel=1e-6)


def test_a_collective_starts_when_its_last_member_joins():
    s = scenario(layers=2, dp=4, cluster={"gpus_per_node": 4, "intra_node": NVLINK})
    env = simpy.Environment()
    comm = FabricComm(env, CostModel(s, flat_profile()), Placement.of(1, 1, 4, 1))
    finished = {}

    def member(rank, delay):
        yield env.timeout(delay)
        yield from comm.collective(rank, "dp", "allreduce", 1e8)
        finished[rank] = env.now
    for rank in range(4):
        env.process(member(rank, delay=0.5 if rank == 3 else 0.0))
    env.run()
    expected = 0.5 + 2 * 3 / 4 * 1e8 / 100e9 + 6 * 2e-6
    assert finished == pytest.approx(dict.fromkeys(range(4), expected), rel=1e-6)


def test_expert_groups_take_every_ep_th_replica():
    s = scenario(layers=2, dp=8, ep=2, model={"experts": 4, "top_k": 2})
    comm = FabricComm(simpy.Environment(), CostModel(s, flat_profile()), Placement.of(1, 1, 8, 1))
    assert comm.members(0, "dp") == tuple(range(8))
    assert comm.members(3, "edp") == (1, 3, 5, 7)


def test_a_mirrored_flow_is_its_peers_flows_each_on_its_own_spine():
    """A fat-tree under static ECMP: a GPU standing for its node's 8 peers (``mirrored``)
    sends each peer's flow over that peer's NIC and hashed spine, at full capacity, and is
    done when the slowest is; the same transfers issued GPU by GPU end at that instant."""
    leaves = {"topology": "fat-tree", "leaf_ports": 8, "spines": 4, "oversubscription": 2,
              "bandwidth": 25.0, "latency": 5e-6}
    env, plain = flat_fabric(32, (100e9, 2e-6), (25e9, 5e-6), inter_node=leaves)
    spines = {plain._ecmp(g, 16 + g) for g in range(8)}
    assert len(spines) > 1  # the peers' hashes pick different spines: they contend unequally

    def each_gpu():
        yield simpy.AllOf(env, [plain.flow(g, 16 + g, 1e8, after=5e-6) for g in range(8)])

    def one_for_all():
        yield mirrored.flow(0, 16, 1e8, after=5e-6)

    alone = elapsed(env, each_gpu())
    env2 = simpy.Environment()
    mirrored = Fabric(env2, plain.cluster, flat_profile(), width=8, mirrored=True)
    assert elapsed(env2, one_for_all()) == pytest.approx(alone, rel=1e-12)
    assert alone > 5e-6 + 1e8 / 25e9 * 1.5  # two peers hashed onto one 2:1 uplink share it
