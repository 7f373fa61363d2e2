"""The HTML report of a saved sweep: one self-contained page holding its table, sortable by any
column, and its plots (``clustersim report RESULTS``, ``clustersim/cli/report.py``, writes it)."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

# pandas and matplotlib (behind .plots) are imported inside the functions that use them.

# (column, heading, how a person reads it); the raw value stays in data-sort for sorting
COLUMNS = (("gpus", "GPUs", "{:,.0f}"), ("step_time_s", "step s", "{:,.3f}"),
           ("mfu", "MFU", "{:.1%}"), ("tokens_per_s", "tokens/s", "{:,.0f}"),
           ("breakdown_s.compute", "compute s", "{:,.3f}"),
           ("breakdown_s.exposed_comm", "exposed comm s", "{:,.3f}"),
           ("breakdown_s.bubble", "bubble s", "{:,.3f}"),
           ("memory.peak_bytes", "peak GiB", "{:,.1f}"))
GIB = 2**30
# Click a heading to sort by it (again to reverse). Numeric columns (th data-type="num") sort by
# each cell's raw data-sort value; text columns as text, digits by value (tp2 before tp16): a
# configuration such as "512 GPUs: tp8 ..." must not sort as the number 512 (issue 24). Rows
# that fit in memory always come before out-of-memory ones, which no plan can use.
SORT_SCRIPT = """
document.querySelectorAll("table.sortable th").forEach((th, col) => th.addEventListener("click",
  () => {
    const table = th.closest("table"), body = table.tBodies[0];
    const up = th.getAttribute("aria-sort") !== "ascending";
    table.querySelectorAll("th").forEach(h => h.removeAttribute("aria-sort"));
    th.setAttribute("aria-sort", up ? "ascending" : "descending");
    const numeric = th.dataset.type === "num";
    const key = r => numeric ? parseFloat(r.cells[col].dataset.sort) : r.cells[col].textContent;
    const order = (a, b) => numeric ? a - b : a.localeCompare(b, "en", {numeric: true});
    const oom = r => r.classList.contains("oom") ? 1 : 0;
    [...body.rows].sort((a, b) => (oom(a) - oom(b)) || order(key(a), key(b)) * (up ? 1 : -1))
      .forEach(r => body.appendChild(r));
  }));
"""


def render_html(df: pd.DataFrame, images: list[Path], source: str) -> str:
    """One self-contained page (plots embedded): the configurations fastest first in a table
    sortable by any column, out-of-memory rows marked, the plots, what was skipped."""
    from .plots import sweep_title

    ok = df[df["status"] == "ok"]  # none: every point was invalid, no result columns
    if len(ok):
        ok = ok.assign(_oom=ok["memory.fits"].astype(str) != "True").sort_values(
            ["_oom", "step_time_s"]).drop(columns="_oom")  # what fits first, then fastest
    title = f"clustersim sweep: {sweep_title(df, ok.iloc[0])}" if len(ok) else "clustersim sweep"
    oom = int((ok["memory.fits"].astype(str) != "True").sum()) if len(ok) else 0
    skipped = df[df["status"] != "ok"][["point", "status", "error"]]
    figures = "\n".join(f'<figure><img src="data:image/png;base64,'
                        f'{base64.b64encode(p.read_bytes()).decode()}" alt="{html.escape(p.stem)}">'
                        f"<figcaption>{html.escape(p.stem)}</figcaption></figure>" for p in images)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}}
table{{border-collapse:collapse;font-size:90%}}td,th{{border:1px solid #ccc;padding:2px 6px}}
td.num{{text-align:right;font-variant-numeric:tabular-nums}}th{{cursor:pointer;background:#eee}}
tr.oom td{{background:#fde2e2}}img{{max-width:100%}}
th[aria-sort=ascending]::after{{content:" \\25B2"}}
th[aria-sort=descending]::after{{content:" \\25BC"}}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p>{len(df):,} points from {html.escape(source)}: {len(ok):,} simulated ({oom:,} do not fit in
memory, marked in red and listed last), {len(skipped):,} invalid or failed. Fastest first; click a
heading to sort.</p>
{_table(ok)}
<h2>Plots</h2>
{figures}
<h2>Not simulated</h2>
{skipped.to_html(index=False) if len(skipped) else "<p>None.</p>"}
<script>{SORT_SCRIPT}</script>
</body></html>
"""


def _table(ok: pd.DataFrame) -> str:
    head = ("<th>configuration</th>" + "".join(f'<th data-type="num">{c[1]}</th>' for c in COLUMNS)
            + "<th>fits in memory</th>")
    return (f'<table class="sortable"><thead><tr>{head}</tr></thead><tbody>\n'
            + "\n".join(_row(r) for _, r in ok.iterrows()) + "</tbody></table>")


def _row(r: pd.Series) -> str:
    from .labels import config_label

    fits = str(r["memory.fits"]) == "True"
    cells = [f"<td>{html.escape(config_label(r))}</td>"]
    for column, _, fmt in COLUMNS:
        value = float(r[column])
        shown = value / GIB if column == "memory.peak_bytes" else value
        cells.append(f'<td class="num" data-sort="{value!r}">{fmt.format(shown)}</td>')
    cells.append(f"<td>{'yes' if fits else 'OUT OF MEMORY'}</td>")
    marked = "" if fits else ' class="oom"'
    return f"<tr{marked}>{''.join(cells)}</tr>"
