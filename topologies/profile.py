"""Calibration profiles: how much of the catalogue's peaks real kernels and collectives reach.

A profile is JSON (``profiles/*.json``), written by hand from published measurements or by
``clustersim calibrate``. Compute time of a matmul is ``flops / (peak * efficiency(flops))``
with the efficiency interpolated in log10(FLOPs) from a ``[[flops, efficiency], ...]`` table, or,
where a calibration measured it, also in log10(tokens) between per-token-count tables
(``matmul_efficiency_by_tokens``: a GEMM with few rows runs further from peak at equal FLOPs);
memory-bound kernels reach ``memory_efficiency`` of HBM bandwidth and the optimizer step
``optimizer_efficiency`` (its own figure where measured); each link tier reaches
``comm_efficiency[tier]`` of its line rate, and a calibrated profile may replace the cluster's
per-message latency of a tier with the alpha it measured (``comm_latency_s``).

A profile with a ``gemm`` block costs each GEMM by its shape instead of the FLOPs curve
(``simulator/model/kernels.py``: ``ceiling`` times tile/wave quantisation over the GPU's SMs,
roofline on HBM, plus ``kernel_overhead_s``); ``attention_efficiency`` is the fraction of peak
that fused (flash) attention reaches on the work it executes; ``comm_compute_slowdown`` is the
fraction of compute throughput lost while a NCCL kernel runs beside it (SMs taken by communication,
Calculon's ``processor_usage``).
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from clustersim.errors import ScenarioError, from_validation_error
from clustersim.fields import Fraction, NonNegativeFloat, PositiveFloat, PositiveInt
from clustersim.yamlio import read_text_file

from .hardware import ClusterSpec
from .pools import PooledCluster, cluster_pools, is_pooled

_TIERS = ("intra_node", "inter_node", "spine")
ANY_GPU = "any"  # the ``gpu`` of default.json: generic figures, for GPUs without a profile
FORCE_FLAG = "--force-profile"  # the flag that applies a profile to another device anyway
# The attention family measured on every GPU (FlashAttention-2's paper covers A100 and H100):
# what a family without figures of its own on a GPU runs at.
FALLBACK_KERNEL = "flash2"
# The figures a profile may give a spread for (``uncertainty``; ``topologies/uncertainty.py``).
UNCERTAIN = ("gemm.ceiling", "matmul_efficiency", "attention_efficiency", "memory_efficiency",
             "optimizer_efficiency", *(f"comm_efficiency.{tier}" for tier in _TIERS))
Slowdown = Annotated[NonNegativeFloat, Field(lt=1)]  # 1 would stall compute for good
EfficiencyCurve = list[tuple[PositiveFloat, Fraction]]  # (GEMM FLOPs, fraction of peak) rows


class GemmModel(BaseModel):
    """Shape-based GEMM efficiency: large-GEMM ceiling and the tiles cuBLAS chooses among."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ceiling: Fraction
    # A tile's prologue and epilogue (filling the pipeline, writing the result) cost about as
    # much as this many extra steps of the reduction: short-k GEMMs run further from peak
    # (fitted on our own sweeps with ``fixed_s``: validation/sweeps.py).
    k_overhead: NonNegativeFloat = 0.0
    tiles: list[tuple[PositiveInt, PositiveInt]] = [(128, 256), (256, 128), (128, 128)]
    # Large FP8 GEMMs' fraction of the FP8 peak, where measured; None: as ``ceiling``.
    fp8_ceiling: Fraction | None = None
    # GPU seconds every GEMM kernel takes besides its FLOPs (filling and draining its waves,
    # its epilogue, the gap before the next kernel): GEMMs of tens of microseconds, as small
    # models and wide tensor parallelism run, take 15-20% longer than their FLOPs say.
    fixed_s: NonNegativeFloat = 0.0


class Profile(BaseModel):
    """Achieved fractions of peak for compute, memory and each link tier."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    gpu: str
    matmul_efficiency: EfficiencyCurve = []  # legacy curve: needed without gemm
    matmul_efficiency_by_tokens: list[tuple[PositiveInt, EfficiencyCurve]] = []
    memory_efficiency: Fraction
    optimizer_efficiency: Fraction | None = None  # None: as memory_efficiency
    comm_efficiency: dict[str, Fraction]
    comm_latency_s: dict[str, NonNegativeFloat] = {}  # measured alpha per tier, if calibrated
    kernel_overhead_s: NonNegativeFloat = 0.0  # launch/sync cost per kernel (fused layers: once)
    # The host's time to issue one transformer layer's (forward, backward) in eager PyTorch:
    # each of its ~15 and ~45 GPU operations costs ~40 us of Python, autograd and launch, and
    # a layer whose kernels are shorter waits for the host (measured; derive_profiles.py).
    host_layer_s: tuple[NonNegativeFloat, NonNegativeFloat] = (0.0, 0.0)
    # Host work once per step outside the kernels (data loading, the loss and gradient-norm
    # synchronisations, logging, launching the optimizer); fitted, end-to-end.
    step_overhead_s: NonNegativeFloat = 0.0
    gemm: GemmModel | None = None  # shape-based GEMM costs; None: the FLOPs curve above
    attention_efficiency: Fraction | None = None  # fused attention; None: as a GEMM of its FLOPs
    # Fused attention's backward, of peak, on the FLOPs it executes; None: as its forward.
    attention_backward_efficiency: Fraction | None = None
    # (forward, backward) fractions by kernel family (``training.attention_kernel``), where
    # measured; a family not listed runs flash2's, the family every GPU's figures include,
    # and a profile listing none at the two fields above.
    attention_by_kernel: dict[str, tuple[Fraction, Fraction]] = {}
    # A fused causal attention kernel's work that does not grow with the keys a query row
    # attends over (each tile's start and end, the masked diagonal), as that many keys,
    # (forward, backward): over L keys the fractions above become theirs x L / (L + this),
    # so they are what long sequences reach (measured; validation/sweeps.py).
    attention_overhead_tokens: tuple[NonNegativeFloat, NonNegativeFloat] = (0.0, 0.0)
    # The same by kernel family, beside ``attention_by_kernel``; a family not listed: as above.
    attention_overhead_by_kernel: dict[str, tuple[NonNegativeFloat, NonNegativeFloat]] = {}
    # What kernels keep of their isolated speed inside a training step (sustained clocks under
    # a whole step's power draw, caches cold between kernels); fitted, end-to-end.
    sustained_fraction: Fraction = 1.0
    comm_compute_slowdown: Slowdown = 0.0  # compute throughput lost beside a NCCL kernel
    # How sure each fitted or measured figure is: parameter (``UNCERTAIN``) -> the sigma of a
    # lognormal factor around it (0.05: about +/-5%); ``simulate --samples`` draws from it.
    uncertainty: dict[str, PositiveFloat] = {}
    source: str = ""
    # The profile whose fitted figures this one reuses, when it was not measured on its own GPU,
    # and what was measured on its own GPU all the same (kernels.yaml: "matmul", "attention").
    derived_from: str | None = None
    measured_here: list[str] = []
    # Published tables (ids: file names under tests/data) whose figures fitted this profile:
    # comparing it with them is fitting, not validation (validation/published.py refuses to).
    fitted_on: list[str] = []
    # Written by ``calibrate --quick``: small shapes only, a smoke test of the harness and not
    # a usable calibration, so ``validate`` never picks it by default (only when named).
    quick: bool = False

    @field_validator("matmul_efficiency")
    @classmethod
    def _sorted_table(cls, table: list[tuple[float, float]]) -> list[tuple[float, float]]:
        return _checked_table(table) if table else table

    @model_validator(mode="after")
    def _has_gemm_costs(self) -> Profile:
        if not self.matmul_efficiency and self.gemm is None:
            raise ValueError("needs matmul_efficiency (a [flops, efficiency] table) or gemm")
        return self

    @field_validator("matmul_efficiency_by_tokens")
    @classmethod
    def _sorted_token_rows(cls, rows: list) -> list:
        tokens = [row[0] for row in rows]
        if tokens != sorted(set(tokens)):
            raise ValueError("rows must have increasing token counts")
        for _, table in rows:
            _checked_table(table)
        return rows

    @field_validator("uncertainty")
    @classmethod
    def _known_parameters(cls, table: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(table) - set(UNCERTAIN))
        if unknown:
            raise ValueError(f"unknown parameter {unknown[0]!r} (allowed: {', '.join(UNCERTAIN)})")
        return table

    @field_validator("comm_efficiency", "comm_latency_s")
    @classmethod
    def _known_tiers(cls, table: dict[str, float], info) -> dict[str, float]:
        # comm_efficiency may also say what NVLink SHARP all-reduce achieves ("nvls")
        allowed = (*_TIERS, "nvls") if info.field_name == "comm_efficiency" else _TIERS
        unknown = set(table) - set(allowed)
        if unknown:
            raise ValueError(f"unknown tier {sorted(unknown)[0]!r} (allowed: {', '.join(allowed)})")
        return table

    def attention_fractions(self, kernel: str | None,
                            keys: float | None = None) -> tuple[float | None, float | None]:
        """(forward, backward) fractions of peak fused attention of family ``kernel`` reaches
        on the FLOPs it executes, over ``keys`` keys per query row where given (the kernel's
        fixed work, ``attention_overhead_tokens``, weighs more on short sequences); (None,
        ...) where the profile has no figure."""
        if kernel is not None and kernel not in self.attention_by_kernel:
            kernel = FALLBACK_KERNEL if FALLBACK_KERNEL in self.attention_by_kernel else None
        if kernel in self.attention_by_kernel:
            forward, backward = self.attention_by_kernel[kernel]
        else:
            forward = self.attention_efficiency
            backward = self.attention_backward_efficiency or forward
        if keys is None or forward is None:
            return forward, backward
        fixed_forward, fixed_backward = self.attention_overhead_by_kernel.get(
            kernel, self.attention_overhead_tokens)
        return forward * keys / (keys + fixed_forward), backward * keys / (keys + fixed_backward)

    def matmul_eff(self, flops: float, tokens: int | None = None) -> float:
        """Efficiency of one matmul of ``flops`` FLOPs over ``tokens`` rows, log-interpolated
        and clamped; without a per-token table (or a token count) by FLOPs alone."""
        if not self.matmul_efficiency_by_tokens or tokens is None:
            return _interp(self.matmul_efficiency, flops)
        rows = self.matmul_efficiency_by_tokens
        by_tokens = [_interp(table, flops) for _, table in rows]
        return interp(math.log10(max(tokens, 1)), [math.log10(r[0]) for r in rows], by_tokens)

    @property
    def optimizer_eff(self) -> float:
        """Achieved fraction of memory bandwidth in the optimizer step."""
        return self.optimizer_efficiency or self.memory_efficiency

    def comm_eff(self, tier: str) -> float:
        """Achieved fraction of a tier's line rate (1.0 where the profile is silent)."""
        return self.comm_efficiency.get(tier, 1.0)

    def basis(self, gpu_id: str) -> str:
        """Where this profile's figures come from for ``gpu_id``, in a few words."""
        if self.gpu != gpu_id:
            return f"{self.name}: generic, not measured on this GPU"
        if self.derived_from and self.measured_here:
            return (f"{self.name}: {' and '.join(self.measured_here)} measured on it, "
                    f"the rest from {self.derived_from}")
        if self.derived_from:
            return f"{self.name}: from {self.derived_from}, not measured on this GPU"
        if self.fitted_on:
            return f"{self.name}: fitted on {', '.join(self.fitted_on)}"
        return f"{self.name}: calibrated on it"

    def comm_latency(self, tier: str, catalogue: float) -> float:
        """Per-message latency of a tier: the measured one, else the catalogue's."""
        return self.comm_latency_s.get(tier, catalogue)


def _checked_table(table: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if not table:
        raise ValueError("needs at least one [flops, efficiency] row")
    flops = [row[0] for row in table]
    if any(f <= 0 for f in flops) or flops != sorted(flops):
        raise ValueError("rows must have positive FLOPs in increasing order")
    return table


def _interp(table: list[tuple[float, float]], flops: float) -> float:
    xs = [math.log10(row[0]) for row in table]
    return interp(math.log10(max(flops, 1.0)), xs, [row[1] for row in table])


def interp(x: float, xs: list[float], ys: list[float]) -> float:
    """``numpy.interp`` for one point: piecewise linear in increasing ``xs``, clamped at the
    ends. Written out because importing numpy for it cost a quarter of `clustersim simulate`'s
    start-up (issue 12); tests/topologies/test_profile_interp.py checks it against numpy."""
    right = bisect_right(xs, x)
    if right == 0:
        return float(ys[0])
    if right == len(xs):
        return float(ys[-1])
    x0, x1, y0, y1 = xs[right - 1], xs[right], ys[right - 1], ys[right]
    return float(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def load_profile(path: str | Path) -> Profile:
    """Read a profile JSON file; bad content raises ScenarioError naming the field."""
    try:
        data = json.loads(read_text_file(path, what="profile"))
    except json.JSONDecodeError as exc:
        raise ScenarioError(str(path), f"malformed JSON: {exc.msg} (line {exc.lineno})") from None
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, prefix="profile", model=Profile) from None


@cache
def profile_for_gpu(gpu_id: str) -> Profile:
    """The shipped profile for a catalogue GPU, or the generic one for GPUs without their own."""
    folder = files("clustersim.topologies").joinpath("profiles")
    for candidate in (f"{gpu_id}.json", "default.json"):
        entry = folder.joinpath(candidate)
        if entry.is_file():
            return Profile.model_validate(json.loads(entry.read_text(encoding="utf-8")))
    raise ScenarioError("profile", f"no profile for GPU {gpu_id!r}")  # pragma: no cover


def generic_profile_note(cluster: ClusterSpec | PooledCluster) -> str | None:
    """A line for results priced by the generic profile: the cluster's GPUs (any pool's) that
    have no shipped profile of their own. Its figures (large GEMMs at 60% of peak, nothing
    fitted) are no GPU's: on an MI300X, whose best measured GEMM reaches 51% of peak, plans
    came out above what its matmuls can run, with nothing said."""
    gpus = sorted({pool.gpu.id for pool in cluster_pools(cluster)
                   if profile_for_gpu(pool.gpu.id).gpu == ANY_GPU})
    if not gpus:
        return None
    return (f"note: {', '.join(gpus)} {'has' if len(gpus) == 1 else 'have'} no profile of "
            "its own; the generic one prices it (large GEMMs at 60% of peak, nothing measured "
            "or fitted on it): read the times as a shape, not a prediction, or pass --profile "
            "(docs/profiles.md)")


def check_device(profile: Profile, cluster: ClusterSpec | PooledCluster, force: bool = False
                 ) -> None:
    """Refuse a profile measured on another device than the cluster's GPU (a CPU core's
    figures on H100s predict a 209.9 s step at 1.9% MFU for examples/llama3-70b-h100.yaml,
    against 7.25 s with the H100's own; issue 24), unless ``force``. A cluster of pools applies
    a profile only to the pools of its GPU (``pool_profiles``), so there it must match one
    pool's GPU, and ``force`` cannot make it apply to another."""
    if is_pooled(cluster):
        gpus = sorted({pool.gpu.id for pool in cluster_pools(cluster)})
        if profile.gpu not in gpus:
            raise ScenarioError("--profile", f"{profile.name} was measured on {profile.gpu}; "
                                             f"no pool has that GPU (pools: {', '.join(gpus)})")
        return
    gpu = cluster.gpu.id
    if force or profile.gpu in (ANY_GPU, gpu):
        return
    raise ScenarioError("--profile", f"{profile.name} was measured on {profile.gpu}, not on "
                                     f"the cluster's GPU {gpu}; leave --profile out for {gpu}'s "
                                     f"shipped profile, give one measured on {gpu}, or add "
                                     f"{FORCE_FLAG} to apply it anyway")
