"""One simulation as ``clustersim simulate`` runs it: the estimate, and fit hints when it does
not fit. The CLI and the Python API (``clustersim.simulate``) both call :func:`run_simulation`,
so ``Simulation.to_dict()`` is exactly what ``simulate --json`` prints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clustersim.errors import ScenarioError
from clustersim.simulator.costs.result import StepResult
from clustersim.simulator.costs.stage_costs import uncertain_profile
from clustersim.simulator.inputs.scenario import Scenario, build_scenario
from clustersim.simulator.planning.spread import Spread, spread
from clustersim.topologies.profile import Profile, check_device

from .hints import FitHint, fit_hints

FIDELITIES = ("representative", "full", "analytic")


@dataclass(frozen=True)
class Simulation:
    """A scenario, its predicted step and the changes that would make it fit (if it does not)."""

    scenario: Scenario
    result: StepResult
    fit_hints: list[FitHint]
    spread: Spread | None = None  # with samples: the step's error bars

    @property
    def step_time_s(self) -> float:
        return self.result.step_time_s

    @property
    def peak_bytes(self) -> int:
        return int(round(self.result.peak_bytes))

    @property
    def fits(self) -> bool:
        return self.result.fits

    def to_dict(self) -> dict[str, Any]:
        """SCENARIO.md's JSON result, with ``memory.fit_hints`` (empty when it fits)."""
        out = self.result.to_json()
        out["memory"]["fit_hints"] = [h.as_dict() for h in self.fit_hints]
        if self.spread is not None:
            out.update(self.spread.as_json())
        return out


def estimator(fidelity: str, profile: Profile | None = None,
              trace: str | None = None):
    """The function that predicts a scenario at ``fidelity``."""
    if fidelity not in FIDELITIES:
        raise ScenarioError("fidelity", f"unknown fidelity {fidelity!r} "
                                        f"(valid: {', '.join(FIDELITIES)})")
    if fidelity == "analytic":
        if trace:
            raise ScenarioError("trace", "the analytic estimate has no timeline; use fidelity "
                                         "representative or full")
        from clustersim.simulator.closed_form.analytic import estimate
        return lambda s: estimate(s, profile)
    from clustersim.simulator.discrete_event.engine import simulate
    return lambda s: simulate(s, fidelity, profile, trace=trace)


def run_simulation(raw: dict, default_name: str = "scenario", fidelity: str = "representative",
                   profile: Profile | None = None, trace: str | None = None,
                   hints: bool = True, samples: int | None = None,
                   seed: int = 0, force_profile: bool = False) -> Simulation:
    """Validate ``raw`` (a scenario mapping, overrides applied), predict it and, if it does not
    fit, search the changes that make it fit (at the same fidelity, without the trace); with
    ``samples``, also predict it under that many draws of the profile's uncertainty. A
    ``profile`` measured on another device than the cluster's GPU is refused unless
    ``force_profile``."""
    if samples is not None and samples < 2:
        raise ScenarioError("samples", f"must be at least 2 for an interval (got {samples})")
    scenario = build_scenario(raw, default_name)
    if profile is not None:
        check_device(profile, scenario.cluster, force_profile)
    result = estimator(fidelity, profile, trace)(scenario)
    found: list[FitHint] = []
    if hints and not result.fits:
        found = fit_hints(raw, scenario, estimator(fidelity, profile))
    errors = None
    if samples is not None:
        base = uncertain_profile(scenario, profile)
        errors = spread(lambda drawn: estimator(fidelity, drawn)(scenario), base, samples, seed)
    return Simulation(scenario, result, found, errors)
