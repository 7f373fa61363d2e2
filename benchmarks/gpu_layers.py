"""What a split backward, a collective beside a GEMM and the host cost on a GPU, measured
(issue 23 items 2, 3 and 6).

    python3 benchmarks/gpu_layers.py

Reads the raw ``layers.csv`` of ``validation/layer_kernels.py`` under
topologies/measurements/own/ (two H200 machines, three rounds each; two H100 machines, three
rounds in all) and prints two tables per GPU (docs/profiles.md, "Split backward, overlap and
the host, measured", shows them; a test fails when stale):

1. **Layers**: one tensor-parallel rank's share of a GPT layer, forward and backward: the GPU
   time with its range over rounds, the engine's cost of the same layer's kernels timed
   alone (the GPU's ``-measured`` profile at sustained fraction 1), without and with the host
   floor (``host_layer_s``), the host's time to issue
   the passes over the GPU's on each machine, the host's time per GPU operation, and what
   splitting the backward costs: Transformer Engine's and the zero-bubble fork's deferred
   weight gradients against the same layer whole, and ``torch.distributed.pipelining``'s
   split against ``nn.Linear``'s backward. Medians over all rounds; signed, positive is
   slower.
2. **Overlap**: large bf16 GEMMs beside a copy kernel holding a number of SMs, each
   slowdown as ``comm_compute_slowdown`` counts it (the share of speed lost,
   ``1 - alone / beside``): median and range over GEMM shapes, rounds and machines, the
   copy's bandwidth on each machine (the second H200 ran a build that cannot vectorise: half
   the bytes, the same slowdown), and what losing those SMs would cost the same GEMMs by wave
   quantisation alone under the engine's tiles ("by waves", range over the shapes).
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from clustersim.simulator.closed_form.analytic import CostModel
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.model.kernels import Gemm, quantisation
from clustersim.topologies.profile import load_profile

ROOT = Path(__file__).resolve().parents[1]
OWN = ROOT / "topologies" / "measurements" / "own"


@dataclass(frozen=True)
class MeasuredGpu:
    """One GPU's own sweeps (folders under own/, one per machine) and how the engine prices
    the same shards: that GPU's ``-measured`` profile on its preset."""

    label: str
    layers: tuple[str, ...]
    sizes: tuple[str, ...]
    clocks: tuple[str, ...]
    preset: str
    profile_name: str

    @property
    def profile(self) -> Path:
        return ROOT / "topologies" / "profiles" / f"{self.profile_name}.json"


GPUS = {
    "h200": MeasuredGpu("H200", ("2026-11-27-h200-layers", "2026-11-27-h200-layers-repeat"),
                        ("2026-11-27-h200-sizes", "2026-11-27-h200-sizes-repeat"),
                        ("2026-11-27-h200-clocks",), "dgx-h200", "h200-measured"),
    "h100-sxm": MeasuredGpu("H100", ("2026-11-28-h100-layers", "2026-11-28-h100-layers-repeat"),
                            ("2026-11-28-h100-sizes", "2026-11-28-h100-sizes-repeat"),
                            ("2026-11-28-h100-clocks", "2026-11-28-h100-clocks-repeat"),
                            "dgx-h100", "h100-sxm-measured")}


def read_runs(gpu: str, folders: tuple[str, ...], name: str) -> list[dict]:
    """Every machine's rows of ``name`` (a csv), each with its GPU and run number, and its
    ``round`` prefixed with the run's (1/2, 2/3, ...)."""
    out = []
    for i, folder in enumerate(folders, 1):
        with (OWN / folder / name).open() as f:
            out += [dict(r, round=f"{i}/{r['round']}", run=i, gpu=gpu)
                    for r in csv.DictReader(f)]
    return out


def rows(gpu: str = "h200") -> list[dict]:
    """Every run's ``layers.csv`` rows of ``gpu``."""
    return read_runs(gpu, GPUS[gpu].layers, "layers.csv")


def steps(data: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """Each layer's ``step`` rows (forward plus backward) by variant, one per round."""
    out: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in data:
        if r["sweep"] == "split" and r["pass"] == "step":
            out[r["name"]][r["variant"]].append(r)
    return out


def split_costs(by_variant: dict[str, list[dict]]) -> tuple[float, float]:
    """(deferred over immediate, pytorch over whole) - 1: medians of the per-round ratios."""
    def ratio(a: str, b: str) -> float:
        return statistics.median(float(x["seconds"]) / float(y["seconds"]) - 1
                                 for x, y in zip(by_variant[a], by_variant[b], strict=True))
    return ratio("deferred", "immediate"), ratio("pytorch", "whole")


def host_share(by_variant: dict[str, list[dict]], run: int) -> float:
    """The host's time to issue a whole forward and backward over the GPU's (median of a run)."""
    return statistics.median(float(r["host_s"]) / float(r["seconds"])
                             for r in by_variant["whole"] if r["run"] == run)


def host_per_operation(by_variant: dict[str, list[dict]]) -> float:
    """Host seconds per GPU operation a whole forward and backward launches (median; the
    second run counted the operations)."""
    return statistics.median(float(r["host_s"]) / int(r["kernels"])
                             for r in by_variant["whole"] if r.get("kernels"))


def shard_passes(r: dict, profile: Path | None = None, **profile_fields) -> tuple:
    """The engine's (forward, backward) ``PassTimes`` of a measured row's layer shard: one
    layer on ``tp`` of the row's GPUs, the row's micro-batch, under that GPU's ``-measured``
    profile (or ``profile``) with ``profile_fields`` changed."""
    tp, batch, gpu = int(r["tp"]), int(r["batch"]), GPUS[r["gpu"]]
    s = build_scenario({
        "name": r["name"], "model": {"layers": 1, "hidden": int(r["hidden"]),
                                     "heads": int(r["heads"]), "ffn_hidden": int(r["ffn"]),
                                     "vocab": 1024, "seq_len": int(r["seq"])},
        "cluster": {"preset": gpu.preset, "gpus": tp}, "parallel": {"tp": tp},
        "training": {"global_batch": batch, "micro_batch": batch, "precision": "bf16"}})
    chosen = load_profile(profile or gpu.profile)
    return CostModel(s, chosen.model_copy(update=profile_fields)).passes


def predicted_layer(r: dict, host: bool = True) -> float:
    """The engine's forward plus backward of the same shard, its kernels timed alone, each
    pass floored by the host's time to issue it (``host_layer_s``) unless ``host`` is off."""
    update = {"sustained_fraction": 1.0, **({} if host else {"host_layer_s": (0.0, 0.0)})}
    forward, backward = shard_passes(r, **update)
    return forward.total + backward.total


def machines(data: list[dict]) -> range:
    """The run numbers of the machines ``data`` came from."""
    return range(1, max(r["run"] for r in data) + 1)


def layer_table(data: list[dict]) -> None:
    print(f"{GPUS[data[0]['gpu']].label} layers: one rank's share of a GPT layer, forward + "
          f"backward, bf16; medians over {len(steps(data)['gpt-1.3b tp1']['whole'])} rounds "
          f"on {len(machines(data))} machines")
    print(f"{'layer':20s} {'seq x mbs':>9s} {'GPU ms':>15s} {'kernels ms':>10s} "
          f"{'engine ms':>10s} {'host/GPU':>9s} {'host us/op':>10s} {'deferred W':>10s} "
          f"{'pytorch split':>13s}")
    for name, by_variant in steps(data).items():
        r = by_variant["whole"][0]
        gpu = [1e3 * float(x["seconds"]) for x in by_variant["whole"]]
        deferred, pytorch = split_costs(by_variant)
        median = statistics.median(gpu)
        kernels, engine = (1e3 * predicted_layer(r, host) for host in (False, True))
        host = "/".join(f"{host_share(by_variant, run):.2f}" for run in machines(data))
        print(f"{name:20s} {r['seq'] + ' x ' + r['batch']:>9s} "
              f"{median:6.2f} ({min(gpu):.2f}-{max(gpu):.2f})"
              f" {kernels:5.2f} {100 * (kernels / median - 1):+3.0f}%"
              f" {engine:5.2f} {100 * (engine / median - 1):+3.0f}%"
              f" {host:>9s} {1e6 * host_per_operation(by_variant):10.0f}"
              f" {100 * deferred:+9.1f}% {100 * pytorch:+12.1f}%")


def overlap_slowdowns(data: list[dict]) -> dict[int, list[float]]:
    """``comm_compute_slowdown`` of each GEMM and round beside a copy on ``sms`` SMs; rows whose
    copy ended before the GEMMs did are left out."""
    alone = {(r["round"], r["m"], r["n"], r["k"]): float(r["seconds"]) for r in data
             if r["sweep"] == "overlap" and r["sms"] == "0"}
    out: dict[int, list[float]] = defaultdict(list)
    for r in data:
        if r["sweep"] == "overlap" and r["sms"] != "0" and not r["note"]:
            out[int(r["sms"])].append(
                1 - alone[(r["round"], r["m"], r["n"], r["k"])] / float(r["seconds"]))
    return dict(sorted(out.items()))


def wave_slowdowns(data: list[dict], all_sms: int = 132) -> dict[int, list[float]]:
    """What taking ``sms`` SMs would cost each measured GEMM by wave quantisation alone: its
    time on the rest over its time on all, under the engine's tiles (``kernels.quantisation``,
    the profile's ``gemm.tiles``), in ``overlap_slowdowns``' sense."""
    tiles = load_profile(GPUS[data[0]["gpu"]].profile).gemm.tiles
    shapes = {(int(r["m"]), int(r["n"]), int(r["k"])) for r in data if r["sweep"] == "overlap"}
    out: dict[int, list[float]] = {}
    for sms in overlap_slowdowns(data):
        left = all_sms - sms
        out[sms] = [1 - left * quantisation(Gemm(*g), left, tiles)
                    / (all_sms * quantisation(Gemm(*g), all_sms, tiles)) for g in sorted(shapes)]
    return out


def copy_rate(data: list[dict], sms: int, run: int) -> float:
    """The copy's median GB/s (read plus written) on ``sms`` SMs beside the GEMMs of a run."""
    return statistics.median(float(r["gbps"]) for r in data if r["run"] == run
                             and r["sweep"] == "overlap" and r["sms"] == str(sms) and not r["note"])


def overlap_table(data: list[dict]) -> None:
    gpu = GPUS[data[0]["gpu"]]
    print(f"\n{gpu.label} overlap: bf16 GEMMs beside a copy kernel on N of the 132 SMs; the "
          "speed the GEMM loses (comm_compute_slowdown's sense)")
    print(f"{'SMs':>4s} {'SM share':>8s} {'copy GB/s':>9s} {'slowdown':>9s} {'range':>13s} "
          f"{'samples':>7s} {'by waves':>13s}")
    waves = wave_slowdowns(data)
    for sms, lost in overlap_slowdowns(data).items():
        rates = "/".join(f"{copy_rate(data, sms, run):.0f}" for run in machines(data))
        print(f"{sms:4d} {sms / 132:8.2f} {rates:>9s} "
              f"{statistics.median(lost):9.3f} {min(lost):6.3f}-{max(lost):.3f} {len(lost):7d}"
              f" {min(waves[sms]):6.3f}-{max(waves[sms]):.3f}")
    profile = load_profile(gpu.profile)
    print(f"profile {profile.name}: comm_compute_slowdown {profile.comm_compute_slowdown} "
          "(published, Lee et al. 2025)")


if __name__ == "__main__":
    for n, gpu in enumerate(GPUS):
        data = rows(gpu)
        print("\n" * (n > 0), end="")
        layer_table(data)
        overlap_table(data)
