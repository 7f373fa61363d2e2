"""Tensor-parallel collectives as flows in full fidelity (issue 13, item 3): alone a member's
rings cost the closed form, they share its NVLink port with whatever else crosses it, and in
a training step they compete with data-parallel rings inside the node."""

from __future__ import annotations

import pytest
from sim_helpers import elapsed, flat_fabric, flat_profile, scenario

from clustersim.simulator.closed_form.analytic import CostModel
from clustersim.simulator.costs.layer_comm import (
    pipelined_tail,
    pipelined_tail_traffic,
    tensor_comm_total,
    tensor_traffic,
)
from clustersim.simulator.discrete_event.engine import Engine
from clustersim.simulator.model import workload as wl
from clustersim.topologies import collectives as c
from clustersim.topologies.collective_algorithms import Ring
from clustersim.topologies.collective_registry import COLLECTIVES, ring_collective

NV, NV_ALPHA = 100e9, 2e-6


def fabric(gpus=8):
    return flat_fabric(gpus, (NV, NV_ALPHA), (25e9, 5e-6))


def test_a_members_rings_alone_cost_the_ring_closed_form():
    """Two all-gathers of X over tp 4: 2 x 3/4 X through the port, 2 x 3 alphas."""
    env, f = fabric()
    x = 4e8
    expected = 2 * c.ring_allgather_time(x, 4, NV, NV_ALPHA)
    assert elapsed(env, f.tensor_ring(0, 2 * 3 / 4 * x, 6)) == pytest.approx(expected)


def test_a_flow_into_the_same_port_halves_the_rings_rate():
    """A message arriving at GPU 0 over NVLink (one alpha, as the ring's one step) shares its
    port's ingress with the ring: both take twice as long."""
    env, f = fabric()
    alone = 3e8 / NV
    assert elapsed(env, f.tensor_ring(0, 3e8, 1), f.p2p(1, 0, 3e8)) == \
        pytest.approx(2 * alone + NV_ALPHA, rel=1e-6)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_traffic_is_what_the_closed_form_charges(sequence_parallel):
    """Bytes at the profile's NVLink rate plus steps at its alpha give back ``tensor_comm_total``
    for both Megatron layouts (all-reduces, or all-gathers and reduce-scatters)."""
    s = scenario(tp=4, dp=2, sequence_parallel=sequence_parallel, recompute="full",
                 cluster={"intra_node": {"bandwidth": 100.0, "latency": NV_ALPHA}})
    cm = CostModel(s, flat_profile(0.5))
    link = cm.tp.intra
    for (nbytes, steps, across), total in zip(tensor_traffic(cm), tensor_comm_total(cm),
                                              strict=True):
        assert across == 0  # one node
        assert nbytes / link.bandwidth + steps * link.latency == pytest.approx(total)


# A made-up ring, unlike NCCL's: each member sends the whole buffer, in n steps.
TOY_RING = Ring(lambda n: 1.0, lambda n, nodes: n, lambda n, nodes: nodes - 1)


def test_the_traffic_reads_the_registered_ring_as_the_closed_form_does(monkeypatch):
    """Issue 25, item 2: a TP collective's bytes are written once, in its registered ring.
    Swap all-gather's and reduce-scatter's ring for ``TOY_RING`` and the flows' bytes and
    steps follow it: with sequence parallelism a layer runs 2 all-gathers and 2
    reduce-scatters forward, 4 and 2 backward (``tp_collectives``), so 4 X in 4 t steps
    forward, 6 X in 6 t backward, and the pipelined tail a quarter of the 2 reduce-scatters';
    and they still give back the closed form, which reads the same ring."""
    for kind in ("allgather", "reduce_scatter"):
        monkeypatch.setitem(COLLECTIVES, kind, ring_collective(kind, TOY_RING, lambda n: 1.0))
    tp = 4
    s = scenario(tp=tp, sequence_parallel=True, tp_comm_overlap=True,
                 cluster={"intra_node": {"bandwidth": 100.0, "latency": NV_ALPHA}})
    cm = CostModel(s, flat_profile(0.5))
    x = wl.tp_collective_bytes(s)
    assert tensor_traffic(cm) == ((pytest.approx(4 * x), 4 * tp, 0),
                                  (pytest.approx(6 * x), 6 * tp, 0))
    assert pipelined_tail_traffic(cm) == (pytest.approx(2 * x / 4), pytest.approx(2 * tp / 4), 0)
    link = cm.tp.intra
    for (nbytes, steps, _), total in zip(tensor_traffic(cm), tensor_comm_total(cm), strict=True):
        assert nbytes / link.bandwidth + steps * link.latency == pytest.approx(total)
    tail_bytes, tail_steps, _ = pipelined_tail_traffic(cm)
    assert tail_bytes / link.bandwidth + tail_steps * link.latency == \
        pytest.approx(pipelined_tail(cm))



def test_the_steps_across_nodes_are_each_rings_own(monkeypatch):
    """A TP group over two nodes: the steps a member's ring spends across nodes are what each
    registered ring says (``Ring.inter_steps``), not a share worked out again. With a toy ring
    crossing nodes twice per step across, the forward's 2 all-gathers and 2 reduce-scatters
    (sequence parallelism) cross 4 x 2 (nodes - 1) times."""
    toy = Ring(lambda n: (n - 1) / n, lambda n, nodes: n - 1, lambda n, nodes: 2 * (nodes - 1))
    for kind in ("allgather", "reduce_scatter"):
        monkeypatch.setitem(COLLECTIVES, kind, ring_collective(kind, toy, lambda n: 1.0))
    s = scenario(tp=16, sequence_parallel=True, model={"hidden": 2048, "heads": 16})
    cm = CostModel(s, flat_profile(0.5))
    assert cm.tp.nodes == 2
    forward, backward = tensor_traffic(cm)
    assert forward[1:] == (4 * 15, 4 * 2)
    assert backward[2] == 6 * 2


def dense(overlap):
    """tp 2 and dp 4 in one node: the TP rings and the gradient rings share NVLink ports."""
    return scenario(layers=8, micro_batches=4, model={"hidden": 2048, "heads": 16}, tp=2, dp=4,
                    sequence_parallel=True,
                    cluster={"intra_node": {"bandwidth": 5.0, "latency": 1e-6}},
                    overlap_grad_reduce=overlap)


def test_alone_in_a_step_full_matches_the_closed_form():
    s = dense(overlap=False)
    full = Engine(s, "full", flat_profile(0.5)).run()
    rep = Engine(s, "representative", flat_profile(0.5)).run()
    assert full.breakdown.exposed_comm > 0.2 * full.step_time_s
    assert full.step_time_s == pytest.approx(rep.step_time_s, rel=1e-6)


def test_gradient_rings_in_flight_slow_the_tensor_parallel_rings():
    """Gradient buckets reduced during the backward cross the same NVLink ports as the
    backward's TP rings: full is slower than the closed forms, which charge each alone."""
    s = dense(overlap=True)
    full = Engine(s, "full", flat_profile(0.5)).run()
    rep = Engine(s, "representative", flat_profile(0.5)).run()
    assert full.step_time_s > 1.01 * rep.step_time_s


def spanning(dp=1, **extra):
    """tp 16 on nodes of 8: the TP group spans two nodes, its rings cross the NICs."""
    return scenario(layers=4, micro_batches=4, model={"hidden": 2048, "heads": 16}, tp=16,
                    dp=dp, sequence_parallel=True, **extra,
                    cluster={"gpus_per_node": 8,
                             "intra_node": {"bandwidth": 20.0, "latency": 1e-6},
                             "inter_node": {"bandwidth": 5.0, "latency": 4e-6}})


def test_a_group_spanning_nodes_alone_costs_the_hierarchical_ring():
    """Each member's rings as flows to its successors in the node and across nodes give the
    closed form's all-gathers and reduce-scatters (``hierarchical_allgather_time``)."""
    s = spanning()
    full = Engine(s, "full", flat_profile(0.5)).run()
    rep = Engine(s, "representative", flat_profile(0.5)).run()
    assert full.breakdown.exposed_comm > 0.2 * full.step_time_s
    assert full.step_time_s == pytest.approx(rep.step_time_s, rel=1e-6)


def test_a_member_ring_splits_its_bytes_between_nvlink_and_its_nic():
    """16 GPUs on two nodes, one member's ring share X: 7/8 X to its node neighbour over
    NVLink and 1/8 X to its peer in the other node over the NIC, at once; 15 steps of which
    one crosses nodes."""
    env, f = flat_fabric(16, (100e9, 2e-6), (10e9, 5e-6))
    x = 8e8
    expected = 14 * 2e-6 + 5e-6 + max(7 / 8 * x / 100e9, x / 8 / 10e9)
    assert elapsed(env, f.member_ring(0, range(16), x, 15, 1)) == pytest.approx(expected)


def test_gradient_rings_on_the_nics_slow_a_spanning_tensor_parallel_group():
    """tp 16 x dp 2 on nodes of 8 under ZeRO-3, each layer's weights gathered and gradients
    reduce-scattered beside the compute: the DP rings and the TP rings' NIC shares cross the
    same NICs, which the closed forms never see."""
    s = spanning(dp=2, zero=3)
    full = Engine(s, "full", flat_profile(0.5)).run()
    rep = Engine(s, "representative", flat_profile(0.5)).run()
    assert full.step_time_s > 1.005 * rep.step_time_s
