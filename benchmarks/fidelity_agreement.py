"""Full against representative fidelity on every shipped example (issue 13's "agree within 3%
where nothing contends"), with the wall time of each.

    python benchmarks/fidelity_agreement.py [EXAMPLE ...]   # file stems; default every one

Prints, per ``examples/*.yaml``: GPUs, the step time in each fidelity, their difference and
the seconds full fidelity took. ``tests/simulator/test_fidelity_agreement.py`` checks the
quick ones; the README explains the two examples that differ by more than 3% (a straggler
draw, and NVL72 racks that tp x cp groups straddle).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from clustersim.errors import ScenarioError
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import load_scenario

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def main() -> int:
    print(f"{'example':36s} {'GPUs':>6s} {'representative':>14s} {'full':>8s} {'diff':>7s} "
          f"{'full took':>9s}")
    names = set(sys.argv[1:])  # examples to run (file stems); default every one
    for path in sorted(EXAMPLES.glob("*.yaml")):
        if names and path.stem not in names:
            continue
        s = load_scenario(path)
        representative = simulate(s, "representative").step_time_s
        start = time.perf_counter()
        try:
            full = simulate(s, "full").step_time_s
        except ScenarioError as e:  # full refuses it (a cluster of pools)
            print(f"{path.stem:36s} {s.cluster.gpus:6d} {representative:14.3f}  full refuses "
                  f"it: {e}", flush=True)
            continue
        took = time.perf_counter() - start
        print(f"{path.stem:36s} {s.cluster.gpus:6d} {representative:14.3f} {full:8.3f} "
              f"{full / representative - 1:+7.2%} {took:8.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
