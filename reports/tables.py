"""Readable terminal tables (rich) for simulation results, a sweep's summary and the preset
catalogue."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from clustersim.simulator.costs.result import StepResult
from clustersim.simulator.costs.stage_breakdown import COMM_KINDS, bottleneck
from clustersim.simulator.inputs.presets import PRESET_METADATA, model_presets
from clustersim.simulator.inputs.scenario import Scenario, build_cluster
from clustersim.simulator.inputs.specs import ModelSpec
from clustersim.simulator.model.param_counts import total_params
from clustersim.simulator.pipeline.stages import stage_layers
from clustersim.topologies.hardware import cluster_presets, gpu_presets
from clustersim.topologies.pools import cluster_label
from clustersim.topologies.profile import profile_for_gpu

if TYPE_CHECKING:
    import pandas as pd

GIB = 2**30


# Width of tables written to a pipe or file (rich assumes 80 columns there): the widest presets
# table, GPUs with their profile's basis, fits on one line per row at this width.
PIPE_WIDTH = 160


def _console() -> Console:
    return Console(soft_wrap=False)


def print_result(s: Scenario, r: StepResult) -> None:
    """Summary, step-time breakdown and per-stage memory of one simulation."""
    console = _console()
    p = s.parallel
    console.print(f"[bold]{s.name}[/bold]: {s.model.name} ({total_params(s.model) / 1e9:.1f}B) "
                  f"on {cluster_label(s.cluster)}")
    folded = f" expert_tp={p.etp}" if p.folded else ""
    console.print(f"  split: tp={p.tp} pp={p.pp} dp={p.dp} cp={p.cp} ep={p.ep}{folded}, "
                  f"zero={p.zero}"
                  f"{', sequence parallel' if p.sequence_parallel else ''}")
    console.print(f"  schedule: {p.schedule}"
                  f"{f' ({p.virtual_stages} chunks per stage)' if p.virtual_stages > 1 else ''}"
                  f", recompute: {p.recompute}")
    if p.stage_pools is not None:
        console.print(f"  stages on pools {p.stage_pools}, layers {stage_layers(s)}")
    console.print(f"  {s.microbatches} micro-batches of {s.training.micro_batch} x "
                  f"{s.model.seq_len} tokens per pipeline per step")
    console.print(_summary_table(r))
    console.print(_breakdown_table(r))
    if r.stages:
        console.print(_stage_table(r))
        console.print(f"[bold]Bottleneck:[/bold] {bottleneck(r.stages).sentence()}")
    console.print(_traffic_table(r))
    console.print(_memory_table(r))


def _summary_table(r: StepResult) -> Table:
    table = Table(title=f"Step ({r.fidelity})", show_header=False, title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("step time", f"{r.step_time_s:.3f} s")
    table.add_row("tokens/s", f"{r.tokens_per_s:,.0f}")
    table.add_row("model TFLOP/s per GPU", f"{r.model_tflops_per_gpu:.1f}")
    table.add_row("hardware TFLOP/s per GPU", f"{r.hardware_tflops_per_gpu:.1f}")
    table.add_row("MFU", f"{100 * r.mfu:.1f}%")
    if r.time_to_train_s is not None:
        table.add_row("time to train", f"{r.time_to_train_s / 86400:.2f} days")
    return table


def _breakdown_table(r: StepResult) -> Table:
    table = Table(title="Breakdown (slowest rank)", title_justify="left")
    table.add_column("part")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for part, seconds in r.breakdown.as_dict().items():
        table.add_row(part.replace("_", " "), f"{seconds:.3f}",
                      f"{100 * seconds / r.step_time_s:.1f}%")
    return table


def _stage_table(r: StepResult) -> Table:
    """Seconds per stage by cause, exposed communication by kind (the kinds any stage has);
    consecutive stages with the same numbers share a row (``1-12``), to keep it compact."""
    kinds = [k for k in COMM_KINDS if any(b.comm[k] > 0 for b in r.stages)]
    table = Table(title="Breakdown per stage, seconds (exposed comm by group)",
                  title_justify="left")
    for column in ("stage", "compute", *kinds, "bubble", "optimizer", "busy"):
        table.add_column(column, justify="right")
    rows: list[tuple[int, int, list[str]]] = []  # first stage, last stage, cells
    for b in r.stages:
        cells = [f"{x:.3f}" for x in (b.compute, *(b.comm[k] for k in kinds), b.bubble,
                                      b.optimizer, b.busy)]
        if rows and rows[-1][2] == cells:
            rows[-1] = (rows[-1][0], b.stage, cells)
        else:
            rows.append((b.stage, b.stage, cells))
    for first, last, cells in rows:
        table.add_row(str(first) if first == last else f"{first}-{last}", *cells)
    return table


def _traffic_table(r: StepResult) -> Table:
    """Bytes sent per GPU per step by group (``traffic_bytes``), the groups that send any."""
    table = Table(title="Traffic sent per GPU per step (busiest stage)", title_justify="left",
                  min_width=46)
    table.add_column("group")
    table.add_column("GB", justify="right")
    for group, nbytes in r.extras.get("traffic_bytes", {}).items():
        if nbytes > 0:
            table.add_row(group, f"{nbytes / 1e9:,.2f}")
    return table


def _memory_table(r: StepResult) -> Table:
    verdict = "[green]fits[/green]" if r.fits else "[red]OUT OF MEMORY[/red]"
    pooled = any(st.pool is not None for st in r.per_stage)
    stepped = any(st.optimizer_step > 0 for st in r.per_stage)  # a foreach optimizer's temporaries
    capacity = "each pool's GPU" if pooled else f"{r.capacity_bytes / GIB:.1f}"
    table = Table(title=f"Peak memory per stage, GiB (capacity {capacity}): {verdict}",
                  title_justify="left")
    columns = ("stage", *(("pool", "capacity") if pooled else ()), "params", "grads",
               "optimizer", "activations", *(("step",) if stepped else ()),
               "buffers", "peak")
    for column in columns:
        table.add_column(column, justify="right")
    for st in r.per_stage:
        style = None if st.peak_bytes <= r.stage_capacity(st) else "red"
        pool = (str(st.pool), f"{r.stage_capacity(st) / GIB:.1f}") if pooled else ()
        parts = (st.params, st.grads, st.optimizer, st.activations,
                 *((st.optimizer_step,) if stepped else ()), st.buffers, st.peak_bytes)
        table.add_row(str(st.stage), *pool, *(f"{x / GIB:.2f}" for x in parts), style=style)
    if stepped:
        table.caption = ("step: what a foreach optimizer step holds beyond the states; peak: the "
                         "states and buffers plus the larger of activations and step")
    return table


def preset_rows() -> dict[str, list[dict]]:
    """The catalogue as plain rows: models, GPUs and clusters."""
    models = []
    for name, entry in model_presets().items():
        spec = ModelSpec.model_validate({k: v for k, v in entry.items()
                                         if k not in PRESET_METADATA})
        models.append({"name": name, "params": total_params(spec), "layers": spec.layers,
                       "hidden": spec.hidden, "heads": spec.heads, "kv_heads": spec.kv_heads,
                       "experts": spec.experts, "seq_len": spec.seq_len,
                       "source": entry.get("source", "")})
    gpus = [{"name": name, "bf16_tflops": e["peak_flops"]["bf16"] / 1e12,
             "fp8_tflops": e["peak_flops"].get("fp8", 0.0) / 1e12,
             "memory_bytes": e["memory_bytes"], "memory_bandwidth_gbps": e["memory_bandwidth"],
             "profile": profile_for_gpu(name).basis(name)}
            for name, e in gpu_presets().items()]
    clusters = []
    for name in cluster_presets():
        c = build_cluster({"preset": name})
        clusters.append({"name": name, "gpu": c.gpu.id, "gpus_per_node": c.gpus_per_node,
                         "intra_node_gbps": c.intra_node.bandwidth,
                         "inter_node_gbps": c.inter_node.bandwidth,
                         "spine_gbps": c.spine.bandwidth if c.spine else None})
    return {"models": models, "gpus": gpus, "clusters": clusters}


def print_presets() -> None:
    """Three tables: models, GPUs, clusters."""
    rows = preset_rows()
    console = _console()
    if not console.is_terminal:  # a pipe or file: 80 columns would cut names to "deepseek-…"
        console.width = max(console.width, PIPE_WIDTH)
    models = Table(title="Models", title_justify="left")
    for col in ("name", "params", "layers", "hidden", "heads", "kv", "experts", "seq"):
        models.add_column(col, justify="left" if col == "name" else "right",
                          no_wrap=col == "name")  # a name is looked up whole: never folded
    for m in rows["models"]:
        models.add_row(m["name"], f"{m['params'] / 1e9:.2f}B", str(m["layers"]), str(m["hidden"]),
                       str(m["heads"]), str(m["kv_heads"]), str(m["experts"]), str(m["seq_len"]))
    gpus = Table(title="GPUs", title_justify="left")
    for col in ("name", "bf16 TFLOP/s", "fp8", "memory GiB", "HBM GB/s", "profile"):
        gpus.add_column(col, justify="left" if col in ("name", "profile") else "right",
                        no_wrap=col == "name")
    for g in rows["gpus"]:
        gpus.add_row(g["name"], f"{g['bf16_tflops']:.0f}",
                     f"{g['fp8_tflops']:.0f}" if g["fp8_tflops"] else "-",
                     f"{g['memory_bytes'] / GIB:.1f}", f"{g['memory_bandwidth_gbps']:.0f}",
                     g["profile"])
    clusters = Table(title="Clusters (GB/s per GPU per direction)", title_justify="left")
    for col in ("name", "gpu", "gpus/node", "intra-node", "inter-node", "spine"):
        clusters.add_column(col, justify="left" if col in ("name", "gpu") else "right",
                            no_wrap=col in ("name", "gpu"))
    for c in rows["clusters"]:
        clusters.add_row(c["name"], c["gpu"], str(c["gpus_per_node"]), f"{c['intra_node_gbps']:g}",
                         f"{c['inter_node_gbps']:g}",
                         "-" if c["spine_gbps"] is None else f"{c['spine_gbps']:.2f}")
    for table in (models, gpus, clusters):
        console.print(table)


def print_sweep_summary(df: pd.DataFrame, top: int) -> None:
    """The fastest configurations that fit, then what was invalid or failed, and why."""
    from .labels import config_label

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
