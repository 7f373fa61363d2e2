"""The capacity planner: the fastest splits of a model over N GPUs that fit in memory.

What it tries and how it narrows them is ``plan_search.py``; here the engine ranks the
shortlist the closed forms leave, and each plan gets its checkpoint advice and, on request,
error bars. GPipe is left out of the search: it has 1F1B's bubble and holds more activations,
so it never wins. ``docs/planner.md`` describes the whole.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

from clustersim.errors import ScenarioError
from clustersim.simulator.costs.result import StepResult
from clustersim.simulator.costs.stage_costs import uncertain_profile
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import Scenario
from clustersim.simulator.planning.spread import Spread, spread
from clustersim.topologies.profile import Profile

from .launch import launch
from .megatron import megatron_args
from .plan_caveats import Caveat, moe_routing_note, with_caveats
from .plan_parallel import search_splits
from .plan_search import (  # noqa: F401  (candidates and _raw: the tests' exhaustive search)
    _raw,
    candidates,
)
from .pool_plan import FastestPoolAlone, alone_request
from .processes import Workers, as_workers
from .resilience import CheckpointPlan, checkpoint_plan

ENGINE_SHORTLIST = 4  # the engine ranks this many times --top of the analytic best


@dataclass(frozen=True)
class PlanRequest:
    model: dict  # the scenario's model section (a preset name or full shape)
    cluster: dict  # its cluster section, with ``gpus``
    global_batch: int
    tokens: float | None = None
    mtbf_hours: float | None = None  # per GPU
    checkpoint_write_s: float = 60.0
    checkpoint_restore_s: float = 300.0
    gpu_hour_price: float | None = None
    training: dict = field(default_factory=dict)  # other training fields (precision, ...)
    memory_reserve: float = 0.05  # fraction of GPU memory kept free (allocator, CUDA context)
    # Pinned fields (``--fix``): parallel.* and training.micro_batch, dotted path -> value;
    # a pinned value outside the search space is still used.
    fixed: dict = field(default_factory=dict)
    # --profile: the calibration that prices every split (None: each GPU's shipped profile).
    profile: Profile | None = None


@dataclass(frozen=True)
class Plan:
    scenario: Scenario
    result: StepResult
    checkpoint: CheckpointPlan | None
    spread: Spread | None = None  # plan --samples: the step's error bars
    caveats: tuple[Caveat, ...] = ()  # its features of uncertain cost (plan_caveats.py)

    @property
    def headroom_bytes(self) -> float:
        return self.result.headroom_bytes

    @property
    def gpu_hours(self) -> float | None:
        t = self.result.time_to_train_s
        return None if t is None else t * self.result.gpus / 3600

    def as_dict(self, price: float | None = None) -> dict:
        hours = self.gpu_hours
        extra = {"gpu_hours": hours, "memory_headroom_bytes": int(self.headroom_bytes)}
        if price is not None and hours is not None:
            extra["cost"] = hours * price
        if self.checkpoint is not None:
            extra["checkpoint"] = self.checkpoint.as_dict()
        extra["megatron_args"] = megatron_args(self.scenario)
        extra["launch"] = launch(self.scenario).as_dict()
        if self.spread is not None:
            extra.update(self.spread.as_json())
        extra["caveats"] = [c.as_dict() for c in self.caveats]
        moe = moe_routing_note(self.scenario, "this plan")
        if moe:
            extra["moe_note"] = moe
        return {"scenario": self.scenario.as_dict(), "result": self.result.to_json(),
                "plan": extra}


def plan(req: PlanRequest, top: int = 5,
         progress: Callable[[int, int], None] | None = None,
         prune: bool = True, caveats: bool = True, jobs: int | Workers = 1
         ) -> tuple[list[Plan], int, int]:
    """The ``top`` fastest splits that fit; also how many were valid and how many fit.
    ``prune=False`` estimates every split that fits, even one a bound shows too slow to
    reach the engine, and checks the memory of every micro-batch (the tests compare).
    ``caveats``: each plan's features of uncertain cost, each run without (``plan_caveats``).
    ``jobs``: processes (or ``Workers``: a Ray cluster's) for the search and the engine's
    runs; the answer does not change."""
    shortlist = max(ENGINE_SHORTLIST * top, 10)
    search = search_splits(req, shortlist, progress, prune, jobs)
    best = [s for _, s in sorted(search.fitting, key=lambda pair: pair[0])[:shortlist]]
    ranked = []
    for s, result in zip(best, _simulated(best, jobs, req.profile), strict=True):
        if _fits(result, req.memory_reserve):
            ranked.append((_rank_key(result), s, result))
    ranked.sort(key=lambda item: item[0])
    plans = [Plan(s, r, _checkpoint(req, r)) for _, s, r in ranked[:top]]
    if caveats:
        plans = with_caveats(plans, req.memory_reserve, req.profile)
    return plans, search.valid, search.fit


def plan_fastest_pool_alone(req: PlanRequest, top: int) -> FastestPoolAlone:
    """Plan the fastest pool alone (the same search, on its GPUs only)."""
    alone, k, cluster = alone_request(req)
    try:
        plans, _, _ = plan(alone, top=1, caveats=False)
    except ScenarioError:  # e.g. no split of the pool's GPUs divides the global batch
        plans = []
    pool = cluster.pools[k]
    return FastestPoolAlone(k, pool.gpus, pool.gpu.id, plans[0] if plans else None)


def _simulated(scenarios: list[Scenario], jobs: int | Workers,
               profile: Profile | None = None) -> list[StepResult]:
    """The engine's result of each scenario (priced by ``profile``, else each GPU's shipped
    one), in their order, over ``jobs`` processes (or ``Workers``)."""
    run = partial(simulate, profile=profile)
    workers = as_workers(jobs)
    if not workers.parallel:
        return [run(s) for s in scenarios]
    return workers.in_order(run, scenarios)


def _rank_key(r: StepResult) -> tuple[float, float]:
    """Fastest first; equal step times (to the nanosecond) go to the one with more free memory."""
    return round(r.step_time_s, 9), r.peak_bytes


def _fits(r: StepResult, reserve: float) -> bool:
    return r.fits_within(reserve)


def _checkpoint(req: PlanRequest, r: StepResult) -> CheckpointPlan | None:
    if req.mtbf_hours is None or r.time_to_train_s is None:
        return None
    return checkpoint_plan(r.time_to_train_s, r.gpus, req.mtbf_hours, req.checkpoint_write_s,
                           req.checkpoint_restore_s)


def with_error_bars(plans: list[Plan], samples: int, seed: int = 0,
                    profile: Profile | None = None) -> list[Plan]:
    """The plans, each with its step's median and 90% interval over ``samples`` draws of the
    profile's uncertainty (``profile``, else its GPU's shipped one; the engine, as the
    ranking ran)."""
    def bars(s: Scenario) -> Spread:
        return spread(lambda drawn: simulate(s, profile=drawn),
                      uncertain_profile(s, profile, "--samples"), samples, seed)
    return [replace(p, spread=bars(p.scenario)) for p in plans]
