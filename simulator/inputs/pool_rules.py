"""Which pool each pipeline stage runs on (``parallel.stage_pools``), and the rules of it.

A stage is ``tp * cp * dp`` GPUs (Megatron-LM numbers ranks with pp outermost, so a stage's
GPUs are consecutive) and lives inside one pool, so that its tensor-, context- and
data-parallel collectives stay on that pool's links. Every pool's GPUs must be whole stages:
the planner compares a mixed cluster against its fastest pool alone rather than leaving GPUs
idle. Each failure is a ScenarioError naming the field to change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clustersim.errors import ScenarioError
from clustersim.topologies.hardware import ClusterSpec
from clustersim.topologies.pools import PooledCluster

from .placement import parse_order
from .specs import ParallelSpec

if TYPE_CHECKING:
    from .scenario import Scenario


def with_stage_pools(s: Scenario) -> ParallelSpec:
    """``s.parallel`` with ``stage_pools`` checked, or derived when left out (stages fill the
    pools in order); None on a cluster without pools."""
    p = s.parallel
    if not isinstance(s.cluster, PooledCluster):
        if p.stage_pools is not None:
            raise ScenarioError("parallel.stage_pools",
                                "needs a cluster made of pools (cluster.pools)")
        return p
    if parse_order(p.order)[-1] != "pp":
        raise ScenarioError("parallel.order", "a cluster of pools needs pp outermost, so that "
                            f"each stage's GPUs lie in one pool (got {p.order!r})")
    per_stage = p.tp * p.cp * p.dp
    pools = s.cluster.pools
    chosen = p.stage_pools if p.stage_pools is not None else filled(pools, per_stage)
    _check(chosen, pools, per_stage, p.pp)
    return p.model_copy(update={"stage_pools": list(chosen)})


def filled(pools: list[ClusterSpec], per_stage: int) -> list[int]:
    """Stages in pipeline order filling the pools in their order, ``gpus / per_stage`` each."""
    out: list[int] = []
    for k, pool in enumerate(pools):
        if pool.gpus % per_stage:
            raise ScenarioError("cluster.pools", f"pool {k} ({pool.name}) has {pool.gpus} GPUs, "
                                f"not whole stages of tp*cp*dp = {per_stage} GPUs")
        out += [k] * (pool.gpus // per_stage)
    return out


def _check(chosen: list[int], pools: list[ClusterSpec], per_stage: int, pp: int) -> None:
    if len(chosen) != pp:
        raise ScenarioError("parallel.stage_pools",
                            f"has {len(chosen)} entries; expected one per stage, pp = {pp}")
    names = ", ".join(f"{k} ({pool.name})" for k, pool in enumerate(pools))
    for k in chosen:
        if k >= len(pools):
            raise ScenarioError("parallel.stage_pools",
                                f"unknown pool {k} (cluster.pools has {len(pools)}: {names})")
    for k, pool in enumerate(pools):
        stages = chosen.count(k)
        if stages * per_stage != pool.gpus:
            raise ScenarioError(
                "parallel.stage_pools",
                f"pool {k} ({pool.name}) has {pool.gpus} GPUs but gets {stages} stage(s) of "
                f"tp*cp*dp = {per_stage} GPUs = {stages * per_stage}; each pool's GPUs must be "
                "whole stages")


def check_fidelity(s: Scenario, fidelity: str) -> None:
    """Full fidelity routes every flow over one fabric of one kind of node: it does not model
    pools yet, so it refuses them rather than price a mixed cluster as a uniform one."""
    if fidelity == "full" and isinstance(s.cluster, PooledCluster):
        raise ScenarioError("fidelity", "full fidelity does not model a cluster of pools "
                                        "(cluster.pools) yet; use representative or analytic")
