"""Wall and CPU time of ``clustersim plan`` on the issues' three plans, top 5 (issues 4 and 26).

    python benchmarks/plan_speed.py [--case llama3-70b|gpt3-175b|mixtral-8x7b|all] [--jobs N]
                                    [--repeat R] [--check]

llama3-70b: 1,024 h100-sxm, 8K tokens, global batch 512 (the default case, issue 4's).
gpt3-175b: 1,024 a100-80gb, 2K tokens, global batch 1,536 (issue 23's first plan).
mixtral-8x7b: 256 h100-sxm, 32K tokens, global batch 128 (issue 26's MoE plan).
Targets on an idle 2-core machine (``TARGETS_S``): issue 26's 5 s for llama3-70b and 15 s for
mixtral-8x7b, issue 4's 2 minutes for gpt3-175b. Prints the wall time, the CPU time (its
workers' included; the steadier figure on a machine shared with other jobs), its ratio to the
case's target, how many splits were valid and fit, and the winner; ``--check`` exits 1 when a
case's median wall time misses its target.
It times the library's ``plan`` call; the command line adds its start-up and printing (about half
a second, ``benchmarks/startup.py``).
``--jobs``: the planner's processes (default: the machine's cores, as ``plan --jobs``);
``--repeat``: runs of each case, then their fastest, median and slowest wall time (the spread).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time

from clustersim.reports.plan import PlanRequest, plan
from clustersim.reports.processes import default_jobs

TARGETS_S = {"llama3-70b": 5.0, "gpt3-175b": 120.0, "mixtral-8x7b": 15.0}
CASES = {
    "llama3-70b": PlanRequest(model={"preset": "llama3-70b"},
                              cluster={"preset": "dgx-h100", "gpus": 1024}, global_batch=512,
                              tokens=15e12),
    "gpt3-175b": PlanRequest(model={"preset": "gpt3-175b", "seq_len": 2048},
                             cluster={"preset": "dgx-a100-80gb", "gpus": 1024},
                             global_batch=1536),
    # `plan --model mixtral-8x7b --cluster dgx-h100 --gpus 256`: 32K tokens, the default
    # batch of about 4M tokens (128 sequences); cp and ep searched, 84K candidates
    "mixtral-8x7b": PlanRequest(model={"preset": "mixtral-8x7b"},
                                cluster={"preset": "dgx-h100", "gpus": 256}, global_batch=128),
}


def cpu_seconds() -> float:
    """CPU time of this process and of its ended children (the ``--jobs`` workers)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def run(name: str, jobs: int) -> float:
    """Plan one case and print its line; the wall time."""
    req = CASES[name]
    start, cpu = time.perf_counter(), cpu_seconds()
    plans, valid, fitting = plan(req, top=5, jobs=jobs)
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    best = plans[0]
    print(f"plan {name} on {req.cluster['gpus']:,} GPUs, top 5, {jobs} jobs: {wall:.2f} s wall, "
          f"{cpu:.2f} s CPU (target {TARGETS_S[name]:.0f} s, ratio {wall / TARGETS_S[name]:.2f}); "
          f"{valid} valid splits, {fitting} fit; best {best.scenario.name} at "
          f"{best.result.step_time_s:.3f} s/step, MFU {best.result.mfu:.1%}")
    return wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=[*CASES, "all"], default="llama3-70b")
    parser.add_argument("--jobs", type=int, default=default_jobs(), metavar="N")
    parser.add_argument("--repeat", type=int, default=1, metavar="R")
    parser.add_argument("--check", action="store_true", help="exit 1 if the target is missed")
    args = parser.parse_args()
    names = list(CASES) if args.case == "all" else [args.case]
    missed = False
    for name in names:
        runs = [run(name, args.jobs) for _ in range(args.repeat)]
        if args.repeat > 1:
            print(f"  {name}: wall min {min(runs):.2f} s, median {statistics.median(runs):.2f} "
                  f"s, max {max(runs):.2f} s over {args.repeat} runs")
        missed |= statistics.median(runs) > TARGETS_S[name]
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
