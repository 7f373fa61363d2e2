"""The analytic estimator against closed forms (accuracy against published runs, held out:
tests/validation/test_published.py and benchmarks/accuracy.py).

Oracles (DESIGN.md, "Closed forms are the tests' oracle"): the pipeline bubble
``(p-1)/(m+p-1)`` (GPipe, 1F1B) and ``(p-1)/(v m)`` of the ideal time (interleaved; Narayanan
et al. 2021, sec. 2.2), compute time ``FLOPs / (peak * eff)``, MFU ``= model FLOPs /
(step * gpus * peak)``, and the ring all-reduce ``2(n-1)/n X/B + 2(n-1) alpha``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_helpers import PEAK, flat_profile, scenario

from clustersim.simulator.closed_form import analytic as an
from clustersim.simulator.closed_form.analytic import estimate
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.model import param_counts as pc
from clustersim.simulator.model import workload as wl
from clustersim.topologies.collectives import ring_allreduce_time
from clustersim.topologies.profile import Profile

# --- the pipeline ---------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("m", [1, 4, 16])
def test_bubble_fraction_of_equal_stages(schedule, p, m):
    """Equal stages, free communication: the bubble is (p-1)/(m+p-1) of the step."""
    r = estimate(scenario(layers=2 * p, micro_batches=m, pp=p, schedule=schedule), flat_profile())
    assert r.breakdown.bubble / r.step_time_s == pytest.approx((p - 1) / (m + p - 1), rel=0.01)


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("v", [2, 4])
@pytest.mark.parametrize("m", [4, 8, 16])
def test_interleaving_shrinks_the_bubble_by_v(p, v, m):
    """v chunks per rank: bubble = (p-1)/(v m) of the ideal time m * (F + B)."""
    s = scenario(layers=p * v, micro_batches=m, pp=p, schedule="interleaved", virtual_stages=v)
    r = estimate(s, flat_profile())
    assert r.breakdown.bubble / r.breakdown.compute == pytest.approx((p - 1) / (v * m), rel=0.02)


def test_interleaving_sends_v_times_the_pipeline_messages():
    """Each chunk sends its activation on and its gradient back (Narayanan et al. sec. 2.2),
    each send blocking its sender."""
    slow = {"intra_node": {"bandwidth": 10, "latency": 1e-5}}
    def comm(v):
        s = scenario(layers=8, pp=2, schedule="interleaved" if v > 1 else "1f1b",
                     virtual_stages=v, cluster=slow, overlap_p2p_comm=False)
        return an.stage_times(an.CostModel(s, flat_profile()), 0).comm
    assert comm(2) == pytest.approx(2 * comm(1))
    assert comm(1) == pytest.approx(2 * (1e-5 + 256 * 512 * 2 / 10e9))


@pytest.mark.parametrize("stage_layers, v", [([2, 14], 1), ([1, 7, 1, 7], 2)])
def test_a_later_stage_with_more_gradients_sets_the_step(stage_layers, v):
    """Stage 1 finishes its last backward one chunk-backward of stage 0 (B_0 / v) earlier, then
    all-reduces its own gradients: step = max(end + G_0, end - B_0/v + G_1)."""
    cluster = {"gpus_per_node": 2, "intra_node": {"bandwidth": 5, "latency": 1e-6}}
    s = scenario(layers=16, micro_batches=4, cluster=cluster, pp=2, dp=2,
                 schedule="interleaved" if v > 1 else "1f1b", virtual_stages=v,
                 stage_layers=stage_layers, overlap_grad_reduce=False,
                 model={"hidden": 1024, "heads": 16, "seq_len": 2048},
                 training={"flash_attention": False})  # the FLOPs convention's full square
    eff, m, model = 0.01, 4, s.model
    fwd = [2 * wl.layer_forward_flops(model) / (PEAK * eff),
           (14 * wl.layer_forward_flops(model) + wl.logits_forward_flops(model)) / (PEAK * eff)]
    per_mb = [3 * f for f in fwd]
    end = m * max(per_mb) + (sum(per_mb) - max(per_mb)) / v
    params = [2 * pc.layer_params(model) + pc.embedding_params(model),
              14 * pc.layer_params(model) + pc.head_params(model) + model.vocab * model.hidden]
    sync = [ring_allreduce_time(4 * n, 2, 5e9, 1e-6) for n in params]  # fp32 main gradients
    finish = [end + sync[0], end - 2 * fwd[0] / v + sync[1]]
    assert finish[1] > finish[0]  # the case under test: stage 1 is critical
    r = estimate(s, flat_profile(eff))
    assert r.step_time_s == pytest.approx(max(finish), rel=1e-7)


# --- compute, throughput, MFU ----------------------------------------------------------------

@pytest.mark.parametrize("eff", [0.25, 0.5, 1.0])
def test_compute_time_is_flops_over_peak_times_efficiency(eff):
    """One GPU, free HBM, unfused attention (it runs the whole s x s square): the step is model
    FLOPs / (peak * eff), so MFU equals eff."""
    s = scenario(layers=4, micro_batches=8, training={"flash_attention": False})
    r = estimate(s, flat_profile(eff))
    assert r.step_time_s == pytest.approx(wl.model_flops_per_step(s) / (PEAK * eff), rel=1e-6)
    assert r.mfu == pytest.approx(eff, rel=1e-6)


def test_full_recompute_runs_the_hardware_flops():
    """Recomputation adds a forward per layer: the step is hardware FLOPs / (peak * eff)
    (unfused attention, which runs the FLOPs the convention counts)."""
    s = scenario(layers=4, micro_batches=8, recompute="full", training={"flash_attention": False})
    r = estimate(s, flat_profile(0.5))
    assert r.step_time_s == pytest.approx(wl.hardware_flops_per_step(s) / (PEAK * 0.5), rel=1e-6)
    assert r.hardware_tflops_per_gpu == pytest.approx(0.5 * PEAK / 1e12, rel=1e-6)


def test_matmul_efficiency_is_looked_up_by_size():
    """A GEMM costs F / (peak * eff(F)), eff log-interpolated: halfway between decades."""
    table = Profile(name="t", gpu="any", matmul_efficiency=[[1e9, 0.2], [1e11, 0.6]],
                    memory_efficiency=1.0, comm_efficiency={})
    cm = an.CostModel(scenario(), table)
    assert cm.matmul(1e10) == pytest.approx(1e10 / (PEAK * 0.4))
    assert cm.matmul(1e13) == pytest.approx(1e13 / (PEAK * 0.6))  # clamped


def test_mfu_and_throughput_follow_their_definitions():
    s = build_scenario({"model": {"preset": "gpt-18.4b"},
                        "cluster": {"preset": "dgx-a100-80gb", "gpus": 256},
                        "training": {"global_batch": 1024}, "parallel": {"tp": 8, "pp": 2}})
    r = estimate(s)
    step, gpus, peak = r.step_time_s, 256, 312e12
    assert r.mfu == pytest.approx(wl.model_flops_per_step(s) / (step * gpus * peak))
    assert r.hardware_tflops_per_gpu == pytest.approx(
        wl.hardware_flops_per_step(s) / (step * gpus) / 1e12)
    assert r.tokens_per_s == pytest.approx(1024 * s.model.seq_len / step)


@settings(max_examples=60, deadline=None)
@given(tp=st.sampled_from([1, 2, 8]), pp=st.sampled_from([1, 2, 4]), dp=st.sampled_from([1, 4]),
       interleaved=st.booleans(), zero=st.sampled_from([0, 1, 3]),
       recompute=st.sampled_from(["none", "selective", "full"]), overlap=st.booleans(),
       flash=st.booleans())
def test_breakdown_sums_to_the_step(tp, pp, dp, interleaved, zero, recompute, overlap, flash):
    v = 2 if interleaved and pp > 1 else 1
    s = build_scenario({
        "model": {"layers": 16, "hidden": 1024, "heads": 16, "vocab": 32000, "seq_len": 1024},
        "cluster": {"preset": "dgx-h100", "gpus": tp * pp * dp},
        "training": {"global_batch": 8 * dp, "flash_attention": flash},
        "parallel": {"tp": tp, "pp": pp, "dp": dp, "zero": zero, "recompute": recompute,
                     "schedule": "interleaved" if v > 1 else "1f1b", "virtual_stages": v,
                     "overlap_grad_reduce": overlap, "overlap_param_gather": overlap}})
    b = estimate(s).breakdown
    assert min(b.compute, b.exposed_comm, b.bubble, b.optimizer) >= 0
    assert b.total == pytest.approx(estimate(s).step_time_s, rel=1e-9)


# --- data-parallel gradients -------------------------------------------------------------------

@pytest.mark.parametrize("where", ["across nodes", "inside a node"])
@pytest.mark.parametrize("zero", [0, 1])
def test_unoverlapped_gradient_reduction_adds_one_ring_allreduce(where, zero):
    """Overlap off, bf16 gradients: the step grows by exactly 2(n-1)/n X/B + 2(n-1) alpha,
    X = 2 bytes * params (ZeRO-1's reduce-scatter plus all-gather is the same ring traffic)."""
    slow = {"bandwidth": 10, "latency": 1e-5}
    if where == "across nodes":  # one GPU per node: the DP ring runs over the NICs
        dp, tiers = 4, {"gpus_per_node": 1, "inter_node": slow}
    else:
        dp, tiers = 8, {"intra_node": slow}
    def step(cluster):
        s = scenario(dp=dp, cluster=cluster, zero=zero, overlap_grad_reduce=False,
                     overlap_param_gather=False, training={"grad_dtype": "bf16"})
        return s, estimate(s, flat_profile()).step_time_s
    s, slow_step = step(tiers)
    _, free_step = step({k: v for k, v in tiers.items() if k == "gpus_per_node"})
    expected = ring_allreduce_time(2 * pc.total_params(s.model), dp, 10e9, 1e-5)
    assert slow_step - free_step == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("zero", [0, 1])
def test_fp32_main_gradients_are_reduced_in_fp32_and_weights_gathered_in_bf16(zero):
    """bf16 training, default fp32 gradients, dp 8 in a node, overlap off: ZeRO-0 all-reduces
    4P bytes; ZeRO-1 reduce-scatters 4P and all-gathers the 2P updated bf16 weights."""
    def step(cluster):
        s = scenario(dp=8, cluster=cluster, zero=zero, overlap_grad_reduce=False,
                     overlap_param_gather=False)
        return s, estimate(s, flat_profile()).step_time_s
    s, slow_step = step({"intra_node": {"bandwidth": 10, "latency": 1e-5}})
    _, free_step = step({})
    big_p, n, b, a = pc.total_params(s.model), 8, 10e9, 1e-5
    expected = (ring_allreduce_time(4 * big_p, n, b, a) if zero == 0 else
                (n - 1) / n * (4 * big_p + 2 * big_p) / b + 2 * (n - 1) * a)
    assert slow_step - free_step == pytest.approx(expected, rel=1e-6)


def test_context_parallel_replicas_reduce_gradients_too():
    """Gradients are reduced over dp*cp ranks (Megatron-LM), even with dp = 1."""
    s = scenario(cp=2, overlap_grad_reduce=False,
                 cluster={"intra_node": {"bandwidth": 10, "latency": 1e-5}})
    sync = an.stage_times(an.CostModel(s, flat_profile()), 0).grad_sync
    # fp32 main gradients: 4 bytes per parameter
    assert sync == pytest.approx(ring_allreduce_time(4 * pc.total_params(s.model), 2, 10e9, 1e-5))


@pytest.mark.parametrize("model", [
    {"layers": 2, "hidden": 1024, "heads": 16, "vocab": 100, "seq_len": 512},
    {"layers": 2, "hidden": 1024, "heads": 16, "kv_heads": 8, "ffn_kind": "swiglu",
     "vocab": 100, "seq_len": 512, "experts": 8, "top_k": 2},
])
def test_layer_kernels_add_up_to_the_layer_flops(model):
    """Per-rank kernels times tp are the forward FLOPs of SCENARIO.md (MoE: per local expert)."""
    s = build_scenario({"model": model, "cluster": {"preset": "dgx-h100", "gpus": 8},
                        "training": {"global_batch": 8},
                        "parallel": {"tp": 4, "dp": 2, "ep": 2 if "experts" in model else 1,
                                     "sequence_parallel": True}})
    k = wl.layer_kernels(s)
    assert k.matmul_flops * 4 == pytest.approx(wl.layer_forward_flops(s.model))


def test_tp_comm_overlap_hides_tensor_parallel_collectives_behind_gemms():
    """With overlap the exposed TP time is max(0, comm - gemms) each way, never more than
    without it, and zero when the GEMMs are the longer. Four sequences a micro-batch, so that
    the layer's kernels outlast the host's floor (``host_layer_s``), which would hide the
    pieces' cost."""
    raw = {"model": {"preset": "gpt-18.4b"}, "cluster": {"preset": "dgx-h100", "gpus": 64},
           "training": {"global_batch": 64, "micro_batch": 4},
           "parallel": {"tp": 8, "sequence_parallel": True}}
    plain = estimate(build_scenario(raw))
    raw["parallel"]["tp_comm_overlap"] = True
    hidden = estimate(build_scenario(raw))
    assert hidden.breakdown.exposed_comm < plain.breakdown.exposed_comm
    # never free: the GEMMs are cut into pieces (test_userbuffers_split_the_gemms_...)
    assert hidden.breakdown.compute > plain.breakdown.compute


def test_userbuffers_split_the_gemms_as_transformer_engine_does():
    """TE's default userbuffers config: QKV and FC1 forward and the output projection's and
    FC2's data gradients run as tp ring-exchange pieces, the output projection and FC2 forward
    as 4 pipeline pieces, up to 3 pieces at once; the column layers' backward GEMMs stay whole
    (bulk overlap)."""
    from clustersim.simulator.closed_form.analytic import CostModel
    from clustersim.simulator.costs.compute import gemm_time, layer_pass_times
    from clustersim.simulator.model.kernels import Gemm
    raw = {"model": {"preset": "gpt-18.4b"}, "cluster": {"preset": "dgx-h100", "gpus": 64},
           "training": {"global_batch": 64, "micro_batch": 4},
           "parallel": {"tp": 8, "sequence_parallel": True}}
    plain = CostModel(build_scenario(raw))
    raw["parallel"]["tp_comm_overlap"] = True
    split = CostModel(build_scenario(raw))
    k = wl.layer_kernels(split.s)
    qkv, proj, fc1, fc2 = k.gemms

    def pieces(g, n):  # up to 3 at a time on TE's streams, each round one GEMM of their rows
        at_once = min(3, n)
        return n / at_once * gemm_time(split, Gemm(g.m * at_once / n, g.n, g.k)) - gemm_time(
            split, g)
    forward = pieces(qkv, 8) + pieces(fc1, 8) + pieces(proj, 4) + pieces(fc2, 4)
    backward = pieces(proj.dgrad(), 8) + pieces(fc2.dgrad(), 8)
    (f0, b0), (f1, b1) = layer_pass_times(plain), layer_pass_times(split)
    assert f1.gemms - f0.gemms == pytest.approx(forward)
    assert b1.gemms - b0.gemms == pytest.approx(backward)
    assert forward > 0 and backward > 0


def test_optimizer_step_moves_its_bytes_through_hbm():
    """Adam under bf16 with fp32 main gradients, ZeRO-1 over dp 8: each rank's shard moves
    4 (gradient) + 24 (master and moments, read and written) + 2 (bf16 weights) + 8 (the
    clipping norm's read and the zeroing of the gradient buffer) = 38 bytes per parameter
    at the profile's share of HBM bandwidth."""
    from clustersim.simulator.closed_form.analytic import CostModel, optimizer_time
    from clustersim.simulator.costs import memory as mem
    s = build_scenario({"model": {"preset": "gpt-18.4b"},
                        "cluster": {"preset": "dgx-h100", "gpus": 64},
                        "training": {"global_batch": 64},
                        "parallel": {"tp": 8, "zero": 1}})
    cm = CostModel(s)
    dense, _ = mem.stage_params_per_rank(s, 0)
    expected = dense / 8 * 38 / (cm.hbm_peak * cm.profile.optimizer_eff)
    assert optimizer_time(cm, 0) == pytest.approx(expected + cm.profile.step_overhead_s)


@pytest.mark.parametrize("training, per_param", [
    ({"optimizer_moments": "bf16"}, 4 + 2 * (4 + 4) + 2 + 8),
    ({"master_weights": "remainders"}, 4 + 2 * (2 + 8) + 2 + 2 + 8),
    ({"master_weights": "none", "optimizer_moments": "bf16"}, 4 + 2 * 4 + 2 + 2 + 8)])
def test_optimizer_step_moves_the_bytes_its_state_is_kept_in(training, per_param):
    """As above, each state read and written in the bytes it is kept in: 16-bit moments
    (DeepSeek-V3), a master kept as its remainder bits (apex's DistributedFusedAdam) or none,
    the step then also reading the bf16 weight (the master's high half, or updated in place)."""
    from clustersim.simulator.closed_form.analytic import CostModel, optimizer_time
    from clustersim.simulator.costs import memory as mem
    s = build_scenario({"model": {"preset": "gpt-18.4b"},
                        "cluster": {"preset": "dgx-h100", "gpus": 64},
                        "training": {"global_batch": 64, **training},
                        "parallel": {"tp": 8, "zero": 1}})
    cm = CostModel(s)
    dense, _ = mem.stage_params_per_rank(s, 0)
    expected = dense / 8 * per_param / (cm.hbm_peak * cm.profile.optimizer_eff)
    assert optimizer_time(cm, 0) == pytest.approx(expected + cm.profile.step_overhead_s)
