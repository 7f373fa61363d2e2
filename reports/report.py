"""``clustersim report RESULTS``: the plots of a saved sweep and one HTML page holding them."""

from __future__ import annotations

import argparse
import html
from pathlib import Path

import pandas as pd

from clustersim.errors import ScenarioError

from .figures import write_figures
from .paths import check_folder_output
from .plots import config_label, sweep_title
from .sweep import read_table

COLUMNS = {"step_time_s": "step s", "mfu": "MFU", "tokens_per_s": "tokens/s",
           "breakdown_s.compute": "compute s", "breakdown_s.exposed_comm": "exposed comm s",
           "breakdown_s.bubble": "bubble s", "memory.peak_bytes": "peak GiB",
           "memory.fits": "fits"}


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
    path = Path(args.results)
    if not path.is_file():
        raise ScenarioError("RESULTS", f"no such file: {args.results!r}")
    try:
        df = read_table(path)
    except Exception as exc:
        raise ScenarioError("RESULTS", f"cannot read {args.results!r}: {exc}") from None
    if not {"point", "status"} <= set(df.columns):
        raise ScenarioError("RESULTS", f"{args.results!r} is not a clustersim sweep table")
    folder = Path(args.out) if args.out else path.with_name(path.name.split(".")[0] + "-report")
    check_folder_output("--out", folder)
    images = write_figures(df, folder)
    page = folder / "report.html"
    page.write_text(render_html(df, images, path.name), encoding="utf-8")
    print(f"wrote {page} and {len(images)} plots")
    return 0


def render_html(df: pd.DataFrame, images: list[Path], source: str) -> str:
    """One self-contained page: the fastest configurations, the plots, what was skipped."""
    ok = df[df["status"] == "ok"].sort_values("step_time_s")
    title = f"clustersim sweep: {sweep_title(df, ok.iloc[0])}" if len(ok) else "clustersim sweep"
    table = ok.assign(configuration=[config_label(r) for _, r in ok.iterrows()])
    table = table[["configuration", *COLUMNS]].rename(columns=COLUMNS)
    table["MFU"] = (100 * table["MFU"].astype(float)).map("{:.1f}%".format)
    table["peak GiB"] = (table["peak GiB"].astype(float) / 2**30).map("{:.1f}".format)
    skipped = df[df["status"] != "ok"][["point", "status", "error"]]
    figures = "\n".join(f'<figure><img src="{html.escape(p.name)}" alt="{html.escape(p.stem)}">'
                        f"</figure>" for p in images)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}}
table{{border-collapse:collapse;font-size:90%}}td,th{{border:1px solid #ccc;padding:2px 6px}}
img{{max-width:100%}}</style></head><body>
<h1>{html.escape(title)}</h1>
<p>{len(df)} points from {html.escape(source)}: {len(ok)} simulated, {len(skipped)} invalid or
failed. Fastest first.</p>
{table.to_html(index=False, float_format=lambda x: f"{x:,.3f}")}
<h2>Plots</h2>
{figures}
<h2>Not simulated</h2>
{skipped.to_html(index=False) if len(skipped) else "<p>None.</p>"}
</body></html>
"""
