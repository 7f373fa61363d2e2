"""The analytic estimator (``--fidelity analytic``): step time in closed form.

Per micro-batch and stage: kernel times from the profile (roofline: matmuls at the profile's
efficiency for their size, element-wise kernels at its share of HBM bandwidth), plus exposed
tensor/context/expert-parallel communication and pipeline sends. The pipeline then costs what
its schedule declares (``schedules.PipelineSchedule.finish``): for GPipe and the 1F1B family
``m * T_max + (sum_i T_i - T_max) / v``, the bubble ``(p-1)/(m+p-1)`` of the step for equal
stages, ``1/v`` of that when interleaved (Narayanan et al. 2021, sec. 2.2), stage ``i`` ending
its last backward ``sum_{j<i} B_j / v`` before stage 0; each stage then reduces its own
gradients (overlapping the last backward) and steps its optimizer (HBM-bound); the step ends
with the last stage to finish.
It is the planner's fast pre-filter and the discrete-event engine's cross-check, a peer of the
engine: both price a step from the same ``cost_model.CostModel``, and neither imports the other.
"""

from __future__ import annotations

from clustersim.topologies import network as net
from clustersim.topologies.profile import Profile

from ..costs import dp_reduction as dp
from ..costs import memory as mem
from ..costs import zero3
from ..costs.compute import kernel_times  # noqa: F401 (re-exported: callers import it from here)
from ..costs.cost_model import (
    CostModel,
    copy_sum_bytes,
    finalize_grads_time,
    optimizer_time,
    twin_stage,
)
from ..costs.layer_comm import pipeline_gather_time
from ..costs.result import Breakdown, StepResult, step_result
from ..costs.stage_costs import StageCosts
from ..inputs import variability
from ..inputs.scenario import Scenario
from ..model import workload as wl
from ..pipeline.overlap import send_hold
from ..pipeline.schedules import schedule_named
from ..pipeline.stages import head_chunks, microbatch_share
from .analytic_stages import StageTimes, stage_breakdowns


def stage_times(cm: CostModel, stage: int, sends: net.GroupLinks | None = None) -> StageTimes:
    """Per-micro-batch and per-step times of one pipeline stage; its pipeline sends cross
    ``sends`` (default: the cost model's neighbour tier). Per micro-batch: its layers and
    heads, times the share of micro-batches that run through them (1; 1/2 for each of
    DualPipe's two copies of the model)."""
    s = cm.s
    fwd, bwd = stage_compute(cm, stage)
    (dense_layers, others), heads = _stage_parts(cm, stage)
    weight = others * cm.weight_gradients[0]
    if dense_layers:
        weight += dense_layers * cm.dense_layer_costs.weight_gradients[0]
    if heads:
        weight += heads * cm.weight_gradients[1]
    slowest = _slowest(cm)
    weight *= slowest
    comm, sends_time = stage_comm(cm, stage, sends)
    split = stage_split_cost(cm, stage)
    timing = dp.dp_timing(s.parallel)
    if timing.reduce == dp.PER_UNIT:  # ZeRO-3, beside the compute: zero3.py
        per_microbatch, once = zero3.stage_exposure(cm, stage)
    elif timing.gather == dp.PER_UNIT:  # ZeRO-3 under PyTorch's pipelining
        per_microbatch, once = zero3.deferred_exposure(cm, stage)
    else:
        per_microbatch, once = _grad_sync(cm, stage, fwd, bwd)
    once += finalize_grads_time(cm, stage)  # tied embedding, TP-whole weights: exposed
    return StageTimes(fwd, bwd, comm + per_microbatch, once,
                      optimizer_time(cm, stage) * slowest, weight, split,
                      cm.profile.comm_compute_slowdown,
                      _alltoalls(cm, stage) + sends_time)


def stage_comm(cm: CostModel, stage: int, sends: net.GroupLinks | None = None
               ) -> tuple[float, float]:
    """(exposed TP/CP/EP collectives and pipeline sends, of which the sends) of one stage per
    micro-batch: ``stage_times``' comm before its data-parallel part (ZeRO-3's per-unit waits,
    ZeRO-2's per-micro-batch reductions), which only ever adds to it. The planner's
    end-stage bound reads it alone (``reports/plan_bound.py``)."""
    (dense_layers, others), _ = _stage_parts(cm, stage)
    comm = others * cm.per_layer[2]
    if dense_layers:
        comm += dense_layers * cm.dense_layer_costs.per_layer[2]
    sends_time = _pipeline_sends(cm, sends or cm.pp)
    return comm + sends_time, sends_time


def stage_split_cost(cm: CostModel, stage: int) -> float:
    """Exposed seconds a split backward adds to one micro-batch on ``stage``: its layers'
    ``split_backward.lost_cover``."""
    (dense_layers, others), _ = _stage_parts(cm, stage)
    split = others * cm.split_cost
    if dense_layers:
        split += dense_layers * cm.dense_layer_costs.split_cost
    return split


def _alltoalls(cm: CostModel, stage: int) -> float:
    """The stage's exposed expert all-to-alls per micro-batch: what the other half of an
    overlapped F&B pair hides, beside the sends (``segments._into_pair``)."""
    (dense_layers, others), _ = _stage_parts(cm, stage)
    ep = others * cm.per_layer_comm_kinds["ep"]
    return ep + (dense_layers * cm.dense_layer_costs.per_layer_comm_kinds["ep"]
                 if dense_layers else 0.0)


def stage_compute(cm: CostModel, stage: int) -> tuple[float, float]:
    """One stage's (forward, backward) compute per micro-batch, stragglers included:
    ``stage_times``' own, without the communication, data-parallel traffic and optimizer it
    also costs, so that the planner's bound (``m`` forwards and backwards one after another,
    ``reports/plan_search.py``) can read it alone."""
    (dense_layers, others), heads = _stage_parts(cm, stage)
    fwd, bwd = others * cm.per_layer[0], others * cm.per_layer[1]
    if dense_layers:
        d = cm.dense_layer_costs
        fwd, bwd = fwd + dense_layers * d.per_layer[0], bwd + dense_layers * d.per_layer[1]
    if heads:
        head_fwd, head_bwd = cm.head_times
        fwd, bwd = fwd + heads * head_fwd, bwd + heads * head_bwd
    slowest = _slowest(cm)
    return fwd * slowest, bwd * slowest


def _stage_parts(cm: CostModel, stage: int) -> tuple[tuple[float, float], float]:
    """((dense first layers, other layers), output heads) a micro-batch runs through on
    ``stage``: its layers and heads times the share of micro-batches that run through them."""
    share = microbatch_share(cm.s)
    dense_layers, others = cm.stage_mix[stage]
    return (dense_layers * share, others * share), len(head_chunks(cm.s, stage)) * share


def _slowest(cm: CostModel) -> float:
    """Stragglers: every stage waits for the job's slowest GPU (inputs/variability.py)."""
    return variability.expected_max(cm.s.cluster.variability, cm.s.cluster.gpus)


def _pipeline_sends(cm: CostModel, links: net.GroupLinks) -> float:
    """Activation out and gradient back for each of the stage's ``v`` chunks a micro-batch
    runs through, per micro-batch: ``2 v (alpha + b s h / (tp cp) / B)`` (sequence
    parallelism or scatter-gather split the message by tp, the latter with a TP all-gather
    after it; interleaving multiplies the messages by v, Narayanan et al. 2021 sec. 2.2);
    DualPipe's micro-batches run through one of its two."""
    s, p = cm.s, cm.s.parallel
    if p.pp == 1:
        return 0.0
    visits = p.virtual_stages * microbatch_share(s)
    hold = send_hold(p.overlap_p2p_comm, cm.profile.comm_compute_slowdown)  # asynchronous sends
    return 2 * visits * (hold * net.p2p_time(links, wl.pipeline_message_bytes(s))
                         + pipeline_gather_time(cm))


def _grad_sync(cm: CostModel, stage: int, fwd: float, bwd: float) -> tuple[float, float]:
    """Exposed data-parallel traffic, (per micro-batch, once per step): gradient all-reduce
    (ZeRO 0), reduce-scatter plus parameter all-gather (ZeRO 1/2), the collectives and when
    they run as ``costs/dp_reduction.py`` describes them for both estimators. ZeRO-3's
    per-unit traffic is ``zero3.stage_exposure``.

    With overlap on, all but the last of the 40M-parameter buckets hide behind the backward
    (reduce) or the next forward (gather). Reductions once a step start after the last
    micro-batch; per micro-batch (ZeRO-2, ``pp`` 1) each chunk's backward reduce-scatters its
    gradients into its shard and waits for them at its end (DeepSpeed's stage-2 epilogue), so
    the step pays that exposure per micro-batch.
    """
    s = cm.s
    timing = dp.dp_timing(s.parallel)
    dense, expert = mem.stage_params_per_rank(s, stage)
    reduce = dp.reduction_seconds(cm, dense, expert)
    gather = dp.gather_seconds(cm, dense, expert)
    buckets = max(1.0, (dense + expert) / mem.BUCKET_PARAMS)
    x = cm.profile.comm_compute_slowdown  # hidden traffic slows the compute it hides behind
    ahead = timing.gather == dp.BEFORE_STEP  # hidden behind the step's first forward
    exposed_gather = max(gather / buckets, gather - fwd) if ahead else gather
    once_gather = exposed_gather + x * (gather - exposed_gather)
    overlap = timing.reduce_overlapped
    if timing.reduce == dp.PER_MICROBATCH:
        v = s.parallel.virtual_stages
        per_chunk = _exposed(reduce / v, max(1.0, buckets / v), bwd / v, overlap)
        return v * per_chunk + x * (reduce - v * per_chunk), once_gather
    exposed_reduce = _exposed(reduce, buckets, bwd, overlap)
    twin = twin_stage(s, stage)  # stage pp - 1's twin is stage 0
    copies = 0.0 if twin is None else net.p2p_time(cm.pp, copy_sum_bytes(s, stage))
    return 0.0, exposed_reduce + x * (reduce - exposed_reduce) + copies + once_gather


def _exposed(reduce: float, buckets: float, backward: float, overlap: bool) -> float:
    """What a reduction of ``buckets`` equal buckets adds after a backward of ``backward``
    seconds: all of it without overlap, else the last bucket or what outlasts the backward."""
    return max(reduce / buckets, reduce - backward) if overlap else reduce


def estimate(s: Scenario, profile: Profile | None = None) -> StepResult:
    """Closed-form StepResult of a scenario."""
    costs = StageCosts(s, profile)
    message = wl.pipeline_message_bytes(s)
    links = [costs.stage_send_links(i, message) for i in range(s.parallel.pp)]
    stages = [stage_times(costs.stage(i), i, links[i]) for i in range(s.parallel.pp)]
    m, v = s.microbatches, s.parallel.virtual_stages
    finish = schedule_named(s.parallel.schedule).finish(stages, m, v)  # as it declares
    critical = max(range(len(stages)), key=lambda i: finish[i])
    step = finish[critical]
    crit = stages[critical]
    compute = m * (crit.forward + crit.backward)
    # Overlapped F&B pairs (DualPipe, combined 1F1B) finish before compute plus every
    # collective: what they hide is not exposed.
    exposed = min(m * crit.comm + crit.grad_sync, max(0.0, step - compute - crit.optimizer))
    bubble = max(0.0, step - compute - exposed - crit.optimizer)
    sends = [_pipeline_sends(costs.stage(i), links[i]) for i in range(s.parallel.pp)]
    return step_result(s, step, Breakdown(compute, exposed, bubble, crit.optimizer),
                       stages=stage_breakdowns(costs, stages, sends, m, step))


