"""Fit a calibration profile to microbenchmark measurements.

Each fitted quantity is the ratio the simulator's cost model needs, computed against the same
accounting the cost model uses, so that a calibrated prediction reproduces what was measured:

- matmul efficiency = FLOPs / (seconds x peak), per token count and GEMM size (forward and
  both backward products together, as the simulator prices backward at twice forward);
- memory efficiency = bytes the simulator charges for a layer's element-wise kernels and for
  the loss / (seconds x nominal bandwidth);
- optimizer efficiency = bytes charged for an AdamW step / (seconds x nominal bandwidth);
- per-tier alpha and beta: least squares, in relative error, of the all-reduce times (ring:
  ``2(n-1) alpha + 2(n-1)/n X beta``), the collective that tensor-parallel and gradient
  traffic use. All-gather (``(n-1) alpha + (n-1)/n X beta``), ping-pong send/recv
  (``2 alpha + 2 X beta``) and, on NCCL only, reduce-scatter (as all-gather) are measured and
  fitted too, for the record: one alpha-beta pair cannot match all of them on gloo, whose
  all-reduce pays about three times the latency of a send.
"""

from __future__ import annotations

import platform
from collections import defaultdict
from datetime import date

import numpy as np

from clustersim.simulator.model import elementwise as ew
from clustersim.simulator.model import workload as wl
from clustersim.topologies.collective_algorithms import ALL_GATHER_RING, ALL_REDUCE_RING
from clustersim.topologies.hardware import ClusterSpec
from clustersim.topologies.profile import Profile, profile_for_gpu


class CalibrationError(ValueError):
    """Measurements that no profile can express (e.g. faster than the nominal peak)."""


def matmul_tables(rows: list[dict], peak: float) -> tuple[list, list]:
    """(by-FLOPs table, per-token-count tables) of GEMM efficiency; FLOPs are one GEMM's
    forward, as the cost model asks for them."""
    gemms = [r for r in rows if r["kind"] == "gemm"]
    by_tokens: dict[int, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    overall: dict[float, list[float]] = defaultdict(list)
    for r in gemms:
        eff = _fraction(r["flops"] / (r["seconds"] * peak), "matmul", peak)
        forward = r["flops"] / 3
        by_tokens[r["tokens"]][forward].append(eff)
        overall[round(float(np.log10(forward)) * 2) / 2].append(eff)  # half-decade bins
    per_tokens = [[t, [[f, float(np.mean(e))] for f, e in sorted(table.items())]]
                  for t, table in sorted(by_tokens.items())]
    flat = [[10 ** b, float(np.median(e))] for b, e in sorted(overall.items())]
    return flat, per_tokens


def memory_efficiency(rows: list[dict], bandwidth: float, act: int) -> float:
    """Charged bytes over achieved seconds, for the layer's element-wise work (forward and its
    backward kernels, as the cost model charges them) and the loss (forward and backward)."""
    charged = seconds = 0.0
    for r in rows:
        if r["kind"] != "elementwise":
            continue
        if r["op"] == "cross_entropy":
            charged += 2 * ew.loss_bytes(r["tokens"], r["n"])
        else:
            charged += (ew.norm_activation_bytes(r["tokens"], r["k"], r["n"], act, "gelu")
                        + ew.norm_activation_backward_bytes(r["tokens"], r["k"], r["n"], act,
                                                            "gelu"))
        seconds += r["seconds"]
    return _fraction(charged / seconds / bandwidth, "memory", bandwidth)


def optimizer_efficiency(rows: list[dict], bandwidth: float, act: int) -> float:
    """AdamW charged ``w + 3 x 8 + w`` bytes per parameter (analytic.optimizer_time)."""
    steps = [r for r in rows if r["kind"] == "optimizer"]
    charged = sum(r["params"] * (2 * act + 24) for r in steps)
    return _fraction(charged / sum(r["seconds"] for r in steps) / bandwidth, "optimizer",
                     bandwidth)


# The ring NCCL (and gloo) runs each measured collective as, described once in
# topologies/collective_algorithms.py: its latency steps and the bytes each rank sends per byte
# of buffer, over one node's tier.
_RINGS = {"all_reduce": ALL_REDUCE_RING, "all_gather": ALL_GATHER_RING,
          "reduce_scatter": ALL_GATHER_RING}


def fit_alpha_beta(rows: list[dict], ops: tuple[str, ...] | None = None) -> tuple[float, float]:
    """(alpha seconds, bandwidth bytes/s) that best explain the times of ``ops`` (all)."""
    design, target = [], []
    for r in rows:
        if r["kind"] != "collective" or (ops is not None and r["op"] not in ops):
            continue
        n, nbytes = r["world"], r["bytes"]
        if r["op"] == "ping_pong":
            steps, volume = 2.0, 2.0 * nbytes
        else:
            ring = _RINGS[r["op"]]
            steps, volume = ring.steps(n, 1), ring.sent(n) * nbytes
        design.append([steps / r["seconds"], volume / r["seconds"]])  # relative error
        target.append(1.0)
    if not design:
        raise CalibrationError("no collectives measured (one rank): use --nproc 2 or more")
    (alpha, beta), *_ = np.linalg.lstsq(np.array(design), np.array(target), rcond=None)
    if alpha < 0:  # latency below resolution: fit bandwidth alone
        alpha = 0.0
        beta = float(np.sum(np.array(design)[:, 1])) / float(np.sum(np.array(design)[:, 1] ** 2))
    if beta <= 0:
        raise CalibrationError("collective times do not grow with message size")
    return float(alpha), 1.0 / float(beta)


def fit_profile(rows: list[dict], cluster: ClusterSpec, backend: str, nproc: int,
                raw_name: str, quick: bool = False) -> Profile:
    """The profile of the machine that produced ``rows``, against ``cluster``'s catalogue;
    ``quick``: measured by ``calibrate --quick`` (small shapes), and marked so."""
    gpu = cluster.gpu
    precision = "fp32" if backend == "gloo" else "bf16"
    act = wl.BYTES[precision]
    bandwidth = gpu.memory_bandwidth * 1e9
    flat, per_tokens = matmul_tables(rows, gpu.peak_flops[precision])
    shipped = profile_for_gpu(gpu.id)  # tiers this machine cannot measure keep their figures
    comm: dict = dict(shipped.comm_efficiency) if backend == "nccl" else {}
    latency: dict = dict(shipped.comm_latency_s) if backend == "nccl" else {}
    if any(r["kind"] == "collective" for r in rows):
        alpha, measured_bw = fit_alpha_beta(rows, ("all_reduce",))
        tiers = ("intra_node", "inter_node") if backend == "gloo" else ("intra_node",)
        for tier in tiers:  # gloo: every rank is on this machine, both tiers are loopback
            line = getattr(cluster, tier).bandwidth * 1e9
            comm[tier] = _fraction(measured_bw / line, f"{tier} bandwidth", line)
            latency[tier] = alpha
    where = platform.processor() or platform.machine()
    fits = "; ".join(f"{op} alpha {a * 1e6:.0f} us, {b / 1e9:.2f} GB/s" for op, (a, b) in
                     per_op_fits(rows).items())
    return Profile(
        name=f"{gpu.id}-calibrated", gpu=gpu.id, matmul_efficiency=flat,
        matmul_efficiency_by_tokens=per_tokens,
        memory_efficiency=memory_efficiency(rows, bandwidth, act),
        optimizer_efficiency=optimizer_efficiency(rows, bandwidth, act),
        comm_efficiency=comm, comm_latency_s=latency,
        # no microbenchmark runs compute beside a collective, nor times a layer's launches: a
        # GPU keeps its shipped figures (nothing overlaps for free; the host floors a layer);
        # a CPU's gloo ranks keep none (their host is the device)
        comm_compute_slowdown=shipped.comm_compute_slowdown if backend == "nccl" else 0.0,
        host_layer_s=shipped.host_layer_s if backend == "nccl" else (0.0, 0.0),
        quick=quick,
        source=(f"clustersim calibrate --backend {backend} --nproc {nproc}"
                f"{' --quick' if quick else ''} on {where} "
                f"({platform.node() or 'unknown host'}), {date.today().isoformat()}; "
                f"{precision}; raw measurements: {raw_name}; tier alpha-beta from all_reduce; "
                f"fits per collective: {fits or 'none (one rank)'}"))


def per_op_fits(rows: list[dict]) -> dict[str, tuple[float, float]]:
    """Each measured collective's own (alpha, bandwidth)."""
    ops = sorted({r["op"] for r in rows if r["kind"] == "collective"})
    return {op: fit_alpha_beta(rows, (op,)) for op in ops}


def _fraction(value: float, what: str, nominal: float) -> float:
    if value > 1.0:
        raise CalibrationError(
            f"measured {what} is {value:.2f}x the catalogue's nominal peak ({nominal:.3g}); "
            "raise the device's peak in topologies/gpus.yaml")
    return float(f"{value:.4g}")  # four significant figures, small fractions too
