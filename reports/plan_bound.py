"""A lower bound of a split's closed-form step, from the request alone: its weight GEMMs at the
GPU's datasheet peak, plus the bubble its schedule cannot avoid; and a second, read off the
end stages' compute (``end_stages_floor_s``). The planner bounds each split that fits by the
tighter of the two (``plan_search.SplitSearch``) and skips those whose bound cannot beat the
shortlist's slowest (``plan_rank.py``), before costing their stages whole.

Why it is a lower bound of ``analytic.estimate`` (and of the engine, which runs the same
kernels): every GPU runs its share of the step's weight GEMMs, forward and backward (three
times the forward FLOPs, ``workload.model_flops_per_step``'s 3x), and a GEMM never runs faster
than the datasheet peak of its precision (``CostModel.matmul``: ``flops / (peak * sustained
* efficiency)``, each factor at most 1, plus a launch overhead). Summed over a replica's
stages that work is the same whatever the split, so the busiest stage carries at least the
mean. Under GPipe and the 1F1B family the schedule's own closed form
(``schedules.one_f_one_b_finish``: ``m T_max + (sum T_i - T_max) / v``) is at least
``(m + (p - 1) / v)`` times the mean stage's ``T`` (``T_max`` is at least the mean, and
``sum T_i`` is ``p`` of them); the zero-bubble and DualPipe schedules are bounded by their
``m`` micro-batches alone. Left out, so only ever under the estimate: attention's score and
value products, element-wise kernels, communication, the optimizer, stragglers, recomputation
and the expert imbalance; routed experts count at ``min(1, capacity_factor)`` of their mean,
since a capacity below 1 drops tokens. ``tests/reports/test_plan_bound.py`` checks the bound
against the estimate on every split of three problems.
"""

from __future__ import annotations

from clustersim.simulator.closed_form.analytic import (
    stage_comm,
    stage_compute,
    stage_split_cost,
)
from clustersim.simulator.costs.stage_costs import StageCosts
from clustersim.simulator.inputs.scenario import Scenario
from clustersim.simulator.model import param_counts as pc
from clustersim.simulator.model import workload as wl
from clustersim.simulator.pipeline.schedules import (
    one_f_one_b_finish,
    schedule_named,
    zero_bubble_finish,
)
from clustersim.topologies.pools import cluster_pools, is_pooled


def weight_gemm_flops_per_sequence(s: Scenario) -> float:
    """Forward FLOPs of one sequence's weight GEMMs (``workload.layer_forward_flops`` without
    the attention core, plus the output layer), routed experts scaled down by a capacity
    below 1 (the tokens it drops never reach a GEMM)."""
    total = wl.logits_forward_flops(s.model)
    for kind, n in pc.layer_kinds(s.model):
        layer = wl.layer_forward_flops(kind) - wl.attention_core_forward_flops(kind)
        if kind.experts > 1 and kind.capacity_factor is not None:
            routed = 2 * kind.ffn_matrices * kind.seq_len * kind.hidden * kind.ffn_hidden
            layer -= routed * kind.top_k * (1 - min(1.0, kind.capacity_factor))
        total += n * layer
    return total


def peak_gemm_flops(s: Scenario) -> float:
    """The fastest a GEMM of the step's precision can run on any GPU of the cluster."""
    precision = s.training.precision
    if is_pooled(s.cluster):
        return max(pool.gpu.peak_flops[precision] for pool in cluster_pools(s.cluster))
    return s.cluster.gpu.peak_flops[precision]


def compute_floor_s(s: Scenario) -> float:
    """One GPU's share of the step's weight GEMMs, forward and backward, at the peak."""
    work = 3.0 * weight_gemm_flops_per_sequence(s) * s.training.global_batch
    return work / s.cluster.gpus / peak_gemm_flops(s)


def step_floor_s(s: Scenario, compute_floor: float | None = None) -> float:
    """A lower bound of ``analytic.estimate(s).step_time_s``: the compute floor, stretched
    by the bubble of the 1F1B family, ``1 + (p - 1) / (v m)``. ``compute_floor`` depends
    on the request only (model, batch, GPUs, precision): the search passes it in once."""
    floor = compute_floor_s(s) if compute_floor is None else compute_floor
    p = s.parallel
    if schedule_named(p.schedule).finish is one_f_one_b_finish:
        floor *= 1 + (p.pp - 1) / (p.virtual_stages * s.microbatches)
    return floor


def end_stages_floor_s(s: Scenario, costs: StageCosts) -> float:
    """A second lower bound of the estimate, read off the end stages: every stage runs its
    ``m`` forwards and backwards one after another, whatever the schedule, so no step ends
    before ``m`` times a stage's forward and backward compute (``analytic.stage_compute``,
    the same figures its ``stage_times`` holds). The end stages hold the embedding and the
    head, so they are the heaviest.

    Under GPipe and the 1F1B family (``schedules.one_f_one_b_finish``: at least ``m`` times
    the slowest stage's ``forward + backward + comm``) and ZB-H1 (``zero_bubble_finish``: at
    least ``m`` times the slowest's ``forward + backward + comm + split_cost``) a stage's
    exposed TP/CP/EP collectives and pipeline sends (``analytic.stage_comm``) and, under
    ZB-H1, what the split backward exposes (``analytic.stage_split_cost``) are on that path
    too: the bound adds them, each summed as ``stage_times`` sums it (floating-point
    additions of terms that are never negative only grow). Left out, so only ever under
    the estimate: the stage's data-parallel part of its comm (ZeRO-3's per-unit waits) and
    what it pays once a step. The schedules list-scheduled from their actions (ZB-H2, ZB-V,
    DualPipe, DualPipeV) may hide sends and all-to-alls behind an overlapped pair: their
    bound is the compute alone."""
    finish = schedule_named(s.parallel.schedule).finish
    if finish not in (one_f_one_b_finish, zero_bubble_finish):
        return s.microbatches * max(sum(stage_compute(costs.stage(i), i)) for i in _ends(s))
    message = wl.pipeline_message_bytes(s)
    busiest = 0.0
    for i in _ends(s):
        cm = costs.stage(i)
        fwd, bwd = stage_compute(cm, i)
        busy = fwd + bwd + stage_comm(cm, i, costs.stage_send_links(i, message))[0]
        if finish is zero_bubble_finish:
            busy += stage_split_cost(cm, i)
        busiest = max(busiest, busy)
    return s.microbatches * busiest


def _ends(s: Scenario) -> set[int]:
    """The first and the last stage."""
    return {0, s.parallel.pp - 1}
