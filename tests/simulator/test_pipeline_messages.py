"""What a pipeline message costs: the activation a stage sends on and the gradient it sends
back, per micro-batch.

Oracle: with sequence parallelism off, Megatron-LM's scatter-gather (Narayanan et al. 2021,
sec. 4.1) has each of the ``tp`` ranks send ``1/tp`` of the ``b s h`` activation over the
inter-node link and the receiving TP group all-gather it over NVLink, so a message takes
``p2p(b s h / tp) + allgather(b s h)``; without it (Megatron-Core, PyTorch pipelining) every TP
rank sends the whole ``b s h``: ``p2p(b s h)``. A blocking send holds the sender for the
message's time, so in a two-stage 1F1B pipeline stage 0 spends ``m`` message times in ``pp``;
an asynchronous send (Megatron-LM's ``overlap_p2p_comm``) holds it for what its compute loses
beside the transfer, ``comm_compute_slowdown`` of the message time, and its message still
arrives a whole message time after the send began.
"""

from __future__ import annotations

import pytest
from sim_helpers import FAST_HBM, flat_profile

from clustersim.simulator.closed_form.analytic import CostModel, estimate
from clustersim.simulator.discrete_event.engine import Engine
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.topologies import network as net

M, B, S, H, TP = 4, 2, 512, 1024, 4


def two_stages(scatter_gather: bool, asynchronous: bool = False):
    """Two nodes of four GPUs, one stage each: the pipeline send crosses nodes."""
    return build_scenario({
        "model": {"hidden": H, "heads": 8, "ffn_hidden": 4 * H, "vocab": 128, "seq_len": S,
                  "layers": 2},
        "cluster": {"preset": "dgx-a100-80gb", "gpus": 8, "gpus_per_node": 4, "gpu": FAST_HBM},
        "training": {"global_batch": B * M, "micro_batch": B},
        "parallel": {"tp": TP, "pp": 2, "dp": 1, "schedule": "1f1b",
                     "pp_scatter_gather": scatter_gather, "overlap_p2p_comm": asynchronous}})


@pytest.mark.parametrize("scatter_gather", [True, False])
def test_a_message_costs_its_send_and_its_gather(scatter_gather):
    s, prof = two_stages(scatter_gather), flat_profile()
    cm = CostModel(s, prof)
    whole = B * S * H * 2  # bf16
    if scatter_gather:
        message = net.p2p_time(cm.pp, whole / TP) + net.allgather_time(cm.tp, whole)
    else:
        message = net.p2p_time(cm.pp, whole)
    stage0 = Engine(s, "representative", prof).run().stages[0]
    assert stage0.comm["pp"] == pytest.approx(M * message, rel=1e-9)
    # The closed form charges each stage a message each way per micro-batch.
    assert estimate(s, prof).stages[0].comm["pp"] == pytest.approx(2 * M * message, rel=1e-9)


def test_scatter_gather_is_cheaper_across_nodes():
    """Over a link slower than NVLink, sending 1/tp and gathering beats sending it whole."""
    prof = flat_profile()
    split, whole = (Engine(two_stages(sg), "representative", prof).run().stages[0].comm["pp"]
                    for sg in (True, False))
    assert split < whole / 2


SLOWDOWN = 0.2


def test_an_asynchronous_send_holds_its_sender_for_what_its_compute_loses():
    """Compute at 2% of peak, so that a message is through before the next is sent (a send
    called while the one before it into the same rank is under way waits for its turn)."""
    s, prof = two_stages(False, asynchronous=True), flat_profile(0.02)
    prof = prof.model_copy(update={"comm_compute_slowdown": SLOWDOWN})
    message = net.p2p_time(CostModel(s, prof).pp, B * S * H * 2)
    stage0 = Engine(s, "representative", prof).run().stages[0]
    assert stage0.comm["pp"] == pytest.approx(M * SLOWDOWN * message, rel=1e-9)
    assert estimate(s, prof).stages[0].comm["pp"] == pytest.approx(
        2 * M * SLOWDOWN * message, rel=1e-9)


def test_an_asynchronous_message_arrives_a_whole_transfer_after_its_send():
    """Stage 1 waits for its first activation: the forward of stage 0, then the message's whole
    transfer, not the fraction its sender waited."""
    prof = flat_profile().model_copy(update={"comm_compute_slowdown": SLOWDOWN})
    found = {}
    for asynchronous in (False, True):
        engine = Engine(two_stages(False, asynchronous), "representative", prof, record=True)
        engine.run()
        recvs = [e for e in engine.timeline.spans if e.rank != 0 and e.stream == "pp_recv"]
        found[asynchronous] = min(e.end for e in recvs)
    assert found[True] == pytest.approx(found[False], rel=1e-12)


@pytest.mark.parametrize("fidelity", ["representative", "full"])
def test_asynchronous_sends_shorten_the_step(fidelity):
    prof = flat_profile().model_copy(update={"comm_compute_slowdown": SLOWDOWN})
    blocking, asynchronous = (Engine(two_stages(False, a), fidelity, prof).run().step_time_s
                              for a in (False, True))
    assert asynchronous < blocking
