"""``clustersim plan``: the fastest splits of a model on N GPUs, printed, as JSON, or plotted."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from clustersim.errors import ScenarioError

from .json_output import print_json
from .megatron import megatron_args, megatron_command_line
from .paths import check_folder_output
from .plan import Plan, PlanRequest, with_error_bars
from .plan_request import make_request, save_best, search
from .pool_plan import stages_label
from .processes import default_jobs

if TYPE_CHECKING:
    import pandas as pd

# pandas, matplotlib (behind .plots) and rich are imported inside the functions that use them:
# importing the CLI must stay cheap for `clustersim simulate` (issue 12).

DAY = 86400
# Nothing fits: an answer, not bad input (2), but not a plan either; scripts see it (issue 24).
EXIT_NOTHING_FITS = 1
CAVEATS_LEGEND = (
    "uncertain: features whose cost the model cannot yet vouch for (tp-overlap: TP collectives\n"
    "hidden behind GEMMs; split-bwd: a zero-bubble or DualPipe split backward; fp8), with the\n"
    "same split's step without each; ! marks a plan that rests on it (without it the split would\n"
    "rank below the next plan, or not run): docs/planner.md, \"Caveats\".")


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
                    "next plan); --json gives each plan's plan.caveats. See docs/planner.md.")
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
                     help="write the fastest plan as a scenario YAML (with its Megatron-LM "
                          "arguments in a comment); clustersim simulate FILE reproduces it")
    cmd.add_argument("--samples", type=int, metavar="N",
                     help="also give each plan's step a median and 90%% interval over N draws "
                          "of the profile's uncertainty (N engine runs per plan)")
    cmd.add_argument("--seed", type=int, default=0, help="seed of the --samples draws")
    cmd.add_argument("--jobs", type=int, default=None, metavar="N",
                     help="processes to search with (default: this machine's cores); the "
                          "plans do not depend on it")
    cmd.add_argument("--json", action="store_true", help="print the plans as one JSON array")
    cmd.add_argument("--plots", metavar="DIR", help="write plots of the plans (PNG, SVG, CSV)")
    cmd.set_defaults(run=run_plan_command)


def request_from(args: argparse.Namespace) -> PlanRequest:
    from clustersim.simulator.scenario import parse_overrides

    if args.top < 1:
        raise ScenarioError("--top", f"must be at least 1 (got {args.top})")
    if args.jobs is not None and args.jobs < 1:
        raise ScenarioError("--jobs", f"must be at least 1 (got {args.jobs})")
    if args.samples is not None and args.samples < 2:
        raise ScenarioError("--samples", f"must be at least 2 for an interval "
                                         f"(got {args.samples})")
    return make_request(
        args.model, args.cluster, args.gpus, fixed=parse_overrides(args.fix, "--fix"),
        tokens=args.tokens, global_batch=args.global_batch, seq_len=args.seq_len,
        memory_reserve=args.memory_reserve, mtbf_hours=args.mtbf_hours,
        checkpoint_write_s=args.checkpoint_write_s,
        checkpoint_restore_s=args.checkpoint_restore_s, gpu_hour_price=args.gpu_hour_price)


def _check_save_path(path: str | None) -> None:
    """``--save-best`` needs a folder to write into; checked before the search."""
    if path and not Path(path).resolve().parent.is_dir():
        raise ScenarioError("--save-best", f"folder {str(Path(path).resolve().parent)!r} "
                                           "does not exist")


def run_plan_command(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress

    req = request_from(args)
    _check_save_path(args.save_best)
    if args.plots:
        check_folder_output("--plots", args.plots)
    stderr = Console(stderr=True)
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), console=stderr, disable=not stderr.is_terminal) as bar:
        task = bar.add_task("estimating splits", total=None)
        found = search(req, args.top, lambda done, total: bar.update(task, completed=done,
                                                                     total=total),
                       jobs=args.jobs or default_jobs())
    if args.samples is not None:
        found = replace(found, plans=with_error_bars(found.plans, args.samples, args.seed))
    plans = found.plans
    if args.save_best:
        save_best(found, args.save_best)
    if args.json:
        print_json(found.to_list())
        if not plans:
            print(nothing_fits(req, found.valid), file=sys.stderr)
    else:
        print_plans(req, plans, found.valid, found.fitting)
        if found.fastest_pool_alone is not None:
            print(found.fastest_pool_alone.line(found.best))
        if plans:
            best = plans[0].scenario
            print(f"Megatron-LM arguments of #1: {megatron_command_line(best)}")
            for note in (a for a in megatron_args(best) if a.startswith("#")):
                print(f"  {note}")
        if args.save_best and plans:
            print(f"wrote {args.save_best}")
    if args.plots and plans:
        from .figures import write_figures
        for path in write_figures(plans_table(plans), Path(args.plots)):
            print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)  # JSON alone
    return 0 if plans else EXIT_NOTHING_FITS


def nothing_fits(req: PlanRequest, valid: int) -> str:
    """Why a search found no plan, and what to change."""
    return (f"No split fits: {valid} valid splits, none within memory "
            f"(reserve {req.memory_reserve:.0%}). Try more GPUs or a smaller batch.")


def plans_table(plans: list[Plan]) -> pd.DataFrame:
    """The plans as sweep-style rows, so the sweep's plots apply."""
    import pandas as pd

    from .sweep import flatten, split_columns

    return pd.DataFrame([{"point": p.scenario.name, "status": "ok", "error": "",
                          **split_columns(p.scenario), "scenario": json.dumps(p.scenario.as_dict()),
                          **flatten(p.result.to_json())} for p in plans])


def print_plans(req: PlanRequest, plans: list[Plan], valid: int, fitting: int) -> None:
    from rich.console import Console
    from rich.table import Table

    from clustersim.topologies.pools import cluster_label

    from .plots import config_label
    from .sweep import split_columns

    console = Console(soft_wrap=False)
    if not console.is_terminal:
        console.width = max(console.width, 230)  # a file or pipe: never fold the table
    if not plans:
        console.print(nothing_fits(req, valid))
        return
    s = plans[0].scenario
    console.print(f"[bold]{s.model.name}[/bold] on {cluster_label(s.cluster)}, "
                  f"global batch {req.global_batch} x {s.model.seq_len} "
                  f"tokens: {valid} valid splits, {fitting} fit; the engine ranked the best")
    table = Table()
    pooled = plans[0].scenario.parallel.stage_pools is not None
    columns = ["#", "split", *(["stages (pool:layers)"] if pooled else []), "step s",
               *(["90% interval s"] if plans[0].spread else []), "MFU", "free GiB"]
    if req.tokens:
        columns += ["train days", "GPU-hours"] + (["cost $"] if req.gpu_hour_price else [])
    if plans[0].checkpoint:
        columns += ["checkpoint", "wall days", "goodput"]
    caveats = any(p.caveats for p in plans)
    if caveats:
        columns.append("uncertain: step without")
    for c in columns:
        table.add_column(c, justify="left" if c in ("split", "stages (pool:layers)",
                                                    "uncertain: step without") else "right")
    for i, p in enumerate(plans, 1):
        r = p.result
        interval = ([f"{p.spread.step_time_s[0]:.3f}-{p.spread.step_time_s[2]:.3f}"]
                    if p.spread else [])
        stages = [stages_label(p.scenario)] if pooled else []
        row = [str(i), config_label(split_columns(p.scenario)), *stages, f"{r.step_time_s:.3f}",
               *interval, f"{r.mfu:.1%}",
               f"{p.headroom_bytes / 2**30:.1f}"]
        if req.tokens:
            row += [f"{r.time_to_train_s / DAY:.1f}", f"{p.gpu_hours:,.0f}"]
            if req.gpu_hour_price:
                row.append(f"{p.gpu_hours * req.gpu_hour_price:,.0f}")
        if p.checkpoint:
            c = p.checkpoint
            row += [f"every {c.interval_s / 60:.0f} min", f"{c.expected_wall_time_s / DAY:.1f}",
                    f"{c.goodput:.1%}"]
        if caveats:
            row.append(", ".join(c.label(r.step_time_s) for c in p.caveats) or "-")
        table.add_row(*row)
    console.print(table)
    if caveats:
        console.print(CAVEATS_LEGEND)
