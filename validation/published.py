"""Predictions against published training throughput, with the line between fitted and held out.

A published table is a YAML list of cases (``tests/data/*.yaml``), each a scenario in the
SCENARIO.md form, the figures as printed, and the metric they measure. A profile names the tables
it was fitted on (``Profile.fitted_on``); comparing it with one of those is fitting, not
validation, so ``held_out_rows`` refuses to, and ``split_fitted`` sets such cases apart for the
fit to be reported on its own (validation/accuracy.py). The table's id is its file name without
``.yaml``.

Where a source did not publish a setting (``unknown_settings``: the interleave depth,
recomputation), a case is predicted over the scenarios it may have been (``unpublished.py``, the
development set's rule) and compared on the fastest that fits in memory; ``Row.scenario`` says
which.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from clustersim.errors import ScenarioError
from clustersim.simulator.closed_form.analytic import estimate
from clustersim.simulator.costs.result import StepResult
from clustersim.simulator.inputs.scenario import Scenario, build_scenario
from clustersim.topologies.profile import Profile, profile_for_gpu
from clustersim.yamlio import load_yaml_file

from . import unpublished

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
    # The scenarios it may have run as, ``scenario`` first (``unpublished.candidates``).
    candidates: tuple[Scenario, ...] = ()

    @property
    def options(self) -> tuple[Scenario, ...]:
        return self.candidates or (self.scenario,)


@dataclass(frozen=True, slots=True)
class Row:
    """A published case beside its prediction under one profile."""

    case: PublishedCase
    profile: str
    predicted: float
    scenario: Scenario | None = None  # the candidate compared (the fastest that fits)

    @property
    def error(self) -> float:
        """Relative error, (predicted - published) / published."""
        return (self.predicted - self.case.published) / self.case.published


def load_table(path: str | Path, parallel: dict | None = None,
               training: dict | None = None) -> list[PublishedCase]:
    """Every case of one published table; ``parallel``, ``training``: fields set on every
    case's section of that name (a what-if: the same runs under another setting)."""
    path = Path(path)
    table = path.stem
    cases = []
    for raw in load_yaml_file(path):
        for section, fields in (("parallel", parallel), ("training", training)):
            if fields:
                scenario = raw["scenario"]
                raw = {**raw, "scenario": {**scenario, section: {**scenario.get(section, {}),
                                                                 **fields}}}
        metric = raw.get("metric") or TABLE_METRICS[table]
        printed = raw["published"]
        if metric in _PERCENT_METRICS:
            value = printed[_PERCENT_METRICS[metric]] / 100
        else:  # a figure printed under the metric's own name (tokens_per_s), else TFLOP/s
            value = printed.get(metric, printed.get("tflops_per_gpu"))
        options = _buildable(unpublished.candidates(raw["scenario"],
                                                    raw.get("unknown_settings") or ()))
        cases.append(PublishedCase(table, raw["id"], options[0], metric, float(value),
                                   tuple(options)))
    return cases


def _buildable(raws: list[dict]) -> list[Scenario]:
    """The candidates that are valid scenarios (an interleave depth the micro-batches cannot
    follow is not one); the first, the scenario as written, must be."""
    built = [build_scenario(raws[0])]
    for raw in raws[1:]:
        try:
            built.append(build_scenario(raw))
        except ScenarioError:
            continue
    return built


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
        scenario, result = fastest_fitting(case, chosen, predict)
        rows.append(Row(case, chosen.name, measure(result, case.metric), scenario))
    return rows


# Which candidates fit does not depend on the profile (memory is not timed): asked once per
# case, so that fitting a profile (many predictions per case) times only those.
_FITTING: dict[tuple[str, str], tuple[int, ...]] = {}
_RECOMPUTE_ORDER = {kind: n for n, kind in enumerate(unpublished.RECOMPUTE)}


def _least_recompute(options: tuple[Scenario, ...], fitting: tuple[int, ...]) -> tuple[int, ...]:
    """The fitting candidates less those recomputing more than another fitting one of the same
    schedule and micro-batch: recomputation only adds work, so it cannot be the faster."""
    kept: dict[tuple, int] = {}
    for i in fitting:
        p = options[i].parallel
        key = (p.schedule, p.virtual_stages, options[i].training.micro_batch)
        if key not in kept or _RECOMPUTE_ORDER[p.recompute] < _RECOMPUTE_ORDER[
                options[kept[key]].parallel.recompute]:
            kept[key] = i
    return tuple(sorted(kept.values()))


def fastest_fitting(case: PublishedCase, profile: Profile, predict: Predict
                    ) -> tuple[Scenario, StepResult]:
    """The case's candidate predicted fastest among those that fit (all, if none does)."""
    key = (case.table, case.id)
    if key not in _FITTING:  # the closed form's memory is the engine's: ask it, it is quick
        fits = [estimate(s, profile).fits for s in case.options]
        fitting = tuple(i for i, f in enumerate(fits) if f) or tuple(range(len(fits)))
        _FITTING[key] = _least_recompute(case.options, fitting)
    predicted = [(case.options[i], predict(case.options[i], profile)) for i in _FITTING[key]]
    return min(predicted, key=lambda pair: pair[1].step_time_s)


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
