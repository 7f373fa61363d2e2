"""Every plot of a sweep or plan table, written to one folder (``--plots DIR``, ``report``).

The breakdown, Pareto and scaling plots come from the table; the memory and Gantt plots re-run
the fastest configuration that fits through the engine, since a table row holds no timeline.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from clustersim.simulator.discrete_event.engine import Engine
from clustersim.simulator.inputs.scenario import Scenario, build_scenario
from clustersim.topologies.pools import cluster_pools
from clustersim.topologies.profile import Profile

from . import plots


def fastest_fitting(df: pd.DataFrame) -> pd.Series | None:
    """The fastest row that ran and fits, else the fastest that ran; None when no row ran
    (then the table has no result columns at all: every point was invalid)."""
    if "status" not in df or "step_time_s" not in df:
        return None
    ok = df[df["status"] == "ok"]
    if "memory.fits" in ok:
        fitting = ok[ok["memory.fits"].astype(str) == "True"]
        ok = fitting if not fitting.empty else ok
    return None if ok.empty else ok.sort_values("step_time_s").iloc[0]


def write_figures(df: pd.DataFrame, folder: Path) -> list[Path]:
    """All plots that the table supports; the paths of the PNGs written."""
    best = fastest_fitting(df)
    if best is None:
        return []
    title = plots.title_of(best)
    model_and_cluster = plots.sweep_title(df, best)
    written = []
    fig, data = plots.breakdown_bars(df, model_and_cluster)
    written.append(plots.save(fig, data, folder, "breakdown")[0])
    fig, data = plots.pareto_front(df, model_and_cluster)
    written.append(plots.save(fig, data, folder, "pareto")[0])
    scaling = plots.scaling(df, model_and_cluster)
    if scaling is not None:
        written.append(plots.save(*scaling, folder, "scaling")[0])
    engine = Engine(build_scenario(json.loads(best["scenario"])), record=True)
    result = engine.run()
    label = f"{title}, {plots.config_label(best)}"
    per_stage = result.to_json()["memory"]["per_stage"]
    fig, data = plots.memory_by_stage(per_stage, result.capacity_bytes, label)
    written.append(plots.save(fig, data, folder, "memory")[0])
    fig, data = plots.pipeline_gantt(engine.timeline.spans, engine.timeline.rank_labels, label)
    written.append(plots.save(fig, data, folder, "timeline")[0])
    return written


def write_timeline(scenario: Scenario, fidelity: str, profile: Profile | None,
                   path: Path) -> None:
    """The step's pipeline timeline as a picture (``simulate --timeline``): PNG, or SVG when
    ``path`` ends so; every micro-batch simulated, spans recorded."""
    engine = Engine(scenario, fidelity, profile, record=True)
    engine.run()
    p = scenario.parallel
    gpus = " + ".join(f"{c.gpus} × {c.gpu.id}" for c in cluster_pools(scenario.cluster))
    label = (f"{scenario.model.name} on {gpus}, "
             f"{p.schedule}" + (f"×{p.virtual_stages}" if p.virtual_stages > 1 else "")
             + f", pp {p.pp}, {scenario.microbatches} micro-batches")
    fig, _ = plots.pipeline_gantt(engine.timeline.spans, engine.timeline.rank_labels, label)
    fig.savefig(path, dpi=120)
    plots.plt.close(fig)
