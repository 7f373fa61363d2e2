"""Full fidelity simulates one peer of each tensor-parallel group when the peers cannot differ
(issue 13, item 4): the step, its breakdown and memory are those of simulating every GPU,
under contention on shared links, and every GPU is simulated when peers can differ. Under
static ECMP, where each NIC hashes its own spine, a group that fills its node folds by having
its simulated peer issue every peer's flows (issue 26, item 3): the step of every GPU
simulated, whose TP rings wait for all their members."""

from __future__ import annotations

from dataclasses import astuple

import pytest
from sim_helpers import flat_profile, scenario

from clustersim.simulator.discrete_event.engine import Engine
from clustersim.simulator.network.symmetry import mirrored, tp_width

SLOW_NIC = {"bandwidth": 2.0, "latency": 5e-6}  # GB/s: DP and PP traffic matter
NVLINK = {"bandwidth": 50.0, "latency": 1e-6}


def contended(tp=4, dp=4, pp=2, cluster=None, micro_batches=4, **parallel):
    """A GPT whose gradient rings and pipeline sends share slow NICs and switch links."""
    return scenario(layers=8, micro_batches=micro_batches, model={"hidden": 1024, "heads": 16},
                    cluster={"intra_node": NVLINK, "inter_node": SLOW_NIC, **(cluster or {})},
                    tp=tp, dp=dp, pp=pp, **parallel)


def both(s):
    """(one peer per TP group, every GPU) simulated in full fidelity."""
    reduced = Engine(s, "full", flat_profile(0.5))
    every = Engine(s, "full", flat_profile(0.5), symmetry=False)
    return reduced, reduced.run(), every, every.run()


CASES = {
    "rail-optimized, 2 leaves, 2 ECMP spines": {
        "inter_node": {**SLOW_NIC, "leaf_ports": 1, "spines": 2}},
    "pods under an oversubscribed spine": {
        "spine": {"bandwidth": 0.5, "latency": 1e-5, "pod_nodes": 1}},
    "rail-only, pipeline crossing rails": {
        "inter_node": {**SLOW_NIC, "topology": "rail-only"}},
    "fat-tree 4:1, one spine": {
        "inter_node": {**SLOW_NIC, "topology": "fat-tree", "leaf_ports": 8, "spines": 1,
                       "oversubscription": 4}},
    "fat-tree 2:1, 4 spines, adaptive routing": {
        "inter_node": {**SLOW_NIC, "topology": "fat-tree", "leaf_ports": 8, "spines": 4,
                       "oversubscription": 2, "routing": "adaptive"}},
}


@pytest.mark.parametrize("case", CASES)
def test_one_peer_per_tp_group_gives_the_step_of_every_gpu(case):
    s = contended(cluster=CASES[case], dp=3)
    reduced, one, every, all_ = both(s)
    assert (reduced.width, len(reduced.ranks)) == (4, len(every.ranks) // 4)
    assert one.breakdown.exposed_comm > 0.05 * one.step_time_s  # the links do contend
    assert one.step_time_s == pytest.approx(all_.step_time_s, rel=1e-9)
    assert astuple(one.breakdown) == pytest.approx(astuple(all_.breakdown), rel=1e-9)
    assert one.per_stage == all_.per_stage


def test_peers_that_can_differ_are_all_simulated():
    faulty = contended(cluster={"faults": [{"gpu": 1, "port": "nic", "bandwidth_factor": 0.5}]})
    jitter = contended(cluster={"variability": {"link_sigma": 0.1}})
    hashed = contended(cluster={"inter_node": {**SLOW_NIC, "topology": "fat-tree",
                                               "leaf_ports": 8, "spines": 4}})
    tp_outer = contended(order="dp-tp-cp-pp")
    assert [tp_width(s) for s in (faulty, jitter, hashed, tp_outer)] == [1, 1, 1, 1]
    assert not mirrored(hashed)  # tp 4 of 8 GPUs: other groups' flows would share its ports
    assert tp_width(contended()) == 4
    # A half-speed NIC on one peer slows that peer's rail only; simulating peer 0 would miss it.
    assert Engine(faulty, "full", flat_profile(0.5)).run().step_time_s > \
        Engine(contended(), "full", flat_profile(0.5)).run().step_time_s


def test_a_simulated_peer_computes_at_its_groups_slowest_gpu():
    """TP collectives every layer hold a group to its slowest member (variability.py)."""
    s = contended(cluster={"variability": {"compute_sigma": 0.2, "seed": 3}})
    reduced = Engine(s, "full", flat_profile(0.5))
    every = Engine(s, "full", flat_profile(0.5), symmetry=False)
    by_id = {r.rid: r.factor for r in every.ranks}
    for r in reduced.ranks:
        assert r.factor == max(by_id[g] for g in range(r.rid, r.rid + 4))


def test_tp_peers_simulated_apart_wait_for_one_another():
    """Every GPU simulated, a TP ring starts once its last member joins (as NCCL's does), so a
    group computes at its slowest member's pace: the step of one rank per group at that pace."""
    s = contended(cluster={"variability": {"compute_sigma": 0.2, "seed": 3}})
    _, one, every, all_ = both(s)
    assert len({r.factor for r in every.ranks}) == len(every.ranks)  # every GPU its own pace
    assert one.step_time_s == pytest.approx(all_.step_time_s, rel=1e-9)


def ecmp(dp=4, pp=2, nic=2.0, over=1, seed=0, micro_batches=4, **parallel):
    """``contended`` with tp 8 filling each 8-GPU node, on a fat-tree of 4 spines whose
    leaves each NIC's flows cross by the spine its own static ECMP hash picks."""
    fabric = {"bandwidth": nic, "latency": 5e-6, "topology": "fat-tree", "leaf_ports": 8,
              "spines": 4, "oversubscription": over, "ecmp_seed": seed}
    return contended(tp=8, dp=dp, pp=pp, cluster={"intra_node": NVLINK, "inter_node": fabric},
                     micro_batches=micro_batches, **parallel)


def test_ecmp_peers_fold_when_their_group_fills_the_node():
    s = ecmp()
    reduced = Engine(s, "full", flat_profile(0.5))
    assert mirrored(s) and (reduced.width, len(reduced.ranks)) == (8, 8)
    assert reduced.comm.fabric.mirrors == tuple(range(8))


ECMP_CASES = {
    "dp 4, pp 2": {},
    "dp 4, pp 4, 8 micro-batches": {"pp": 4, "micro_batches": 8},
    "leaves 2:1, ECMP seed 1, 0.5 GB/s NICs": {"nic": 0.5, "over": 2, "seed": 1},
    "leaves 4:1, dp 8, ZeRO-1": {"dp": 8, "nic": 1.0, "over": 4, "seed": 2, "zero": 1},
    "interleaved, 2 chunks": {"pp": 4, "schedule": "interleaved", "virtual_stages": 2},
    "sequence parallel": {"dp": 2, "pp": 2, "sequence_parallel": True, "micro_batches": 8},
}


@pytest.mark.parametrize("case", ECMP_CASES)
def test_a_folded_ecmp_step_is_every_gpus(case):
    """Each peer's flows cross its own NIC and the spine its own hash picks, on links at full
    capacity: the same load as every GPU simulated, the step to the last digits."""
    s = ecmp(**ECMP_CASES[case])
    reduced, one, every, all_ = both(s)
    assert len(reduced.ranks) * 8 == len(every.ranks)
    assert one.breakdown.exposed_comm > 0.5 * one.step_time_s  # the NICs and leaves contend
    assert one.step_time_s == pytest.approx(all_.step_time_s, rel=1e-9)


DRIFTING = {  # (case, how far apart measured)
    "pp 4, dp 2, 0.5 GB/s NICs (97% exposed)": ({"dp": 2, "pp": 4, "nic": 0.5,
                                                 "micro_batches": 8}, 0.0037),
    "8 one-layer stages, 3 replicas, 4:1 leaves (69% exposed)": (
        {"dp": 3, "pp": 8, "nic": 0.5, "over": 4, "seed": 1, "micro_batches": 8, "zero": 1},
        0.0148),
}


@pytest.mark.parametrize("case", DRIFTING)
def test_a_folded_ecmp_step_stays_within_a_percent_and_a_half_where_peers_drift(case):
    """Where one peer's pipeline sends and gradient rings end before another's, the peers
    simulated apart run their next transfers out of step until their next TP ring, the
    folded one in step: on these NIC-bound steps the two differ, the deeper pipeline most
    (docs/modelling.md, "Symmetry")."""
    kwargs, apart = DRIFTING[case]
    _, one, _, all_ = both(ecmp(**kwargs))
    assert abs(one.step_time_s / all_.step_time_s - 1) == pytest.approx(apart, abs=5e-4)
    assert one.step_time_s == pytest.approx(all_.step_time_s, rel=0.015)


@pytest.mark.parametrize("faults", [
    [{"gpu": 1, "port": "nic", "bandwidth_factor": 0.5}],
    [{"gpu": 9, "port": "nic", "bandwidth_factor": 0.25},
     {"gpu": 20, "port": "nic", "bandwidth_factor": 0.5}]])
def test_a_degraded_nic_folds_its_group_and_slows_it_as_every_gpu_does(faults):
    """The simulated peer sends the degraded peer's flows over that NIC: its group waits for
    them, as every GPU simulated waits at the group's next TP ring."""
    s = contended(tp=8, dp=4, cluster={"faults": faults})
    reduced, one, every, all_ = both(s)
    assert mirrored(s) and len(reduced.ranks) * 8 == len(every.ranks)
    assert one.step_time_s == pytest.approx(all_.step_time_s, rel=1e-9)
    healthy = both(contended(tp=8, dp=4))[1]
    assert one.step_time_s > 1.2 * healthy.step_time_s


@pytest.mark.parametrize("faults", [
    [{"gpu": 3, "port": "nvlink", "bandwidth_factor": 0.5}],
    [{"gpu": 3, "port": "nvlink", "bandwidth_factor": 0.5},
     {"gpu": 13, "port": "nvlink", "bandwidth_factor": 0.25}]])
def test_a_degraded_nvlink_port_folds_its_group_at_the_slowest_port(faults):
    """An NVLink port carries only its group's TP rings, which end together with the slowest
    member's: the simulated peer's port runs at the group's slowest."""
    s = contended(tp=8, dp=4, cluster={"faults": faults})
    reduced, one, every, all_ = both(s)
    assert mirrored(s) and len(reduced.ranks) * 8 == len(every.ranks)
    assert one.step_time_s == pytest.approx(all_.step_time_s, rel=1e-9)
    healthy = both(contended(tp=8, dp=4))[1]
    assert one.step_time_s > 1.02 * healthy.step_time_s  # the slow port shows


def test_peers_differing_on_both_sides_of_the_node_are_all_simulated():
    """A slow NIC on one peer and a slow NVLink port on another (or jitter on every port):
    the slowest peer changes from phase to phase, which one rank cannot stand for (folded
    anyway, the step came out 0.8% slow)."""
    both_sides = contended(tp=8, dp=4, cluster={"faults": [
        {"gpu": 3, "port": "nvlink", "bandwidth_factor": 0.3},
        {"gpu": 12, "port": "nic", "bandwidth_factor": 0.5}]})
    jitter = contended(tp=8, dp=4, cluster={"variability": {"link_sigma": 0.1}})
    assert [mirrored(s) or tp_width(s) > 1 for s in (both_sides, jitter)] == [False, False]
