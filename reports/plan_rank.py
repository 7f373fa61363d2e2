"""The planner's second pass: the splits that fit estimated best bound first, so that the
``keep`` fastest are found before the slower splits, which their bounds then skip.

The first pass (``plan_search.SplitSearch``) leaves every split that fits with a lower bound
of its closed-form step (``plan_bound.end_stages_floor_s``). Here they are taken in the order
of their bounds and estimated (``closed_form_step``: ``analytic.estimate``'s step) until the
next bound cannot beat the ``keep``-th fastest estimate: no split after it can either, so the
``keep`` fastest are those an exhaustive search finds. Equal steps rank by the order the
splits were considered (``seq``), as a stable sort of the exhaustive search's would; a split
is skipped only when its (bound, seq) comes after the ``keep``-th (step, seq).

Why best first: in the order the splits are tried, the ``keep``-th estimate falls slowly and
the slower splits found early are all estimated (5,474 of Mixtral 8x7B's 29,027 that fit on
256 GPUs, 8,775 when two processes each searched their runs of splits); best first, only
those whose bound is below the final ``keep``-th are (4,794), whatever the processes.

One process estimates exactly the splits whose (bound, seq) comes before the final
``keep``-th (step, seq): a split in reach of the ``keep``-th in hand stays in reach of the
final one, since every split after it in the order has a larger bound, so a larger step
(``tests/reports/test_plan_search.py`` counts them against an exhaustive search). With
``jobs`` > 1 the splits go out in batches over the processes, in the order of their bounds,
while the first split of the next batch can still beat the ``keep``-th estimate in hand:
every split one process estimates is estimated, and a few batches more, sent before the
estimates that would have ruled them out came back; the answer is the same
(``tests/reports/test_plan_jobs.py``).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import TYPE_CHECKING

from clustersim.simulator.closed_form.analytic import stage_times
from clustersim.simulator.costs.stage_costs import StageCosts
from clustersim.simulator.inputs.scenario import Scenario, build_cluster
from clustersim.simulator.model import workload as wl
from clustersim.simulator.pipeline.schedules import schedule_named

from .plan_build import ScenarioBuilder, scenarios_of
from .processes import Workers, as_workers

if TYPE_CHECKING:
    from .plan import PlanRequest
    from .plan_search import SplitSearch

BATCH = 16  # splits per batch sent to a process: a few tens of ms of work each


def closed_form_step(s: Scenario, costs: StageCosts) -> float:
    """``analytic.estimate``'s step: every stage's closed form, run by its schedule."""
    message = wl.pipeline_message_bytes(s)
    stages = [stage_times(costs.stage(i), i, costs.stage_send_links(i, message))
              for i in range(s.parallel.pp)]
    finish = schedule_named(s.parallel.schedule).finish(stages, s.microbatches,
                                                        s.parallel.virtual_stages)
    return max(finish)


class Fastest:
    """The ``keep`` fastest estimates so far, as (step, seq), and whether a bound can still
    beat them."""

    def __init__(self, keep: int, prune: bool) -> None:
        self.keep, self.prune = keep, prune
        self.best: list[tuple[float, tuple]] = []

    def add(self, step: float, seq: tuple) -> None:
        if len(self.best) < self.keep or (step, seq) < self.best[-1]:
            bisect.insort(self.best, (step, seq))
            del self.best[self.keep:]

    def out_of_reach(self, bound: float, seq: tuple) -> bool:
        """Whether a split with this bound ranks after the ``keep``-th whatever its step."""
        return self.prune and len(self.best) == self.keep and (bound, seq) > self.best[-1]


def rank(search: SplitSearch, keep: int, jobs: int | Workers = 1) -> SplitSearch:
    """Estimate ``search``'s pending splits best first (every one with ``prune`` off);
    ``search.fitting`` then holds the estimates in the order considered, ``skipped_slow``
    counts the splits left out (``skipped_floor`` those whose step floor was the bound).
    Over ``jobs`` processes (or ``Workers``), ``fitting`` holds the ``keep`` fastest only
    (rebuilt here: the workers send back steps, not scenarios)."""
    req, workers = search.req, as_workers(jobs)
    order = sorted(search.pending, key=lambda entry: (entry[0], entry[1]))
    fastest = Fastest(keep, search.prune)
    if not workers.parallel:
        estimated = list(_in_this_process(req, order, fastest, search.layer_costs))
        done = {seq for seq, _, _ in estimated}
    else:
        steps = dict(_in_processes(req, order, fastest, workers))
        kept = {seq for _, seq in fastest.best} if search.prune else set(steps)
        rebuild = Rebuilder(req)
        estimated = [(seq, steps[seq], rebuild(split, seq))
                     for _, seq, split, _ in order if seq in kept]
        done = set(steps)
    search.skipped_slow = len(order) - len(done)
    search.skipped_floor = len(search.floor_tighter - done)
    estimated.sort(key=lambda entry: entry[0])
    search.fitting = [(step, s) for _, step, s in estimated]
    search.pending, search.floor_tighter = [], set()
    return search


class Rebuilder:
    """The scenario a pending split's ``seq`` names, built again from its split (at its
    placement on a cluster of pools): the processes exchange splits, not scenarios."""

    def __init__(self, req: PlanRequest) -> None:
        self.req, self.builder = req, ScenarioBuilder()
        self.cluster = build_cluster(req.cluster)

    def __call__(self, split: dict, seq: tuple) -> Scenario:
        built = scenarios_of(self.req, split, self.cluster, self.builder)
        s = next(itertools.islice(built, seq[-1], None))
        if not isinstance(s, Scenario):  # it was valid in the first pass: never
            raise s
        return s


def _in_this_process(req: PlanRequest, order: list, fastest: Fastest, caches: dict
                     ) -> Iterator[tuple[tuple, float, Scenario]]:
    """(seq, step, scenario) of each split estimated, best bound first, in this process;
    ``caches``: the first pass's shared costs."""
    rebuild = None
    for bound, seq, split, s in order:
        if fastest.out_of_reach(bound, seq):
            return
        if s is None:
            rebuild = rebuild or Rebuilder(req)
            s = rebuild(split, seq)
        step = closed_form_step(s, StageCosts(s, req.profile, caches))
        fastest.add(step, seq)
        yield seq, step, s


def _in_processes(req: PlanRequest, order: list, fastest: Fastest, workers: Workers
                  ) -> Iterator[tuple[tuple, float]]:
    """(seq, step) of each split estimated, in batches over ``workers`` in the order of
    their bounds; no batch goes out once its first split is out of reach."""
    light = [(bound, seq, split) for bound, seq, split, _ in order]
    at = 0
    with workers.executor(_start_worker, (req,)) as pool:
        running: set[Future] = set()
        while True:
            while len(running) < workers.count and at < len(light) and not fastest.out_of_reach(
                    *light[at][:2]):
                batch = light[at:at + BATCH]
                running.add(pool.submit(estimate_batch, batch))
                at += len(batch)
            if not running:
                return
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                for seq, step in future.result():
                    fastest.add(step, seq)
                    yield seq, step


_worker: dict = {}  # in a worker process: its request's rebuilder and shared costs


def _start_worker(req: PlanRequest) -> None:
    """A worker's initializer: the request's rebuilder and an empty cost cache, kept across
    its batches (one layer's costs serve many splits)."""
    _worker.update(req=req, rebuild=Rebuilder(req), caches={})


def estimate_batch(batch: list[tuple[float, tuple, dict]]) -> list[tuple[tuple, float]]:
    """A worker's estimates of a batch of splits, each scenario rebuilt from its split."""
    req, rebuild, caches = _worker["req"], _worker["rebuild"], _worker["caches"]
    out = []
    for _, seq, split in batch:
        s = rebuild(split, seq)
        out.append((seq, closed_form_step(s, StageCosts(s, req.profile, caches))))
    return out
