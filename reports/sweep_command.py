"""``clustersim sweep``: run a grid with progress, save the table, summarise, plot."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from clustersim.errors import ScenarioError
from clustersim.simulator.hf_config import anchor
from clustersim.simulator.scenario import apply_overrides, build_scenario
from clustersim.yamlio import load_yaml_file

from .paths import check_folder_output
from .profile_args import add_profile_arguments, chosen_profile, profile_path

if TYPE_CHECKING:
    import pandas as pd

# pandas, matplotlib (behind .plots and .figures) and rich are imported inside the functions that
# use them: importing the CLI must stay cheap for `clustersim simulate` (issue 12).

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

    from .backends import make_runner
    from .sweep import Grid, base_for, check_output, run_sweep

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
    print_summary(df, args.top)
    if args.plots:
        from .figures import write_figures
        written = write_figures(df, Path(args.plots))
        for path in written:
            print(f"wrote {path}")
        if not written:
            print("no plots: no point of the sweep ran", file=sys.stderr)
    return 0


def print_summary(df: pd.DataFrame, top: int) -> None:
    """The fastest configurations that fit, then what was invalid or failed, and why."""
    from rich.console import Console
    from rich.table import Table

    from .plots import config_label

    console = Console(soft_wrap=False)
    if not console.is_terminal:
        console.width = max(console.width, 120)  # a file or pipe: never fold the table
    ok = df[df["status"] == "ok"] if "status" in df else df.iloc[0:0]
    fits = ok[ok["memory.fits"].astype(str) == "True"] if len(ok) else ok
    table = Table(title=f"Fastest of {len(fits)} fitting configurations "
                        f"({len(df)} points, {len(ok) - len(fits)} out of memory)")
    bars = "step_time_lo_s" in fits
    columns = ("configuration", "step s", *(("90% interval s",) if bars else ()), "MFU",
               "tokens/s", "peak GiB")
    for column in columns:
        table.add_column(column, justify="left" if column == "configuration" else "right")
    ranked = fits.sort_values("step_time_s").head(top) if len(fits) else fits  # none simulated
    for _, row in ranked.iterrows():
        interval = ((f"{row['step_time_lo_s']:.3f}-{row['step_time_hi_s']:.3f}",)
                    if bars else ())
        table.add_row(config_label(row), f"{row['step_time_s']:.3f}", *interval,
                      f"{row['mfu']:.1%}", f"{row['tokens_per_s']:,.0f}",
                      f"{row['memory.peak_bytes'] / 2**30:.1f}")
    console.print(table)
    bad = df[df["status"].isin(["invalid", "failed"])] if "status" in df else df.iloc[0:0]
    if len(bad):
        console.print(f"{len(bad)} combinations not simulated:")
        for _, row in bad.iterrows():
            console.print(f"  {row['point']}: {row['status']}: {row['error']}", markup=False)
