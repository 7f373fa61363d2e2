"""Predictions against published training throughput, with the line between fitted and held out.

A published table is a YAML list of cases (``tests/data/*.yaml``), each a scenario in the
SCENARIO.md form, the figures as printed, and the metric they measure. A profile names the tables
it was fitted on (``Profile.fitted_on``); comparing it with one of those is fitting, not
validation, so ``held_out_rows`` refuses to, and ``fitted_rows`` exists only to report the fit
apart. The table's id is its file name without ``.yaml``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from clustersim.simulator.analytic import estimate
from clustersim.simulator.result import StepResult
from clustersim.simulator.scenario import Scenario, build_scenario
from clustersim.topologies.profile import Profile, profile_for_gpu
from clustersim.yamlio import load_yaml_file

# What each table's printed ``tflops_per_gpu`` counts, where its cases do not say: Narayanan et
# al. count the recomputation forward (hardware FLOPs), Megatron-Core's README model FLOPs.
TABLE_METRICS = {"megatron2021": "hardware_tflops_per_gpu",
                 "megatron-core-h100": "model_tflops_per_gpu"}
_PERCENT_METRICS = {"mfu": "mfu_percent", "hfu": "hfu_percent"}

Predict = Callable[[Scenario, Profile], StepResult]


@dataclass(frozen=True, slots=True)
class PublishedCase:
    """One published run: its scenario, the metric printed and its value."""

    table: str
    id: str
    scenario: Scenario
    metric: str  # a StepResult attribute, or "mfu" / "hfu" (fractions of peak)
    published: float


@dataclass(frozen=True, slots=True)
class Row:
    """A published case beside its prediction under one profile."""

    case: PublishedCase
    profile: str
    predicted: float

    @property
    def error(self) -> float:
        """Relative error, (predicted - published) / published."""
        return (self.predicted - self.case.published) / self.case.published


def load_table(path: str | Path) -> list[PublishedCase]:
    """Every case of one published table."""
    path = Path(path)
    table = path.stem
    cases = []
    for raw in load_yaml_file(path):
        metric = raw.get("metric") or TABLE_METRICS[table]
        printed = raw["published"]
        value = (printed[_PERCENT_METRICS[metric]] / 100 if metric in _PERCENT_METRICS
                 else printed["tflops_per_gpu"])
        cases.append(PublishedCase(table, raw["id"], build_scenario(raw["scenario"]), metric,
                                   float(value)))
    return cases


def measure(result: StepResult, metric: str) -> float:
    """The figure ``metric`` names, from a prediction (HFU: hardware TFLOP/s over the peak)."""
    if metric == "hfu":
        return result.mfu * result.hardware_tflops_per_gpu / result.model_tflops_per_gpu
    return float(getattr(result, metric))


def default_predict(s: Scenario, profile: Profile) -> StepResult:
    return estimate(s, profile)


def predict_rows(cases: Iterable[PublishedCase], profile: Profile | None = None,
                 predict: Predict = default_predict) -> list[Row]:
    """Each case predicted under ``profile`` (default: the shipped one of its GPU)."""
    rows = []
    for case in cases:
        chosen = profile or profile_for_gpu(case.scenario.cluster.gpu.id)
        rows.append(Row(case, chosen.name, measure(predict(case.scenario, chosen), case.metric)))
    return rows


class FittedDataError(ValueError):
    """A held-out comparison was asked of a profile fitted on that very table."""


def held_out_rows(cases: list[PublishedCase], profile: Profile | None = None,
                  predict: Predict = default_predict) -> list[Row]:
    """``predict_rows``, refusing any case whose table fitted the profile used for it."""
    for case in cases:
        chosen = profile or profile_for_gpu(case.scenario.cluster.gpu.id)
        if case.table in chosen.fitted_on:
            raise FittedDataError(f"profile {chosen.name!r} was fitted on {case.table!r}: "
                                  f"comparing it with {case.id!r} is not validation")
    return predict_rows(cases, profile, predict)


def summary(rows: list[Row]) -> tuple[float, float]:
    """(mean, worst) absolute relative error of some rows."""
    errors = [abs(row.error) for row in rows]
    return statistics.fmean(errors), max(errors)


def format_rows(title: str, rows: list[Row]) -> str:
    """A plain-text table of rows with their mean and worst error."""
    lines = [title, f"{'case':40s} {'profile':20s} {'metric':24s} {'predicted':>9s} "
                    f"{'published':>9s} {'error':>7s}"]
    for row in rows:
        scale = 100 if row.case.metric in _PERCENT_METRICS else 1
        lines.append(f"{row.case.id:40s} {row.profile:20s} {row.case.metric:24s} "
                     f"{row.predicted * scale:9.1f} {row.case.published * scale:9.1f} "
                     f"{100 * row.error:+6.1f}%")
    mean, worst = summary(rows)
    lines.append(f"mean |error| {100 * mean:.1f}%, worst {100 * worst:.1f}%")
    return "\n".join(lines)
