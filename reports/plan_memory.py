"""The planner's memory check: whether a candidate's closed-form memory fits on its GPUs,
reading as few stages as decide it (``stages_to_check``) and sharing what candidates alike in
part share (``simulator/costs/shared_memory.py``), the verdict itself among them.
``plan_search.SplitSearch`` asks it of every valid candidate (but for the larger micro-batches
of a split already out of memory); ``tests/reports/test_plan_search.py`` compares its shortcut
with every stage's memory, ``tests/reports/test_plan_build.py`` its shared parts with each
candidate's computed alone.
"""

from __future__ import annotations

from clustersim.simulator.costs import memory as mem
from clustersim.simulator.costs import shared_memory
from clustersim.simulator.costs.last_scenario import Same
from clustersim.simulator.inputs.scenario import Scenario
from clustersim.simulator.pipeline.schedules import splits_backward
from clustersim.simulator.pipeline.stages import (
    chunk_mix,
    chunks_of_stage,
    embedding_chunks,
    head_chunks,
)
from clustersim.topologies.pools import cluster_pools, is_pooled


def fits_in_memory(s: Scenario, reserve: float, shared: dict | None = None) -> bool:
    """Whether the closed-form memory of every stage stays within its GPU less ``reserve``:
    the check the analytic estimate's ``fits_within`` makes, without costing the step. The
    end stages go first (the first holds the most micro-batches, the embedding and the head
    sit at the ends), so that a split out of memory is found after a stage or two; of stages
    alike but for their micro-batches in flight, only the one holding the most
    (``stages_to_check``). ``shared``: what splits alike in part share (``SplitSearch``'s),
    the verdict itself among them (``shared_memory.verdict_key``)."""
    if shared is None:
        return _stages_fit(s, reserve)
    key = (shared_memory.verdict_key(s), reserve)
    if key not in shared:
        shared[key] = _unsharded_twin_fits(s, key, shared) or _stages_fit(s, reserve, shared)
    return shared[key]


def _unsharded_twin_fits(s: Scenario, key: tuple, shared: dict) -> bool:
    """Whether ``s`` under ZeRO-1 fits because the same split under ZeRO-0 was found to fit:
    ZeRO-1 shards only the optimizer state over ``dp cp`` (``dp cp / ep`` for experts)
    replicas, and nothing else of a stage's memory differs (the activations and the stages
    checked never read the ZeRO stage, the buffers differ under ZeRO-2 and -3 only, and under
    DeepSpeed's ZeRO-1 optimizer, which adds its gradient buckets), so each stage's peak is a
    sum of the same terms or smaller ones. A twin not yet asked (or asked with any other field
    different) decides nothing."""
    if s.parallel.zero != 1 or mem.deepspeed_reduce_buffers(s.training, s.parallel):
        return False
    verdict, reserve = key
    return shared.get((shared_memory.with_zero(verdict, 0), reserve), False)


def _stages_fit(s: Scenario, reserve: float, shared: dict | None = None) -> bool:
    """``fits_in_memory`` worked out: the checked stages' peaks against their GPUs."""
    pools = cluster_pools(s.cluster) if is_pooled(s.cluster) else None

    def capacity(stage: int) -> int:
        return (s.cluster.gpu.tensor_memory_bytes if pools is None
                else pools[s.parallel.stage_pools[stage]].gpu.tensor_memory_bytes)

    def peak(stage: int) -> float:
        return (mem.stage_memory(s, stage) if shared is None
                else shared_memory.stage_memory(s, stage, shared)).peak_bytes

    return all(peak(i) <= (1 - reserve) * capacity(i) for i in checked_stages(s, shared))


def checked_stages(s: Scenario, shared: dict | None = None) -> list[int]:
    """``stages_to_check(s)``, once per key in ``shared`` (when given): it reads the model's
    layers, the stages' layout and schedule, and the micro-batches, nothing else."""
    if shared is None:
        return stages_to_check(s)
    p = s.parallel
    key = ("check", Same(s.model), p.schedule, p.pp, p.virtual_stages,
           tuple(p.stage_layers or ()), tuple(p.stage_pools or ()), s.microbatches)
    if key not in shared:
        shared[key] = stages_to_check(s)
    return shared[key]


def stages_to_check(s: Scenario) -> list[int]:
    """The stages whose memory decides whether all fit, ends first.

    Two stages with the same chunks' layers, neither an embedding nor a head, on the same
    pool, differ in memory only by the micro-batches each chunk holds: every byte that
    depends on them grows with them (``memory.stage_activation_bytes``), so where one stage
    holds at least as many in every chunk as the others alike, it alone needs checking (the
    middle stages of 1F1B, interleaved and GPipe: the first of them). Not under a split
    backward, whose deferred weight halves may keep less than the activations they free."""
    pp = s.parallel.pp
    ends = list(dict.fromkeys([0, pp - 1]))
    middle = [i for i in range(pp) if i not in ends]
    if splits_backward(s.parallel.schedule) or len(middle) < 2:
        return ends + middle
    mix = chunk_mix(s)
    pools = s.parallel.stage_pools
    alike: dict[tuple, list[int]] = {}
    for i in middle:
        chunks = chunks_of_stage(s, i)
        special = embedding_chunks(s, i) or head_chunks(s, i)
        key = (i,) if special else (tuple(mix[c] for c in chunks),
                                     pools[i] if pools is not None else None)
        alike.setdefault(key, []).append(i)
    out = list(ends)
    for group in alike.values():
        held = {i: mem.inflight_microbatches(s, i) for i in group}
        top = max(group, key=lambda i: sum(held[i]))
        if all(all(a >= b for a, b in zip(held[top], held[j], strict=True)) for j in group):
            out.append(top)
        else:
            out += group
    return out
