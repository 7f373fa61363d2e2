"""What a step's weights move outside the GEMMs (compute.weight_traffic_bytes): unfused gradient
accumulation and per-use casts of fp32 weights, against their byte counts. Oracle: the bytes
each kernel reads and writes (3 x the gradient per micro-batch after the first; fp32 read plus
bf16 written per cast), over the HBM rate, on one GPU where nothing else changes."""

from __future__ import annotations

import pytest
from sim_helpers import scenario

from clustersim.simulator.closed_form.analytic import CostModel, estimate
from clustersim.simulator.costs.compute import weight_traffic_bytes
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.model.param_counts import layer_params_per_rank
from clustersim.simulator.model.workload import logits_gemm
from clustersim.topologies.profile import profile_for_gpu

M = 8  # micro-batches
H100 = {"preset": "h100-sxm"}  # the real HBM rate: element-wise work costs time
# Kernels alone: layers this small wait for the host (``host_layer_s``), which would hide
# the bytes under test.
PROFILE = profile_for_gpu("h100-sxm").model_copy(update={"host_layer_s": (0.0, 0.0)})


def one_gpu(layers: int = 4, dp: int = 1, zero: int = 0, **training):
    return scenario(layers=layers, micro_batches=M, dp=dp, zero=zero,
                    cluster={"gpu": H100},
                    model={"hidden": 2048, "heads": 16, "vocab": 32000, "seq_len": 2048},
                    training={"precision": "bf16", "grad_dtype": "fp32",
                              "master_weights": "optimizer", "grad_accumulation_fusion": True,
                              **training})


def weights_on_rank(s) -> float:
    g = logits_gemm(s)
    return s.model.layers * sum(layer_params_per_rank(s.model, 1, 1)) + g.n * g.k


def step(s, estimator: str) -> float:
    return (estimate(s, PROFILE) if estimator == "analytic"
            else simulate(s, profile=PROFILE)).step_time_s


@pytest.mark.parametrize("estimator", ["analytic", "engine"])
def test_unfused_accumulation_reads_and_writes_the_fp32_buffer_after_the_first_micro_batch(
        estimator):
    fused, unfused = one_gpu(), one_gpu(grad_accumulation_fusion=False)
    hbm = CostModel(fused, PROFILE).hbm
    expected = (M - 1) * 3 * 4 * weights_on_rank(fused) / hbm
    assert step(unfused, estimator) - step(fused, estimator) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("estimator", ["analytic", "engine"])
def test_fp32_weights_cast_per_use_cost_a_cast_each_way_per_micro_batch(estimator):
    # autocast: fp32 weight read, bf16 copy written (forward); bf16 gradient read, fp32
    # written (backward): 6 bytes each way per parameter and micro-batch.
    master, autocast = one_gpu(), one_gpu(master_weights="params")
    hbm = CostModel(master, PROFILE).hbm
    expected = M * 2 * (4 + 2) * weights_on_rank(master) / hbm
    assert step(autocast, estimator) - step(master, estimator) == pytest.approx(expected,
                                                                                 rel=1e-6)


def test_sharded_gradients_accumulate_into_the_shard_and_zero3_casts_only_shards():
    cm = CostModel(one_gpu(dp=4, zero=3, master_weights="params",
                           grad_accumulation_fusion=False), profile_for_gpu("h100-sxm"))
    forward, backward = weight_traffic_bytes(cm, 1000.0)
    assert forward == 0.0
    assert backward == pytest.approx((M - 1) / M * 3 * 4 * 1000.0 / 4)


def test_megatron_fuses_and_the_other_stacks_do_not():
    base = {"precision": "bf16", "grad_dtype": None, "master_weights": None}
    stacks = {f: one_gpu(framework=f, **base, grad_accumulation_fusion=None).training
              for f in ("megatron", "deepspeed", "fsdp")}
    assert [stacks[f].grad_accumulation_fusion for f in stacks] == [True, False, False]
