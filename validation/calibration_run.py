"""Calibrate this machine: run the microbenchmarks on N ranks at once, fit a profile to them
(``calibrate.py``), and write it with its raw measurements beside it, both atomically
(``clustersim calibrate`` runs it). Torch, pandas and the launcher are imported inside
:func:`calibrate`, so the helpers here load without them.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from clustersim.errors import ScenarioError

CALIBRATE_TIMEOUT_S = 900  # the launcher's limit on one calibration, all ranks (15 minutes)


def raw_path(profile_path: Path) -> Path:
    """The raw measurements' file beside a profile: the same name, ``.raw.csv``."""
    return profile_path.with_name(profile_path.stem + ".raw.csv")


def calibrate(backend: str, nproc: int, quick: bool, out: Path):
    """Measure, fit, and write the profile and its raw rows; (profile, rows)."""
    import pandas as pd

    from clustersim.simulator.discrete_event.timeline import write_json_atomically

    from . import machine
    from .calibrate import CalibrationError, fit_profile
    from .launch import run_ranks
    from .microbench import BenchPlan, measure

    plan = BenchPlan.quick(backend) if quick else \
        BenchPlan.gpu() if backend == "nccl" else BenchPlan(backend)
    how_long = "quick" if quick else "about a minute" if backend == "nccl" else \
        "one to two minutes on 2 CPU cores"
    print(f"calibrate: measuring on {nproc} {backend} ranks ({how_long}) ...", file=sys.stderr)
    start = time.monotonic()
    rows = run_ranks(measure, nproc, plan, timeout=CALIBRATE_TIMEOUT_S, backend=backend)[0]
    print(f"calibrate: measured in {time.monotonic() - start:.0f} s", file=sys.stderr)
    try:
        profile = fit_profile(rows, machine.local_cluster(backend, nproc), backend, nproc,
                              raw_path(out).name, quick)
    except CalibrationError as exc:
        raise ScenarioError("calibrate", str(exc)) from None
    raw = raw_path(out)
    tmp = raw.with_name(f".{raw.name}.tmp")
    pd.DataFrame(rows).to_csv(tmp, index=False)
    write_json_atomically(out, profile.model_dump(mode="json"))
    tmp.replace(raw)
    return profile, rows
