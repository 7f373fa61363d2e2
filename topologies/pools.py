"""Heterogeneous clusters: pools of GPUs, each pool a homogeneous cluster of its own.

A pool has its GPU, its nodes and its links (``ClusterSpec``): 512 H100 beside 512 A100, or
H100 nodes on two different networks. A job's pipeline stages are placed on pools
(``parallel.stage_pools``), each stage's tensor-, context- and data-parallel GPUs inside one
pool, so that a stage's collectives stay in its pool; only pipeline sends cross between pools.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from .hardware import ClusterSpec


class PooledCluster(BaseModel):
    """A cluster made of ``pools``; its GPUs are the pools' GPUs, pool 0's first."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("pools", description="label in reports")
    pools: Annotated[list[ClusterSpec], Field(min_length=1)] = Field(
        description="the pools, each a cluster of its own (a preset with gpus or nodes, and "
                    "overrides); parallel.stage_pools refers to them by index")

    @property
    def gpus(self) -> int:
        return sum(pool.gpus for pool in self.pools)

    @property
    def nodes(self) -> int:
        return sum(pool.nodes for pool in self.pools)

    @property
    def gpus_per_node(self) -> int:
        """The smallest node among the pools: the widest group that fits a node of any pool."""
        return min(pool.gpus_per_node for pool in self.pools)


def cluster_pools(cluster: ClusterSpec | PooledCluster) -> list[ClusterSpec]:
    """The pools of a cluster: its own list, or the one homogeneous cluster itself."""
    return list(cluster.pools) if isinstance(cluster, PooledCluster) else [cluster]


def is_pooled(cluster: ClusterSpec | PooledCluster) -> bool:
    return isinstance(cluster, PooledCluster)


def cluster_label(cluster: ClusterSpec | PooledCluster) -> str:
    """``"512 x h100-sxm (dgx-h100)"``, or each pool's joined by ``+``."""
    return " + ".join(f"{c.gpus} x {c.gpu.id} ({c.name})" for c in cluster_pools(cluster))


def mean_peak_flops(cluster: ClusterSpec | PooledCluster, precision: str) -> float:
    """Dense peak FLOP/s per GPU at ``precision``, averaged over the cluster's GPUs: MFU's
    denominator, so that a mixed cluster's MFU is its model FLOP/s over all its GPUs' peaks."""
    if not isinstance(cluster, PooledCluster):
        return cluster.gpu.peak_flops[precision]
    return sum(p.gpus * p.gpu.peak_flops[precision] for p in cluster.pools) / cluster.gpus
