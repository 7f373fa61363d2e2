"""``clustersim plan``: the fastest splits of a model on N GPUs, printed, as JSON, or plotted."""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from clustersim.errors import ScenarioError
from clustersim.reports.paths import check_folder_output

from .json_output import print_json
from .profile_args import add_profile_arguments, chosen_profile, note_generic_profile

if TYPE_CHECKING:  # the planner is imported where it runs: other commands start without it
    from clustersim.reports.plan import PlanRequest

# pandas, matplotlib (behind reports.figures) and rich are imported inside the functions that
# use them: importing the CLI must stay cheap for `clustersim simulate` (issue 12).

# Nothing fits: an answer, not bad input (2), but not a plan either; scripts see it (issue 24).
EXIT_NOTHING_FITS = 1


def add_plan(commands: argparse._SubParsersAction) -> None:
    cmd = commands.add_parser(
        "plan", help="find the fastest splits of a model on N GPUs that fit in memory",
        description="Search every valid split (tp; pp: powers of two and divisors of the "
                    "layers; dp, cp, ep; micro-batches up to what memory allows; schedule, "
                    "virtual stages, ZeRO stage, recomputation; sequence parallelism with tp) "
                    "and print the fastest that fit, with time and GPU-hours to train. A plan "
                    "that uses a feature of uncertain cost (tp_comm_overlap, a zero-bubble or "
                    "DualPipe split backward, fp8) shows the same split's step without it, "
                    "marked ! when the plan rests on it (without it, it would rank below the "
                    "next plan); --json gives each plan's plan.caveats. --framework narrows "
                    "the search to what that training stack runs and prints the best plan as "
                    "its arguments. See docs/planner.md.")
    cmd.add_argument("--model", required=True, metavar="PRESET|FILE",
                     help="model preset, or a YAML file with a model section (or a scenario)")
    cmd.add_argument("--cluster", required=True, metavar="PRESET|FILE",
                     help="cluster preset, or a YAML file with a cluster section")
    cmd.add_argument("--gpus", type=int, metavar="N",
                     help="GPUs to plan for (a cluster made of pools: its own, by default)")
    cmd.add_argument("--tokens", type=float, metavar="T",
                     help="tokens to train on (e.g. 15e12), for time and GPU-hours")
    cmd.add_argument("--global-batch", type=int, metavar="SEQUENCES",
                     help="sequences per step (default: about 4M tokens, a power of two)")
    cmd.add_argument("--seq-len", type=int, metavar="TOKENS", help="override the sequence length")
    cmd.add_argument("--top", type=int, default=5, metavar="K", help="plans to print (default 5)")
    cmd.add_argument("--framework", metavar="STACK",
                     help="training stack to plan for: megatron (default), deepspeed or fsdp "
                          "(torchtitan); its defaults, only the splits it runs, and its launch "
                          "arguments (docs/frameworks.md); the same as --fix "
                          "training.framework=STACK")
    cmd.add_argument("--memory-reserve", type=float, default=0.05, metavar="FRACTION",
                     help="GPU memory to keep free for the allocator and CUDA context "
                          "(default 0.05)")
    cmd.add_argument("--mtbf-hours", type=float, metavar="HOURS",
                     help="mean time between failures of one GPU (with its share of the node); "
                          "gives the optimal checkpoint interval and expected wall time")
    cmd.add_argument("--checkpoint-write-s", type=float, default=60.0, metavar="S",
                     help="seconds to write a checkpoint (default 60)")
    cmd.add_argument("--checkpoint-restore-s", type=float, default=300.0, metavar="S",
                     help="seconds to restart from one (default 300)")
    cmd.add_argument("--gpu-hour-price", type=float, metavar="USD", help="price of a GPU-hour")
    cmd.add_argument("--fix", action="append", default=[], metavar="PATH=VALUE",
                     help="pin a field, e.g. --fix parallel.tp=8 (repeatable); parallel.* and "
                          "training.micro_batch narrow the search, other fields set the "
                          "scenario (values outside the searched ones are honoured)")
    cmd.add_argument("--save-best", metavar="FILE",
                     help="write the fastest plan as a scenario YAML (with its training "
                          "stack's arguments in a comment); clustersim simulate FILE "
                          "reproduces it")
    cmd.add_argument("--samples", type=int, metavar="N",
                     help="also give each plan's step a median and 90%% interval over N draws "
                          "of the profile's uncertainty (N engine runs per plan)")
    cmd.add_argument("--seed", type=int, default=0, help="seed of the --samples draws")
    add_profile_arguments(cmd, "the shipped one for each GPU")
    cmd.add_argument("--jobs", type=int, default=None, metavar="N",
                     help="processes to search with (default: this machine's cores; with "
                          "--backend ray, the cluster's CPUs); the plans do not depend on it")
    cmd.add_argument("--backend", choices=["local", "ray"], default="local",
                     help="this machine's processes (default) or a Ray cluster's CPUs, for a "
                          "search that outgrows one machine")
    cmd.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, or a "
                                       "local Ray instance)")
    cmd.add_argument("--json", action="store_true", help="print the plans as one JSON array")
    cmd.add_argument("--plots", metavar="DIR", help="write plots of the plans (PNG, SVG, CSV)")
    cmd.set_defaults(run=run_plan_command)


def request_from(args: argparse.Namespace) -> PlanRequest:
    from clustersim.reports.plan_request import make_request
    from clustersim.simulator.inputs.scenario import parse_overrides

    if args.top < 1:
        raise ScenarioError("--top", f"must be at least 1 (got {args.top})")
    if args.jobs is not None and args.jobs < 1:
        raise ScenarioError("--jobs", f"must be at least 1 (got {args.jobs})")
    if args.address and args.backend != "ray":
        raise ScenarioError("--address", "only applies to --backend ray")
    if args.samples is not None and args.samples < 2:
        raise ScenarioError("--samples", f"must be at least 2 for an interval "
                                         f"(got {args.samples})")
    fixed = parse_overrides(args.fix, "--fix")
    if args.framework is not None:
        if fixed.get("training.framework", args.framework) != args.framework:
            raise ScenarioError("--framework", f"{args.framework}, but --fix pins "
                                               f"training.framework={fixed['training.framework']}")
        fixed["training.framework"] = args.framework
    req = make_request(
        args.model, args.cluster, args.gpus, fixed=fixed,
        tokens=args.tokens, global_batch=args.global_batch, seq_len=args.seq_len,
        memory_reserve=args.memory_reserve, mtbf_hours=args.mtbf_hours,
        checkpoint_write_s=args.checkpoint_write_s,
        checkpoint_restore_s=args.checkpoint_restore_s, gpu_hour_price=args.gpu_hour_price)
    if args.profile is None:
        return req
    from clustersim.simulator.inputs.scenario import build_cluster
    return replace(req, profile=chosen_profile(args, build_cluster(req.cluster)))


def _check_save_path(path: str | None) -> None:
    """``--save-best`` needs a folder to write into; checked before the search."""
    if path and not Path(path).resolve().parent.is_dir():
        raise ScenarioError("--save-best", f"folder {str(Path(path).resolve().parent)!r} "
                                           "does not exist")


def run_plan_command(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress

    from clustersim.reports.launch import launch
    from clustersim.reports.plan import with_error_bars
    from clustersim.reports.plan_caveats import moe_routing_note
    from clustersim.reports.plan_request import save_best, search
    from clustersim.reports.plan_table import nothing_fits, plans_table, print_plans
    from clustersim.reports.processes import workers_for

    req = request_from(args)
    _check_save_path(args.save_best)
    if args.plots:
        check_folder_output("--plots", args.plots)
    stderr = Console(stderr=True)
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), console=stderr, disable=not stderr.is_terminal) as bar:
        task = bar.add_task("estimating splits", total=None)
        with workers_for(args.backend, args.jobs, args.address) as workers:
            found = search(req, args.top, lambda done, total: bar.update(
                task, completed=done, total=total), jobs=workers)
    if args.samples is not None:
        found = replace(found, plans=with_error_bars(found.plans, args.samples, args.seed,
                                                     req.profile))
    plans = found.plans
    if args.save_best:
        save_best(found, args.save_best)
    if args.json:
        print_json(found.to_list())
        if not plans:
            print(nothing_fits(req, found.valid), file=sys.stderr)
    else:
        print_plans(req, plans, found.valid, found.fitting)
        if plans:
            note_generic_profile(plans[0].scenario.cluster, req.profile)
        if found.fastest_pool_alone is not None:
            print(found.fastest_pool_alone.line(found.best))
        if found.record is not None:
            print("\n".join(found.record.lines()))
        moe = moe_routing_note(plans[0].scenario) if plans else None
        if moe:
            print("\n".join(textwrap.wrap(moe, 100)))
        if plans:
            print("\n".join(launch(plans[0].scenario).lines("#1")))
        if args.save_best and plans:
            print(f"wrote {args.save_best}")
    if args.plots and plans:
        from clustersim.reports.figures import write_figures
        for path in write_figures(plans_table(plans), Path(args.plots)):
            print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)  # JSON alone
    return 0 if plans else EXIT_NOTHING_FITS
