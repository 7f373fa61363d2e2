"""Predictions against published training throughput, with the line between fitted and held out.

A published table is a YAML list of cases (``tests/data/*.yaml``), each a scenario in the
SCENARIO.md form, the figures as printed, and the metric they measure. A profile names the tables
it was fitted on (``Profile.fitted_on``); comparing it with one of those is fitting, not
validation, so ``held_out_rows`` refuses to, and ``split_fitted`` sets such cases apart for the
fit to be reported on its own (validation/accuracy.py). The table's id is its file name without
``.yaml``.
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
        if metric in _PERCENT_METRICS:
            value = printed[_PERCENT_METRICS[metric]] / 100
        else:  # a figure printed under the metric's own name (tokens_per_s), else TFLOP/s
            value = printed.get(metric, printed.get("tflops_per_gpu"))
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
        chosen = profile_of(case, profile)
        rows.append(Row(case, chosen.name, measure(predict(case.scenario, chosen), case.metric)))
    return rows


def profile_of(case: PublishedCase, profile: Profile | None = None) -> Profile:
    """The profile a case is predicted with: ``profile``, else the shipped one of its GPU."""
    return profile or profile_for_gpu(case.scenario.cluster.gpu.id)


def split_fitted(cases: Iterable[PublishedCase], profile: Profile | None = None
                 ) -> tuple[list[PublishedCase], list[PublishedCase]]:
    """(held out, fitted): the cases whose table did not / did fit the profile used for them."""
    held, fitted = [], []
    for case in cases:
        (fitted if case.table in profile_of(case, profile).fitted_on else held).append(case)
    return held, fitted


class FittedDataError(ValueError):
    """A held-out comparison was asked of a profile fitted on that very table."""


def held_out_rows(cases: list[PublishedCase], profile: Profile | None = None,
                  predict: Predict = default_predict) -> list[Row]:
    """``predict_rows``, refusing any case whose table fitted the profile used for it."""
    for case in cases:
        chosen = profile_of(case, profile)
        if case.table in chosen.fitted_on:
            raise FittedDataError(f"profile {chosen.name!r} was fitted on {case.table!r}: "
                                  f"comparing it with {case.id!r} is not validation")
    return predict_rows(cases, profile, predict)


def summary(rows: list[Row]) -> tuple[float, float]:
    """(mean, worst) absolute relative error of some rows."""
    errors = [abs(row.error) for row in rows]
    return statistics.fmean(errors), max(errors)
