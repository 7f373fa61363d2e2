"""Wall time of ``clustersim plan`` for llama3-70b on 1,024 h100-sxm, top 5 (issue 4).

    python benchmarks/plan_speed.py [--check]

Target: under 2 minutes on the 2-core CI machine. Prints the wall time, its ratio to the
target, how many splits were valid, fit and were ranked, and the winner; ``--check`` exits 1
when the target is missed.
"""

from __future__ import annotations

import argparse
import sys
import time

from clustersim.reports.plan import PlanRequest, plan

TARGET_S = 120.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the target is missed")
    args = parser.parse_args()
    req = PlanRequest(model={"preset": "llama3-70b"},
                      cluster={"preset": "dgx-h100", "gpus": 1024}, global_batch=512,
                      tokens=15e12)
    start = time.perf_counter()
    plans, valid, fitting = plan(req, top=5)
    wall = time.perf_counter() - start
    best = plans[0]
    print(f"plan llama3-70b on 1,024 h100-sxm, top 5: {wall:.2f} s (target {TARGET_S:.0f} s, "
          f"ratio {wall / TARGET_S:.3f}); {valid} valid splits, {fitting} fit; best "
          f"{best.scenario.name} at {best.result.step_time_s:.3f} s/step, "
          f"MFU {best.result.mfu:.1%}")
    return 1 if args.check and wall > TARGET_S else 0


if __name__ == "__main__":
    sys.exit(main())
