"""ZeRO-2 with gradient accumulation: every micro-batch's gradients are reduce-scattered.

DeepSpeed stage 2 keeps only a rank's gradient shard, so each micro-batch's backward
reduce-scatters its buckets into it and waits for them at the end of that backward
(``independent_gradient_partition_epilogue`` synchronises the device,
deepspeed/runtime/zero/stage_1_and_2.py); ZeRO-1 (Megatron's distributed optimizer) reduces
once, after the last micro-batch. Oracles: the closed form of that per-micro-batch exposure, and
the engine against the analytic estimate.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim.simulator.closed_form.analytic import CostModel, estimate
from clustersim.simulator.costs import memory as mem
from clustersim.simulator.costs.traffic import traffic_bytes
from clustersim.simulator.discrete_event.engine import Engine, simulate
from clustersim.simulator.inputs.scenario import build_scenario, load_scenario
from clustersim.topologies import network as net
from clustersim.topologies.profile import profile_for_gpu

EXAMPLE = Path(__file__).parent.parent.parent / "examples" / "zero2-vs-zero1-ethernet.yaml"


def ethernet(zero: int):
    """The shipped example: 7B, dp 64 over 8 nodes on 25 Gb/s Ethernet, 16 x 1K tokens."""
    return load_scenario(EXAMPLE, [f"parallel.zero={zero}"])


def infiniband(zero: int, seq_len: int = 8192):
    """The same model and split on DGX H100 InfiniBand with 8K-token micro-batches."""
    return build_scenario({"model": {"preset": "llama2-7b", "seq_len": seq_len},
                           "cluster": {"preset": "dgx-h100", "nodes": 8},
                           "training": {"global_batch": 1024}, "parallel": {"zero": zero}})


def test_where_reduce_scatters_outlast_the_backward_zero2_is_clearly_slower():
    """Ethernet: each micro-batch's reduce-scatter far outlasts its backward, so ZeRO-2 pays it
    16 times and ZeRO-1 once: the difference is (m - 1) reduce-scatters less the backwards
    they overlap, within 2%."""
    z1, z2 = (simulate(ethernet(z)).step_time_s for z in (1, 2))
    assert z2 > 5 * z1
    s = ethernet(2)
    assert s.microbatches == 16
    dense, _ = mem.stage_params_per_rank(s, 0)
    reduce_scatter = net.reduce_scatter_time(CostModel(s).dp, 4 * dense)  # fp32 main grads
    backward = CostModel(s).per_layer[1] * s.model.layers  # one micro-batch's, logits aside
    assert reduce_scatter > 10 * backward
    assert z2 - z1 == pytest.approx(15 * (reduce_scatter - backward), rel=0.02)


def test_where_reduce_scatters_hide_behind_the_backward_zero2_costs_almost_nothing():
    """InfiniBand and 8K tokens per micro-batch: each reduce-scatter hides behind its backward
    but the last bucket, so ZeRO-2 is within 2% of ZeRO-1 where hidden traffic is free, and
    costs only the compute it slows where it is not (the shipped profile)."""
    free = profile_for_gpu("h100-sxm").model_copy(update={"comm_compute_slowdown": 0.0})
    z1, z2 = (simulate(infiniband(z), profile=free).step_time_s for z in (1, 2))
    assert z1 <= z2 < 1.02 * z1
    z1, z2 = (simulate(infiniband(z)).step_time_s for z in (1, 2))
    assert z1 < z2 < 1.05 * z1


@pytest.mark.parametrize("make", [ethernet, infiniband])
def test_engine_and_closed_form_agree_on_zero2(make):
    s = make(2)
    assert simulate(s).step_time_s == pytest.approx(estimate(s).step_time_s, rel=0.02)


def test_zero2_moves_m_times_the_gradient_bytes_of_zero1():
    """DP busy time: ZeRO-2 reduce-scatters 16 times what ZeRO-1 does once (same all-gather)."""
    busy = {}
    for zero in (1, 2):
        engine = Engine(ethernet(zero), profile=profile_for_gpu("h100-sxm"), record=True)
        engine.run()
        spans = [sp for sp in engine.timeline.spans
                 if sp.rank == engine.ranks[0].rid and sp.stream == "dp"]
        busy[zero] = sum(sp.end - sp.start for sp in spans if sp.name.startswith("grads"))
    assert busy[2] == pytest.approx(16 * busy[1], rel=1e-6)


def ethernet_pipeline(zero: int):
    """The Ethernet example cut into a 4-stage 1F1B pipeline (dp 16): ZeRO-2 under a pipeline."""
    return load_scenario(EXAMPLE, [f"parallel.zero={zero}", "parallel.pp=4", "parallel.dp=16"])


def test_under_a_pipeline_zero2_reduces_once_a_step_like_zero1():
    """PyTorch's pipelining turns FSDP's gradient sync off for every backward and reduces after
    the last one (torch/distributed/pipelining/stage.py, perform_reduce_grad), and DeepSpeed's
    pipeline engine refuses ZeRO-2: with pp > 1 ZeRO-2 is ZeRO-1 in time, traffic and memory,
    while the same Ethernet scenario without a pipeline pays its reduce-scatters 16 times."""
    z1, z2 = ethernet_pipeline(1), ethernet_pipeline(2)
    assert not z2.parallel.sharded_gradients and ethernet(2).parallel.sharded_gradients
    for predict in (simulate, estimate):
        one, two = predict(z1), predict(z2)
        assert two.step_time_s == pytest.approx(one.step_time_s, rel=1e-9)
        assert two.peak_bytes == pytest.approx(one.peak_bytes, rel=1e-9)
    assert traffic_bytes(z2)["dp"] == pytest.approx(traffic_bytes(z1)["dp"], rel=1e-12)
    # Whole gradients held: 4 bytes (fp32 main grads) per parameter of the stage, unsharded.
    dense, _ = mem.stage_params_per_rank(z2, 0)
    assert mem.stage_model_states(z2, 0)[1] == pytest.approx(4 * dense)
