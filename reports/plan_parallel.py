"""The planner's search run (``search_splits``): every candidate split (``plan_search.py``)
searched in this process or, with ``plan --jobs``, over several, with one process's answer.

The splits are cut into runs of one shape (``shape_groups``), each searched whole in a worker
of the sweeps' local pool (``processes.py``), the largest runs first; the runs' searches are
merged in their order (``SplitSearch.merged``). The workers share the fastest ``keep``-th
estimate any of them holds (``SplitSearch.shared``), so that each prunes by the others' finds
too, as one process prunes by everything it has seen.
"""

from __future__ import annotations

import functools
import itertools
import math
import multiprocessing
from collections.abc import Callable
from typing import TYPE_CHECKING

from clustersim.errors import ScenarioError
from clustersim.simulator.inputs.scenario import build_cluster, build_scenario

from .plan_search import SplitSearch, candidates, search_group
from .pool_plan import one_gpu_cluster
from .processes import completed

if TYPE_CHECKING:
    from .plan import PlanRequest


def search_splits(req: PlanRequest, keep: int,
                  progress: Callable[[int, int], None] | None = None,
                  prune: bool = True, jobs: int = 1) -> SplitSearch:
    """Every candidate split validated and, where it fits, estimated (the ``keep`` fastest
    at least); errors when the request leaves no split at all. ``jobs`` > 1 spreads the
    splits over that many processes (``search_in_processes``), with the same outcome."""
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
    if jobs > 1:
        search = search_in_processes(req, keep, prune, shape_groups(tried), jobs, progress)
    else:
        search = search_group(req, keep, prune, tried, progress=progress)
    if search.valid == 0 and req.fixed and search.first_error is not None:
        raise search.first_error  # the pinned fields rule out every split: say why
    return search


def shape_groups(splits: list[dict]) -> list[list[dict]]:
    """The splits in runs of one shape (tp, cp, pp, dp, ep), in their order: every
    micro-batch of a split lies in one run, so that the memory shortcut works within it."""
    groups: list[list[dict]] = []
    for _, run in itertools.groupby(splits, key=lambda d: tuple(
            d[k] for k in ("tp", "cp", "pp", "dp", "ep"))):
        groups.append(list(run))
    return groups


def _fastest_of_group(req: PlanRequest, keep: int, prune: bool, splits: list[dict]
                      ) -> SplitSearch:
    """A worker's search of one run of splits, its estimates cut to the ``keep`` fastest
    (all that can reach the shortlist; fewer scenarios to send back)."""
    search = search_group(req, keep, prune, splits, _shared_threshold)
    search.fitting = sorted(search.fitting, key=lambda pair: pair[0])[:keep]
    search.shared = None  # a process's own: not sent back
    search.layer_costs, search.activations = {}, {}  # nor its caches
    return search


_shared_threshold = None  # in a worker: the value ``_share`` hands it


def _share(threshold: object) -> None:
    """A worker's initializer: keep the shared threshold (inherited, never pickled)."""
    global _shared_threshold
    _shared_threshold = threshold


def search_in_processes(req: PlanRequest, keep: int, prune: bool, groups: list[list[dict]],
                         jobs: int, progress: Callable[[int, int], None] | None
                         ) -> SplitSearch:
    """The runs of splits over ``jobs`` processes, merged in the runs' order, so the outcome
    is the one process's: the counts add up (the memory shortcut stays within a run); a split
    is skipped only when ``keep`` others are at least as fast (its run's own, which the one
    process had seen too, ties kept as it keeps them) or strictly faster (the shared
    threshold: some worker's ``keep`` estimates, all below the split's bound), so none that
    can reach the shortlist is lost; the runs' fastest, joined in order and sorted stably,
    rank equal estimates as the one process does (in the order they were tried). Which
    splits a worker skips depends on timing; the answer does not."""
    order = sorted(range(len(groups)), key=lambda i: -len(groups[i]))  # largest first
    parts: list[SplitSearch | None] = [None] * len(groups)
    done, total = 0, sum(map(len, groups))
    work = functools.partial(_fastest_of_group, req, keep, prune)
    # No lock: any value a worker writes is its own keep-th fastest, a valid threshold.
    threshold = multiprocessing.RawValue("d", math.inf)
    for i, part in completed(work, [groups[i] for i in order], jobs, _share, (threshold,)):
        parts[order[i]] = part
        done += len(groups[order[i]])
        if progress:
            progress(done, total)
    return SplitSearch.merged(req, prune, keep, [p for p in parts if p is not None])
