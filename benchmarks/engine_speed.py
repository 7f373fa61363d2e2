"""Wall time of the discrete-event engine on the scenarios its targets name (issue 3).

    python benchmarks/engine_speed.py [--repeat N] [--check]

Targets (2-core CI machine): llama3-405b on 16,384 h100-sxm in ``representative`` under 1 s;
a 1,024-GPU scenario in ``full`` under 60 s. Prints each wall time, its ratio to the target and
the step time simulated; ``--check`` exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from clustersim.simulator.analytic import estimate
from clustersim.simulator.engine import Engine
from clustersim.simulator.scenario import build_scenario

LLAMA3_405B_16K = {
    "name": "llama3-405b on 16,384 h100-sxm (tp 8, pp 16, dp 128, 1F1B)",
    "model": {"preset": "llama3-405b", "seq_len": 8192},
    "cluster": {"preset": "dgx-h100", "gpus": 16384},
    "training": {"global_batch": 2048},
    "parallel": {"tp": 8, "pp": 16, "dp": 128, "schedule": "1f1b", "zero": 1,
                 "sequence_parallel": True, "recompute": "full"},
}
LLAMA3_70B_1K = {
    "name": "llama3-70b on 1,024 h100-sxm (tp 8, pp 4, dp 32, 1F1B)",
    "model": {"preset": "llama3-70b", "seq_len": 8192},
    "cluster": {"preset": "dgx-h100", "gpus": 1024},
    "training": {"global_batch": 512},
    "parallel": {"tp": 8, "pp": 4, "dp": 32, "schedule": "1f1b", "zero": 1,
                 "sequence_parallel": True, "recompute": "selective"},
}
CASES = [(LLAMA3_405B_16K, "representative", 1.0), (LLAMA3_70B_1K, "full", 60.0)]


def wall_time(raw: dict, fidelity: str, repeat: int) -> tuple[float, float, int]:
    """(median wall seconds, simulated step seconds, ranks simulated)."""
    s = build_scenario(raw)
    times, step, ranks = [], 0.0, 0
    for _ in range(repeat):
        start = time.perf_counter()
        engine = Engine(s, fidelity)
        step = engine.run().step_time_s
        times.append(time.perf_counter() - start)
        ranks = len(engine.ranks)
    return statistics.median(times), step, ranks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per case (median)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args()
    missed = False
    print(f"{'scenario':58s} {'fidelity':>14s} {'ranks':>6s} {'wall s':>8s} {'target':>7s} "
          f"{'ratio':>6s} {'step s':>8s} {'analytic':>8s}")
    for raw, fidelity, target in CASES:
        repeat = args.repeat if fidelity == "representative" else 1
        wall, step, ranks = wall_time(raw, fidelity, repeat)
        analytic = estimate(build_scenario(raw)).step_time_s
        missed |= wall > target
        print(f"{raw['name']:58s} {fidelity:>14s} {ranks:6d} {wall:8.3f} {target:7.1f} "
              f"{wall / target:6.3f} {step:8.3f} {analytic:8.3f}", flush=True)
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
