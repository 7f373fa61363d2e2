"""``clustersim plan``: the fastest splits of a model on N GPUs, printed, as JSON, or plotted."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress
from rich.table import Table

from clustersim.errors import ScenarioError
from clustersim.yamlio import load_yaml_file

from .paths import check_folder_output
from .plan import Plan, PlanRequest, plan
from .plots import config_label
from .sweep import flatten, split_columns

TOKENS_PER_STEP = 4 * 2**20  # default global batch: about 4M tokens, as Llama-scale runs use
DAY = 86400


def add_plan(commands: argparse._SubParsersAction) -> None:
    cmd = commands.add_parser(
        "plan", help="find the fastest splits of a model on N GPUs that fit in memory",
        description="Search every valid split (tp, pp, dp, cp, ep, micro-batch, schedule, "
                    "virtual stages, ZeRO stage, recomputation; sequence parallelism with tp) "
                    "and print the fastest that fit, with time and GPU-hours to train.")
    cmd.add_argument("--model", required=True, metavar="PRESET|FILE",
                     help="model preset, or a YAML file with a model section (or a scenario)")
    cmd.add_argument("--cluster", required=True, metavar="PRESET|FILE",
                     help="cluster preset, or a YAML file with a cluster section")
    cmd.add_argument("--gpus", required=True, type=int, metavar="N", help="GPUs to plan for")
    cmd.add_argument("--tokens", type=float, metavar="T",
                     help="tokens to train on (e.g. 15e12), for time and GPU-hours")
    cmd.add_argument("--global-batch", type=int, metavar="SEQUENCES",
                     help="sequences per step (default: about 4M tokens, a power of two)")
    cmd.add_argument("--seq-len", type=int, metavar="TOKENS", help="override the sequence length")
    cmd.add_argument("--top", type=int, default=5, metavar="K", help="plans to print (default 5)")
    cmd.add_argument("--memory-reserve", type=float, default=0.05, metavar="FRACTION",
                     help="GPU memory to keep free for the allocator and CUDA context "
                          "(default 0.05)")
    cmd.add_argument("--mtbf-hours", type=float, metavar="HOURS",
                     help="mean time between failures of one GPU (with its share of the node); "
                          "gives the optimal checkpoint interval and expected wall time")
    cmd.add_argument("--checkpoint-write-s", type=float, default=60.0, metavar="S",
                     help="seconds to write a checkpoint (default 60)")
    cmd.add_argument("--checkpoint-restore-s", type=float, default=300.0, metavar="S",
                     help="seconds to restart from one (default 300)")
    cmd.add_argument("--gpu-hour-price", type=float, metavar="USD", help="price of a GPU-hour")
    cmd.add_argument("--json", action="store_true", help="print the plans as one JSON array")
    cmd.add_argument("--plots", metavar="DIR", help="write plots of the plans (PNG, SVG, CSV)")
    cmd.set_defaults(run=run_plan_command)


def _section(value: str, key: str) -> dict:
    """A preset name, or the ``key`` section of a YAML file (or the file itself)."""
    path = Path(value)
    if not path.exists():
        return {"preset": value}
    data = load_yaml_file(path)
    if not isinstance(data, dict):
        raise ScenarioError(f"--{key}", f"{value!r} is not a YAML mapping")
    section = data.get(key, data)
    if not isinstance(section, dict):
        raise ScenarioError(f"--{key}", f"{value!r} has no {key} mapping")
    return section


def request_from(args: argparse.Namespace) -> PlanRequest:
    for flag in ("gpus", "top"):
        if getattr(args, flag) < 1:
            raise ScenarioError(f"--{flag}", f"must be at least 1 (got {getattr(args, flag)})")
    for flag in ("tokens", "mtbf_hours", "checkpoint_write_s", "checkpoint_restore_s",
                 "gpu_hour_price", "global_batch", "seq_len"):
        value = getattr(args, flag)
        if value is not None and value <= 0 and not (flag.startswith("checkpoint") and value == 0):
            raise ScenarioError("--" + flag.replace("_", "-"), f"must be positive (got {value})")
    if not 0 <= args.memory_reserve < 1:
        raise ScenarioError("--memory-reserve", "must be a fraction in [0, 1)")
    model = _section(args.model, "model")
    if args.seq_len:
        model = {**model, "seq_len": args.seq_len}
    cluster = {**_section(args.cluster, "cluster"), "gpus": args.gpus}
    cluster.pop("nodes", None)
    batch = args.global_batch or _default_batch(model, cluster)
    return PlanRequest(model, cluster, batch, tokens=args.tokens, mtbf_hours=args.mtbf_hours,
                       checkpoint_write_s=args.checkpoint_write_s,
                       checkpoint_restore_s=args.checkpoint_restore_s,
                       gpu_hour_price=args.gpu_hour_price, memory_reserve=args.memory_reserve)


def _default_batch(model: dict, cluster: dict) -> int:
    from clustersim.simulator.scenario import build_scenario
    seq = build_scenario({"model": model, "cluster": {**cluster, "gpus": 1},
                          "training": {"global_batch": 1}}).model.seq_len
    return 2 ** max(0, round(math.log2(TOKENS_PER_STEP / seq)))


def run_plan_command(args: argparse.Namespace) -> int:
    req = request_from(args)
    if args.plots:
        check_folder_output("--plots", args.plots)
    stderr = Console(stderr=True)
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), console=stderr, disable=not stderr.is_terminal) as bar:
        task = bar.add_task("estimating splits", total=None)
        plans, valid, fitting = plan(req, args.top,
                                     lambda done, total: bar.update(task, completed=done,
                                                                    total=total))
    if args.json:
        print(json.dumps([p.as_dict(req.gpu_hour_price) for p in plans], indent=2))
    else:
        print_plans(req, plans, valid, fitting)
    if args.plots and plans:
        from .figures import write_figures
        for path in write_figures(plans_table(plans), Path(args.plots)):
            print(f"wrote {path}")
    return 0


def plans_table(plans: list[Plan]) -> pd.DataFrame:
    """The plans as sweep-style rows, so the sweep's plots apply."""
    return pd.DataFrame([{"point": p.scenario.name, "status": "ok", "error": "",
                          **split_columns(p.scenario), "scenario": json.dumps(p.scenario.as_dict()),
                          **flatten(p.result.to_json())} for p in plans])


def print_plans(req: PlanRequest, plans: list[Plan], valid: int, fitting: int) -> None:
    console = Console(soft_wrap=False)
    if not console.is_terminal:
        console.width = max(console.width, 180)  # a file or pipe: never fold the table
    if not plans:
        console.print(f"No split fits: {valid} valid splits, none within memory "
                      f"(reserve {req.memory_reserve:.0%}). Try more GPUs or a smaller batch.")
        return
    s = plans[0].scenario
    console.print(f"[bold]{s.model.name}[/bold] on {s.cluster.gpus} x {s.cluster.gpu.id} "
                  f"({s.cluster.name}), global batch {req.global_batch} x {s.model.seq_len} "
                  f"tokens: {valid} valid splits, {fitting} fit; the engine ranked the best")
    table = Table()
    columns = ["#", "split", "step s", "MFU", "free GiB"]
    if req.tokens:
        columns += ["train days", "GPU-hours"] + (["cost $"] if req.gpu_hour_price else [])
    if plans[0].checkpoint:
        columns += ["checkpoint", "wall days", "goodput"]
    for c in columns:
        table.add_column(c, justify="left" if c == "split" else "right")
    for i, p in enumerate(plans, 1):
        r = p.result
        row = [str(i), config_label(split_columns(p.scenario)), f"{r.step_time_s:.3f}",
               f"{r.mfu:.1%}",
               f"{p.headroom_bytes / 2**30:.1f}"]
        if req.tokens:
            row += [f"{r.time_to_train_s / DAY:.1f}", f"{p.gpu_hours:,.0f}"]
            if req.gpu_hour_price:
                row.append(f"{p.gpu_hours * req.gpu_hour_price:,.0f}")
        if p.checkpoint:
            c = p.checkpoint
            row += [f"every {c.interval_s / 60:.0f} min", f"{c.expected_wall_time_s / DAY:.1f}",
                    f"{c.goodput:.1%}"]
        table.add_row(*row)
    console.print(table)
