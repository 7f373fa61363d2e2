"""Bytes each GPU sends per step, by parallel group: what each choice of split costs the network.

One function per group, each from the message sizes the cost model uses (``workload``'s
``tp_collective_bytes``, ``expert_dispatch_bytes``, the pipeline message, ``context_messages``'
blocks and the parameters each stage owns) and the bytes a rank sends in each collective, read from
its registered description (``topologies/collective_algorithms.py``, ``ring_share``): an
all-reduce of ``X`` over ``n`` ranks sends ``2(n-1)/n X`` in its ring, a reduce-scatter or
all-gather ``(n-1)/n X``, an all-to-all ``(n-1)/n X``; a point-to-point message ``X``.
(NCCL's two-level rings send the same total, split between NVLink and the NIC.) Each group
reports its busiest pipeline stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clustersim.topologies.collective_registry import collective_named

from ..inputs.placement import context_levels, expert_levels
from ..model import context_messages as cpm
from ..model import routing
from ..model import workload as wl
from ..pipeline.stages import (
    dense_layer_scenario,
    microbatch_share,
    scenario_layout,
    stage_mix,
)
from . import memory as mem
from .dp_reduction import dp_timing, gathered_weight_bytes, per_step, reduce_op
from .layer_comm import tp_collectives

if TYPE_CHECKING:
    from ..inputs.scenario import Scenario

GROUPS = ("tp", "cp", "ep", "pp", "dp")


def ring_share(kind: str, n: int) -> float:
    """Bytes a rank sends per byte of registered collective ``kind``'s buffer (``nbytes``
    convention of ``topologies/collectives.py``) over ``n`` ranks, as its description says:
    its ring where it declares one (all-reduce, all-gather, reduce-scatter), else its one
    algorithm (all-to-all's pairwise sends), laid on one node, where every byte is counted
    once."""
    if n <= 1:
        return 0.0
    algorithms = collective_named(kind).algorithms
    load = algorithms.get("ring", next(iter(algorithms.values()))).load(1.0, n, 1, n)
    return load.nvlink + load.nic


def _layer_passes(s: Scenario) -> float:
    """Layer passes per micro-batch that run a layer's forward collectives: 1, or 2 when full
    recomputation runs the forward again in backward."""
    return 2.0 if s.parallel.recompute == "full" else 1.0


def tp_layer_bytes(s: Scenario) -> float:
    """Tensor-parallel collectives of one layer and micro-batch (``tp_collectives``)."""
    rerun = _layer_passes(s) - 1
    return sum((c.forward * (1 + rerun) + c.backward) * c.nbytes
               * ring_share(c.kind, s.parallel.tp) for c in tp_collectives(s))


def cp_layer_bytes(s: Scenario) -> float:
    """Context parallelism of one layer and micro-batch (``layer_comm.context_comm``). Ring
    attention: ``cp - 1`` K/V blocks forward (again when recomputed), K/V and their gradients
    backward. All-gather: one gather forward (again when recomputed), a gather and a
    reduce-scatter backward, each sending ``cp - 1`` blocks in its ring. The all-to-alls:
    ``(cp-1)/cp`` of both each way. Hierarchical: the all-to-alls over a node's CP ranks and
    the ring over the nodes, each as alone."""
    p = s.parallel
    if p.cp == 1:
        return 0.0
    passes = _layer_passes(s)
    if p.cp_comm == "allgather":
        return ring_share("allgather", p.cp) * cpm.cp_gathered_kv_bytes(s) * (passes + 2)
    a2a, ring = context_levels(s)  # the all-to-alls' ranks, the ring's (both: a2a+p2p)
    return (ring_share("alltoall", a2a) * sum(cpm.cp_a2a_bytes(s)) * (passes + 1)
            + (ring - 1) * cpm.cp_kv_block_bytes(s) * (passes + 2))


def ep_layer_bytes(s: Scenario) -> float:
    """Token dispatch and combine of one layer and micro-batch, forward (again when
    recomputed) and backward, and under the alltoall dispatcher the probabilities' own
    dispatch (``token_dispatch.probs_comm``): a pairwise all-to-all's ``(ep-1)/ep`` of the
    routed copies or,
    forwarded across nodes (``moe_dispatcher: deepep``), one copy to each other node reached
    and the copies fanned out over NVLink (``token_dispatch.expert_dispatch_time``)."""
    m, p = s.model, s.parallel
    if m.experts == 1 or p.ep == 1:
        return 0.0
    nbytes = wl.expert_dispatch_bytes(s)
    sent = nbytes * ring_share("alltoall", p.ep)
    probs = 0.0 if p.moe_dispatcher == "deepep" else (
        wl.expert_probs_bytes(s) * ring_share("alltoall", p.ep))  # token_dispatch.probs_comm
    if p.moe_dispatcher == "deepep":
        local, nodes = expert_levels(s)
        if nodes > 1:
            sent = sum(routing.forwarded_bytes(m, nbytes, local, p.ep))
    return (_layer_passes(s) + 1) * (2 * sent + probs)


def pp_bytes(s: Scenario, stage: int) -> float:
    """Activations sent on and gradients sent back by the stage's chunks, every micro-batch
    that runs through them (``b s h / (tp cp)`` each, Megatron's scatter-gather); a hand-over
    to a chunk on the same stage (the turn of a V) sends nothing."""
    layout = scenario_layout(s)
    owner, message = layout.stages, wl.pipeline_message_bytes(s)
    sends = sum((not layout.is_last(c) and owner[c + 1] != stage)
                + (not layout.is_first(c) and owner[c - 1] != stage)
                for c in layout.of_stage(stage))
    return sends * message * s.microbatches * microbatch_share(s)


def dp_bytes(s: Scenario, stage: int) -> float:
    """Gradient reduction and parameter gathers of the stage's parameters, as
    ``dp_reduction.py`` describes them for both estimators: dense over the ``dp*cp`` replicas
    (under hybrid sharding over ``dp_shard*cp``, then the shard all-reduced over the copies),
    experts over the ``expert_dp`` ranks holding them. ZeRO-0 all-reduces once; ZeRO-1
    reduce-scatters once and all-gathers the updated weights; ZeRO-2 reduce-scatters every
    micro-batch (once with ``pp > 1``: ``ParallelSpec.sharded_gradients``); ZeRO-3 also
    gathers every unit before its forward and its backward, every micro-batch (under
    PyTorch's pipelining ``m + 1`` times, reducing once: ``dp_reduction.per_step``). A
    reduce-scatter and an all-gather send the same share of their buffer, so one share covers
    both."""
    p, t = s.parallel, s.training
    grad, weight = wl.BYTES[t.grad_dtype], gathered_weight_bytes(s)
    reduces, gathers = per_step(dp_timing(p), s.microbatches)
    share_of = reduce_op(p)
    total = 0.0
    for params, n in zip(mem.stage_params_per_rank(s, stage),
                         (p.state_shards, p.expert_dp), strict=True):
        total += ring_share(share_of, n) * params * (reduces * grad + gathers * weight)
        if p.hybrid_sharded:  # and each reduced shard all-reduced over the copies
            total += ring_share("allreduce", p.state_copies) * params / n * reduces * grad
            break  # hybrid sharding has no expert parallelism (rules._hybrid_sharding)
    return total


def traffic_bytes(s: Scenario) -> dict[str, float]:
    """Bytes one GPU sends per step for each group, on its busiest pipeline stage. A stage's
    dense first layers (``dense_layers``) send as the dense layers they are: no expert
    all-to-alls; under DualPipe each micro-batch runs through one copy's layers."""
    dense_s = dense_layer_scenario(s) if s.model.dense_layers else s
    share, m = microbatch_share(s), s.microbatches
    mix = [(d * share, n * share) for d, n in stage_mix(s)]
    # per layer and micro-batch, of the other layers and of the dense first ones
    layer = {group: (of(s), of(dense_s)) for group, of in
             (("tp", tp_layer_bytes), ("cp", cp_layer_bytes), ("ep", ep_layer_bytes))}
    per_stage = [{**{group: other * n * m + dense * d * m
                     for group, (other, dense) in layer.items()},
                  "pp": pp_bytes(s, i), "dp": dp_bytes(s, i)}
                 for i, (d, n) in enumerate(mix)]
    return {group: max(stage[group] for stage in per_stage) for group in GROUPS}
