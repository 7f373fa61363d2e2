"""``clustersim collective``: one collective alone on a cluster, over a range of sizes, printed
as nccl-tests prints it (size, time, algorithm and bus bandwidth), so a fabric can be checked
against ``all_reduce_perf`` / ``alltoall_perf`` output before a model runs on it."""

from __future__ import annotations

import argparse

from clustersim.errors import ScenarioError
from clustersim.fields import LIMIT_REASONS, MAX_BYTES

from .json_output import print_json

SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def add_collective(commands: argparse._SubParsersAction) -> None:
    from clustersim.topologies.collective_registry import COLLECTIVES

    cmd = commands.add_parser(
        "collective", help="time one collective alone, as nccl-tests does",
        description="Run one collective over the first N GPUs of a cluster, nothing else on "
                    "the fabric, for sizes from --min-bytes to --max-bytes, and print its time, "
                    "algorithm bandwidth and bus bandwidth as nccl-tests defines them.")
    cmd.add_argument("op", choices=list(COLLECTIVES),
                     help="the collective (nccl-tests: all_reduce_perf, all_gather_perf, "
                          "reduce_scatter_perf, alltoall_perf), or one registered with "
                          "collective_registry.register_collective")
    cmd.add_argument("--cluster", required=True, metavar="PRESET|FILE",
                     help="cluster preset, or a YAML file with a cluster section")
    cmd.add_argument("--gpus", type=int, required=True, metavar="N", help="GPUs taking part")
    cmd.add_argument("--min-bytes", default="1M", metavar="SIZE",
                     help="smallest size, e.g. 8, 64K, 1M, 8G (default 1M)")
    cmd.add_argument("--max-bytes", default="8G", metavar="SIZE", help="largest (default 8G)")
    cmd.add_argument("--factor", type=int, default=2, metavar="F",
                     help="size multiplier between rows (default 2)")
    cmd.add_argument("--fidelity", choices=["full", "representative"], default="full",
                     help="full (default): flows on the fabric; representative: closed forms")
    cmd.add_argument("--measured", metavar="LOG",
                     help="an nccl-tests output of this collective on the real cluster: its "
                          "sizes replace --min/--max-bytes, its bus bandwidth is printed beside "
                          "the prediction, and the fraction of the crossed tier's line rate "
                          "that reproduces its largest size is printed for the cluster file "
                          "(cluster.<tier>.efficiency)")
    cmd.add_argument("--json", action="store_true", help="print the rows as one JSON object")
    cmd.set_defaults(run=run_collective)


def parse_size(flag: str, text: str) -> int:
    """``8``, ``64K``, ``1M`` or ``8G`` (binary units, as nccl-tests reads -b and -e)."""
    text = str(text).strip().upper()
    unit = text[-1] if text and text[-1] in SIZE_UNITS else ""
    number = text[:-1] if unit else text
    if not number.isdigit() or int(number) <= 0:
        raise ScenarioError(flag, f"{text!r} is not a positive size (e.g. 8, 64K, 1M, 8G)")
    size = int(number) * SIZE_UNITS[unit]
    if size > MAX_BYTES:
        raise ScenarioError(flag, f"{text!r} must be at most {MAX_BYTES:,} bytes, "
                                  f"{LIMIT_REASONS[MAX_BYTES]}")
    return size


def sizes(args: argparse.Namespace) -> list[int]:
    low = parse_size("--min-bytes", args.min_bytes)
    high = parse_size("--max-bytes", args.max_bytes)
    if high < low:
        raise ScenarioError("--max-bytes", f"{args.max_bytes} is below --min-bytes")
    if args.factor < 2:
        raise ScenarioError("--factor", f"must be at least 2 (got {args.factor})")
    out = [low]
    while out[-1] * args.factor <= high:
        out.append(out[-1] * args.factor)
    return out


def run_collective(args: argparse.Namespace) -> int:
    from clustersim.reports.plan_request import section
    from clustersim.simulator.inputs.scenario import build_cluster
    from clustersim.simulator.network.bus_bandwidth import bus_factor, collective_seconds
    from clustersim.topologies.profile import profile_for_gpu

    if args.gpus < 2:
        raise ScenarioError("--gpus", f"a collective needs at least 2 GPUs (got {args.gpus})")
    measured = _measured(args.measured) if args.measured else None
    rows_sizes = sorted(measured) if measured else sizes(args)
    raw = section(args.cluster, "cluster")
    if "pools" in raw:
        raise ScenarioError("--cluster", "a cluster made of pools: give one pool's cluster")
    per_node = build_cluster(raw).gpus_per_node
    if args.gpus > per_node and args.gpus % per_node:
        raise ScenarioError("--gpus", f"{args.gpus} GPUs are not whole nodes of {per_node}")
    raw = {k: v for k, v in raw.items() if k != "nodes"}
    cluster = build_cluster({**raw, "gpus": max(args.gpus, per_node)})
    profile = profile_for_gpu(cluster.gpu.id)
    rows = []
    for nbytes in rows_sizes:
        seconds = collective_seconds(cluster, profile, args.op, args.gpus, nbytes, args.fidelity)
        algbw = nbytes / seconds / 1e9
        rows.append({"size_bytes": nbytes, "time_us": seconds * 1e6, "algbw_GBps": algbw,
                     "busbw_GBps": algbw * bus_factor(args.op, args.gpus)})
        if measured:
            rows[-1]["measured_busbw_GBps"] = measured[nbytes]
    fit = _fit(cluster, profile, args, measured) if measured else None
    if args.json:
        print_json({"op": args.op, "gpus": args.gpus, "cluster": args.cluster,
                    "fidelity": args.fidelity, "rows": rows,
                    **({"measured_fit": fit} if fit else {})})
        return 0
    print(f"# {args.op} over {args.gpus} x {cluster.gpu.id} ({args.cluster}, "
          f"{cluster.gpus_per_node} per node), {args.fidelity} fidelity, profile {profile.name}")
    extra = f" {'measured busbw':>14s}" if measured else ""
    print(f"# {'size (B)':>14s} {'time (us)':>12s} {'algbw (GB/s)':>13s} {'busbw (GB/s)':>13s}"
          + extra)
    for row in rows:
        extra = f" {row['measured_busbw_GBps']:14.2f}" if measured else ""
        print(f"  {row['size_bytes']:14d} {row['time_us']:12.1f} {row['algbw_GBps']:13.2f} "
              f"{row['busbw_GBps']:13.2f}" + extra)
    if fit:
        print(_fit_line(fit))
    return 0


def _measured(path: str) -> dict[int, float]:
    """The nccl-tests log's bus bandwidth by size; one error line where it cannot be read."""
    from pathlib import Path

    from clustersim.simulator.network.nccl_log import measured_busbw

    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ScenarioError("--measured", f"cannot read {path}: {exc.strerror}") from None
    return measured_busbw(text)


def _fit(cluster, profile, args: argparse.Namespace, measured: dict[int, float]) -> dict:
    """What fraction of the crossed tier's line rate reproduces the largest measured size."""
    from clustersim.simulator.network.nccl_log import crossed_tier, fitted_efficiency
    from clustersim.topologies.network import tier_efficiency

    nbytes = max(measured)
    tier = crossed_tier(cluster, args.gpus)
    link = getattr(cluster, tier)
    return {"tier": tier, "size_bytes": nbytes, "measured_busbw_GBps": measured[nbytes],
            "line_rate_GBps": link.bandwidth,
            "efficiency_in_use": tier_efficiency(profile, tier, link),
            "efficiency": fitted_efficiency(cluster, profile, args.op, args.gpus, nbytes,
                                            measured[nbytes], args.fidelity)}


def _fit_line(fit: dict) -> str:
    head = (f"# {fit['tier']}: measured {fit['measured_busbw_GBps']:.2f} GB/s at "
            f"{fit['size_bytes']} B; in use {fit['efficiency_in_use']:.3f} of the "
            f"{fit['line_rate_GBps']:g} GB/s line rate")
    if fit["efficiency"] is None:
        return (head + "; no fraction up to 1 reproduces it: check the cluster's line rate "
                       "and the GPU count")
    return (head + f"; {fit['efficiency']:.3f} reproduces it: set cluster.{fit['tier']}."
                   f"efficiency: {fit['efficiency']:.3f}")
