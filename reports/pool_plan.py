"""The planner on a cluster of pools: where the pipeline stages go, how many layers each takes,
and how the best mixed plan compares with the cluster's fastest pool alone.

For each split the planner tries every order of the pools along the pipeline (stages fill
each pool contiguously, its GPUs whole stages: ``simulator/inputs/pool_rules.py``), each with the
layers spread evenly and balanced over the stages' speeds (``simulator/planning/balance.py``: more
layers on faster GPUs). A user's ``--fix parallel.stage_pools=...`` or ``stage_layers`` pins
that choice. The fastest pool (highest peak at the training precision, then the most GPUs)
is then planned alone (``plan.plan_fastest_pool_alone``), so that the output says whether
mixing in the slower GPUs pays.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from clustersim.errors import ScenarioError
from clustersim.simulator.inputs.scenario import Scenario, apply_values, build_cluster
from clustersim.simulator.planning.balance import balanced_stage_layers
from clustersim.topologies.pools import PooledCluster

if TYPE_CHECKING:
    from .plan import Plan, PlanRequest

MAX_ORDERS = 24  # pool orders tried per split: all of them up to four pools


def is_pooled(req: PlanRequest) -> bool:
    return isinstance(req.cluster, dict) and "pools" in req.cluster


def one_gpu_cluster(cluster: dict) -> dict:
    """A one-GPU cluster section, for validating the model and training alone: of a cluster
    of pools, the first pool's (the pools are validated with the cluster)."""
    if "pools" in cluster:
        pools = cluster["pools"]
        section = pools[0] if isinstance(pools, list) and pools else {}
        cluster = section if isinstance(section, dict) else {}
    return {**{k: v for k, v in cluster.items() if k != "nodes"}, "gpus": 1}


def pipeline_depths(layers: int, gpus: int, cluster: PooledCluster) -> list[int]:
    """Every pipeline depth whose stages are whole in each pool (3 for 512 + 256 GPUs)."""
    return [pp for pp in range(1, min(layers, gpus) + 1)
            if gpus % pp == 0 and all(pool.gpus % (gpus // pp) == 0 for pool in cluster.pools)]


def placements(cluster: PooledCluster, per_stage: int) -> list[list[int]]:
    """Every stage-to-pool assignment with each pool's stages together, in each pool order."""
    if any(pool.gpus % per_stage for pool in cluster.pools):
        return []
    orders = itertools.islice(itertools.permutations(range(len(cluster.pools))), MAX_ORDERS)
    found = {tuple(k for k in order for _ in range(cluster.pools[k].gpus // per_stage))
             for order in orders}
    return [list(p) for p in sorted(found)]


def pool_variants(raw: dict, split: dict, cluster: PooledCluster, fixed: dict
                  ) -> Iterator[dict]:
    """``raw`` once per placement of its stages (a pinned ``stage_pools`` is kept)."""
    if "parallel.stage_pools" in fixed:
        yield raw
        return
    per_stage = split["tp"] * split["cp"] * split["dp"]
    found = placements(cluster, per_stage)
    if not found:  # its stages are not whole in every pool: building it says which pool
        yield raw
    for chosen in found:
        yield apply_values(raw, {"parallel.stage_pools": chosen})


def balanced(raw: dict, s: Scenario, fixed: dict) -> dict | None:
    """``raw`` with its layers balanced over its stages' speeds, or None when that is the
    split it already has (or its layers are pinned)."""
    if "parallel.stage_layers" in fixed or s.parallel.pp == 1:
        return None
    layers = balanced_stage_layers(s)
    if layers == s.parallel.stage_layers:
        return None
    return apply_values(raw, {"parallel.stage_layers": layers})


@dataclass(frozen=True)
class FastestPoolAlone:
    """The best plan on the fastest pool alone, to compare a mixed plan with."""

    pool: int
    gpus: int
    gpu: str
    best: Plan | None  # None: no split of the pool alone fits (or divides the batch)

    def as_dict(self) -> dict[str, Any]:
        best = self.best
        return {"pool": self.pool, "gpus": self.gpus, "gpu": self.gpu,
                "step_time_s": best.result.step_time_s if best else None,
                "split": best.scenario.name if best else None}

    def line(self, mixed: Plan | None) -> str:
        """One sentence: the pool alone's best against the best mixed plan."""
        head = f"Fastest pool alone (pool {self.pool}: {self.gpus} x {self.gpu})"
        if self.best is None:
            return f"{head}: no split fits."
        line = f"{head}: {self.best.result.step_time_s:.3f} s per step ({self.best.scenario.name})"
        if mixed is not None:
            ratio = self.best.result.step_time_s / mixed.result.step_time_s
            verdict = "faster" if ratio > 1 else "slower"
            line += (f"; the mixed plan is {max(ratio, 1 / ratio):.2f}x {verdict}, on "
                     f"{mixed.result.gpus} GPUs")
        return line + "."


def fastest_pool(cluster: PooledCluster, precision: str) -> int:
    """The pool with the highest peak at ``precision``, then the most GPUs."""
    def speed(k: int) -> tuple[float, int]:
        pool = cluster.pools[k]
        return pool.gpu.peak_flops.get(precision, 0.0), pool.gpus
    return max(range(len(cluster.pools)), key=speed)


def alone_request(req: PlanRequest) -> tuple[PlanRequest, int, PooledCluster]:
    """The request on the fastest pool alone (its own GPU count), and which pool that is."""
    cluster = build_cluster(req.cluster)
    if not isinstance(cluster, PooledCluster):
        raise ScenarioError("cluster.pools", "the fastest pool of a cluster without pools")
    k = fastest_pool(cluster, req.training.get("precision", "bf16"))
    section = {key: v for key, v in req.cluster["pools"][k].items() if key != "nodes"}
    fixed = {path: v for path, v in req.fixed.items()
             if path not in ("parallel.stage_pools", "parallel.stage_layers")}
    return replace(req, cluster={**section, "gpus": cluster.pools[k].gpus}, fixed=fixed), k, \
        cluster


def stages_label(s: Scenario) -> str:
    """``0:13 0:13 1:11 1:11``: each stage's pool and layers."""
    from clustersim.simulator.pipeline.stages import stage_layers

    return " ".join(f"{k}:{n}" for k, n in zip(s.parallel.stage_pools, stage_layers(s),
                                                strict=True))
