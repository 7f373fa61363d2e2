"""BLOOM's runs on Jean Zay with the Omni-Path rate NCCL was measured to reach there.

    python benchmarks/bloom_network.py [--efficiency F]

The development set's rules give BLOOM's runs Jean Zay's inter-node line rate, four 100 Gb/s
Omni-Path links per 8-GPU node (6.25 GB/s per GPU), and leave the fraction NCCL reaches to the
A100 profile, which was measured on NVIDIA's HDR InfiniBand (0.91). BigScience measured NCCL on
Jean Zay's A100 nodes itself: an all-reduce of 4 GB over 4 nodes x 4 GPUs, every ring through one
100 Gb/s HFI per node, reached 39.9 Gb/s of bus bandwidth (bigscience-workshop/bigscience
experiments/bandwidth/n4_a100_all_reduce_bench.txt @ 74c6c3d0a5; NCCL 2.10.3 over its IB verbs
transport; the README beside it: "we have an issue with nccl that doesn't fully utilize Intel OPA
full bandwidth"), 0.40 of the line. This script scores the development set's BLOOM runs as
``devset.py`` makes them and again with ``cluster.inter_node.efficiency`` at that fraction,
assuming two GPUs' rings sharing an HFI each get half of what one ring got: a diagnosis of the
sweep's bias, not a change of the rules (``../shared/validation/devset.py`` judges as before).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from clustersim.validation import devset
from clustersim.validation.accuracy import predictor

DEV_SET = Path(__file__).resolve().parent.parent / "tests" / "data" / "published-dev.yaml"
JEAN_ZAY_NCCL = 39.9 / 100  # bus bandwidth over the HFI's line rate, Gb/s (module docstring)


def on_measured_fabric(run: devset.DevRun, efficiency: float) -> devset.DevRun:
    """``run`` with its inter-node links at ``efficiency`` of their line rate."""
    candidates = tuple({**raw, "cluster": {**raw["cluster"], "inter_node": {
        **raw["cluster"]["inter_node"], "efficiency": efficiency}}} for raw in run.candidates)
    return dataclasses.replace(run, candidates=candidates)


def report(title: str, results: list[devset.DevResult]) -> list[str]:
    """One block: each source's errors, the fit/OOM agreement, the ranking, and the sweep's
    signed error by tensor-parallel degree (where a residual that the network does not
    explain shows)."""
    score = devset.score(results)
    lines = [title, f"{'source':22s} {'runs':>4s} {'mean |err|':>10s} {'signed':>7s} {'worst':>6s}"]
    lines += [f"{s.source:22s} {s.runs:4d} {100 * s.mean_abs:9.1f}% {100 * s.signed:+6.1f}% "
              f"{100 * s.worst:5.1f}%" for s in score.sources]
    rank = score.ranking
    lines.append(f"fit/OOM {score.memory_agree}/{score.memory_total}; ranking {rank.right}/"
                 f"{rank.pairs} pairs in the measured order")
    by_tp: dict[int, list[float]] = {}
    for r in results:
        if r.error is not None and r.run.source == "bloom-topology-sweep":
            by_tp.setdefault(r.run.candidates[0]["parallel"]["tp"], []).append(r.error)
    lines.append("sweep's signed mean by tp: " + ", ".join(
        f"tp {tp} {100 * sum(e) / len(e):+.1f}% ({len(e)})" for tp, e in sorted(by_tp.items())))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--efficiency", type=float, default=JEAN_ZAY_NCCL,
                        help="fraction of the line rate NCCL reaches (default %(default).3f)")
    args = parser.parse_args(argv)
    runs = [r for r in devset.load_runs(DEV_SET) if r.source.startswith("bloom")]
    predict = predictor("representative")
    as_ruled = devset.predict_runs(runs, predict)
    measured = devset.predict_runs([on_measured_fabric(r, args.efficiency) for r in runs],
                                   predict)
    print("\n".join(report("As the development set's rules make them (the profile's 0.91):",
                           as_ruled)))
    print()
    print("\n".join(report(f"With Jean Zay's measured NCCL rate ({args.efficiency:.2f} of the "
                           "line):", measured)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
