"""How well the GPU profiles predict our own H100 and H200 measurements (issue 23 item 9).

    python3 benchmarks/gpu_agreement.py

Reads the raw files of ``benchmarks/measure_gpu.sh`` under topologies/measurements/own/ and
prints two tables (docs/calibration.md, "Measured GPUs", shows them; a test fails when stale):

1. **Kernels**: each measured kernel against the profile's cost of it in isolation (sustained
   fraction 1): bf16 layer GEMMs (forward, data and weight gradient) of at least 1 TFLOP and
   below, FP8 at DeepGEMM's shape, causal attention (cuDNN, head size 128) per sequence length,
   the HBM copy. Signed errors, (predicted time - measured) / measured: positive is too slow.
2. **Training runs**: the single-GPU bf16 runs (``validate --backend nccl --nproc 1``) against
   the engine's prediction of the same shrunk scenario under each profile, step time (median of
   the repeats, spread over repeats and steps) and peak memory
   (``torch.cuda.max_memory_allocated``).
3. **A GPU calibration**: the profile ``calibrate --backend nccl --nproc 1`` wrote on an H200,
   and that machine's training runs predicted under it beside the shipped profiles.
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

from clustersim.simulator.closed_form.analytic import CostModel
from clustersim.simulator.costs.compute import gemm_time
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.topologies.profile import load_profile
from clustersim.validation.sweeps import product_shape

ROOT = Path(__file__).resolve().parents[1]
OWN = ROOT / "topologies" / "measurements" / "own"
PROFILES = ROOT / "topologies" / "profiles"
RUNS = {"h100-sxm": ("2026-11-25-h100-sxm", "2026-11-25-h100-sxm-repeat"),
        "h200": ("2026-11-25-h200",)}
PRESET = {"h100-sxm": "dgx-h100", "h200": "dgx-h200"}
# calibrate --backend nccl on a GPU, then validate under the profile it wrote (same machine)
CALIBRATED = {"h200": "2026-11-27-h200-calibrate"}


def profiles(gpu: str) -> list:
    return [load_profile(PROFILES / f"{name}.json") for name in (gpu, f"{gpu}-measured")]


def isolated(profile):
    """The profile's isolated kernel speed: a single kernel timed alone keeps all of it."""
    return profile.model_copy(update={"sustained_fraction": 1.0})


def cost_model(gpu: str, profile, precision: str = "bf16") -> CostModel:
    s = build_scenario({"name": "kernels", "model": {"layers": 1, "hidden": 1024, "heads": 8,
                                                     "vocab": 1024, "seq_len": 1024},
                        "cluster": {"preset": PRESET[gpu], "gpus": 1},
                        "training": {"global_batch": 1, "precision": precision}})
    return CostModel(s, isolated(profile))


def kernel_rows(gpu: str) -> list[dict]:
    rows = []
    for folder in RUNS[gpu]:
        with (OWN / folder / "kernels.csv").open() as f:
            rows += [r for r in csv.DictReader(f) if not r["error"]]
    return rows


def gemm_errors(cm: CostModel, rows: list[dict], dtype: str, large: bool | None) -> list[float]:
    out = []
    for r in rows:
        if r["op"] != "gemm" or r["dtype"] != dtype:
            continue
        m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
        if large is not None and (2.0 * m * n * k >= 1e12) != large:
            continue
        predicted = gemm_time(cm, product_shape(r["pass"], m, n, k), fp8=dtype != "bf16")
        out.append(predicted / float(r["seconds"]) - 1)
    return out


def attention_error(cm: CostModel, rows: list[dict], seq: int, backward: bool) -> float:
    """The profile's causal attention (cuDNN, head size 128) against the sweeps' median."""
    mine = [r for r in rows if r["op"] == "attention" and r["backend"] == "default"
            and r["seq"] == str(seq) and r["head_dim"] == "128"]
    got = {way: statistics.median(float(r["seconds"]) for r in mine if r["pass"] == way)
           for way in ("forward", "forward+backward")}
    flops = 4.0 * int(mine[0]["batch"]) * int(mine[0]["heads"]) * seq * seq * 128 / 2
    forward, backward_fraction = cm.profile.attention_fractions("flash3", seq)
    if backward:
        measured = got["forward+backward"] - got["forward"]
        predicted = 2.5 * flops / (cm.peak * backward_fraction)
    else:
        measured = got["forward"]
        predicted = flops / (cm.peak * forward)
    return predicted / measured - 1


def describe(errors: list[float]) -> str:
    if len(errors) == 1:
        return f"{100 * errors[0]:+6.1f}%"
    q = statistics.quantiles(errors, n=10)
    return f"{100 * statistics.median(errors):+6.1f}% ({100 * q[0]:+.0f} .. {100 * q[-1]:+.0f})"


def kernel_table() -> None:
    print("Kernels: the profile's isolated time against ours, median signed error (10th .. 90th "
          "percentile); + is too slow")
    print(f"{'GPU':9s} {'profile':18s} {'GEMM >= 1 TFLOP':>22s} {'GEMM < 1 TFLOP':>22s} "
          f"{'FP8 GEMM':>9s} {'attn fwd 2K/8K':>15s} {'attn bwd 2K/8K':>15s} {'HBM copy':>9s}")
    for gpu in RUNS:
        rows = kernel_rows(gpu)
        for profile in profiles(gpu):
            cm, fp8_model = cost_model(gpu, profile), cost_model(gpu, profile, "fp8")
            fp8 = [r for r in rows if r["dtype"] == "fp8-e4m3" and r["m"] == "4096"]
            copy = statistics.median(float(r["gbps"]) for r in rows if r["op"] == "copy")
            hbm = (cm.hbm / 1e9) / copy
            attention = [" ".join(f"{100 * attention_error(cm, rows, s, b):+.0f}%"
                                  for s in (2048, 8192)) for b in (False, True)]
            large, small = (describe(gemm_errors(cm, rows, "bf16", size)) for size in (True, False))
            print(f"{gpu:9s} {profile.name:18s} {large:>22s} {small:>22s}"
                  f" {describe(gemm_errors(fp8_model, fp8, 'fp8-e4m3', None)):>9s}"
                  f" {attention[0]:>15s} {attention[1]:>15s} {100 * (1 / hbm - 1):+8.1f}%")


def harness_scenario(recorded: dict, **changed):
    """The run's shrunk scenario with the harness's model and training fields as shrink sets
    them now (no dropout; fp32 weights cast per use under autocast, unfused accumulation,
    foreach AdamW, F.cross_entropy): what the harness did on that day too; ``changed``
    training fields on top (what another setting would predict)."""
    from clustersim.validation.shrink import HARNESS_MODEL, harness_training
    training = recorded["training"]
    return build_scenario({**recorded, "model": {**recorded["model"], **HARNESS_MODEL},
                           "training": {**training, **harness_training(training["precision"]),
                                        **changed}})


def training_table() -> None:
    print("\nTraining runs: one GPU, bf16 autocast, 8 micro-batches a step; the engine's "
          "prediction under each profile")
    print(f"{'GPU':9s} {'model':9s} {'measured step':>20s} {'published':>17s} "
          f"{'measured profile':>17s} {'peak memory: real':>18s} {'predicted':>17s}")
    for gpu in RUNS:
        names = sorted({p.name[len("validate-"):-len(".json")] for folder in RUNS[gpu]
                        for p in (OWN / folder).glob("validate-*.json")})
        for name in names:
            runs = [json.loads(p.read_text()) for folder in RUNS[gpu]
                    if (p := OWN / folder / f"validate-{name}.json").is_file()]
            steps = [r["measured"]["step_time_s"] for r in runs]
            spread = max(max(steps) - min(steps), *(r["measured"]["step_time_spread_s"]
                                                     for r in runs))
            measured = statistics.median(steps)
            s = harness_scenario(runs[0]["scenario"])
            cells = []
            for profile in profiles(gpu):
                result = simulate(s, profile=profile)
                error = 100 * (result.step_time_s / measured - 1)
                cells.append(f"{result.step_time_s:.3f} s {error:+.0f}%")
            real = runs[0]["measured"]["peak_bytes"] / 2**30
            predicted = simulate(s).peak_bytes / 2**30
            print(f"{gpu:9s} {name:9s} {measured:8.3f} s ±{spread:.3f} ({len(runs)}) "
                  f"{cells[0]:>17s} {cells[1]:>17s} {real:14.1f} GiB {predicted:8.1f} GiB "
                  f"{100 * (predicted / real - 1):+.0f}%")

    for gpu in RUNS:
        for folder in RUNS[gpu]:
            for failed in sorted((OWN / folder).glob("validate-*.error.txt")):
                print(f"{gpu:9s} {failed.name[9:-10]:9s} out of memory on the GPU ({folder}): "
                      f"{failed.read_text().split('Tried')[0].split('failed: ')[-1].strip()}")


def calibration_table() -> None:
    print("\nA GPU calibration (calibrate --backend nccl --nproc 1), then the same GPU's runs "
          "predicted under each profile")
    print(f"{'GPU':9s} {'model':9s} {'measured step':>14s} {'published':>14s} "
          f"{'measured profile':>17s} {'calibrated':>14s}")
    for gpu, folder in CALIBRATED.items():
        calibrated = load_profile(OWN / folder / "calibrate-nccl.json")
        for path in sorted((OWN / folder).glob("validate-*.json")):
            run = json.loads(path.read_text())
            measured = run["measured"]["step_time_s"]
            s = harness_scenario(run["scenario"])
            cells = [f"{(t := simulate(s, profile=p).step_time_s):.3f} s "
                     f"{100 * (t / measured - 1):+.0f}%" for p in (*profiles(gpu), calibrated)]
            print(f"{gpu:9s} {path.stem[9:]:9s} {measured:12.3f} s {cells[0]:>14s} "
                  f"{cells[1]:>17s} {cells[2]:>14s}")


if __name__ == "__main__":
    kernel_table()
    training_table()
    calibration_table()
