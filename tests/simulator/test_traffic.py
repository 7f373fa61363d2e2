"""``traffic_bytes``: bytes each GPU sends per step by group, against the ring closed forms.

An all-reduce of X over n ranks sends 2(n-1)/n X per rank, a reduce-scatter or all-gather
(n-1)/n X, a pipeline message X (Patarasuk & Yuan 2009; Megatron-LM's schedules).
"""

from __future__ import annotations

import pytest
from memory_helpers import gpt, scenario

from clustersim.simulator.closed_form.analytic import estimate
from clustersim.simulator.costs.traffic import GROUPS, traffic_bytes
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.model import param_counts as pc
from clustersim.topologies.collective_algorithms import Ring
from clustersim.topologies.collective_registry import COLLECTIVES, ring_collective


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_data_parallel_bytes_follow_the_zero_stage(zero):
    """dp 8, 4 micro-batches, P parameters, fp32 gradients (4 bytes), bf16 weights (2):
    ZeRO-0 all-reduces 4P once; ZeRO-1 reduce-scatters 4P and gathers 2P once; ZeRO-2
    reduce-scatters every micro-batch; ZeRO-3 also gathers before each forward and backward."""
    s = scenario(gpt(), gpus=8, global_batch=32, zero=zero)
    n, m, big_p = 8, s.microbatches, pc.total_params(s.model)
    assert m == 4
    share = (n - 1) / n
    expected = {0: 2 * share * 4 * big_p, 1: share * (4 * big_p + 2 * big_p),
                2: share * (m * 4 * big_p + 2 * big_p),
                3: share * (m * 4 * big_p + 2 * m * 2 * big_p)}[zero]
    traffic = traffic_bytes(s)
    assert traffic["dp"] == pytest.approx(expected, rel=1e-12)
    assert traffic["tp"] == traffic["pp"] == traffic["cp"] == traffic["ep"] == 0


def test_a_middle_pipeline_stage_sends_an_activation_and_a_gradient_per_micro_batch():
    s = scenario(gpt(), gpus=4, global_batch=8, pp=4)
    message = 1 * 128 * 256 * 2  # b s h in bf16
    assert traffic_bytes(s)["pp"] == 2 * s.microbatches * message


def test_interleaving_multiplies_the_pipeline_messages_by_the_chunks():
    plain = scenario(gpt(), gpus=4, global_batch=8, pp=4)
    interleaved = scenario(gpt(), gpus=4, global_batch=8, pp=4, schedule="interleaved",
                           virtual_stages=2)
    assert traffic_bytes(interleaved)["pp"] == 2 * traffic_bytes(plain)["pp"]


@pytest.mark.parametrize("recompute, passes", [("none", 1), ("full", 2)])
def test_context_parallel_bytes_by_how_the_ranks_share_k_and_v(recompute, passes):
    """cp 4, 8 layers, seq 128 (32 tokens a rank), 8 heads of 32, bf16. The ring sends 3 K/V
    blocks a forward pass and 3 K/V-and-gradient pairs backward; the all-gather's rings send
    the same 3 blocks a gather or reduce-scatter (one a pass forward, two backward); Ulysses'
    all-to-alls send 3/4 of Q, K, V and the output a pass, once backward."""
    def cp_bytes(cp_comm):
        s = scenario(gpt(layers=8), gpus=4, global_batch=4, cp=4, cp_comm=cp_comm,
                     recompute=recompute)
        return traffic_bytes(s)["cp"] / (8 * s.microbatches)  # per layer and micro-batch
    block = 2 * 32 * 256 * 2  # K and V of 32 tokens, 256 wide
    assert cp_bytes("p2p") == pytest.approx(3 * block * (passes + 2), rel=1e-12)
    assert cp_bytes("allgather") == pytest.approx(3 * block * (passes + 2), rel=1e-12)
    assert cp_bytes("a2a") == pytest.approx(3 / 4 * 4 * 32 * 256 * 2 * (passes + 1), rel=1e-12)


def test_tensor_parallel_all_reduces_two_each_way_per_layer():
    """No sequence parallelism: 4 all-reduces of b s h per layer and micro-batch."""
    s = scenario(gpt(layers=8), gpus=4, global_batch=4, tp=4)
    x = 128 * 256 * 2
    assert traffic_bytes(s)["tp"] == pytest.approx(
        4 * 2 * 3 / 4 * x * 8 * s.microbatches, rel=1e-12)


def test_sequence_parallel_backward_sends_one_and_a_half_times_the_forward():
    """4 gathers/scatters forward, 6 backward, each (t-1)/t X: the same 10/8 of the
    all-reduce bytes per layer."""
    plain = traffic_bytes(scenario(gpt(), gpus=4, global_batch=4, tp=4))["tp"]
    sp = traffic_bytes(scenario(gpt(), gpus=4, global_batch=4, tp=4, sequence_parallel=True))
    assert sp["tp"] == pytest.approx(plain * 10 / 8, rel=1e-12)


def test_the_bytes_are_those_of_each_registered_collectives_description(monkeypatch):
    """Issue 25, item 2: the bytes a rank sends are read from the registered description, not
    written again here. A made-up all-reduce ring in which each member sends the whole buffer
    (``sent(n) = 1``): tp 4's 4 all-reduces per layer and micro-batch send 4 X, not
    4 x 2(t-1)/t X; ZeRO-0's gradient all-reduce over dp 4 sends 1/(2 x 3/4) of NCCL's ring's."""
    s = scenario(gpt(layers=8), gpus=16, global_batch=16, tp=4, zero=0)
    assert s.parallel.dp == 4
    ring = traffic_bytes(s)
    toy = Ring(lambda n: 1.0, lambda n, nodes: n, lambda n, nodes: nodes - 1)
    monkeypatch.setitem(COLLECTIVES, "allreduce",
                        ring_collective("allreduce", toy, lambda n: 1.0))
    x = 128 * 256 * 2
    traffic = traffic_bytes(s)
    assert traffic["tp"] == pytest.approx(4 * x * 8 * s.microbatches, rel=1e-12)
    assert traffic["dp"] == pytest.approx(ring["dp"] / (2 * 3 / 4), rel=1e-12)


@pytest.mark.parametrize("fidelity", ["analytic", "representative"])
def test_every_json_result_carries_the_five_groups(fidelity):
    s = scenario(gpt(), gpus=8, global_batch=16, tp=2, pp=2, zero=1)
    result = estimate(s) if fidelity == "analytic" else simulate(s)
    assert set(result.to_json()["traffic_bytes"]) == set(GROUPS)
    assert result.to_json()["traffic_bytes"] == traffic_bytes(s)
