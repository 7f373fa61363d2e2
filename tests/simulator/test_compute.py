"""Compute costs by operation: GEMM shapes, tile/wave quantisation, roofline, attention."""

from __future__ import annotations

import json

import pytest
from sim_helpers import PEAK, flat_profile, scenario

from clustersim.errors import ScenarioError
from clustersim.simulator.closed_form import analytic as an
from clustersim.simulator.costs import compute
from clustersim.simulator.model import workload as wl
from clustersim.simulator.model.kernels import Gemm, quantisation
from clustersim.topologies.profile import Profile, load_profile, profile_for_gpu

H100_SMS = 132

def shape_profile(ceiling=1.0, tiles=((128, 128),), **extra) -> Profile:
    return Profile(name="shape", gpu="any", gemm={"ceiling": ceiling, "tiles": list(tiles)},
                   memory_efficiency=1.0, comm_efficiency={}, **extra)

def test_backward_gemms_have_the_transposed_shapes_and_the_forward_flops():
    g = Gemm(4096, 1536, 8192)
    assert (g.dgrad().m, g.dgrad().n, g.dgrad().k) == (4096, 8192, 1536)
    assert (g.wgrad().m, g.wgrad().n, g.wgrad().k) == (8192, 1536, 4096)
    assert g.dgrad().flops == g.wgrad().flops == g.flops == 2 * 4096 * 1536 * 8192

def test_a_partial_last_wave_wastes_its_idle_sms():
    """4096 x 1536 in 128x128 tiles: 32 x 12 = 384 tiles, 3 waves of 132 = 396 slots."""
    assert quantisation(Gemm(4096, 1536, 1024), H100_SMS, [(128, 128)]) == pytest.approx(
        384 / 396)
    # exactly one full wave: nothing wasted; a 129-row GEMM pads a second tile row
    assert quantisation(Gemm(128 * 132, 128, 64), H100_SMS, [(128, 128)]) == pytest.approx(1.0)
    assert quantisation(Gemm(129, 128, 64), H100_SMS, [(128, 128)]) == pytest.approx(
        129 * 128 / (1 * 132 * 128 * 128))

def test_the_best_candidate_tile_is_chosen():
    g = Gemm(256, 256 * 66, 4096)  # 128x256 tiles: 2 x 66 = 132, one full wave
    assert quantisation(g, H100_SMS, [(128, 128), (128, 256)]) == pytest.approx(1.0)

def test_gemm_time_is_the_slower_of_compute_and_hbm_plus_overhead():
    s = scenario()  # h100-sxm, 132 SMs, bf16, FAST_HBM: 1e12 GB/s
    cm = an.CostModel(s, shape_profile(ceiling=0.8, kernel_overhead_s=3e-6))
    big = Gemm(128 * 132, 128, 4096)  # one full wave of 128x128 tiles
    assert compute.gemm_time(cm, big) == pytest.approx(big.flops / (PEAK * 0.8) + 3e-6)
    slow_hbm = scenario(cluster={"gpu": {"preset": "h100-sxm", "memory_bandwidth": 1.0}})
    cm = an.CostModel(slow_hbm, shape_profile(ceiling=0.8))
    thin = Gemm(128 * 132, 128, 8)  # arithmetic intensity ~8 FLOP/byte: memory-bound
    assert compute.gemm_time(cm, thin) == pytest.approx(thin.operand_bytes(2) / 1e9)

def test_k_overhead_charges_short_reductions():
    """k_overhead = k: each tile pays as much again for prologue and epilogue."""
    profile = Profile(name="k", gpu="any", memory_efficiency=1.0, comm_efficiency={},
                      gemm={"ceiling": 1.0, "k_overhead": 512, "tiles": [[128, 128]]})
    cm = an.CostModel(scenario(), profile)
    g = Gemm(128 * 132, 128, 512)
    assert compute.gemm_time(cm, g) == pytest.approx(g.flops / PEAK * 2)

def test_layer_gemms_by_shape_cover_the_weight_flops():
    """QKV, projection and MLP shapes: tokens rows, their FLOPs those of SCENARIO.md."""
    s = scenario(tp=2, model={"hidden": 1024, "heads": 16, "seq_len": 512})
    k = wl.layer_kernels(s)
    tokens, h = 512, 1024
    assert [(g.m, g.n, g.k) for g in k.gemms] == [
        (tokens, 3 * h / 2, h), (tokens, h, h / 2), (tokens, 4 * h / 2, h), (tokens, h, 4 * h / 2)]
    assert sum(g.flops for g in k.attention_gemms) == pytest.approx(k.attention)

def test_flash_attention_runs_the_causal_half_and_a_2_5x_backward():
    """Fused causal attention: time for half of 4 s^2 h at the attention efficiency; backward
    2.5x (FlashAttention-2's 5 matmuls to 2); model FLOPs keep the full square."""
    s = scenario(model={"hidden": 1024, "heads": 16, "seq_len": 2048})
    profile = Profile(name="a", gpu="any", matmul_efficiency=[[1e6, 1.0]], memory_efficiency=1.0,
                      comm_efficiency={}, attention_efficiency=0.4)
    cm = an.CostModel(s, profile)
    fwd, bwd = compute.attention_times(cm, wl.layer_kernels(s))
    full_square = 4 * 2048 * 2048 * 1024
    assert fwd == pytest.approx(0.5 * full_square / (PEAK * 0.4))
    assert bwd == pytest.approx(2.5 * fwd)
    assert wl.layer_forward_flops(s.model) > full_square  # MFU still counts the whole square

def test_fused_attention_pays_its_fixed_work_per_query_row_on_short_sequences():
    """Fixed work of 2,048 keys forward and 6,144 backward: a 2,048-token sequence runs at
    half the long-sequence fraction forward and a quarter backward; under context parallelism
    2 each ring step's call attends over 1,024 keys, a third and a seventh (over half the
    queries, so the work halves too)."""
    profile = Profile(name="a", gpu="any", matmul_efficiency=[[1e6, 1.0]], memory_efficiency=1.0,
                      comm_efficiency={}, attention_efficiency=0.4,
                      attention_overhead_tokens=(2048, 6144))
    executed = 0.5 * 4 * 2048 * 2048 * 1024
    model = {"hidden": 1024, "heads": 16, "seq_len": 2048}
    for cp, forward, backward in ((1, 1 / 2, 1 / 4), (2, 1 / 3, 1 / 7)):
        s = scenario(model=model, cp=cp)
        fwd, bwd = compute.attention_times(an.CostModel(s, profile), wl.layer_kernels(s))
        assert fwd == pytest.approx(executed / cp / (PEAK * 0.4 * forward)), cp
        assert bwd == pytest.approx(2.5 * executed / cp / (PEAK * 0.4 * backward)), cp

def test_a_kernel_family_keeps_its_own_fixed_work():
    profile = Profile(name="a", gpu="any", matmul_efficiency=[[1e6, 1.0]], memory_efficiency=1.0,
                      comm_efficiency={}, attention_efficiency=0.6,
                      attention_overhead_tokens=(100, 100),
                      attention_by_kernel={"flash2": (0.3, 0.2)},
                      attention_overhead_by_kernel={"flash2": (1000, 3000)})
    assert profile.attention_fractions("flash2", 1000) == pytest.approx((0.15, 0.05))
    assert profile.attention_fractions(None, 100) == pytest.approx((0.3, 0.3))  # the default
    assert profile.attention_fractions("flash2") == (0.3, 0.2)  # no length: the long limit

def test_a_family_without_figures_on_a_gpu_runs_flash2s():
    """FlashAttention-2 is measured on every GPU profile; a family measured elsewhere (triton,
    only against FlashAttention-2 on A100) or not at all there (flash3 before Hopper) runs at
    its figures, fixed work included, and never at a faster default."""
    profile = Profile(name="a", gpu="any", matmul_efficiency=[[1e6, 1.0]], memory_efficiency=1.0,
                      comm_efficiency={}, attention_efficiency=0.6,
                      attention_overhead_tokens=(100, 100),
                      attention_by_kernel={"flash2": (0.3, 0.2), "flash3": (0.6, 0.5)},
                      attention_overhead_by_kernel={"flash2": (1000, 3000), "flash3": (100, 100)})
    flash2 = profile.attention_fractions("flash2", 1000)
    assert profile.attention_fractions("triton", 1000) == flash2
    bare = Profile(name="b", gpu="any", matmul_efficiency=[[1e6, 1.0]], memory_efficiency=1.0,
                   comm_efficiency={}, attention_efficiency=0.6)
    assert bare.attention_fractions("triton") == (0.6, 0.6)  # no families at all: the default

@pytest.mark.parametrize("family, forward, backward", [("triton", (1.3, 1.5), (1.98, 2.02)),
                                                        ("flash1", (1.98, 2.02), (1.98, 2.02))])
def test_older_attention_on_a100_is_flash2_over_the_fa2_papers_speedups(family, forward, backward):
    """Dao 2023 (FlashAttention-2, sec. 4.1, A100): FlashAttention-2 runs 1.3-1.5x faster than
    FlashAttention in Triton forward and about 2x backward, and around 2x faster than
    FlashAttention (flash-attn 1.x); each at the same fixed work."""
    a100 = profile_for_gpu("a100-80gb")
    for keys in (512, 2048, 65536):
        f2, b2 = a100.attention_fractions("flash2", keys)
        f, b = a100.attention_fractions(family, keys)
        assert forward[0] <= f2 / f <= forward[1] and backward[0] <= b2 / b <= backward[1], keys

def test_on_h100_flash1_keeps_its_a100_ratio_and_triton_runs_flash2s():
    """flash-attn 1.x and FlashAttention-2 both run without Hopper's instructions, so the
    FA2 paper's A100 ratio (around 2x) carries over to H100; Triton emits Hopper's
    instructions (FlashAttention-3's H100 benchmarks: at or above FlashAttention-2), so its
    A100 ratio does not, and it runs flash2's figures (kernels.yaml)."""
    h100 = profile_for_gpu("h100-sxm")
    for keys in (512, 2048, 65536):
        f2, b2 = h100.attention_fractions("flash2", keys)
        f1, b1 = h100.attention_fractions("flash1", keys)
        assert 1.98 <= f2 / f1 <= 2.02 and 1.98 <= b2 / b1 <= 2.02, keys
        assert h100.attention_fractions("triton", keys) == (f2, b2)


def test_unfused_attention_runs_the_full_square_as_gemms():
    s = scenario(model={"hidden": 1024, "heads": 16, "seq_len": 2048},
                 training={"flash_attention": False})
    fwd, bwd = compute.attention_times(an.CostModel(s, flat_profile(0.5)), wl.layer_kernels(s))
    assert fwd == pytest.approx(4 * 2048 * 2048 * 1024 / (PEAK * 0.5))
    assert bwd == pytest.approx(2 * fwd)

def test_old_profiles_without_a_gemm_model_still_load_and_use_their_curve():
    old = Profile.model_validate({"name": "old", "gpu": "any", "memory_efficiency": 0.8,
                                  "matmul_efficiency": [[1e9, 0.5]], "comm_efficiency": {}})
    cm = an.CostModel(scenario(), old)
    g = Gemm(1024, 1024, 1024)
    assert compute.gemm_time(cm, g) == pytest.approx(g.flops / (PEAK * 0.5))
    with pytest.raises(ValueError, match="matmul_efficiency"):
        Profile.model_validate({"name": "none", "gpu": "any", "memory_efficiency": 0.8,
                                "comm_efficiency": {}})

def test_shipped_gpu_profiles_cost_gemms_by_shape_over_their_sm_count():
    s = scenario()
    assert s.cluster.gpu.sm_count == H100_SMS
    assert profile_for_gpu("h100-sxm").gemm is not None
    assert profile_for_gpu("a100-80gb").gemm is not None


@pytest.mark.parametrize("field, value, says", [
    ("comm_compute_slowdown", 1.0, "comm_compute_slowdown"),
    ("comm_compute_slowdown", -0.1, "comm_compute_slowdown"),
    ("attention_efficiency", 0.0, "attention_efficiency"),
    ("gemm", {"ceiling": 0.8, "tiles": [[0, 128]]}, "gemm"),
    ("gemm", {"ceiling": 1.5}, "gemm"),
])
def test_impossible_profile_values_are_one_error_naming_the_field(tmp_path, field, value, says):
    data = {"name": "bad", "gpu": "any", "memory_efficiency": 0.8, "comm_efficiency": {},
            "gemm": {"ceiling": 0.7}, field: value}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ScenarioError, match=says):
        load_profile(path)

def test_a_layer_pass_takes_at_least_the_hosts_time_to_issue_it():
    """The host floor (compute.host_floor): a pass whose kernels are shorter than the host's
    issue time waits for the host, exactly to it; longer kernels hide the host entirely."""
    s = scenario()
    free = an.CostModel(s, shape_profile(ceiling=0.8)).passes
    kernels = [p.gemms + p.attention + p.elementwise for p in free]
    assert all(p.host_wait == 0.0 for p in free)
    below = tuple(1.5 * k for k in kernels)  # the host slower than the kernels: it paces
    floored = an.CostModel(s, shape_profile(ceiling=0.8, host_layer_s=below)).passes
    for p, host, k in zip(floored, below, kernels, strict=True):
        assert p.total == pytest.approx(host)
        assert p.host_wait == pytest.approx(host - k)
    above = tuple(0.5 * k for k in kernels)  # the host ahead: nothing changes
    hidden = an.CostModel(s, shape_profile(ceiling=0.8, host_layer_s=above)).passes
    assert [p.total for p in hidden] == pytest.approx(kernels)
