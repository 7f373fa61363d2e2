"""Calibration profiles: how much of the catalogue's peaks real kernels and collectives reach.

A profile is JSON (``profiles/*.json``), written by hand from published measurements or by
``clustersim calibrate``. Compute time of a matmul is ``flops / (peak * efficiency(flops))``
with the efficiency interpolated in log10(FLOPs) from a ``[[flops, efficiency], ...]`` table;
memory-bound kernels reach ``memory_efficiency`` of HBM bandwidth; each link tier reaches
``comm_efficiency[tier]`` of its line rate.
"""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from clustersim.errors import ScenarioError, from_validation_error
from clustersim.fields import Fraction, NonNegativeFloat

_TIERS = ("intra_node", "inter_node", "spine")


class Profile(BaseModel):
    """Achieved fractions of peak for compute, memory and each link tier."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    gpu: str
    matmul_efficiency: list[tuple[float, Fraction]]
    memory_efficiency: Fraction
    comm_efficiency: dict[str, Fraction]
    kernel_overhead_s: NonNegativeFloat = 0.0  # launch/sync cost per kernel (fused layers: once)
    source: str = ""

    @field_validator("matmul_efficiency")
    @classmethod
    def _sorted_table(cls, table: list[tuple[float, float]]) -> list[tuple[float, float]]:
        if not table:
            raise ValueError("needs at least one [flops, efficiency] row")
        flops = [row[0] for row in table]
        if any(f <= 0 for f in flops) or flops != sorted(flops):
            raise ValueError("rows must have positive FLOPs in increasing order")
        return table

    @field_validator("comm_efficiency")
    @classmethod
    def _known_tiers(cls, table: dict[str, float]) -> dict[str, float]:
        unknown = set(table) - set(_TIERS)
        if unknown:
            raise ValueError(f"unknown tier {sorted(unknown)[0]!r} (allowed: {', '.join(_TIERS)})")
        return table

    def matmul_eff(self, flops: float) -> float:
        """Efficiency of one matmul of ``flops`` FLOPs, log-interpolated and clamped."""
        xs = np.log10([row[0] for row in self.matmul_efficiency])
        ys = [row[1] for row in self.matmul_efficiency]
        return float(np.interp(np.log10(max(flops, 1.0)), xs, ys))

    def comm_eff(self, tier: str) -> float:
        """Achieved fraction of a tier's line rate (1.0 where the profile is silent)."""
        return self.comm_efficiency.get(tier, 1.0)


def load_profile(path: str | Path) -> Profile:
    """Read a profile JSON file; bad content raises ScenarioError naming the field."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScenarioError(str(path), f"cannot read profile: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ScenarioError(str(path), f"malformed JSON: {exc.msg} (line {exc.lineno})") from None
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, prefix="profile") from None


@cache
def profile_for_gpu(gpu_id: str) -> Profile:
    """The shipped profile for a catalogue GPU, or the generic one for GPUs without their own."""
    folder = files("clustersim.topologies").joinpath("profiles")
    for candidate in (f"{gpu_id}.json", "default.json"):
        entry = folder.joinpath(candidate)
        if entry.is_file():
            return Profile.model_validate(json.loads(entry.read_text(encoding="utf-8")))
    raise ScenarioError("profile", f"no profile for GPU {gpu_id!r}")  # pragma: no cover
