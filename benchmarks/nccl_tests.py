"""Predicted against published nccl-tests bus bandwidths (``tests/data/nccl-tests.yaml``).

    python benchmarks/nccl_tests.py [--fidelity full|representative]

Prints one row per published figure: the collective, GPUs, size, the published bus bandwidth,
clustersim's and the relative error, held-out figures first, then those a profile was set from
(``fitted``) and those shown but not held to a tolerance (``outlier``, with its reason).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from clustersim.simulator.inputs.scenario import build_cluster
from clustersim.simulator.network.bus_bandwidth import bus_bandwidth
from clustersim.topologies.profile import profile_for_gpu

DATA = Path(__file__).parents[1] / "tests" / "data" / "nccl-tests.yaml"


def predicted(row: dict, fidelity: str) -> float:
    """Bus bandwidth (GB/s) clustersim predicts for a published row."""
    cluster = build_cluster({"preset": row["cluster"], "gpus": max(row["gpus"], 8)})
    profile = profile_for_gpu(cluster.gpu.id)
    return bus_bandwidth(cluster, profile, row["op"], row["gpus"], row["size_bytes"],
                         fidelity) / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fidelity", default="full", choices=["full", "representative"])
    args = parser.parse_args()
    rows = yaml.safe_load(DATA.read_text())
    groups = [("held out", [r for r in rows if not r.get("fitted") and not r.get("outlier")]),
              ("fitted", [r for r in rows if r.get("fitted")]),
              ("outlier", [r for r in rows if r.get("outlier")])]
    print(f"{'figure':40s} {'op':>10s} {'GPUs':>5s} {'size':>8s} {'published':>9s} "
          f"{'predicted':>9s} {'error':>7s}")
    for title, group in groups:
        errors = []
        for row in group:
            busbw = predicted(row, args.fidelity)
            errors.append(busbw / row["busbw"] - 1)
            print(f"{row['id']:40s} {row['op']:>10s} {row['gpus']:5d} "
                  f"{row['size_bytes'] / 2**20:6.0f}Mi {row['busbw']:9.1f} {busbw:9.1f} "
                  f"{errors[-1]:+7.1%}")
        if errors:
            mean = sum(abs(e) for e in errors) / len(errors)
            print(f"  {title}: {len(errors)} figures, mean |error| {mean:.1%}, "
                  f"worst {max(errors, key=abs):+.1%}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
