"""Wall time of ``clustersim simulate`` on a shipped example, start-up included (issue 12).

    python benchmarks/startup.py [--runs N] [--check] [SCENARIO]

Runs the command N times (default 7) as a fresh process each time and prints the median and
the spread (min, max). Target: a median under 0.6 s on an idle 2-core machine; ``--check``
exits 1 when it is missed. The import-only time of ``clustersim.cli`` is printed
beside it, so a slow run can be told apart from a slow import.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_S = 0.6
DEFAULT_SCENARIO = Path(__file__).resolve().parent.parent / "examples" / "llama3-70b-h100.yaml"


def wall_times(command: list[str], runs: int) -> list[float]:
    """Seconds each of ``runs`` fresh processes of ``command`` took; a failure stops the run."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return times


def describe(label: str, times: list[float]) -> str:
    return (f"{label}: median {statistics.median(times):.3f} s "
            f"(min {min(times):.3f}, max {max(times):.3f}, {len(times)} runs)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="?", default=str(DEFAULT_SCENARIO))
    parser.add_argument("--runs", type=int, default=7, help="fresh processes per measurement")
    parser.add_argument("--check", action="store_true", help="exit 1 if the target is missed")
    args = parser.parse_args()
    python = [sys.executable, "-m", "clustersim"]
    imports = wall_times([sys.executable, "-c", "import clustersim.cli"], args.runs)
    simulate = wall_times([*python, "simulate", args.scenario], args.runs)
    print(describe("import clustersim.cli", imports))
    print(describe(f"clustersim simulate {Path(args.scenario).name}", simulate)
          + f"; target {TARGET_S} s")
    return 1 if args.check and statistics.median(simulate) > TARGET_S else 0


if __name__ == "__main__":
    sys.exit(main())
