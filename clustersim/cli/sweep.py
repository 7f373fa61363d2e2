"""``clustersim sweep``: run a grid with progress, save the table, summarise, plot (the sweep
itself is ``clustersim.reports.sweep``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clustersim.errors import ScenarioError
from clustersim.reports.paths import check_folder_output
from clustersim.simulator.inputs.hf_config import anchor
from clustersim.simulator.inputs.scenario import apply_overrides, build_scenario
from clustersim.yamlio import load_yaml_file

from .profile_args import add_profile_arguments, chosen_profile, profile_path

# pandas, matplotlib (behind reports.sweep and reports.figures) and rich are imported inside the
# function that runs the command: importing the CLI must stay cheap (issue 12).

EXIT_INTERRUPTED = 130


def add_sweep(commands: argparse._SubParsersAction) -> None:
    cmd = commands.add_parser(
        "sweep", help="simulate every combination of a grid of overrides",
        description="Simulate every combination of --grid values over a base scenario. Invalid "
                    "combinations are listed with the reason. With --out, the table is saved "
                    "as it fills (CSV or Parquet), with what it was computed from in "
                    "FILE.fingerprint.json; a rerun with the same --out resumes only the "
                    "same sweep (same scenario, --set, --grid, --profile, estimator and "
                    "clustersim) and refuses otherwise (--fresh replaces it).")
    cmd.add_argument("scenario", metavar="SCENARIO", help="base scenario YAML file")
    cmd.add_argument("--grid", action="append", required=True, metavar="PATH=V1,V2,...",
                     help="a swept field and its values, e.g. --grid parallel.tp=1,2,4,8 "
                          "(repeatable; parallel.dp is derived unless swept)")
    cmd.add_argument("--set", dest="overrides", action="append", default=[],
                     metavar="PATH=VALUE", help="override a field of the base scenario")
    cmd.add_argument("--out", metavar="FILE", help="table to write: .csv, .csv.gz or .parquet")
    cmd.add_argument("--fresh", action="store_true",
                     help="replace the table at --out instead of resuming it")
    cmd.add_argument("--plots", metavar="DIR", help="write the sweep's plots (PNG, SVG, CSV)")
    cmd.add_argument("--jobs", type=int, default=None, metavar="N",
                     help="parallel workers (default: all cores)")
    cmd.add_argument("--backend", choices=["local", "ray"], default="local",
                     help="local processes (default) or a Ray cluster")
    cmd.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, or a "
                                       "local Ray instance)")
    cmd.add_argument("--fidelity", choices=["representative", "full", "analytic"],
                     default="representative", help="estimator for every point")
    add_profile_arguments(cmd, "the shipped one for each point's GPU")
    cmd.add_argument("--samples", type=int, metavar="N",
                     help="also predict each point under N draws of the profile's uncertainty: "
                          "median and 90%% interval columns, error bars in the plots")
    cmd.add_argument("--seed", type=int, default=0, help="seed of the --samples draws")
    cmd.add_argument("--top", type=int, default=10, metavar="K",
                     help="rows in the printed summary (default 10)")
    cmd.set_defaults(run=run_sweep_command)


def run_sweep_command(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from clustersim.reports.backends import make_runner
    from clustersim.reports.sweep import Grid, base_for, check_output, run_sweep
    from clustersim.reports.tables import print_sweep_summary

    if args.jobs is not None and args.jobs < 1:
        raise ScenarioError("--jobs", f"must be at least 1 (got {args.jobs})")
    if args.samples is not None and args.samples < 2:
        raise ScenarioError("--samples", f"must be at least 2 for an interval "
                                         f"(got {args.samples})")
    grid = Grid.parse(args.grid)
    raw = load_yaml_file(args.scenario)
    if not isinstance(raw, dict):
        raise ScenarioError(args.scenario, "a scenario file must be a YAML mapping")
    raw = anchor(apply_overrides(raw, args.overrides), args.scenario)  # hf_config paths
    base = build_scenario(base_for(raw, grid), Path(args.scenario).stem)  # a bad base fails here
    chosen_profile(args, base.cluster)  # so does a profile of another device: once, here
    profile = profile_path(args.profile)  # the workers read it from its file
    out = Path(args.out) if args.out else None
    if out is not None:
        check_output(out)
    elif args.fresh:
        raise ScenarioError("--fresh", "replaces the table at --out; give --out")
    if args.plots:
        check_folder_output("--plots", args.plots)
    runner = make_runner(args.backend, args.jobs, args.address)
    points = len(grid.points())
    stderr = Console(stderr=True)
    progress = Progress("[progress.description]{task.description}", BarColumn(),
                        MofNCompleteColumn(), TimeRemainingColumn(), console=stderr,
                        disable=not stderr.is_terminal)
    task = progress.add_task("simulating", total=points)

    def advance(_row: dict) -> None:
        progress.start()  # at the first row, so that a refused --out prints one line only
        progress.advance(task)

    try:
        df = run_sweep(raw, grid, runner, out, args.fidelity,
                       str(profile) if profile else None,
                       Path(args.scenario).stem, on_row=advance, samples=args.samples,
                       seed=args.seed, overrides=args.overrides, fresh=args.fresh,
                       force_profile=args.force_profile)
    except KeyboardInterrupt:
        where = f"; run the same command to resume from {out}" if out else ""
        print(f"interrupted{where}", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        progress.stop()
    print_sweep_summary(df, args.top)
    if args.plots:
        from clustersim.reports.figures import write_figures
        written = write_figures(df, Path(args.plots))
        for path in written:
            print(f"wrote {path}")
        if not written:
            print("no plots: no point of the sweep ran", file=sys.stderr)
    return 0
