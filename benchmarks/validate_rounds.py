"""Features of the real-run harness trained for real on gloo against their predictions, repeated.

    python3 benchmarks/validate_rounds.py --runs moe|cp|tp [--rounds 3] [--steps 6] [--profile FILE]

Runs ``clustersim validate`` on a set of runs and on the dense example beside them (what the
profile makes of this machine today, whatever the feature), alternated round by round so that
all see the same load. A real run on a shared machine is a sample: each row prints every
round's error, and the median.

- ``moe``: the small MoE example with its experts spread over both ranks (EP 2) and kept on each
  (EP 1), and Mixtral 8x7B shrunk to the machine; docs/validation.md ("Mixtures of experts, run
  for real") shows one output.
- ``cp``: the dense example with each sequence split over both ranks, by each exchange the
  harness builds (ring p2p, allgather, Ulysses a2a); docs/validation.md ("Context parallelism,
  run for real").
- ``tp``: the dense example at TP 2 without and with sequence parallelism, the MoE example at
  TP 2 and the Mixtral example as it stands (TP 2, its experts split over both ranks);
  docs/validation.md ("Tensor parallelism's reduce-scatters, run for real").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

LEVEL = {"gpt-60m, DP 2 (dense)": ["examples/validate-gpt-60m.yaml"]}  # the profile's level
CP = ["examples/validate-gpt-60m.yaml", "--set", "parallel.dp=1", "--set", "parallel.cp=2",
      "--set", "training.global_batch=8"]
TP = ["--set", "parallel.dp=1", "--set", "parallel.tp=2", "--set", "training.global_batch=8"]
RUNS = {
    "moe": {
        **LEVEL,
        "moe-60m, EP 2": ["examples/validate-moe-60m.yaml", "--set", "parallel.ep=2"],
        "moe-60m, EP 1": ["examples/validate-moe-60m.yaml", "--set", "parallel.ep=1"],
        "mixtral-8x7b shrunk, EP 2": ["examples/mixtral-8x7b-h100.yaml", "--set",
                                      "parallel.tp=1", "--set", "parallel.zero=0",
                                      "--set", "parallel.sequence_parallel=false"],
    },
    "cp": {
        **LEVEL,
        **{f"gpt-60m, CP 2 {comm}": [*CP, "--set", f"parallel.cp_comm={comm}"]
           for comm in ("p2p", "allgather", "a2a")},
    },
    "tp": {
        **LEVEL,
        "gpt-60m, TP 2": ["examples/validate-gpt-60m.yaml", *TP],
        "gpt-60m, TP 2 + SP": ["examples/validate-gpt-60m.yaml", *TP,
                               "--set", "parallel.sequence_parallel=true"],
        "moe-60m, TP 2 + SP": ["examples/validate-moe-60m.yaml", *TP, "--set", "parallel.ep=1",
                               "--set", "parallel.sequence_parallel=true"],
        "mixtral-8x7b shrunk, TP 2 + SP": ["examples/mixtral-8x7b-h100.yaml"],
    },
}


def validate(args: list[str], steps: int, profile: str | None) -> dict:
    cmd = [sys.executable, "-m", "clustersim", "validate", *args, "--json", "--steps", str(steps)]
    if profile:
        cmd += ["--profile", profile]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", choices=sorted(RUNS), required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--profile", default=None, help="default: validate's (the shipped one)")
    a = ap.parse_args()
    runs = RUNS[a.runs]
    reports: dict[str, list[dict]] = {name: [] for name in runs}
    for r in range(a.rounds):
        for name, args in runs.items():
            print(f"round {r + 1}/{a.rounds}: {name}", file=sys.stderr)
            reports[name].append(validate(args, a.steps, a.profile))
    print(f"{'run':32s} {'predicted':>9s} {'measured (each round)':>24s} "
          f"{'error (each round)':>24s} {'median':>7s} {'memory':>7s}")
    for name, runs in reports.items():
        measured = " ".join(f"{r['measured']['step_time_s']:.2f}" for r in runs)
        errors = [r["error"]["step_time"] for r in runs]
        each = " ".join(f"{100 * e:+.1f}%" for e in errors)
        memory = max((r["error"]["peak_bytes"] for r in runs), key=abs)
        print(f"{name:32s} {runs[0]['predicted']['step_time_s']:8.2f}s {measured:>24s} "
              f"{each:>24s} {100 * statistics.median(errors):+6.1f}% {100 * memory:+6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
