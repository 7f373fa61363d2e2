"""Our own kernel sweeps (``validation/kernels.py``) summarised as a kernel-measurements entry.

A measured profile (``topologies/profiles/*-measured.json``) is derived from this summary
exactly as a published one is from ``topologies/measurements/kernels.yaml``. Repeated sweeps
of one GPU are pooled by the median of each kernel's medians. The figures:

- **matmul**: the GEMM ceiling is the median, over the sweep's bf16 layer GEMMs of at least
  1 TFLOP (where tiles fill the GPU and launch gaps vanish), of the measured fraction of peak
  over the shape's tile/wave quantisation and its K loop's share (``k / (k + k_overhead)``).
  Not a maximum: the best of 288 noisy timings is an outlier, and the ceiling must reproduce
  the typical large GEMM. Each of a layer's products is taken at the shape it ran (the data
  gradient reduces over the forward's ``n``, the weight gradient over its ``m``).
- **gemm_fixed**: what every GEMM kernel takes besides its FLOPs at the ceiling, fitted
  together on every bf16 GEMM of the sweep (each of a layer's three products at its own
  shape): a time per kernel (filling and draining its waves, the gap to the next kernel; 0.1 us
  steps) and a length of K per output tile (``k_overhead``: the tile's prologue, which fills
  the shared-memory pipeline before the first multiply-accumulate, and its epilogue, which
  writes the tile, amortised over the K loop; steps of 16), the pair giving the least median
  absolute log error. On our H100s GEMMs under 60 us ran 16-21% longer than their FLOPs at
  the ceiling say, and large GEMMs of K 1,024-2,048 at 0.63-0.67 of peak over their
  quantisation where K of 8K-16K reach 0.71.
- **fp8_ceiling**: as the GEMM ceiling, the median over the sweep's FP8 GEMMs (E4M3,
  ``torch._scaled_mm`` with per-tensor scales: DeepGEMM's published shape, 4096 x 7168 x
  16384, and three more large ones) of the measured fraction of the FP8 peak over the
  shape's quantisation: the typical large FP8 GEMM, on the bf16 ceiling's footing.
- **attention**: causal attention at head size 128 over sequence lengths 1,024-16,384, fitted
  to ``fraction = long x L / (L + fixed)`` (``length_fit``): the fraction long sequences reach
  and the kernel's fixed work per query row as keys, 250-370 forward and 1,100-1,650 backward on
  our H100s and H200 for both backends (each measured point within 6% of the fit).
  SDPA's default backend on Hopper is cuDNN's fused attention, the kernel Transformer Engine
  runs there too ("Disabling FlashAttention to give FusedAttention preference on
  Hopper+", ``get_attention_backend`` in transformer_engine/pytorch/attention/
  dot_product_attention/utils.py): the ``flash3`` family, clustersim's name for
  Megatron-Core's attention on Hopper (docs/frameworks.md). ``flash2`` is SDPA's
  FlashAttention-2 backend. The backward's fraction follows from the forward and forward +
  backward timings with the backward counted as 2.5 forwards.
- **hbm**: the copy's bytes read plus written over time, of the catalogue's HBM line rate.
- **host** (``validation/layer_kernels.py``, any GPU's host): the time eager PyTorch takes to
  issue one transformer layer's forward and backward, a property of the host and the
  framework rather than the GPU. Per machine, the median over the measured layers of the
  whole pass's host time; the faster machine's is kept, the least a host was seen to take.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections import defaultdict
from functools import cache
from pathlib import Path

from clustersim.simulator.model.kernels import Gemm, quantisation
from clustersim.topologies.hardware import GpuSpec, gpu_presets

OWN = Path(__file__).resolve().parent.parent / "topologies" / "measurements"
LARGE_GEMM_FLOPS = 1e12
FP8_SHAPE = (4096, 7168, 16384)
TILES = [[128, 256], [256, 128], [128, 128]]  # as derive_profiles.TILES (kernels.py)
HOST_SWEEPS = ("own/2026-11-27-h200-layers", "own/2026-11-27-h200-layers-repeat",
               "own/2026-11-28-h100-layers", "own/2026-11-28-h100-layers-repeat")


def pooled(folders: list[str]) -> dict[tuple, float]:
    """Kernel key -> median over the sweeps of its median seconds (failed rows skipped)."""
    times: dict[tuple, list[float]] = defaultdict(list)
    for folder in folders:
        with (OWN / folder / "kernels.csv").open() as f:
            for r in csv.DictReader(f):
                if not r["error"]:
                    key = tuple(r[k] for k in ("op", "dtype", "backend", "pass", "m", "n", "k",
                                               "batch", "heads", "seq", "head_dim"))
                    times[key].append(float(r["seconds"]))
    return {key: statistics.median(t) for key, t in times.items()}


@cache
def _summary(gpu_id: str, folders: tuple[str, ...]) -> dict:
    gpu = GpuSpec.model_validate({**gpu_presets()[gpu_id], "id": gpu_id})
    kernels = pooled(list(folders))
    where = _where(folders)
    fixed, time_only = _gemm_fixed(gpu, kernels, where)
    return {"matmul_ceiling": _gemm_ceiling(gpu, kernels, where, fixed["k_overhead"]),
            "gemm_fixed": fixed, "gemm_fixed_time_only": time_only,
            "fp8_ceiling": _fp8_ceiling(gpu, kernels, where, fixed["k_overhead"]),
            "attention": _attention(gpu, kernels, where),
            "hbm": _hbm(gpu, kernels, where)}


def summary(gpu_id: str, folders: list[str]) -> dict:
    """The entry ``derive_profiles.measured_profile`` reads: matmul, fp8, attention, hbm."""
    return _summary(gpu_id, tuple(folders))


def matmul_ceiling(gpu_id: str, folders: list[str], k_overhead: float) -> dict:
    """The sweeps' GEMM ceiling under a given ``k_overhead`` (another GPU's), so that two
    GPUs' ceilings compare on one footing."""
    gpu = GpuSpec.model_validate({**gpu_presets()[gpu_id], "id": gpu_id})
    return _gemm_ceiling(gpu, pooled(folders), _where(folders), k_overhead)


def _where(folders: list[str] | tuple[str, ...]) -> str:
    return f"own sweep{'s' if len(folders) > 1 else ''} {', '.join(folders)}"


def product_shape(name: str, m: int, n: int, k: int) -> Gemm:
    """The GEMM one of ``nn.Linear``'s products runs, as ``kernels.py`` records it under the
    forward's ``m, n, k``: the forward, its data gradient or its weight gradient."""
    g = Gemm(m, n, k)
    return {"forward": g, "dgrad": g.dgrad(), "wgrad": g.wgrad()}[name]


def _gemms(kernels: dict, dtype: str) -> list[tuple[Gemm, float]]:
    """Each GEMM of ``dtype`` in the sweep at the shape it ran, with its seconds."""
    return [(product_shape(name, int(m), int(n), int(k)), seconds)
            for (op, kind, _, name, m, n, k, *_), seconds in kernels.items()
            if op == "gemm" and kind == dtype]


def _shape_share(gpu: GpuSpec, g: Gemm, k_overhead: float) -> float:
    """The fraction of the ceiling a GEMM's shape lets it reach: its tile/wave quantisation
    and its K loop's share of each tile's work (``compute.gemm_time``)."""
    return quantisation(g, gpu.sm_count, TILES) * g.k / (g.k + k_overhead)


def _fractions(gpu: GpuSpec, kernels: dict, dtype: str, peak: str, k_overhead: float,
               min_flops: float = 0.0) -> list[float]:
    """Each GEMM of ``dtype`` of at least ``min_flops``: its measured fraction of the
    ``peak`` precision's peak over its shape's share (what a ceiling must reproduce)."""
    return [g.flops / seconds / gpu.peak_flops[peak] / _shape_share(gpu, g, k_overhead)
            for g, seconds in _gemms(kernels, dtype) if g.flops >= min_flops]


def _gemm_ceiling(gpu: GpuSpec, kernels: dict, where: str, k_overhead: float) -> dict:
    ratios = _fractions(gpu, kernels, "bf16", "bf16", k_overhead, LARGE_GEMM_FLOPS)
    return {"fraction": round(statistics.median(ratios), 3),
            "source": f"{where}: median over {len(ratios)} bf16 layer GEMM products of at "
                      f"least 1 TFLOP of the measured fraction of peak over the shape's "
                      f"quantisation and K loop (validation/sweeps.py)"}


def _gemm_fixed(gpu: GpuSpec, kernels: dict, where: str) -> tuple[dict, dict]:
    """The GEMM kernels' fixed costs, ``seconds`` per kernel and ``k_overhead`` per tile:
    with every bf16 GEMM costed at the ceiling (the large GEMMs' median under the same
    ``k_overhead``) times its shape's share plus the seconds, the pair whose median absolute
    log error is least; and the best time alone, for GPUs of another architecture, whose
    kernels' pipelines (and so the K they take to fill) these sweeps do not measure."""
    gemms = _gemms(kernels, "bf16")
    times = [1e-7 * i for i in range(101)]  # 0-10 us
    peaks = {k: gpu.peak_flops["bf16"] * statistics.median(  # the ceiling under each K
        _fractions(gpu, kernels, "bf16", "bf16", k, LARGE_GEMM_FLOPS))
        for k in (16.0 * j for j in range(33))}  # 0-512

    def error(k_overhead: float, fixed: float) -> float:
        peak = peaks[k_overhead]
        return statistics.median(
            abs(math.log((g.flops / (peak * _shape_share(gpu, g, k_overhead)) + fixed) / s))
            for g, s in gemms)

    k_overhead, fixed = min(((k, t) for k in peaks for t in times),
                            key=lambda pair: error(*pair))
    time_alone = min(times, key=lambda t: error(0.0, t))
    both = {"seconds": round(fixed, 7), "k_overhead": k_overhead,
            "source": f"{where}: the fixed time per GEMM kernel and the K per output tile "
                      f"that, added to each of the {len(gemms)} bf16 GEMMs' FLOPs at the "
                      f"ceiling, fit their times best (median absolute log error "
                      f"{error(0.0, 0.0):.3f} with neither, {error(0.0, time_alone):.3f} with "
                      f"the time alone, {error(k_overhead, fixed):.3f} with both; "
                      f"validation/sweeps.py)"}
    alone = {"seconds": round(time_alone, 7), "k_overhead": 0.0,
             "source": f"{where}: the fixed time per GEMM kernel alone that, added to each of "
                       f"the {len(gemms)} bf16 GEMMs' FLOPs at the ceiling, fits their times "
                       f"best (median absolute log error {error(0.0, 0.0):.3f} without it, "
                       f"{error(0.0, time_alone):.3f} with; validation/sweeps.py)"}
    return both, alone


def _fp8_ceiling(gpu: GpuSpec, kernels: dict, where: str, k_overhead: float) -> dict:
    ratios = _fractions(gpu, kernels, "fp8-e4m3", "fp8", k_overhead)  # the sweep's are large
    return {"fraction": round(statistics.median(ratios), 3),
            "source": f"{where}: median over {len(ratios)} large FP8 GEMMs (torch._scaled_mm, "
                      f"E4M3, per-tensor scales; DeepGEMM's shape {FP8_SHAPE} among them) of the "
                      f"measured fraction of the FP8 peak over the shape's quantisation"}


def _attention(gpu: GpuSpec, kernels: dict, where: str) -> dict:
    families = {}
    for backend, family in (("default", "flash3"), ("flash", "flash2")):
        passes = attention_fractions(gpu, kernels, backend)
        (forward, fixed_forward), (backward, fixed_backward) = map(length_fit, passes)
        seqs = ", ".join(str(seq) for seq, _ in passes[0])
        families[family] = {
            "forward": round(forward, 3), "backward": round(backward, 3),
            "overhead_tokens": [round(fixed_forward, -1), round(fixed_backward, -1)],
            "source": f"{where}: SDPA's {backend} backend, causal, bf16, head size 128, "
                      f"sequence lengths {seqs}: the long-sequence fraction and the fixed work "
                      f"as keys, fitted to 1/fraction = (1 + fixed/L)/long (validation/sweeps.py)"}
    return families


def attention_fractions(gpu: GpuSpec, kernels: dict,
                        backend: str) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """Causal head-size-128 attention of one SDPA backend: (sequence length, fraction of the
    bf16 peak) forward, and backward (the forward + backward timing less the forward, on
    2.5 forwards' FLOPs), on the FLOPs the kernel executes (half the square)."""
    forward, backward = [], []
    seqs = sorted({int(k[9]) for k in kernels
                   if k[:3] == ("attention", "bf16", backend) and k[10] == "128"})
    for seq in seqs:
        rows = {k[3]: (k, s) for k, s in kernels.items()
                if k[:3] == ("attention", "bf16", backend) and k[9] == str(seq) and k[10] == "128"}
        (fk, fs), (_, bs) = rows["forward"], rows["forward+backward"]
        flops = 4.0 * int(fk[7]) * int(fk[8]) * seq * seq * 128 / 2
        forward.append((seq, flops / fs / gpu.peak_flops["bf16"]))
        backward.append((seq, 2.5 * flops / (bs - fs) / gpu.peak_flops["bf16"]))
    return forward, backward


def length_fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(long-sequence fraction, fixed work as keys) of ``fraction = long x L / (L + fixed)``,
    least squares on its linear form ``1/fraction = 1/long + (fixed/long) / L``: the time per
    FLOP is a constant plus a fixed cost per query row spread over its ``L`` keys."""
    slope, intercept = statistics.linear_regression([1.0 / seq for seq, _ in points],
                                                    [1.0 / fraction for _, fraction in points])
    return 1.0 / intercept, slope / intercept


def attention_overhead(folders: list[str], gpu_id: str, family: str) -> list[float]:
    """The fixed work as keys (forward, backward) of one kernel family in our sweeps of
    ``gpu_id``: what a published long-sequence figure of that family is scaled by."""
    gpu = GpuSpec.model_validate({**gpu_presets()[gpu_id], "id": gpu_id})
    return _attention(gpu, pooled(folders), "")[family]["overhead_tokens"]


def _hbm(gpu: GpuSpec, kernels: dict, where: str) -> dict:
    (seconds,) = [s for key, s in kernels.items() if key[0] == "copy"]
    nbytes = 4.0 * ((4 << 30) // 2)  # kernels.hbm_rows: 2 Gi bf16 values read and written
    gbps = nbytes / seconds / 1e9
    return {"fraction": round(gbps / gpu.memory_bandwidth, 3),
            "source": f"{where}: a 4 GiB device-to-device copy, {gbps:.0f} GB/s read plus "
                      f"written of {gpu.memory_bandwidth:.0f}"}


def host_layer_seconds(folders: tuple[str, ...] = HOST_SWEEPS) -> dict:
    """``host_layer_s``: (forward, backward) host seconds to issue one layer, with its source."""
    per_machine = []
    for folder in folders:
        with (OWN / folder / "layers.csv").open() as f:
            rows = [r for r in csv.DictReader(f)
                    if r["sweep"] == "split" and r["variant"] == "whole"]
        per_machine.append([statistics.median(float(r["host_s"]) for r in rows
                                              if r["pass"] == way)
                            for way in ("forward", "backward")])
    # The median machine, not the fastest: the host's time is the machine's, not the GPU's,
    # and one of our four hosts was a quarter faster than the other three, which agree within
    # 13%; the median is what a planner's host is likeliest to take.
    middle = [statistics.median(way) for way in zip(*per_machine, strict=True)]
    return {"seconds": [round(t, 5) for t in middle],
            "source": f"own layer sweeps {', '.join(folders)}: eager PyTorch's host time to "
                      f"issue one GPT layer's forward and backward whole, median over the "
                      f"layers of each machine, then over the {len(folders)} machines "
                      f"(validation/sweeps.py)"}
