"""Ring attention as flows in full fidelity (issue 13, item 3): each CP rank's K/V sends go to
its ring successor beside the attention they hide behind; alone they cost what the closed form
charges, and across nodes they share NICs with the data-parallel rings."""

from __future__ import annotations

import pytest
import simpy
from sim_helpers import flat_profile, scenario

from clustersim.simulator.closed_form.analytic import CostModel, kernel_times
from clustersim.simulator.costs.layer_comm import context_comm, context_traffic
from clustersim.simulator.discrete_event.comm import FabricComm
from clustersim.simulator.discrete_event.engine import Engine

ALPHA = 3e-6


def ring_attention(cp=2, dp=1, per_node=8, link=2.0, hidden=512, **extra):
    """A long-sequence GPT with its CP ring on links slow enough to expose part of it."""
    tier = {"bandwidth": link, "latency": ALPHA}
    model = {"seq_len": 4096, "hidden": hidden, "heads": hidden // 64}
    return scenario(layers=4, micro_batches=4, model=model, cp=cp, dp=dp,
                    cluster={"gpus_per_node": per_node, "intra_node": tier, "inter_node": tier},
                    **extra)


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("link", [0.5, 5000.0])
def test_traffic_beside_its_attention_is_the_closed_form(cp, link):
    """(cp-1) sends of one K/V block each, beside (cp-1)/cp of the attention: what outlasts
    the attention is ``context_comm``'s exposed time, hidden (fast link) or not (slow)."""
    cm = CostModel(ring_attention(cp=cp, link=link), flat_profile(0.5))
    _, attention = kernel_times(cm)
    closed = context_comm(cm, attention)
    for (nbytes, sends, hide), exposed in zip(context_traffic(cm, attention), closed,
                                              strict=True):
        seconds = sends * ALPHA + nbytes / cm.cp.inter.bandwidth
        assert max(0.0, seconds - hide) == pytest.approx(exposed, rel=1e-9, abs=1e-12)
    if link < 1:
        assert closed[0] > 0


def test_each_rank_sends_to_the_next_of_its_ring():
    """cp 4 under dp 2 (order tp-cp-dp-pp): ranks 0-3 and 4-7 are rings, wrapping around."""
    s = ring_attention(cp=4, dp=2)
    cm = CostModel(s, flat_profile())
    comm = FabricComm(simpy.Environment(), cm, cm.placement)
    assert [comm.context_successor(r) for r in range(8)] == [1, 2, 3, 0, 5, 6, 7, 4]


@pytest.mark.parametrize("link", [0.5, 5000.0])
@pytest.mark.parametrize("per_node", [8, 1])
def test_alone_in_a_step_full_matches_the_closed_form(link, per_node):
    """Nothing else on the links (no data parallelism): inside a node or across nodes, hidden
    or exposed, full fidelity's step is representative's."""
    s = ring_attention(cp=4, link=link, per_node=per_node)
    full = Engine(s, "full", flat_profile(0.5)).run()
    rep = Engine(s, "representative", flat_profile(0.5)).run()
    assert full.step_time_s == pytest.approx(rep.step_time_s, rel=1e-6)
    if link < 1:
        assert rep.breakdown.exposed_comm > 0.1 * rep.step_time_s


def test_ring_attention_and_gradient_rings_share_the_nics():
    """cp 2 x dp 2 with one GPU per node, a gradient bucket per layer: the last backward's CP
    sends and the gradient rings reduced beside it cross the same NICs in full fidelity, so
    it is slower than the closed forms, which never meet."""
    s = ring_attention(cp=2, dp=2, per_node=1, link=0.5, hidden=2048, overlap_grad_reduce=True)
    full = Engine(s, "full", flat_profile(0.5)).run()
    rep = Engine(s, "representative", flat_profile(0.5)).run()
    assert full.step_time_s > 1.01 * rep.step_time_s


def test_one_tensor_parallel_peer_stands_for_all_with_ring_attention():
    """tp 2 x cp 2 x dp 2 on nodes of 4: peer 0's CP successor is peer 0 of the next CP rank,
    so simulating one peer per TP group gives every GPU's step (``symmetry.py``)."""
    s = ring_attention(cp=2, dp=2, tp=2, per_node=4, link=0.5, hidden=2048,
                       overlap_grad_reduce=True)
    alike = Engine(s, "full", flat_profile(0.5)).run()
    every = Engine(s, "full", flat_profile(0.5), symmetry=False).run()
    assert alike.step_time_s == pytest.approx(every.step_time_s, rel=1e-9)


@pytest.mark.parametrize("cp_comm", ["allgather", "a2a"])
def test_gathered_and_all_to_all_context_parallelism_cost_their_closed_form_in_both(cp_comm):
    """All-gather and Ulysses CP run exposed between the layer's kernels: no flow beside the
    attention, and both fidelities charge ``context_comm``'s closed form."""
    s = ring_attention(cp=4, link=0.5, cp_comm=cp_comm)
    cm = CostModel(s, flat_profile(0.5))
    _, attention = kernel_times(cm)
    assert context_traffic(cm, attention) == ((0.0, 0.0, 0.0), (0.0, 0.0, 0.0))
    assert context_comm(cm, attention)[0] > 0
    full = Engine(s, "full", flat_profile(0.5)).run()
    rep = Engine(s, "representative", flat_profile(0.5)).run()
    assert full.step_time_s == pytest.approx(rep.step_time_s, rel=1e-6)
    assert rep.breakdown.exposed_comm > 0.1 * rep.step_time_s
