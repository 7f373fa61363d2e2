"""What-if sweeps: every combination of a grid of overrides, simulated, as one tidy table.

A *point* is a list of ``dotted.path=value`` overrides applied to a base scenario. Invalid
combinations are rows too (``status`` "invalid" and the reason in ``error``), never dropped.
``simulate_point`` is a pure function of plain data, so any pool can run it: local processes or
Ray (``backends.py``). Results are written atomically as they come in, so an interrupted sweep
leaves a complete table of what it finished, and running it again with the same output resumes
it, provided its inputs are the same (``sweep_fingerprint.py``).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from clustersim.errors import ScenarioError
from clustersim.yamlio import parse_scalar

from .labels import split_columns
from .paths import check_file_output
from .sweep_fingerprint import check_resumable, make_fingerprint, sidecar, write_fingerprint

# Scenario fields every row carries, whatever was swept: enough to label and re-run it.
SPLIT_COLUMNS = ("gpus", "tp", "pp", "dp", "cp", "ep", "micro_batch", "global_batch",
                 "schedule", "virtual_stages", "zero", "recompute", "sequence_parallel")
DERIVED_WHEN_SPLIT_CHANGES = ("parallel.tp", "parallel.pp", "parallel.cp", "cluster.gpus",
                              "cluster.nodes")
WRITE_EVERY_S = 1.0


@dataclass(frozen=True)
class Grid:
    """Swept keys and their values, in the order given on the command line."""

    axes: tuple[tuple[str, tuple[Any, ...]], ...]

    @classmethod
    def parse(cls, specs: Iterable[str]) -> Grid:
        """``["parallel.tp=1,2,4", ...]`` into a Grid; values are YAML scalars."""
        axes = []
        for spec in specs:
            key, sep, values = spec.partition("=")
            key = key.strip()
            if not sep or not key or not values.strip():
                raise ScenarioError("--grid", f"expected dotted.path=v1,v2,..., got {spec!r}")
            if any(key == k for k, _ in axes):
                raise ScenarioError("--grid", f"{key} is swept twice")
            axes.append((key, tuple(parse_scalar(v.strip(), "--grid") for v in values.split(","))))
        return cls(tuple(axes))

    @property
    def keys(self) -> list[str]:
        return [key for key, _ in self.axes]

    def specs(self) -> list[str]:
        """The axes as ``--grid`` would take them: ``["parallel.tp=1,2,4", ...]``."""
        return [f"{key}={','.join(map(_text, values))}" for key, values in self.axes]

    def points(self) -> list[list[str]]:
        """Every combination as a list of overrides, the last axis varying fastest."""
        values = [vals for _, vals in self.axes]
        return [[f"{key}={_text(v)}" for key, v in zip(self.keys, combo, strict=True)]
                for combo in itertools.product(*values)]


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def point_id(overrides: list[str]) -> str:
    """The key a row is known by when resuming: its overrides joined by ``;``."""
    return ";".join(overrides)


def base_for(raw: dict, grid: Grid) -> dict:
    """The base scenario, with ``parallel.dp`` (and, on a cluster of pools, the stages'
    ``parallel.stage_pools``) left to be derived when the grid changes the split or the GPU
    count but not them itself (otherwise nearly every point would be invalid)."""
    changed = [k for k in grid.keys if k in (*DERIVED_WHEN_SPLIT_CHANGES, "parallel.dp")]
    if not changed:
        return raw
    derived = {"stage_pools"} | ({"dp"} if changed != ["parallel.dp"] else set())
    derived -= {key.removeprefix("parallel.") for key in grid.keys}
    parallel = {k: v for k, v in (raw.get("parallel") or {}).items() if k not in derived}
    return {**raw, "parallel": parallel}


# --- one point ---------------------------------------------------------------------------------

def simulate_point(job: dict) -> dict:
    """One row: ``job`` holds ``raw`` (base scenario), ``overrides``, ``fidelity`` and
    ``profile`` (a path or None; a point whose GPU it was not measured on is invalid unless
    ``force_profile``). Plain data in and out, for any process pool."""
    from clustersim.plugins import load_plugins
    from clustersim.simulator.closed_form.analytic import estimate
    from clustersim.simulator.discrete_event.engine import simulate
    from clustersim.simulator.inputs.scenario import apply_overrides, build_scenario
    from clustersim.topologies.profile import check_device, load_profile

    load_plugins()  # a Ray worker starts bare; a forked one has them already (cached)
    overrides = job["overrides"]
    row: dict[str, Any] = {"point": point_id(overrides)}
    row.update((o.partition("=")[0], parse_scalar(o.partition("=")[2])) for o in overrides)
    try:
        s = build_scenario(apply_overrides(job["raw"], overrides), job.get("name", "sweep"))
        profile = load_profile(job["profile"]) if job.get("profile") else None
        if profile is not None:  # the grid may change the GPU (cluster.gpu, cluster.preset)
            check_device(profile, s.cluster, job.get("force_profile", False))
    except ScenarioError as exc:
        return {**row, "status": "invalid", "error": str(exc)}
    row.update(split_columns(s))
    row["scenario"] = json.dumps(s.as_dict())
    try:
        fidelity = job.get("fidelity", "representative")
        result = (estimate(s, profile) if fidelity == "analytic"
                  else simulate(s, fidelity, profile))
        errors = _error_bars(s, fidelity, profile, job.get("samples"), job.get("seed", 0))
    except Exception as exc:  # a bug in one point must not lose the others
        return {**row, "status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    return {**row, "status": "ok", "error": "", **flatten(result.to_json()), **errors}


def _error_bars(s, fidelity: str, profile, samples: int | None, seed: int) -> dict[str, float]:
    """With ``samples``: the step's median and 90% interval under the profile's uncertainty."""
    if not samples:
        return {}
    from clustersim.reports.simulation import estimator
    from clustersim.simulator.costs.stage_costs import uncertain_profile
    from clustersim.simulator.planning.spread import spread

    base = uncertain_profile(s, profile)
    lo, median, hi = spread(lambda drawn: estimator(fidelity, drawn)(s), base, samples,
                            seed).step_time_s
    return {"step_time_lo_s": lo, "step_time_median_s": median, "step_time_hi_s": hi}


def flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted columns; lists (per-stage memory) as JSON text."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, list):
            out[name] = json.dumps(value)
        else:
            out[name] = value
    return out


# --- the table on disk ---------------------------------------------------------------------------

def read_table(path: str | Path) -> pd.DataFrame:
    """A saved sweep (CSV, CSV.gz or Parquet)."""
    path = Path(path)
    if _is_parquet(path):
        return pd.read_parquet(path)
    return pd.read_csv(path, keep_default_na=False, na_values=[""])


def write_table(df: pd.DataFrame, path: Path) -> None:
    """Write to a temporary file beside ``path`` and rename it: never half-written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if _is_parquet(path):
            _one_type_a_column(df).to_parquet(tmp, index=False)
        else:
            df.to_csv(tmp, index=False, compression="gzip" if path.suffix == ".gz" else None)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _one_type_a_column(df: pd.DataFrame) -> pd.DataFrame:
    """Parquet stores one type a column: a column whose values mix types (a grid axis given
    text and numbers, ``--grid parallel.zero=abc,3``) is written as text."""
    mixed = [c for c in df.columns
             if df[c].dtype == object and df[c].dropna().map(type).nunique() > 1]
    return df.astype({c: str for c in mixed}) if mixed else df


def _is_parquet(path: Path) -> bool:
    return path.suffix in (".parquet", ".pq")


def check_output(path: Path) -> None:
    """Refuse an output we could not write, before any simulation runs."""
    if path.suffix not in (".csv", ".gz", ".parquet", ".pq"):
        raise ScenarioError("--out", "must end in .csv, .csv.gz or .parquet")
    check_file_output("--out", path)
    check_file_output("--out", sidecar(path))
    if _is_parquet(path):
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ScenarioError("--out", "Parquet needs pyarrow: pip install "
                                         "'clustersim[parquet]' (or write .csv)") from None


# --- running -------------------------------------------------------------------------------------

Runner = Callable[[list[dict]], Iterator[dict]]


def run_sweep(raw: dict, grid: Grid, runner: Runner, out: Path | None = None,
              fidelity: str = "representative", profile: str | None = None,
              name: str = "sweep", on_row: Callable[[dict], None] | None = None,
              samples: int | None = None, seed: int = 0, overrides: Iterable[str] = (),
              fresh: bool = False, force_profile: bool = False) -> pd.DataFrame:
    """Simulate every point not already in ``out``; the whole table, in grid order. With
    ``samples``, each point also gets its step's median and 90% interval
    (``step_time_lo_s``, ``step_time_median_s``, ``step_time_hi_s``).

    ``raw`` already has the ``overrides`` applied; they are passed to be recorded in the
    fingerprint beside ``out`` (``sweep_fingerprint.py``). An existing ``out`` is resumed only
    when its fingerprint matches, else refused before anything is written; ``fresh`` replaces
    it instead."""
    base = base_for(raw, grid)
    points = grid.points()
    done: dict[str, dict] = {}
    if out is not None:
        fingerprint = make_fingerprint(
            raw, _resolved(base, name), grid.specs(), list(overrides), profile,
            {"fidelity": fidelity, "samples": samples, "seed": seed,
             "force_profile": force_profile})
        done = _start(out, fingerprint, fresh)
    todo = [{"raw": base, "overrides": p, "fidelity": fidelity, "profile": profile,
             "name": name, "samples": samples, "seed": seed, "force_profile": force_profile}
            for p in points if point_id(p) not in done]
    rows = dict(done)
    last_write = time.monotonic()
    try:
        for row in runner(todo):
            rows[row["point"]] = row
            if on_row:
                on_row(row)
            if out is not None and time.monotonic() - last_write >= WRITE_EVERY_S:
                write_table(_ordered(rows, points), out)
                last_write = time.monotonic()
    finally:
        if out is not None and rows:
            write_table(_ordered(rows, points), out)
        elif out is not None and not out.exists():  # stopped before its first row
            sidecar(out).unlink(missing_ok=True)
    return _ordered(rows, points)


def _resolved(base: dict, name: str) -> dict | None:
    """The base scenario as the model sees it (presets and model files resolved), or None
    where the base alone does not build (the grid may still make every point valid)."""
    from clustersim.simulator.inputs.scenario import build_scenario

    try:
        return build_scenario(base, name).as_dict()
    except ScenarioError:
        return None


def _start(out: Path, fingerprint: dict, fresh: bool) -> dict[str, dict]:
    """The rows to keep from ``out``: those of the same sweep, or none when it is new or
    ``fresh``. Checks come before any write; the fingerprint is written before the table, so
    a table on disk is never paired with another sweep's fingerprint."""
    for stale in out.parent.glob(f".{out.name}.*.tmp"):  # left by a killed writer
        stale.unlink(missing_ok=True)
    if out.exists() and not fresh:
        check_resumable(out, fingerprint)
        return _resume(out)
    out.unlink(missing_ok=True)
    write_fingerprint(out, fingerprint)
    return {}


def _resume(out: Path) -> dict[str, dict]:
    """Rows of an earlier run of this sweep, by point id."""
    try:
        df = read_table(out)
    except Exception as exc:
        raise ScenarioError("--out", f"cannot resume from {str(out)!r}: {exc}") from None
    if "point" not in df.columns:
        raise ScenarioError("--out", f"{str(out)!r} is not a clustersim sweep table")
    df = df.astype(object).where(df.notna(), None)
    return {str(r["point"]): r for r in df.to_dict("records")}


def _ordered(rows: dict[str, dict], points: list[list[str]]) -> pd.DataFrame:
    return pd.DataFrame([rows[k] for k in map(point_id, points) if k in rows])
