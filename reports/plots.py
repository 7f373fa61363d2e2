"""The pictures a capacity planner looks at (matplotlib, headless ``Agg``).

Each function returns a Figure; ``save`` writes it as PNG and SVG beside a CSV of the data it
shows (NOTES.md B5). Titles name the model and cluster, axes carry units.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from .labels import config_label  # noqa: E402

GIB = 2**30
CAUSES = ("compute", "exposed_comm", "bubble", "optimizer")
CAUSE_COLORS = {"compute": "#4C72B0", "exposed_comm": "#DD8452", "bubble": "#C7C7C7",
                "optimizer": "#55A868"}
PARTS = ("params", "grads", "optimizer", "activations", "buffers")
PART_COLORS = dict(zip(PARTS, ("#4C72B0", "#8172B3", "#55A868", "#DD8452", "#937860"),
                       strict=True))
OP_COLORS = {"forward": "#4C72B0", "backward": "#DD8452", "input grad": "#E5AE38",
             "weight grad": "#937860", "optimizer": "#55A868", "tp": "#8172B3", "cp": "#64B5CD",
             "ep": "#DA8BC3", "dp": "#C44E52", "pp": "#7F7F7F"}


BREAKDOWN_ROWS = 100  # beyond this a bar chart stops being readable; the title says what is kept


def breakdown_bars(df: pd.DataFrame, title: str,
                   limit: int = BREAKDOWN_ROWS) -> tuple[Figure, pd.DataFrame]:
    """Step time of each configuration stacked by cause, fastest first: all of them, or the
    fastest ``limit`` with the title saying so."""
    simulated = df[df["status"] == "ok"]
    ok = simulated.sort_values("step_time_s").head(limit)
    kept = (f"all {len(ok)} configurations" if len(ok) == len(simulated)
            else f"fastest {len(ok)} of {len(simulated)} configurations")
    fits = (ok["memory.fits"].astype(str) == "True").to_numpy()
    data = pd.DataFrame({"configuration": [config_label(r) + ("" if f else " (OOM)")
                                           for (_, r), f in zip(ok.iterrows(), fits,
                                                                strict=True)],
                         "fits": fits, **{c: ok[f"breakdown_s.{c}"].to_numpy() for c in CAUSES}})
    fig, ax = plt.subplots(figsize=(12, 0.3 * len(data) + 2.2))
    left = pd.Series(0.0, index=data.index)
    for cause in CAUSES:
        ax.barh(data["configuration"], data[cause], left=left, color=CAUSE_COLORS[cause],
                label=cause.replace("_", " "), hatch=["" if f else "//" for f in fits])
        left += data[cause]
    if "step_time_lo_s" in ok:  # sweep --samples: the 90% interval of each step
        low, high = ok["step_time_lo_s"].to_numpy(), ok["step_time_hi_s"].to_numpy()
        # drawn about the interval's middle: the bar's end (the breakdown's sum) can lie
        # outside the sampled interval, and a one-sided error cannot be negative
        ax.errorbar((low + high) / 2, data["configuration"], xerr=(high - low) / 2, fmt="none",
                    ecolor="black", capsize=3, linewidth=1, label="90% interval")
    ax.invert_yaxis()
    ax.margins(y=0.01)
    ax.set_xlabel("step time (s)")
    ax.set_title(f"Step time by cause — {title}\n{kept}, fastest first", fontsize="medium")
    handles, _ = ax.get_legend_handles_labels()
    if not fits.all():
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//",
                             label="does not fit in memory"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1),  # beside, not over
              fontsize="small")
    fig.tight_layout()
    return fig, data


def memory_by_stage(per_stage: list[dict], capacity: float, title: str) -> tuple[Figure,
                                                                                   pd.DataFrame]:
    """Peak memory of each pipeline stage stacked by component, against the GPU's capacity."""
    data = pd.DataFrame(per_stage)
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(data) + 4.5), 4.5))
    bottom = pd.Series(0.0, index=data.index)
    for part in PARTS:
        ax.bar(data["stage"], data[part] / GIB, bottom=bottom, color=PART_COLORS[part],
               label=part, width=0.6)
        bottom += data[part] / GIB
    ax.set_xticks(data["stage"])  # stages are whole numbers, one tick each
    ax.set_xlim(data["stage"].min() - 0.7, data["stage"].max() + 0.7)
    ax.set_ylim(0, 1.08 * max(capacity, data["peak_bytes"].max()) / GIB)
    ax.axhline(capacity / GIB, color="black", linestyle="--", label="GPU memory")
    over = data[data["peak_bytes"] > capacity]
    ax.scatter(over["stage"], over["peak_bytes"] / GIB, marker="x", color="red", zorder=3,
               label="out of memory" if len(over) else None)
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("peak memory per GPU (GiB)")
    ax.set_title("Memory per stage — " + title.replace(", ", "\n", 1), fontsize="medium")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the plot
    fig.tight_layout()
    return fig, data


def pipeline_gantt(spans: list, labels: dict[int, str], title: str) -> tuple[Figure,
                                                                             pd.DataFrame]:
    """One step of the engine's timeline: per rank a compute row (forward, backward or its
    input- and weight-gradient halves, optimizer) and a communication row (TP, CP, EP, DP,
    pipeline),
    idle time left blank. The legend lists the ops the timeline has."""
    ranks = sorted(labels)
    data = pd.DataFrame([{"rank": s.rank, "stream": s.stream, "name": s.name,
                          "start_s": s.start, "end_s": s.end, "op": _op(s)} for s in spans
                         if s.rank in labels and s.stream != "pp_recv"])
    fig, ax = plt.subplots(figsize=(12, 0.55 * len(ranks) + 1.6))
    ticks, names = [], []
    for i, rank in enumerate(ranks):
        mine = data[data["rank"] == rank]
        for j, row in enumerate(("compute", "comm")):
            y = 2.2 * i + 1.0 * j
            part = mine[(mine["stream"] == "compute") == (row == "compute")]
            for op, group in part.groupby("op"):
                ax.broken_barh(list(zip(group["start_s"], group["end_s"] - group["start_s"],
                                        strict=True)), (y, 0.85), color=OP_COLORS[op])
            ticks.append(y + 0.42)
            names.append(f"{labels[rank].split(' (')[0]} {row}")
    ax.set_yticks(ticks, names, fontsize="x-small")
    ax.invert_yaxis()
    ax.set_xlabel("time in the step (s)")
    ax.set_title(f"Pipeline timeline — {title}")
    shown = [op for op in OP_COLORS if op in set(data["op"])]
    fig.legend(handles=[Patch(color=OP_COLORS[op], label=op) for op in shown],
               fontsize="small", loc="lower center", ncols=max(1, len(shown)), frameon=False)
    fig.tight_layout(rect=(0, 0.06 if len(ranks) < 6 else 0.03, 1, 1))
    return fig, data


def _op(span) -> str:
    if span.stream == "compute":
        return {"F": "forward", "B": "backward", "I": "input grad",
                "W": "weight grad"}.get(span.name[:1], "optimizer")
    return span.stream if span.stream in ("tp", "cp", "ep", "dp") else "pp"


def scaling(df: pd.DataFrame, title: str) -> tuple[Figure, pd.DataFrame] | None:
    """Best throughput and MFU at each GPU count (needs at least two counts)."""
    ok = df[(df["status"] == "ok") & (df["memory.fits"].astype(str) == "True")]
    if ok["gpus"].nunique() < 2:
        return None
    best = ok.loc[ok.groupby("gpus")["tokens_per_s"].idxmax()].sort_values("gpus")
    data = best[["gpus", "tokens_per_s", "mfu"]].reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(data["gpus"], data["tokens_per_s"], "o-", label="best split")
    ideal = data["tokens_per_s"].iloc[0] * data["gpus"] / data["gpus"].iloc[0]
    ax.plot(data["gpus"], ideal, "--", color="gray", label="linear scaling")
    _gpu_axis(ax, data["gpus"])
    ax.set_ylabel("throughput (tokens/s)")
    ax.yaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
    mfu = ax.twinx()
    mfu.plot(data["gpus"], 100 * data["mfu"], "s:", color="#C44E52", label="MFU")
    mfu.set_ylabel("MFU (%)")
    # from zero on both axes: a fraction of a point must look like one
    ax.set_ylim(0, 1.15 * max(data["tokens_per_s"].max(), ideal.max()))
    mfu.set_ylim(0, 100)
    ax.set_title(f"Scaling — {title}")
    ax.legend(loc="upper left", fontsize="small")
    mfu.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    return fig, data


def pareto_front(df: pd.DataFrame, title: str) -> tuple[Figure, pd.DataFrame]:
    """Every configuration that fits: step time against GPUs — or, when the table holds one
    GPU count, against peak memory per GPU — with the Pareto-optimal ones joined and numbered.
    The numbers key into a legend below the plot: a configuration's label is ~50 characters,
    too long to sit beside its point without leaving the figure or covering its neighbour."""
    ok = df[(df["status"] == "ok") & (df["memory.fits"].astype(str) == "True")].copy()
    ok["configuration"] = [config_label(r) for _, r in ok.iterrows()]
    by_gpus = ok["gpus"].nunique() > 1
    ok["x"] = ok["gpus"] if by_gpus else ok["memory.peak_bytes"].astype(float) / GIB
    ok = ok.sort_values(["x", "step_time_s"])
    front = ok[ok["step_time_s"] < ok["step_time_s"].cummin().shift(fill_value=float("inf"))]
    data = ok[["configuration", "gpus", "memory.peak_bytes", "step_time_s"]].assign(
        pareto=ok.index.isin(front.index))
    fig, ax = plt.subplots(figsize=(7, 4.2 + 0.19 * (len(front) + 2)), layout="constrained")
    dots = ax.scatter(ok["x"], ok["step_time_s"], color="#C7C7C7", label="fits in memory")
    (line,) = ax.step(front["x"], front["step_time_s"], "o-", where="post", color="#4C72B0",
                      label="Pareto front")
    if by_gpus:
        _gpu_axis(ax, ok["gpus"])
    else:
        ax.set_xlabel("peak memory per GPU (GiB)")
    against = "GPUs" if by_gpus else "memory"
    ax.set_title(f"Step time against {against}\n{title}", fontsize="medium")
    ax.set_ylabel("step time (s)")
    ax.margins(x=0.08, y=0.12)  # room for each number beside its point, inside the axes
    numbers = [ax.annotate(str(i), (x, y), fontsize="small", color="#4C72B0",
                           xytext=_NUMBER_OFFSETS[0], textcoords="offset points")
               for i, (x, y) in enumerate(zip(front["x"], front["step_time_s"], strict=True),
                                          start=1)]
    _keep_apart(fig, ax, numbers, list(zip(ok["x"], ok["step_time_s"], strict=True)))
    key = [Line2D([], [], linestyle="none", label=f"{i}  {c}")
           for i, c in enumerate(front["configuration"], start=1)]
    fig.legend(handles=[dots, line, *key], loc="outside lower center", fontsize="small",
               handlelength=1.5)
    return fig, data


# Where a point's number may go, in points from the point: up-right first, then the other
# corners, then further out; the first that covers no other number and stays in the axes wins.
_NUMBER_OFFSETS = [(4, 4), (4, -12), (-10, 4), (-10, -12), (4, 14), (4, -22), (12, -4)]


def _keep_apart(fig: Figure, ax, labels: list, points: list[tuple[float, float]]) -> None:
    """Move each label to the first offset where it lies inside the axes and covers neither an
    earlier label nor a plotted point (Agg's text extents); one left with no such place keeps
    the first offset. The layout runs first, so the extents are those of the axes as drawn."""
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    radius = _MARKER_RADIUS_PT * fig.dpi / 72
    taken = [Bbox.from_extents(x - radius, y - radius, x + radius, y + radius)
             for x, y in ax.transData.transform(points)]
    for label in labels:
        for offset in _NUMBER_OFFSETS:
            label.set_position(offset)
            box = label.get_window_extent(renderer)
            if (inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0
                    and box.y1 <= inside.y1 and not any(box.overlaps(t) for t in taken)):
                break
        else:
            label.set_position(_NUMBER_OFFSETS[0])
        taken.append(label.get_window_extent(renderer))


_MARKER_RADIUS_PT = 3.0  # matplotlib's default scatter and line marker: 6 pt across


def _gpu_axis(ax, gpus: pd.Series) -> None:
    """GPU counts on a log2 axis, labelled with the counts themselves."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(int(g) for g in gpus)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("GPUs")


def save(fig: Figure, data: pd.DataFrame, folder: Path, name: str) -> list[Path]:
    """``name.png``, ``name.svg`` and ``name.csv`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.png", folder / f"{name}.svg", folder / f"{name}.csv"]
    fig.savefig(paths[0], dpi=120)
    fig.savefig(paths[1])
    plt.close(fig)
    data.to_csv(paths[2], index=False)
    return paths


def title_of(row: pd.Series | dict) -> str:
    """``llama3-70b on 512 × h100-sxm (dgx-h100)`` from a row's scenario."""
    s = json.loads(row["scenario"])
    cluster = s["cluster"]
    if "pools" in cluster:  # a cluster of pools: each pool's GPUs
        pools = " + ".join(f"{pool['gpus']} × {pool['gpu']['id']}" for pool in cluster["pools"])
        return f"{s['model'].get('name', 'model')} on {pools} ({cluster.get('name', 'pools')})"
    return f"{s['model'].get('name', 'model')} on {int(row['gpus'])} × {cluster['gpu']['id']} " \
           f"({cluster.get('preset', 'custom')})"


def sweep_title(df: pd.DataFrame, row: pd.Series | dict) -> str:
    """``title_of`` the row; without the GPU count when the table spans several."""
    title = title_of(row)
    if df["gpus"].nunique() == 1:
        return title
    return title.split(" on ")[0] + " on " + title.split(" × ")[1]
