"""Wall and CPU time of ``clustersim plan`` on the issues' two plans, top 5 (issues 4 and 26).

    python benchmarks/plan_speed.py [--case llama3-70b|gpt3-175b|all] [--check]

llama3-70b: 1,024 h100-sxm, 8K tokens, global batch 512 (the default case, issue 4's).
gpt3-175b: 1,024 a100-80gb, 2K tokens, global batch 1,536 (issue 23's first plan).
Target: under 2 minutes on the 2-core CI machine. Prints the wall time, the process's CPU time
(the steadier figure on a machine shared with other jobs), its ratio to the target, how many
splits were valid and fit, and the winner; ``--check`` exits 1 when a case misses the target.
"""

from __future__ import annotations

import argparse
import sys
import time

from clustersim.reports.plan import PlanRequest, plan

TARGET_S = 120.0
CASES = {
    "llama3-70b": PlanRequest(model={"preset": "llama3-70b"},
                              cluster={"preset": "dgx-h100", "gpus": 1024}, global_batch=512,
                              tokens=15e12),
    "gpt3-175b": PlanRequest(model={"preset": "gpt3-175b", "seq_len": 2048},
                             cluster={"preset": "dgx-a100-80gb", "gpus": 1024},
                             global_batch=1536),
}


def run(name: str) -> float:
    """Plan one case and print its line; the wall time."""
    req = CASES[name]
    start, cpu = time.perf_counter(), time.process_time()
    plans, valid, fitting = plan(req, top=5)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    best = plans[0]
    print(f"plan {name} on {req.cluster['gpus']:,} GPUs, top 5: {wall:.2f} s wall, {cpu:.2f} s "
          f"CPU (target {TARGET_S:.0f} s, ratio {wall / TARGET_S:.3f}); {valid} valid splits, "
          f"{fitting} fit; best {best.scenario.name} at {best.result.step_time_s:.3f} s/step, "
          f"MFU {best.result.mfu:.1%}")
    return wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=[*CASES, "all"], default="llama3-70b")
    parser.add_argument("--check", action="store_true", help="exit 1 if the target is missed")
    args = parser.parse_args()
    names = list(CASES) if args.case == "all" else [args.case]
    walls = [run(name) for name in names]
    return 1 if args.check and max(walls) > TARGET_S else 0


if __name__ == "__main__":
    sys.exit(main())
