"""Layer time by size and burst against sustained speed (validation/layer_sizes.py,
validation/clocks.py, benchmarks/gpu_sizes.py): the scripts write what they promise, the
kernel families add up to physically possible rates, and what two H200 machines measured
bounds the engine's layer costs wherever the host runs ahead of the GPU."""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from clustersim.validation import autocast_memory, clocks, layer_sizes  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gpu_layers  # noqa: E402  (benchmarks/, beside the docs' figures)
import gpu_sizes  # noqa: E402

BF16_PEAK = 989.4e12  # dense, NVIDIA's H100 SXM and H200 datasheets (the dgx presets' figure)


def test_quick_sweeps_write_every_pass_and_phase(tmp_path):
    assert layer_sizes.main(["--out", str(tmp_path), "--quick", "--rounds", "2"]) == 0
    with (tmp_path / "sizes.csv").open() as f:
        sizes = list(csv.DictReader(f))
    assert [(r["round"], r["pass"]) for r in sizes] == [
        (str(n), p) for n in (1, 2) for p in ("forward", "backward", "step")]
    assert all(float(r["seconds"]) > 0 for r in sizes)
    assert clocks.main(["--out", str(tmp_path), "--quick", "--rounds", "1"]) == 0
    with (tmp_path / "clocks.csv").open() as f:
        phases = [(r["workload"], r["phase"]) for r in csv.DictReader(f)]
    assert phases == [(w, p) for w in ("gemm 256^3", "layer quick tp2")
                      for p in ("burst", "sustained")]


@pytest.mark.parametrize("main", [layer_sizes.main, clocks.main, autocast_memory.main])
def test_without_a_gpu_a_full_sweep_says_so_and_exits_2(main, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --quick:")


def test_the_quick_autocast_sweep_writes_one_row_per_shape(tmp_path):
    assert autocast_memory.main(["--out", str(tmp_path), "--quick"]) == 0
    with (tmp_path / "autocast.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["name"] for r in rows] == ["quick"]
    assert set(rows[0]) == set(autocast_memory.FIELDS)


def test_autocast_keeps_more_than_bf16_beside_its_weight_casts():
    """Measured: under autocast each layer keeps its bf16 weight copies (2 bytes per weight,
    exactly) and more activation bytes than in bf16 throughout (the fp32 residual stream)."""
    with gpu_sizes.AUTOCAST.open() as f:
        for r in csv.DictReader(f):
            units = int(r["batch"]) * int(r["seq"]) * int(r["hidden"])
            bf16 = int(r["layer_bf16_bytes"]) / units
            beyond = (int(r["layer_autocast_bytes"]) - int(r["weight_casts_bytes"])) / units
            assert 29.9 < bf16 < 30.2 and bf16 + 1.9 < beyond < bf16 + 4.2, r["name"]


def test_the_engines_autocast_terms_are_what_the_gpu_kept():
    """The engine's autocast layer (``activations.layer_tensors(autocast=True)``, its tensors
    read off PyTorch's autocast lists) and loss against the H200: the loss to 0.5% for every
    shape, the layer for the 2.7B and 6.7B shapes; the 1.3B layer kept 2 T h more (its
    attention backend saved one more copy), which the engine leaves out."""
    with gpu_sizes.AUTOCAST.open() as f:
        for r in csv.DictReader(f):
            layer, loss = gpu_sizes.autocast_engine(r)
            units = int(r["batch"]) * int(r["seq"]) * int(r["hidden"])
            kept = int(r["layer_autocast_bytes"]) - int(r["weight_casts_bytes"])
            assert abs(loss / int(r["loss_autocast_bytes"]) - 1) < 0.005, r["name"]
            extra = 2 if r["name"] == "gpt-1.3b" else 0
            assert abs(kept / units - layer / units - extra) < 0.1, r["name"]


@pytest.mark.parametrize("kernel, family", [
    ("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_TNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "gemm"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7", "attention"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>", "attention"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<...>", "other"),
    ("void cudnn::fusion::convert_dq_to_16bits<true>(...)", "other"),
    ("Memset (Device)", "other")])
def test_kernels_are_grouped_by_what_they_compute(kernel, family):
    assert layer_sizes.family(kernel) == family


@pytest.fixture(scope="module", params=list(gpu_layers.GPUS))
def measured(request) -> list[dict]:
    return gpu_sizes.rows(request.param)


def test_no_measured_gemm_family_beats_the_gpus_peak(measured):
    """The profiler's GEMM kernels ran each shard's 6 x tokens x weights FLOPs (forward and
    backward) no faster than the GPU's dense bf16 peak and, on the large shards, at over half
    of it: kernels put in the wrong family would break one bound or the other."""
    for name, runs in gpu_sizes.steps(measured).items():
        for r in runs:
            rate = float(r["tflops"]) * 1e12 * float(r["seconds"]) / float(r["gemm_s"])
            assert rate < BF16_PEAK, name
            if int(r["hidden"]) * int(r["batch"]) // int(r["tp"]) >= 6144:
                assert rate > 0.5 * BF16_PEAK, name


def test_engine_layers_land_within_a_tenth_of_measured_ones_where_the_host_runs_ahead(measured):
    """Held out: the engine's GEMM model comes from an earlier kernel sweep of the same GPU,
    its host floor from the split-backward layers; these shards, sized as the development
    set's runs, fitted nothing."""
    errors = gpu_sizes.engine_errors(measured)
    ahead = [errors[name] for name, runs in gpu_sizes.steps(measured).items()
             if gpu_sizes.host_share(runs) < 0.6]
    assert len(ahead) >= 6
    assert all(-0.16 < e < 0.05 for e in ahead), ahead
    assert abs(statistics.median(ahead)) < 0.06


def test_a_forward_keeps_for_backward_what_the_engine_says_a_layer_keeps(measured):
    """Independent of the cost model: the bytes a real forward left allocated, against the sum
    of the engine's activation tensors (docs/memory.md's table) for the same shard."""
    for name, runs in gpu_sizes.steps(measured).items():
        engine = gpu_sizes.engine_saved_bytes(runs[0])
        for r in runs:
            assert abs(engine / int(r["saved_bytes"]) - 1) < 0.005, name


@pytest.mark.parametrize("gpu", list(gpu_layers.GPUS))
def test_a_card_at_its_power_limit_runs_the_large_layer_slower_than_a_burst(gpu):
    """The H100 and H200 at 700 W hold their SM clock well below boost, and the 1T layer's
    kernels run a tenth slower or more back to back than alone: profiler times of a single
    pass are bursts."""
    rows = gpu_sizes.clock_rows(gpu)
    burst, held = rows[("layer 1t tp8", "burst")], rows[("layer 1t tp8", "sustained")]

    def med(rs, key):
        return statistics.median(float(r[key]) for r in rs)
    assert med(held, "sm_mhz") < 0.8 * med(burst, "sm_mhz")
    assert med(held, "seconds") > 1.08 * med(burst, "seconds")
    assert med(held, "power_w") > 0.95 * 700
    assert med(held, "seconds") > 1.10 * med(burst, "seconds")


def _saved_bytes(layer, x, autocast: bool) -> int:
    """Bytes of the distinct storages autograd saves for one forward of ``layer`` on CPUs, less
    the input and the bf16 copies of the linear layers' weights (model states, not
    activations)."""
    import torch
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = (t.untyped_storage().nbytes(),
                                                 tuple(sorted(t.shape)))
        return t
    # a GEMM saves its weight transposed: compare shapes as sorted sizes
    weights = {tuple(sorted(m.weight.shape)) for m in layer.modules() if hasattr(m, "deferral")}
    with (torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
          torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)):
        layer(x)
    saved.pop(x.untyped_storage().data_ptr(), None)
    return sum(n for n, shape in saved.values() if shape not in weights)


@pytest.mark.parametrize("autocast", [False, True])
def test_the_tensors_autograd_saves_are_the_engines_layer(autocast):
    """Independent of any GPU: the storages autograd keeps for one GPT layer shard (LayerShard,
    as the H200 sweeps run it, on CPU), counted by saved-tensor hooks, against
    ``activations.layer_tensors`` less the layer's input: in bf16 throughout, and under bf16
    autocast over fp32 parameters with an fp32 input (the residual stream)."""
    import torch

    from clustersim.simulator.inputs.specs import ModelSpec
    from clustersim.simulator.model.activations import layer_tensors
    from clustersim.validation.layer_kernels import LayerShard
    hidden, ffn, heads, seq, batch = 256, 1024, 4, 64, 2
    dtype = torch.float32 if autocast else torch.bfloat16
    layer = LayerShard(hidden, ffn, heads, 1, None).to(dtype)
    x = torch.randn(batch, seq, hidden, dtype=dtype, requires_grad=True)
    model = ModelSpec(layers=1, hidden=hidden, heads=heads, ffn_hidden=ffn, vocab=1024,
                      seq_len=seq, dropout=0.0)
    engine = sum(layer_tensors(model, batch, flash_attention=True, precision="bf16",
                               autocast=autocast).values())
    engine -= (4 if autocast else 2) * batch * seq * hidden
    assert _saved_bytes(layer, x, autocast) == pytest.approx(engine, rel=0.01)


def test_the_derived_h200_profile_prices_the_shards_within_one_gpu_kinds_spread():
    """The shipped h200 profile is derived from the H100's figures (validation/
    derive_profiles.py). On the shards both GPUs ran with the host ahead, its prediction over
    the h100-sxm profile's differs from the median H200-over-H100 ratio of the machines we
    measured by less than H100 machines differ among themselves: the same 8192^3 GEMM in the
    kernel sweeps of 2026-11-25's H100s against back to back on 2026-11-28's fastest."""
    sweeps, held = gpu_sizes.sweep_gemm_ms("h100-sxm"), gpu_sizes.clock_rows("h100-sxm")
    spread = max(sweeps) / min(1e3 * float(r["seconds"])
                               for r in held[("gemm 8192^3", "sustained")]) - 1
    pairs = gpu_sizes.pair_ratios()
    assert len(pairs) >= 6 and 0 < spread < 0.1
    for name, (measured, shipped) in pairs.items():
        assert abs(shipped - statistics.median(measured)) < spread, name
