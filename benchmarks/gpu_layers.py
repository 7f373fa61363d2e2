"""What a split backward, a collective beside a GEMM and the host cost on a GPU, measured
(issue 23 items 2, 3 and 6).

    python3 benchmarks/gpu_layers.py

Reads the raw ``layers.csv`` of ``validation/layer_kernels.py`` under
topologies/measurements/own/ (two H200 machines, three rounds each) and prints two tables
(docs/profiles.md, "Split backward, overlap and the host, measured", shows them; a test
fails when stale):

1. **Layers**: one tensor-parallel rank's share of a GPT layer, forward and backward: the GPU
   time with its range over rounds, the engine's cost of the same layer's kernels timed
   alone (the ``h200-measured`` profile at sustained fraction 1), without and with the host
   floor (``host_layer_s``), the host's time to issue
   the passes over the GPU's on each machine, the host's time per GPU operation, and what
   splitting the backward costs: Transformer Engine's and the zero-bubble fork's deferred
   weight gradients against the same layer whole, and ``torch.distributed.pipelining``'s
   split against ``nn.Linear``'s backward. Medians over all rounds; signed, positive is
   slower.
2. **Overlap**: large bf16 GEMMs beside a copy kernel holding a number of SMs, each
   slowdown as ``comm_compute_slowdown`` counts it (the share of speed lost,
   ``1 - alone / beside``): median and range over GEMM shapes, rounds and machines, and the
   copy's bandwidth on each machine (the second ran a build that cannot vectorise: half the
   bytes, the same slowdown).
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from pathlib import Path

from clustersim.simulator.closed_form.analytic import CostModel
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.topologies.profile import load_profile

ROOT = Path(__file__).resolve().parents[1]
OWN = ROOT / "topologies" / "measurements" / "own"
RUNS = ("2026-11-27-h200-layers", "2026-11-27-h200-layers-repeat")
PROFILE = ROOT / "topologies" / "profiles" / "h200-measured.json"


def rows() -> list[dict]:
    """Every run's rows, each ``round`` prefixed with its run's number (1/2, 2/3, ...)."""
    out = []
    for i, folder in enumerate(RUNS, 1):
        with (OWN / folder / "layers.csv").open() as f:
            out += [dict(r, round=f"{i}/{r['round']}", run=i) for r in csv.DictReader(f)]
    return out


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


def shard_passes(r: dict, **profile_fields) -> tuple:
    """The engine's (forward, backward) ``PassTimes`` of a measured row's layer shard: one
    layer on ``tp`` H200s, the row's micro-batch, under the ``h200-measured`` profile with
    ``profile_fields`` changed."""
    tp, batch = int(r["tp"]), int(r["batch"])
    s = build_scenario({
        "name": r["name"], "model": {"layers": 1, "hidden": int(r["hidden"]),
                                     "heads": int(r["heads"]), "ffn_hidden": int(r["ffn"]),
                                     "vocab": 1024, "seq_len": int(r["seq"])},
        "cluster": {"preset": "dgx-h200", "gpus": tp}, "parallel": {"tp": tp},
        "training": {"global_batch": batch, "micro_batch": batch, "precision": "bf16"}})
    return CostModel(s, load_profile(PROFILE).model_copy(update=profile_fields)).passes


def predicted_layer(r: dict, host: bool = True) -> float:
    """The engine's forward plus backward of the same shard, its kernels timed alone, each
    pass floored by the host's time to issue it (``host_layer_s``) unless ``host`` is off."""
    update = {"sustained_fraction": 1.0, **({} if host else {"host_layer_s": (0.0, 0.0)})}
    forward, backward = shard_passes(r, **update)
    return forward.total + backward.total


def layer_table(data: list[dict]) -> None:
    print("Layers: one rank's share of a GPT layer, forward + backward, bf16; medians over "
          f"{len(steps(data)['gpt-1.3b tp1']['whole'])} rounds on {len(RUNS)} machines")
    print(f"{'layer':20s} {'seq x mbs':>9s} {'GPU ms':>15s} {'kernels ms':>10s} "
          f"{'engine ms':>10s} {'host/GPU':>9s} {'host us/op':>10s} {'deferred W':>10s} "
          f"{'pytorch split':>13s}")
    for name, by_variant in steps(data).items():
        r = by_variant["whole"][0]
        gpu = [1e3 * float(x["seconds"]) for x in by_variant["whole"]]
        deferred, pytorch = split_costs(by_variant)
        median = statistics.median(gpu)
        kernels, engine = (1e3 * predicted_layer(r, host) for host in (False, True))
        host = "/".join(f"{host_share(by_variant, run):.2f}" for run in range(1, len(RUNS) + 1))
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


def copy_rate(data: list[dict], sms: int, run: int) -> float:
    """The copy's median GB/s (read plus written) on ``sms`` SMs beside the GEMMs of a run."""
    return statistics.median(float(r["gbps"]) for r in data if r["run"] == run
                             and r["sweep"] == "overlap" and r["sms"] == str(sms) and not r["note"])


def overlap_table(data: list[dict]) -> None:
    print("\nOverlap: bf16 GEMMs beside a copy kernel on N of the 132 SMs; the speed the GEMM "
          "loses (comm_compute_slowdown's sense)")
    print(f"{'SMs':>4s} {'SM share':>8s} {'copy GB/s':>9s} {'slowdown':>9s} {'range':>13s} "
          f"{'samples':>7s}")
    for sms, lost in overlap_slowdowns(data).items():
        rates = "/".join(f"{copy_rate(data, sms, run):.0f}" for run in range(1, len(RUNS) + 1))
        print(f"{sms:4d} {sms / 132:8.2f} {rates:>9s} "
              f"{statistics.median(lost):9.3f} {min(lost):6.3f}-{max(lost):.3f} {len(lost):7d}")
    profile = load_profile(PROFILE)
    print(f"profile h200-measured: comm_compute_slowdown {profile.comm_compute_slowdown} "
          "(published, Lee et al. 2025)")


if __name__ == "__main__":
    data = rows()
    layer_table(data)
    overlap_table(data)
