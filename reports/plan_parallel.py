"""The planner's search run (``search_splits``): every candidate split (``plan_search.py``)
searched in this process or, with ``plan --jobs``, over several, with one process's answer.

Two passes. The first builds, counts, checks the memory of and bounds every split: the
splits are cut into runs of one shape (``shape_groups``), each searched whole in a worker of
the sweeps' local pool (``processes.py``), the largest runs first, and the runs' passes are
merged in their order (``SplitSearch.merged``), each split keeping its place in the order.
The second estimates the splits that fit best bound first (``plan_rank.py``), in batches over
the workers, until no bound left can beat the ``keep``-th estimate.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from clustersim.errors import ScenarioError
from clustersim.simulator.inputs.scenario import build_cluster, build_scenario

from .plan_rank import rank
from .plan_search import SplitSearch, candidates, search_group, shape_groups
from .pool_plan import one_gpu_cluster
from .processes import Workers, as_workers

if TYPE_CHECKING:
    from .plan import PlanRequest


def search_splits(req: PlanRequest, keep: int,
                  progress: Callable[[int, int], None] | None = None,
                  prune: bool = True, jobs: int | Workers = 1) -> SplitSearch:
    """Every candidate split validated and, where it fits, estimated (the ``keep`` fastest
    at least); errors when the request leaves no split at all. ``jobs`` > 1 spreads the
    splits over that many processes, or ``Workers`` over a Ray cluster's
    (``first_pass_in_processes``, ``plan_rank.rank``), with the same outcome."""
    workers = as_workers(jobs)
    cluster = build_cluster(req.cluster)  # the GPU count itself must make whole nodes
    # The shapes of model and cluster, validated once (one GPU: any batch splits over it).
    base = build_scenario({"model": req.model, "cluster": one_gpu_cluster(req.cluster),
                           "training": {"global_batch": 1, **req.training}}, "plan")
    tried = list(candidates(req, base, cluster))
    if not tried and req.fixed:
        pins = ", ".join(f"{k}={v}" for k, v in req.fixed.items())
        raise ScenarioError("--fix", f"no split of {req.cluster['gpus']} GPUs with {pins} "
                                     f"divides the GPUs and the global batch {req.global_batch}")
    if not tried:
        raise ScenarioError("--gpus", f"no split of {req.cluster['gpus']} GPUs divides the global "
                                      f"batch {req.global_batch} evenly")
    groups = shape_groups(tried)
    if workers.parallel:
        search = first_pass_in_processes(req, prune, groups, workers, progress)
    else:
        search = SplitSearch(req, prune)  # one, sharing its caches over every run
        for g, group in enumerate(groups):
            search.run(group, g, _progress_from(progress, groups, g))
    rank(search, keep, workers)
    if search.valid == 0 and req.fixed and search.first_error is not None:
        raise search.first_error  # the pinned fields rule out every split: say why
    return search


def _progress_from(progress: Callable[[int, int], None] | None, groups: list[list[dict]],
                   g: int) -> Callable[[int, int], None] | None:
    """``progress`` over all the splits, for the splits of the ``g``-th run."""
    if progress is None:
        return None
    before, total = sum(map(len, groups[:g])), sum(map(len, groups))
    return lambda done, _: progress(before + done, total)


def _first_pass_of_group(req: PlanRequest, prune: bool, item: tuple[int, list[dict]]
                         ) -> SplitSearch:
    """A worker's first pass over one run of splits, light to send back."""
    g, splits = item
    return search_group(req, splits, g, prune=prune).without_scenarios()


def first_pass_in_processes(req: PlanRequest, prune: bool, groups: list[list[dict]],
                            workers: Workers, progress: Callable[[int, int], None] | None
                            ) -> SplitSearch:
    """The runs of splits' first passes over ``workers``, merged in the runs' order,
    so the outcome is the one process's: the counts add up (the memory shortcut stays within
    a run) and each split keeps its place in the order (``seq``)."""
    order = sorted(range(len(groups)), key=lambda i: -len(groups[i]))  # largest first
    parts: list[SplitSearch | None] = [None] * len(groups)
    done, total = 0, sum(map(len, groups))
    work = functools.partial(_first_pass_of_group, req, prune)
    for i, part in workers.completed(work, [(g, groups[g]) for g in order]):
        parts[order[i]] = part
        done += len(groups[order[i]])
        if progress:
            progress(done, total)
    return SplitSearch.merged(req, prune, [p for p in parts if p is not None])
