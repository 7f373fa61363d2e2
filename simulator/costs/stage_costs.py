"""Which cost model prices each pipeline stage: the cluster's one, or its stage's pool's.

On a cluster of pools (``topologies/pools.py``) each pool gets a cost model of its own, built
on the scenario as if the pool were the whole cluster: its GPU's peaks and calibration
profile, its links for the stage's tensor-, context- and data-parallel groups (which stay
inside the pool), its memory capacity and its stragglers. A pipeline send between stages of
two pools crosses the slower of their inter-node links (the smaller achieved bandwidth, the
larger latency): both ends' NICs carry it, and the slower one paces it. A cluster without
pools has one cost model for every stage, exactly as before pools existed.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING

from clustersim.errors import ScenarioError
from clustersim.topologies import collectives as c
from clustersim.topologies import network as net
from clustersim.topologies.pools import cluster_pools, is_pooled
from clustersim.topologies.profile import Profile, profile_for_gpu

from ..inputs.scenario import Scenario
from ..pipeline.stages import scenario_chunk_stages
from .cost_model import CostModel

if TYPE_CHECKING:
    from .work import ChunkWork


class StageCosts:
    """The cost model of each stage, and the links of the pipeline sends between stages."""

    def __init__(self, s: Scenario, profile: Profile | None = None,
                 shared: dict | None = None) -> None:
        """``shared``: one layer's costs of scenarios alike but for their schedule
        (``CostModel``'s), or None."""
        self.s = s
        if is_pooled(s.cluster):
            pools = cluster_pools(s.cluster)
            profiles = pool_profiles(pools, profile)
            self.models = [CostModel(replace(s, cluster=pool), prof, shared)
                           for pool, prof in zip(pools, profiles, strict=True)]
            self.pool_of = tuple(s.parallel.stage_pools)
        else:
            self.models = [CostModel(s, profile, shared)]
            self.pool_of = (0,) * s.parallel.pp
        self._bridges: dict[tuple[int, int], net.GroupLinks] = {}

    def stage(self, stage: int) -> CostModel:
        """The cost model of ``stage``'s pool."""
        return self.models[self.pool_of[stage]]

    @cached_property
    def chunks(self) -> list[ChunkWork]:
        """Every model chunk's work (``work.py``), each costed on its stage's pool."""
        if len(self.models) == 1:
            return self.models[0].chunks
        owner = scenario_chunk_stages(self.s)
        return [self.stage(stage).chunks[chunk] for chunk, stage in enumerate(owner)]

    def send_links(self, a: int, b: int) -> net.GroupLinks:
        """The links a pipeline send from stage ``a`` to stage ``b`` crosses: the pool's
        neighbour tier inside a pool, the slower pool's inter-node tier between pools."""
        pa, pb = self.pool_of[a], self.pool_of[b]
        if pa == pb:
            return self.models[pa].pp
        return self._between(min(pa, pb), max(pa, pb))

    def stage_send_links(self, stage: int, nbytes: float) -> net.GroupLinks:
        """The slowest link for an ``nbytes`` message among ``stage``'s pipeline sends (to and
        from the stages of the chunks next to its own): what the closed form charges each of
        its sends."""
        if len(self.models) == 1:
            return self.models[0].pp
        owner = scenario_chunk_stages(self.s)
        links = [self.send_links(a, b) for a, b in zip(owner, owner[1:], strict=False)
                 if stage in (a, b) and a != b]
        if not links:
            return self.stage(stage).pp
        return max(links, key=lambda g: net.p2p_time(g, nbytes))

    def _between(self, pa: int, pb: int) -> net.GroupLinks:
        key = (pa, pb)
        if key not in self._bridges:
            ends = [_inter_node(self.models[k]) for k in key]
            tier = c.TierCost(min(e.bandwidth for e in ends), max(e.latency for e in ends))
            self._bridges[key] = net.GroupLinks(2, 1, 2, tier, tier, "inter_node", tier)
        return self._bridges[key]


def _inter_node(cm: CostModel) -> c.TierCost:
    """A pool's achieved inter-node tier (profile, link jitter, degraded NICs)."""
    cluster = cm.links_cluster
    tier = net.tier_cost(cm.profile, "inter_node", cluster.inter_node)
    return c.TierCost(tier.bandwidth * cluster.fault_factor("nic"), tier.latency)


def pool_profiles(pools: list, profile: Profile | None) -> list[Profile]:
    """Each pool's calibration profile: ``profile`` for the pools of its GPU (a calibration
    measures one kind of GPU), the shipped one for the others."""
    if profile is not None and all(pool.gpu.id != profile.gpu for pool in pools):
        gpus = ", ".join(sorted({pool.gpu.id for pool in pools}))
        raise ScenarioError("profile", f"{profile.name} was measured on {profile.gpu}; no pool "
                                       f"has that GPU (pools: {gpus})")
    return [profile if profile is not None and pool.gpu.id == profile.gpu
            else profile_for_gpu(pool.gpu.id) for pool in pools]


def uncertain_profile(s: Scenario, profile: Profile | None, field: str = "samples") -> Profile:
    """The profile whose uncertainty ``--samples`` draws: the one given, or the shipped one of
    the cluster's GPU. A cluster of pools prices each GPU with its own profile, and the draws
    of several profiles are not modelled together yet, so it is refused."""
    if is_pooled(s.cluster):
        raise ScenarioError(field, "draws one GPU's profile uncertainty; a cluster of pools "
                                   "(cluster.pools) has several GPUs: not supported yet")
    return profile or profile_for_gpu(s.cluster.gpu.id)
