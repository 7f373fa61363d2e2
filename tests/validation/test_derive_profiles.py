"""Every shipped GPU profile is what validation/derive_profiles.py derives from the kernel
measurements (topologies/measurements/kernels.yaml); its GEMM model reproduces the measured
best matmul at its shape; at most two constants per GPU are fitted end-to-end."""

from __future__ import annotations

import pytest

from clustersim.simulator.model.kernels import Gemm, quantisation
from clustersim.topologies.hardware import GpuSpec, gpu_presets
from clustersim.topologies.profile import Profile, load_profile, profile_for_gpu
from clustersim.validation import derive_profiles as derive

MEASURED = {gid: e for gid, e in derive.measurements().items() if "matmul" in e
            and "derived_from" not in e}


def shipped(name: str) -> Profile:
    """The shipped profile of that name (a GPU's own, or a ``-measured`` one)."""
    return load_profile(derive.PROFILES / f"{name}.json")


def entry_of(name: str) -> dict:
    """The measurements a profile's figures come from (our sweeps summarised, if any)."""
    data = derive.measurements()
    entry = data[data[name].get("derived_from", name)]
    return derive.sweep_entry(entry, data) if "sweeps" in entry else entry


def test_shipped_profiles_are_what_the_measurements_derive():
    assert derive.differences() == [], (
        "run: python -m clustersim.validation.derive_profiles --write")


@pytest.mark.parametrize("gpu_id", sorted(MEASURED))
def test_gemm_model_reproduces_the_measured_best_matmul(gpu_id):
    """The ceiling times the shape's quantisation is the MAMF over the bf16 peak (to the
    ceiling's three decimals)."""
    entry = MEASURED[gpu_id]["matmul"]
    gpu = GpuSpec.model_validate({**gpu_presets()[gpu_id], "id": gpu_id})
    profile = profile_for_gpu(gpu_id)
    m, n, k = entry["shape"]
    modelled = profile.gemm.ceiling * quantisation(Gemm(m, n, k), gpu.sm_count,
                                                   profile.gemm.tiles)
    assert modelled == pytest.approx(entry["tflops"] * 1e12 / gpu.peak_flops["bf16"], abs=1e-3)


FP8_MEASURED = {g: e for g, e in derive.measurements().items() if "fp8_matmul" in e}


@pytest.mark.parametrize("gpu_id", sorted(FP8_MEASURED))
def test_gemm_model_reproduces_the_measured_best_fp8_matmul(gpu_id):
    """An FP8 GEMM at the measured shape runs at the published FP8 figure (DeepGEMM's best
    dense GEMM for H100), the sustained fraction aside; every GPU derived from it keeps it."""
    entry = FP8_MEASURED[gpu_id]["fp8_matmul"]
    gpu = GpuSpec.model_validate({**gpu_presets()[gpu_id], "id": gpu_id})
    m, n, k = entry["shape"]
    for derived in [gpu_id, *(g for g, e in derive.measurements().items()
                              if e.get("derived_from") == gpu_id)]:
        profile = profile_for_gpu(derived)
        modelled = profile.gemm.fp8_ceiling * quantisation(Gemm(m, n, k), gpu.sm_count,
                                                           profile.gemm.tiles)
        assert modelled == pytest.approx(entry["tflops"] * 1e12 / gpu.peak_flops["fp8"],
                                         abs=1e-3)


@pytest.mark.parametrize("gpu_id", sorted(derive.measurements()))
def test_only_two_constants_per_gpu_are_fitted_end_to_end(gpu_id):
    """Everything but step_overhead_s and sustained_fraction is a measured figure: setting
    those two aside, the profile is the measurements' alone."""
    profile = shipped(gpu_id)
    assert isinstance(profile, Profile)
    entry = entry_of(gpu_id)
    assert profile.fitted_on == [entry["fitted"]["table"]]
    assert profile.memory_efficiency == entry["hbm"]["fraction"]
    for family, figures in entry["attention"].items():
        assert profile.attention_fractions(family) == (figures["forward"], figures["backward"])
    slowdown = entry["overlap_slowdown"]["fraction"]
    assert profile.comm_compute_slowdown == pytest.approx(1 - 1 / (1 + slowdown), abs=1e-3)
    assert 0.5 <= profile.sustained_fraction <= 1.0
    assert profile.kernel_overhead_s == 0.0  # the host's cost is per step, not per kernel


def test_docs_quote_the_fitted_overheads_of_the_shipped_profiles():
    """docs/profiles.md's "Today" sentence names each GPU's fitted step overhead and sustained
    fraction as the shipped profiles hold them (a refit that moves them must update it)."""
    import re
    text = (derive.PROFILES.parents[1] / "docs" / "profiles.md").read_text()
    quoted = dict(re.findall(r"(A100|H100) ([0-9.]+ s and [0-9.]+)", " ".join(text.split())))
    for gpu, name in (("A100", "a100-80gb"), ("H100", "h100-sxm")):
        p = shipped(name)
        assert quoted[gpu] == f"{p.step_overhead_s:g} s and {p.sustained_fraction:g}", gpu
