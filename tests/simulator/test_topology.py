"""Switches between nodes in full fidelity (issue 13): rail-optimized, fat-tree and rail-only
pods, oversubscribed leaf uplinks and static ECMP, checked by hand-computable cases."""

from __future__ import annotations

from collections import Counter

import pytest
import simpy
from sim_helpers import flat_profile, scenario

from clustersim.errors import ScenarioError
from clustersim.simulator.discrete_event.engine import Engine
from clustersim.simulator.inputs.scenario import build_cluster
from clustersim.simulator.network.fabric import Fabric

NVLINK = {"bandwidth": 100.0, "latency": 0.0}
NIC = 25.0  # GB/s
X = 1e8  # bytes: 4 ms on one NIC


def fabric(gpus: int = 64, **net):
    env = simpy.Environment()
    cluster = build_cluster({"preset": "dgx-h100", "gpus": gpus, "gpus_per_node": 8,
                             "intra_node": NVLINK,
                             "inter_node": {"bandwidth": NIC, "latency": 0.0, **net}})
    return env, Fabric(env, cluster, flat_profile())


def finish(env, fabric_, pairs) -> float:
    """All (src, dst) messages of X bytes at once; when the last one ends."""
    def all_of():
        yield simpy.AllOf(env, [fabric_.flow(a, b, X) for a, b in pairs])
    env.process(all_of())
    env.run()
    return env.now


def test_rail_optimized_keeps_a_rail_on_its_leaf_and_reaches_other_rails_over_nvlink():
    """GPU 0 of node 0 to GPU 0 of node 1: one rail leaf. To GPU 1 of node 1 (rail 1): PXN,
    NVLink to GPU 1 of node 0, then rail 1's leaf; only another leaf group's nodes (beyond
    ``leaf_ports``) are reached through a spine."""
    _, f = fabric()
    assert len(f.path(0, 8)) == 2
    assert f.path(0, 9) == (("out", "intra_node", 0), ("in", "intra_node", 1),
                            ("out", "inter_node", 1), ("in", "inter_node", 9))
    _, f = fabric(gpus=32, leaf_ports=2)  # two nodes to a rail leaf
    assert len(f.path(0, 16)) == 4  # node 0 to node 2: leaf up, spine, leaf down
    env, f = fabric()
    assert finish(env, f, [(0, 9)]) == pytest.approx(X / (NIC * 1e9))  # alone: NIC-bound


@pytest.mark.parametrize("ratio", [1.0, 2.0, 4.0])
def test_a_leaf_sending_everything_up_gets_one_over_the_oversubscription(ratio):
    """Fat-tree, 4 nodes (32 NICs) per leaf, one spine: all 32 NICs of leaf 0 send to leaf 1
    at once; the uplink carries 32 x NIC / ratio, so each message takes ratio times longer
    (never faster than its NIC)."""
    env, f = fabric(gpus=64, topology="fat-tree", oversubscription=ratio, spines=1)
    assert f.leaf(0) != f.leaf(32)
    t = finish(env, f, [(g, 32 + g) for g in range(32)])
    assert t == pytest.approx(ratio * X / (NIC * 1e9))


@pytest.mark.parametrize("seed", range(6))
def test_ecmp_collisions_set_the_pace(seed):
    """One node per leaf (8 ports), 8 spines, 1:1: each leaf-to-spine link carries one NIC.
    Node 0 sends one message per GPU to node 1; the spine each takes is a static hash of
    (sender, receiver, seed), and the step waits for the most crowded spine."""
    env, f = fabric(gpus=16, topology="fat-tree", leaf_ports=8, spines=8, ecmp_seed=seed)
    pairs = [(g, 8 + g) for g in range(8)]
    crowd = Counter(f.path(a, b)[1] for a, b in pairs)  # the leaf uplink each one took
    assert finish(env, f, pairs) == pytest.approx(max(crowd.values()) * X / (NIC * 1e9))


@pytest.mark.parametrize("seed", range(3))
def test_adaptive_routing_spreads_every_flow_so_nothing_collides(seed):
    """The same eight messages under InfiniBand-style adaptive routing: packets sprayed over
    all eight spines give each its NIC's rate, whatever the seed (ECMP's worst crowd above
    is 2 or more for every seed shown)."""
    env, f = fabric(gpus=16, topology="fat-tree", leaf_ports=8, spines=8, ecmp_seed=seed,
                    routing="adaptive")
    assert finish(env, f, [(g, 8 + g) for g in range(8)]) == pytest.approx(X / (NIC * 1e9))


def test_seeds_change_which_flows_collide():
    _, f0 = fabric(gpus=16, topology="fat-tree", leaf_ports=8, spines=8, ecmp_seed=0)
    spreads = set()
    for seed in range(8):
        _, f = fabric(gpus=16, topology="fat-tree", leaf_ports=8, spines=8, ecmp_seed=seed)
        spreads.add(tuple(f.path(g, 8 + g)[1] for g in range(8)))
    assert len(spreads) > 1


@pytest.mark.parametrize("topology", ["rail-only", "rail-optimized"])
def test_rails_forward_other_rails_over_nvlink_to_that_rails_nic(topology):
    """GPU 0 to GPU 9 (rail 1): NVLink to GPU 1, then GPU 1's NIC. Sent beside GPU 1's own
    message on rail 1, both share GPU 1's NIC: twice as long; a fat-tree leaf holds both
    rails' NICs, so GPU 0 sends from its own NIC and neither waits."""
    _, f = fabric(topology=topology)
    path = f.path(0, 9)
    assert ("in", "intra_node", 1) in path and ("out", "inter_node", 1) in path
    one = X / (NIC * 1e9)
    env, f = fabric(topology=topology)
    assert finish(env, f, [(0, 9), (1, 17)]) == pytest.approx(2 * one)
    env, f = fabric(topology="fat-tree")
    assert finish(env, f, [(0, 9), (1, 17)]) == pytest.approx(one)


@pytest.mark.parametrize(("field", "value"), [("oversubscription", 0.5),
                                              ("topology", "torus"), ("spines", 0),
                                              ("routing", "random")])
def test_bad_topology_fields_are_refused_naming_them(field, value):
    with pytest.raises(ScenarioError, match=f"inter_node.{field}"):
        build_cluster({"preset": "dgx-h100", "gpus": 16,
                       "inter_node": {"bandwidth": NIC, "latency": 0.0, field: value}})


@pytest.mark.parametrize("ratio", [2.0, 4.0])
def test_representative_charges_oversubscribed_leaves_as_full_fidelity_does(ratio):
    """One node per fat-tree leaf, adaptive routing (no hash collisions): every gradient-ring
    flow between nodes leaves its leaf, so both fidelities run them ``ratio`` times slower —
    full as flows on the uplinks, representative by ``leaf_slowdowns``. (No pipeline: its
    sends meet the gradient rings on the NICs in full fidelity only.)"""
    def step(fidelity, r):
        s = scenario(layers=8, micro_batches=4, model={"hidden": 1024, "heads": 16},
                     cluster={"intra_node": {"bandwidth": 50.0, "latency": 1e-6},
                              "inter_node": {"bandwidth": 2.0, "latency": 5e-6,
                                             "topology": "fat-tree", "leaf_ports": 8,
                                             "oversubscription": r, "routing": "adaptive"}},
                     tp=4, dp=8)
        return Engine(s, fidelity, flat_profile(0.5)).run().step_time_s
    assert step("representative", ratio) == pytest.approx(step("full", ratio), rel=1e-6)
    assert step("representative", ratio) > 1.5 * step("representative", 1.0)
