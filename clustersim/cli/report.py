"""``clustersim report RESULTS``: the plots of a saved sweep and one HTML page holding them
(drawn by ``clustersim.reports.figures`` and ``clustersim.reports.report``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from clustersim.errors import ScenarioError
from clustersim.reports.paths import check_folder_output

# pandas and matplotlib (behind reports.figures and reports.sweep) are imported inside the
# function that runs the command: importing the CLI must stay cheap (issue 12).


def add_report(commands: argparse._SubParsersAction) -> None:
    cmd = commands.add_parser(
        "report", help="plots and an HTML page from a saved sweep table",
        description="Read a sweep table (CSV or Parquet, as written by 'sweep --out') and "
                    "write its plots and report.html into a folder.")
    cmd.add_argument("results", metavar="RESULTS", help="sweep table (.csv, .csv.gz, .parquet)")
    cmd.add_argument("--out", metavar="DIR", default=None,
                     help="folder for the plots and report.html (default: RESULTS without "
                          "its suffix, plus '-report')")
    cmd.set_defaults(run=run_report_command)


def run_report_command(args: argparse.Namespace) -> int:
    from clustersim.reports.figures import write_figures
    from clustersim.reports.report import render_html
    from clustersim.reports.sweep import read_table

    path = Path(args.results)
    if not path.is_file():
        raise ScenarioError("RESULTS", f"no such file: {args.results!r}")
    try:
        df = read_table(path)
    except Exception as exc:
        raise ScenarioError("RESULTS", f"cannot read {args.results!r}: {exc}") from None
    if not {"point", "status"} <= set(df.columns):
        raise ScenarioError("RESULTS", f"{args.results!r} is not a clustersim sweep table")
    missing = {"step_time_s", "memory.fits"} - set(df.columns)
    if (df["status"] == "ok").any() and missing:
        raise ScenarioError("RESULTS", f"{args.results!r} has rows that ran but no "
                                       f"{', '.join(sorted(missing))} column")
    folder = Path(args.out) if args.out else path.with_name(path.name.split(".")[0] + "-report")
    check_folder_output("--out", folder)
    images = write_figures(df, folder)
    page = folder / "report.html"
    folder.mkdir(parents=True, exist_ok=True)  # no plots were drawn when no point ran
    page.write_text(render_html(df, images, path.name), encoding="utf-8")
    print(f"wrote {page} and {len(images)} plots")
    return 0
