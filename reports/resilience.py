"""Failures and checkpoints: how often to checkpoint, and what failures cost in wall time.

With independent GPU failures the job fails at rate ``gpus / MTBF_gpu``: the system MTBF is
``M = MTBF_gpu / gpus``. Checkpointing every ``tau`` seconds of work costs ``delta`` seconds per
checkpoint; a failure costs the restart ``R`` plus the work since the last checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def system_mtbf(gpu_mtbf_s: float, gpus: int) -> float:
    """Mean time between failures of a job on ``gpus`` GPUs failing independently."""
    return gpu_mtbf_s / gpus


def young_interval(delta: float, mtbf: float) -> float:
    """Young 1974: ``tau = sqrt(2 delta M)``, first order in ``delta / M``."""
    return math.sqrt(2 * delta * mtbf)


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly 2006 (FGCS 22:303): ``sqrt(2dM) [1 + sqrt(d/2M)/3 + (d/2M)/9] - d`` for ``d < 2M``,
    else ``M``: the higher-order optimum of the expected wall time below."""
    if delta >= 2 * mtbf:
        return mtbf
    x = delta / (2 * mtbf)
    return math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - delta


def expected_wall_time(solve: float, tau: float, delta: float, restart: float,
                       mtbf: float) -> float:
    """Daly 2006: ``M e^(R/M) (e^((tau + delta)/M) - 1) T_s / tau`` — the expected
    wall time of ``solve`` seconds of work under exponential failures."""
    return mtbf * math.exp(restart / mtbf) * math.expm1((tau + delta) / mtbf) * solve / tau


@dataclass(frozen=True, slots=True)
class CheckpointPlan:
    """The optimal interval and what the run then costs in expectation."""

    interval_s: float
    expected_wall_time_s: float
    goodput: float  # useful training time / expected wall time
    system_mtbf_s: float

    def as_dict(self) -> dict[str, float]:
        return {"interval_s": self.interval_s, "expected_wall_time_s": self.expected_wall_time_s,
                "goodput": self.goodput, "system_mtbf_s": self.system_mtbf_s}


def checkpoint_plan(solve: float, gpus: int, gpu_mtbf_hours: float, write_s: float,
                    restore_s: float) -> CheckpointPlan:
    """Daly's interval for a run of ``solve`` seconds of training on ``gpus`` GPUs."""
    mtbf = system_mtbf(gpu_mtbf_hours * 3600, gpus)
    tau = daly_interval(write_s, mtbf)
    wall = expected_wall_time(solve, tau, write_s, restore_s, mtbf)
    return CheckpointPlan(tau, wall, solve / wall, mtbf)
