"""The planner's terminal table (the plans ranked, with their time to train, checkpointing and
caveats), the plans as a sweep-style table for the sweep's plots, and the line that says why
nothing fits: what ``clustersim plan`` prints (``clustersim/cli/plan.py``)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .plan import Plan, PlanRequest
from .pool_plan import stages_label

if TYPE_CHECKING:
    import pandas as pd

# pandas and rich are imported inside the functions that use them (issue 12).

DAY = 86400
CAVEATS_LEGEND = (
    "uncertain: features whose cost the model cannot yet vouch for (tp-overlap: TP collectives\n"
    "hidden behind GEMMs; split-bwd: a zero-bubble or DualPipe split backward; fp8; a2a-overlap:\n"
    "combined 1F1B's paired all-to-alls), with the same split's step without each; ! marks a\n"
    "plan that rests on it (without it the split would rank below the next plan, or not run):\n"
    "docs/planner.md, \"Caveats\".")


def nothing_fits(req: PlanRequest, valid: int) -> str:
    """Why a search found no plan, and what to change."""
    return (f"No split fits: {valid} valid splits, none within memory "
            f"(reserve {req.memory_reserve:.0%}). Try more GPUs or a smaller batch.")


def plans_table(plans: list[Plan]) -> pd.DataFrame:
    """The plans as sweep-style rows, so the sweep's plots apply."""
    import pandas as pd

    from .labels import split_columns
    from .sweep import flatten

    return pd.DataFrame([{"point": p.scenario.name, "status": "ok", "error": "",
                          **split_columns(p.scenario), "scenario": json.dumps(p.scenario.as_dict()),
                          **flatten(p.result.to_json())} for p in plans])


def print_plans(req: PlanRequest, plans: list[Plan], valid: int, fitting: int) -> None:
    """The plans ranked as one terminal table, never folded when written to a pipe or file."""
    from rich.console import Console
    from rich.table import Table

    from clustersim.topologies.pools import cluster_label

    from .labels import config_label, split_columns

    console = Console(soft_wrap=False)
    if not console.is_terminal:
        console.width = max(console.width, 230)  # a file or pipe: never fold the table
    if not plans:
        console.print(nothing_fits(req, valid))
        return
    s = plans[0].scenario
    console.print(f"[bold]{s.model.name}[/bold] on {cluster_label(s.cluster)}, "
                  f"global batch {req.global_batch} x {s.model.seq_len} "
                  f"tokens: {valid} valid splits, {fitting} fit; the engine ranked the best"
                  + (f" (profile {req.profile.name})" if req.profile else ""))
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
