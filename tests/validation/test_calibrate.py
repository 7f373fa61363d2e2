"""Calibration fits: each fitted number reproduces the measurements it came from, checked on
measurements synthesised from known closed forms (ring all-reduce, all-gather, send/recv)."""

from __future__ import annotations

import math

import pytest

from clustersim.simulator.inputs.scenario import build_cluster
from clustersim.simulator.model import elementwise as ew
from clustersim.topologies.profile import profile_for_gpu
from clustersim.validation.calibrate import (
    CalibrationError,
    fit_alpha_beta,
    fit_profile,
    matmul_tables,
    memory_efficiency,
    optimizer_efficiency,
)

ALPHA, BANDWIDTH = 80e-6, 2.5e9


def collective_rows(world: int = 2) -> list[dict]:
    """Times of gloo's collectives as the alpha-beta closed forms give them."""
    rows = []
    for nbytes in (4096, 65536, 1 << 20, 1 << 24):
        n = world
        forms = {"all_reduce": 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * nbytes / BANDWIDTH,
                 "all_gather": (n - 1) * ALPHA + (n - 1) / n * nbytes / BANDWIDTH,
                 "ping_pong": 2 * (ALPHA + nbytes / BANDWIDTH)}
        rows += [{"kind": "collective", "op": op, "bytes": nbytes, "world": n, "seconds": t}
                 for op, t in forms.items()]
    return rows


@pytest.mark.parametrize("world", [2, 4])
def test_alpha_beta_recovers_the_closed_forms(world):
    alpha, bandwidth = fit_alpha_beta(collective_rows(world))
    assert alpha == pytest.approx(ALPHA, rel=1e-6)
    assert bandwidth == pytest.approx(BANDWIDTH, rel=1e-6)


def test_one_rank_has_no_collectives_to_fit():
    with pytest.raises(CalibrationError, match="--nproc 2"):
        fit_alpha_beta([])


def gemm_rows(eff_of_tokens, peak: float) -> list[dict]:
    rows = []
    for tokens in (128, 1024):
        for k, n in ((512, 512), (512, 2048)):
            flops = 6.0 * tokens * k * n
            rows.append({"kind": "gemm", "tokens": tokens, "k": k, "n": n, "flops": flops,
                         "seconds": flops / (peak * eff_of_tokens(tokens))})
    return rows


def test_matmul_tables_are_per_token_count_and_per_forward_gemm():
    rows = gemm_rows(lambda t: 0.5 if t == 128 else 0.8, peak=1e11)
    flat, per_tokens = matmul_tables(rows, 1e11)
    assert [t for t, _ in per_tokens] == [128, 1024]
    small = dict((f, e) for f, e in per_tokens[0][1])
    assert small == {2.0 * 128 * 512 * 512: 0.5, 2.0 * 128 * 512 * 2048: 0.5}
    assert all(e == 0.8 for _, e in per_tokens[1][1])
    assert all(0.5 <= e <= 0.8 for _, e in flat)


def test_faster_than_the_nominal_peak_is_refused():
    with pytest.raises(CalibrationError, match="raise the device's peak"):
        matmul_tables(gemm_rows(lambda t: 1.5, peak=1e11), 1e11)


def test_memory_and_optimizer_efficiency_invert_the_cost_model():
    """Times made from the cost model's own byte counts at 30% (20%) of 50 GB/s give back 0.3
    (0.2): layer element-wise work forward and backward, loss forward + backward, AdamW at
    2w + 24 bytes per parameter."""
    bw = 50e9
    layer = (ew.norm_activation_bytes(256, 512, 2048, 4, "gelu")
             + ew.norm_activation_backward_bytes(256, 512, 2048, 4, "gelu"))
    loss = 2 * ew.loss_bytes(256, 8192)
    rows = [{"kind": "elementwise", "op": "layer_norms_adds_gelu", "tokens": 256, "k": 512,
             "n": 2048, "seconds": layer / (0.3 * bw)},
            {"kind": "elementwise", "op": "cross_entropy", "tokens": 256, "k": 0, "n": 8192,
             "seconds": loss / (0.3 * bw)},
            {"kind": "optimizer", "params": 10**6, "seconds": 10**6 * 32 / (0.2 * bw)}]
    assert memory_efficiency(rows, bw, 4) == pytest.approx(0.3, abs=1e-4)
    assert optimizer_efficiency(rows, bw, 4) == pytest.approx(0.2, abs=1e-4)


def test_a_fitted_profile_prices_the_loopback_tier_as_measured():
    cluster = build_cluster({"preset": "localhost-gloo", "gpus": 2})
    peak = cluster.gpu.peak_flops["fp32"]
    rows = [*collective_rows(), *gemm_rows(lambda t: 0.6, peak),
            {"kind": "optimizer", "params": 10**6, "seconds": 0.01},
            {"kind": "elementwise", "op": "cross_entropy", "tokens": 128, "k": 0, "n": 512,
             "seconds": 0.001}]
    profile = fit_profile(rows, cluster, "gloo", 2, "x.raw.csv")
    line = cluster.intra_node.bandwidth * 1e9
    assert profile.comm_eff("intra_node") * line == pytest.approx(BANDWIDTH, rel=1e-3)
    assert profile.comm_latency("intra_node", 1.0) == pytest.approx(ALPHA)
    assert profile.matmul_eff(2.0 * 128 * 512 * 512, tokens=128) == pytest.approx(0.6)
    assert math.isclose(profile.optimizer_eff * cluster.gpu.memory_bandwidth * 1e9, 32e6 / 0.01,
                        rel_tol=1e-3)


def test_an_nccl_calibration_keeps_the_tiers_one_node_cannot_measure():
    """One node measures NVLink; InfiniBand keeps the shipped profile's fraction."""
    cluster = build_cluster({"preset": "dgx-h100", "gpus": 8})
    peak = cluster.gpu.peak_flops["bf16"]
    rows = [*collective_rows(8), *gemm_rows(lambda t: 0.5, peak),
            {"kind": "optimizer", "params": 10**6, "seconds": 0.001},
            {"kind": "elementwise", "op": "cross_entropy", "tokens": 128, "k": 0, "n": 512,
             "seconds": 1e-5}]
    profile = fit_profile(rows, cluster, "nccl", 8, "x.raw.csv")
    assert profile.comm_eff("intra_node") * 450e9 == pytest.approx(BANDWIDTH, rel=1e-3)
    assert profile.comm_eff("inter_node") == profile_for_gpu("h100-sxm").comm_eff("inter_node")
    # nor does it time compute beside a collective: the published slowdown stays, never 0
    assert profile.comm_compute_slowdown == profile_for_gpu("h100-sxm").comm_compute_slowdown > 0
    assert profile.host_layer_s == profile_for_gpu("h100-sxm").host_layer_s != (0.0, 0.0)


def test_round_noise_is_the_median_relative_spread_of_kernels():
    from clustersim.validation.noise import round_noise
    rows = [{"kind": "gemm", "seconds": 1.0, "round_spread": s} for s in (0.1, 0.2, 0.4)]
    rows.append({"kind": "collective", "seconds": 1.0, "round_spread": 5.0})  # not a kernel
    assert round_noise(rows) == pytest.approx(0.2)


def test_a_gpu_calibration_times_gemms_that_take_milliseconds():
    # A kernel launch and a host synchronisation cost ~10-20 us: a GEMM must run ~1 ms for its
    # timing to read the tensor cores rather than the launch. At the H100's bf16 peak
    # (989 TFLOP/s) that is ~1e12 FLOPs; the CPU plan's largest is 1.5e10.
    from clustersim.validation.microbench import BenchPlan, gemm_shapes
    largest = {name: max(2 * t * k * n for t, k, n in gemm_shapes(plan))
               for name, plan in (("cpu", BenchPlan()), ("gpu", BenchPlan.gpu()))}
    assert largest["gpu"] >= 989e12 * 1e-3
    assert largest["cpu"] < 989e12 * 20e-6  # launch-bound on a GPU: the first H100 run
