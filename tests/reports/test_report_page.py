"""The plots and the HTML report a user reads: every row or a stated cap, whole-number stage
ticks with the legend off the data, axes from zero, and a self-contained sortable page that
marks out-of-memory rows."""

from __future__ import annotations

import base64
import json
import re

import pytest

from clustersim.cli import main
from clustersim.reports.plots import breakdown_bars, memory_by_stage, scaling
from clustersim.reports.sweep import read_table

SCENARIO = "examples/gpt-18b-a100.yaml"


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """12 points on 256 A100s; without ZeRO or recomputation tp1 cannot hold 18B (OOM)."""
    out = tmp_path_factory.mktemp("sweep") / "s.csv"
    assert main(["sweep", SCENARIO, "--grid", "parallel.tp=1,2,8", "--grid",
                 "parallel.recompute=none,full", "--grid", "training.micro_batch=1,2",
                 "--set", "parallel.zero=0", "--fidelity", "analytic",
                 "--out", str(out)]) == 0
    return out


def test_breakdown_shows_every_row_or_says_what_it_keeps(table):
    df = read_table(table)
    simulated = int((df["status"] == "ok").sum())
    fig, data = breakdown_bars(df, "t")
    assert len(data) == simulated and f"all {simulated} configurations" in fig.axes[0].get_title()
    fig, data = breakdown_bars(df, "t", limit=5)
    assert len(data) == 5 and f"fastest 5 of {simulated}" in fig.axes[0].get_title()


@pytest.mark.parametrize("stages", [1, 2])
def test_memory_plot_has_whole_stage_ticks_and_a_legend_off_the_capacity_line(stages):
    gib = 2**30
    per_stage = [{"stage": i, "params": 10 * gib, "grads": 10 * gib, "optimizer": 40 * gib,
                  "activations": 15 * gib, "buffers": gib, "peak_bytes": 76 * gib}
                 for i in range(stages)]
    fig, _ = memory_by_stage(per_stage, 80 * gib, "a long model and cluster title, "
                                                  "512 GPUs: tp8 pp2 dp32 cp2 ep8 mb1 1f1b")
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == list(range(stages))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend, plot = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
    assert legend.x0 >= plot.x1  # beside the axes, so never over the capacity line
    title = ax.title.get_window_extent(renderer)
    width = fig.get_window_extent(renderer)
    assert width.x0 <= title.x0 and title.x1 <= width.x1  # not cut off


def test_scaling_axes_start_at_zero_so_a_small_change_looks_small(table, tmp_path):
    df = read_table(table)
    df = df.assign(gpus=[256 if i % 2 else 128 for i in range(len(df))])
    fig, data = scaling(df, "t")
    throughput, mfu = fig.axes
    assert throughput.get_ylim()[0] == 0 and mfu.get_ylim() == (0, 100)


def test_report_is_self_contained_sortable_with_gpus_and_marked_oom_rows(table, tmp_path):
    assert main(["report", str(table), "--out", str(tmp_path / "r")]) == 0
    page = (tmp_path / "r" / "report.html").read_text()
    sources = re.findall(r'<img src="([^"]+)"', page)
    assert len(sources) >= 4 and all(s.startswith("data:image/png;base64,") for s in sources)
    assert all(base64.b64decode(s.split(",", 1)[1])[:4] == b"\x89PNG" for s in sources)
    df = read_table(table)
    ok = df[df["status"] == "ok"]
    out_of_memory = int((ok["memory.fits"].astype(str) != "True").sum())
    assert out_of_memory > 0
    assert page.count('<tr class="oom">') == out_of_memory
    assert '<th data-type="num">GPUs</th>' in page
    assert '<td class="num" data-sort="256.0">256</td>' in page
    assert 'class="sortable"' in page and "<script>" in page and "addEventListener" in page
    fastest = ok.sort_values("step_time_s").iloc[0]
    assert f"{fastest['tokens_per_s']:,.0f}" in page and f"{fastest['mfu']:.1%}" in page
    scenario = json.loads(fastest["scenario"])
    assert f"tp{scenario['parallel']['tp']}" in page
