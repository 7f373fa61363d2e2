"""The Python API: what ``clustersim simulate`` and ``clustersim plan`` do, as functions.

Overrides are keyword arguments with ``__`` between a section and its field
(``parallel__tp=4`` is ``--set parallel.tp=4``, ``cluster__inter_node__bandwidth=50`` a nested
field); values are Python values, validated exactly as a scenario file's. Bad input raises
:class:`clustersim.errors.ScenarioError`, whose ``field`` names the dotted path at fault.

Everything heavy (the engine, pandas, rich) is imported inside the functions, so
``import clustersim`` stays light; so are installed plugins (``clustersim/plugins.py``), the
first time a function is called.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ScenarioError
from .plugins import load_plugins

if TYPE_CHECKING:
    from clustersim.reports.plan_request import PlanSearch
    from clustersim.reports.simulation import Simulation
    from clustersim.simulator.inputs.scenario import Scenario

def _dotted(overrides: dict[str, Any]) -> dict[str, Any]:
    """``{"parallel__tp": 4}`` as ``{"parallel.tp": 4}``."""
    out = {}
    for key, value in overrides.items():
        if "__" not in key:
            raise ScenarioError(key, "an override names a section and a field joined by '__' "
                                     "(e.g. parallel__tp=4)")
        out[key.replace("__", ".")] = value
    return out


def _raw(scenario: Any) -> tuple[dict, str]:
    """A scenario given as a file path, a mapping or a Scenario, as a raw mapping and name."""
    from clustersim.simulator.inputs.scenario import Scenario, raw_scenario

    load_plugins()  # the schedules and collectives installed plugins register
    if isinstance(scenario, str | Path):
        return raw_scenario(scenario)
    if isinstance(scenario, Scenario):
        return scenario.as_dict(), scenario.name
    if isinstance(scenario, dict):
        return scenario, str(scenario.get("name", "scenario"))
    raise ScenarioError("scenario", f"expected a file path, a mapping or a Scenario, got "
                                    f"{type(scenario).__name__}")


def load_scenario(scenario: Any, **overrides: Any) -> Scenario:
    """A validated Scenario from a file path, a mapping or a Scenario, with overrides."""
    from clustersim.simulator.inputs.scenario import apply_values, build_scenario

    raw, name = _raw(scenario)
    return build_scenario(apply_values(raw, _dotted(overrides)), name)


def simulate(scenario: Any, fidelity: str = "representative", profile: str | Path | None = None,
             trace: str | Path | None = None, samples: int | None = None, seed: int = 0,
             force_profile: bool = False, **overrides: Any) -> Simulation:
    """Predict one step, as ``clustersim simulate``; ``.to_dict()`` is its ``--json`` output
    (fit hints included when it does not fit; with ``samples``, the error bars of that many
    draws of the profile's uncertainty, as ``--samples``). ``profile`` is a file or a
    profile's name, as ``--profile``; one measured on another GPU is refused unless
    ``force_profile``, as ``--force-profile``."""
    from clustersim.reports.simulation import run_simulation
    from clustersim.simulator.inputs.scenario import apply_values
    from clustersim.validation.profiles import load_named_profile

    raw, name = _raw(scenario)
    loaded = load_named_profile(str(profile)) if profile else None
    return run_simulation(apply_values(raw, _dotted(overrides)), name, fidelity, loaded,
                          trace=str(trace) if trace else None, samples=samples, seed=seed,
                          force_profile=force_profile)


def plan(model: str | dict, cluster: str | dict, gpus: int | None = None, *,
         fix: dict[str, Any] | None = None, **options: Any) -> PlanSearch:
    """Search the fastest splits that fit, as ``clustersim plan``; ``.to_list()`` is its
    ``--json`` output. ``model`` and ``cluster`` are preset names, YAML files or mappings;
    ``gpus`` may be left out for a cluster made of pools (``{"pools": [...]}``), which has its
    own, and the result then has ``fastest_pool_alone``;
    ``fix`` pins dotted fields (``{"parallel.tp": 8}``, as ``--fix``); the other options are
    ``plan``'s flags with underscores (``tokens``, ``global_batch``, ``seq_len``, ``top``,
    ``memory_reserve``, ``mtbf_hours``, ``gpu_hour_price`` ...; ``samples`` and ``seed`` give
    each plan error bars, as ``--samples``; ``jobs`` is ``--jobs``, by default the machine's
    cores; ``backend="ray"`` (and ``address``) search on a Ray cluster, as ``--backend ray``;
    the plans do not depend on either; ``profile`` and ``force_profile`` are ``--profile``
    and ``--force-profile``; ``framework`` is ``--framework``: the search keeps to what that
    training stack runs, and each plan's ``plan.launch`` is its arguments)."""
    from dataclasses import replace

    from clustersim.reports.plan import with_error_bars
    from clustersim.reports.plan_request import make_request, search
    from clustersim.reports.processes import workers_for

    top = options.pop("top", 5)
    samples, seed = options.pop("samples", None), options.pop("seed", 0)
    jobs = options.pop("jobs", None)
    if jobs is not None and jobs < 1:
        raise ScenarioError("jobs", f"must be at least 1 (got {jobs})")
    backend, address = options.pop("backend", "local"), options.pop("address", None)
    if backend not in ("local", "ray"):
        raise ScenarioError("backend", f"must be local or ray (got {backend!r})")
    if address and backend != "ray":
        raise ScenarioError("address", "only applies to backend ray")
    profile, force = options.pop("profile", None), options.pop("force_profile", False)
    fix = dict(fix or {})
    framework = options.pop("framework", None)
    if framework is not None:
        if fix.get("training.framework", framework) != framework:
            raise ScenarioError("framework", f"{framework}, but fix pins "
                                             f"training.framework={fix['training.framework']}")
        fix["training.framework"] = framework
    load_plugins()
    req = make_request(model, cluster, gpus, fixed=fix, **options)
    if profile:
        from clustersim.simulator.inputs.scenario import build_cluster
        from clustersim.validation.profiles import load_named_profile
        req = replace(req, profile=load_named_profile(str(profile), build_cluster(req.cluster),
                                                      force))
    with workers_for(backend, jobs, address) as workers:
        found = search(req, top, jobs=workers)
    if samples is None:
        return found
    if samples < 2:
        raise ScenarioError("samples", f"must be at least 2 for an interval (got {samples})")
    return replace(found, plans=with_error_bars(found.plans, samples, seed, req.profile))

