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
It is the planner's fast pre-filter and the discrete-event engine's cross-check.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from clustersim.topologies import network as net
from clustersim.topologies.pools import cluster_pools, is_pooled, mean_peak_flops
from clustersim.topologies.profile import Profile, profile_for_gpu

from . import compute, recompute, split_backward, traffic, variability, zero3
from . import memory as mem
from . import workload as wl
from .layer_comm import context_comm, expert_comm, layer_comm, pipeline_gather_time, tensor_comm
from .placement import Placement
from .result import Breakdown, StepResult
from .scenario import Scenario
from .schedules import schedule_named
from .stages import (
    dense_layer_scenario,
    head_chunks,
    microbatch_share,
    scenario_layout,
    stage_layers,
    stage_mix,
)


@dataclass(frozen=True, slots=True)
class StageTimes:
    """One stage's time per micro-batch (compute, exposed comm) and once per step."""

    forward: float  # compute of one micro-batch's forward
    backward: float  # compute of its backward, recomputation included
    comm: float  # exposed TP/CP/EP collectives and pipeline sends, per micro-batch
    grad_sync: float  # exposed data-parallel gradient/parameter traffic, per step
    optimizer: float  # optimizer step, per step
    weight_grad: float = 0.0  # the weight-gradient GEMMs among the backward's compute
    split_cost: float = 0.0  # exposed time a split backward adds (split_backward.lost_cover)
    slowdown: float = 0.0  # compute lost beside communication (the profile's)

    @property
    def per_microbatch(self) -> float:
        return self.forward + self.backward + self.comm


class CostModel:
    """Kernel and collective times of one scenario on its cluster, from a profile."""

    def __init__(self, s: Scenario, profile: Profile | None = None) -> None:
        self.s = s
        self.profile = profile or profile_for_gpu(s.cluster.gpu.id)
        # Attention, the output layer and (but under fp8) the weight GEMMs run at ``peak``;
        # under fp8 the layers' weight GEMMs run at the FP8 peak (``gemm_peak``).
        precision = s.training.precision
        # Kernels inside a step keep ``sustained_fraction`` of their isolated speed.
        sustained = self.profile.sustained_fraction
        self.peak = s.cluster.gpu.peak_flops[wl.WIDE.get(precision, precision)] * sustained
        self.fp8 = precision == "fp8"
        self.gemm_peak = s.cluster.gpu.peak_flops[precision] * sustained
        self.hbm_peak = s.cluster.gpu.memory_bandwidth * 1e9
        self.hbm = self.hbm_peak * self.profile.memory_efficiency * sustained
        p, c = s.parallel, variability.with_link_jitter(s.cluster)
        self.links_cluster = c  # the cluster its closed forms cost collectives on
        self.placement = Placement.of(p.tp, p.cp, p.dp, p.pp, p.order)
        st, replicas = self.placement.strides, self.placement.replica_stride()
        self.tp = net.group_links(c, self.profile, p.tp, st["tp"])
        self.cp = net.group_links(c, self.profile, p.cp, st["cp"])
        # Experts are carved out of the dp*cp replicas, innermost first.
        self.ep = net.group_links(c, self.profile, p.ep, replicas)
        # Dense gradients reduce over every replica, dp*cp of them; each expert's over dp*cp/ep.
        self.dp = net.group_links(c, self.profile, p.dp * p.cp, replicas)
        self.edp = net.group_links(c, self.profile, max(p.dp * p.cp // p.ep, 1), replicas * p.ep)
        # Pipeline sends go between neighbours only: the tier that one pair crosses.
        self.pp = net.group_links(c, self.profile, min(p.pp, 2), st["pp"])
        self.stage_layers = stage_layers(s)
        self.stage_mix = stage_mix(s)  # (dense first layers, other layers) per stage

    @cached_property
    def per_layer(self) -> tuple[float, float, float]:
        """``layer_times`` once: every layer of the model costs the same, but for its dense
        first layers (``dense_layers``), whose costs are ``dense_layer_costs``'."""
        return layer_times(self)

    @cached_property
    def dense_layer_costs(self) -> CostModel:
        """The cost model of the dense first layers (``stages.dense_layer_scenario``): the same
        cluster, profile and split, one dense MLP in each layer."""
        return CostModel(dense_layer_scenario(self.s), self.profile)

    @cached_property
    def per_layer_comm(self) -> tuple[float, float]:
        """Exposed TP/CP/EP communication of one layer and micro-batch: (forward, backward)."""
        return layer_comm(self, *kernel_times(self))

    @cached_property
    def per_layer_comm_kinds(self) -> dict[str, float]:
        """``per_layer_comm`` by group, forward plus backward: {"tp", "cp", "ep"} seconds."""
        gemms, attention = kernel_times(self)
        return {"tp": sum(tensor_comm(self, gemms)), "cp": sum(context_comm(self, attention)),
                "ep": sum(expert_comm(self))}

    @cached_property
    def chunks(self) -> list:
        """Every model chunk's per-micro-batch work (``work.py:ChunkWork``), built once."""
        from .work import chunk_work  # work.py builds on this cost model
        return chunk_work(self)

    @cached_property
    def weight_gradients(self) -> tuple[float, float]:
        """Weight-gradient GEMMs of one layer and of the output layer, per micro-batch."""
        return compute.weight_gradient_times(self)

    @cached_property
    def split_cost(self) -> float:
        """Exposed time a split backward adds to one layer, per micro-batch."""
        return split_backward.lost_cover(self)

    @cached_property
    def passes(self) -> tuple[compute.PassTimes, compute.PassTimes]:
        """One layer's (forward, backward) compute by kernel family, recomputation excluded."""
        return compute.layer_pass_times(self)

    def matmul(self, flops: float, tokens: int | None = None) -> float:
        """One GEMM over ``tokens`` rows: ``flops / (peak * efficiency)`` plus the kernel
        overhead."""
        if flops <= 0:
            return 0.0
        eff = self.profile.matmul_eff(flops, tokens)
        return flops / (self.peak * eff) + self.profile.kernel_overhead_s

    def memory_bound(self, nbytes: float) -> float:
        """Element-wise kernels moving ``nbytes`` through HBM."""
        return nbytes / self.hbm


def kernel_times(cm: CostModel) -> tuple[tuple[float, float], tuple[float, float]]:
    """One layer's GEMM and attention-core times, (forward, backward) each, recomputation
    included in backward: what TP and CP collectives can hide behind."""
    fwd, bwd = cm.passes
    core = "core_attn" in cm.s.parallel.recomputed and not cm.s.training.flash_attention
    rerun = {"none": (0.0, 0.0), "full": (fwd.gemms, fwd.attention),
             "selective": (_rerun_gemm_time(cm), fwd.attention if core else 0.0)}
    gemms_rerun, attention_rerun = rerun[cm.s.parallel.recompute]
    return (fwd.gemms, bwd.gemms + gemms_rerun), (fwd.attention, bwd.attention + attention_rerun)


def _rerun_gemm_time(cm: CostModel) -> float:
    """The weight GEMMs selective recomputation re-runs per layer (``recompute.rerun_gemms``:
    MLA's up-projections under ``mla_up_proj``)."""
    return sum(compute.weight_gemm_time(cm, g, g.m) for g in recompute.rerun_gemms(cm.s))


def layer_times(cm: CostModel) -> tuple[float, float, float]:
    """(forward, backward, exposed comm) of one layer for one micro-batch on one rank.

    Full recomputation re-runs the forward in backward; selective re-runs the attention core,
    except with flash attention, whose backward recomputes the scores anyway (in its 2.5x),
    and what its other ``recompute_modules`` cover (``recompute.py``)."""
    s, p = cm.s, cm.s.parallel
    fwd, bwd = cm.passes
    forward, backward = fwd.total, bwd.total
    if p.recompute == "full":
        backward += forward
    elif p.recompute == "selective":
        if "core_attn" in p.recomputed and not s.training.flash_attention:
            backward += fwd.attention
        # Megatron-Core's other modules: MLA's up-projections, norms, the experts' activation.
        backward += _rerun_gemm_time(cm) + cm.memory_bound(recompute.rerun_bytes(s))
    return forward, backward, sum(cm.per_layer_comm)


def stage_times(cm: CostModel, stage: int, sends: net.GroupLinks | None = None) -> StageTimes:
    """Per-micro-batch and per-step times of one pipeline stage; its pipeline sends cross
    ``sends`` (default: the cost model's neighbour tier). Per micro-batch: its layers and
    heads, times the share of micro-batches that run through them (1; 1/2 for each of
    DualPipe's two copies of the model)."""
    s = cm.s
    p, share = s.parallel, microbatch_share(s)
    dense_layers, others = (n * share for n in cm.stage_mix[stage])
    fwd, bwd, comm = (others * t for t in cm.per_layer)
    weight, split = others * cm.weight_gradients[0], others * cm.split_cost
    if dense_layers:
        d = cm.dense_layer_costs
        fwd, bwd, comm = (x + dense_layers * t for x, t in zip((fwd, bwd, comm), d.per_layer,
                                                                strict=True))
        weight += dense_layers * d.weight_gradients[0]
        split += dense_layers * d.split_cost
    heads = len(head_chunks(s, stage)) * share
    if heads:
        head_fwd, head_bwd = compute.logits_times(cm)
        fwd, bwd = fwd + heads * head_fwd, bwd + heads * head_bwd
        weight += heads * cm.weight_gradients[1]
    # Stragglers: every stage waits for the job's slowest GPU (simulator/variability.py).
    slowest = variability.expected_max(s.cluster.variability, s.cluster.gpus)
    fwd, bwd, weight = fwd * slowest, bwd * slowest, weight * slowest
    comm += _pipeline_sends(cm, sends or cm.pp)
    if p.zero == 3:  # per unit, every micro-batch, beside the compute: simulator/zero3.py
        per_microbatch, once = zero3.stage_exposure(cm, stage)
    else:
        per_microbatch, once = _grad_sync(cm, stage, fwd, bwd)
    return StageTimes(fwd, bwd, comm + per_microbatch, once,
                      optimizer_time(cm, stage) * slowest, weight, split,
                      cm.profile.comm_compute_slowdown)


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
    return 2 * visits * (net.p2p_time(links, wl.pipeline_message_bytes(s))
                         + pipeline_gather_time(cm))


def _grad_sync(cm: CostModel, stage: int, fwd: float, bwd: float) -> tuple[float, float]:
    """Exposed data-parallel traffic, (per micro-batch, once per step): gradient all-reduce
    (ZeRO 0), reduce-scatter plus parameter all-gather (ZeRO 1/2). ZeRO-3's per-unit traffic
    is ``zero3.stage_exposure``.

    Dense parameters reduce over the dp*cp replicas, expert parameters over dp*cp/ep. With
    overlap on, all but the last of the 40M-parameter buckets hide behind the backward
    (reduce) or the next forward (gather). ZeRO-0/1 reduce once, after the last micro-batch;
    ZeRO-2 (``pp`` 1) reduce-scatters every micro-batch's gradients into its shard and waits
    for them at the end of each chunk's backward (DeepSpeed's stage-2 epilogue), so the step
    pays that exposure per micro-batch.
    """
    s, p = cm.s, cm.s.parallel
    dense, expert = mem.stage_params_per_rank(s, stage)
    dense_reduce, dense_gather = _dp_traffic(cm, cm.dp, dense)
    expert_reduce, expert_gather = _dp_traffic(cm, cm.edp, expert)
    reduce, gather = dense_reduce + expert_reduce, dense_gather + expert_gather
    buckets = max(1.0, (dense + expert) / mem.BUCKET_PARAMS)
    x = cm.profile.comm_compute_slowdown  # hidden traffic slows the compute it hides behind
    exposed_gather = max(gather / buckets, gather - fwd) if p.overlap_param_gather else gather
    once_gather = exposed_gather + x * (gather - exposed_gather)
    if p.zero == 2 and p.sharded_gradients:
        v = p.virtual_stages
        per_chunk = _exposed(reduce / v, max(1.0, buckets / v), bwd / v, p.overlap_grad_reduce)
        return v * per_chunk + x * (reduce - v * per_chunk), once_gather
    exposed_reduce = _exposed(reduce, buckets, bwd, p.overlap_grad_reduce)
    copies = net.p2p_time(cm.pp, copy_sum_bytes(s, stage)) if twin_stage(s, stage) else 0.0
    return 0.0, exposed_reduce + x * (reduce - exposed_reduce) + copies + once_gather


def twin_stage(s: Scenario, stage: int) -> int | None:
    """The stage holding the other copy of ``stage``'s parameters, where the chunks hold two
    copies of the model (DualPipe: stage ``pp - 1 - r`` holds the parts rank r holds, of the
    other copy); None with one copy."""
    layout = scenario_layout(s)
    if layout.copies == 1:
        return None
    twins = {layout.stages[(c + layout.per_copy) % len(layout.stages)]
             for c in layout.of_stage(stage)}
    return twins.pop() if len(twins) == 1 and stage not in twins else None


def copy_sum_bytes(s: Scenario, stage: int) -> float:
    """Gradient bytes a stage swaps with its twin so that both copies step on the sum: all of
    its gradients under ZeRO-0, its reduce-scattered shard under ZeRO-1/2 (DeepSeek-V3 keeps
    "two copies of the model parameters", sec. 3.2.1; deepseek-ai/DualPipe
    examples/example_dualpipe.py adds rank ``pp - 1 - r``'s gradients of the same stage to
    rank r's). The swap runs after the data-parallel reduction, both ways at once."""
    p = s.parallel
    dense, expert = mem.stage_params_per_rank(s, stage)
    if p.zero >= 1:
        dense, expert = dense / (p.dp * p.cp), expert / max(p.dp * p.cp // p.ep, 1)
    return (dense + expert) * wl.BYTES[s.training.grad_dtype]


def _exposed(reduce: float, buckets: float, backward: float, overlap: bool) -> float:
    """What a reduction of ``buckets`` equal buckets adds after a backward of ``backward``
    seconds: all of it without overlap, else the last bucket or what outlasts the backward."""
    return max(reduce / buckets, reduce - backward) if overlap else reduce


def _dp_traffic(cm: CostModel, group: net.GroupLinks, params: float) -> tuple[float, float]:
    """(reduce, gather) times of ``params`` parameters over one data-parallel group: gradients
    reduced in ``grad_dtype``, updated weights gathered in the training precision."""
    if params == 0 or group.size == 1:  # e.g. a dense model's (empty) expert group
        return 0.0, 0.0
    t = cm.s.training
    grads, weights = params * wl.BYTES[t.grad_dtype], params * wl.BYTES[t.precision]
    if cm.s.parallel.zero == 0:
        return net.allreduce_time(group, grads), 0.0
    return net.reduce_scatter_time(group, grads), net.allgather_time(group, weights)


def optimizer_time(cm: CostModel, stage: int) -> float:
    """Optimizer step over the locally owned parameters, HBM-bound.

    Adam reads the gradient (``grad_dtype``), reads and writes master weights and both moments
    (fp32) and writes the low-precision weights: ``g + 8*3 + w`` bytes per parameter; SGD
    ``g + 8*2 + w``. Around it Megatron-LM's optimizer reads every gradient once more for the
    clipping norm (``clip_grad_norm_fp32``, megatron/core/optimizer/clip_grads.py) and zeroes
    the gradient buffer for the next step (``zero_grad_buffer``): ``2 g`` more. The profile's
    ``step_overhead_s`` adds the host's once-a-step work.
    ZeRO >= 1 leaves each rank its shard: dense over dp*cp replicas, experts over dp*cp/ep.
    """
    s, p = cm.s, cm.s.parallel
    dense, expert = mem.stage_params_per_rank(s, stage)
    if p.zero >= 1:
        dense, expert = dense / (p.dp * p.cp), expert / max(p.dp * p.cp // p.ep, 1)
    w, g = wl.BYTES[s.training.precision], wl.BYTES[s.training.grad_dtype]
    per_param = 3 * g + 8 * (3 if s.training.optimizer == "adam" else 2) + w
    hbm = (dense + expert) * per_param / (cm.hbm_peak * cm.profile.optimizer_eff)
    return hbm + cm.profile.step_overhead_s


def estimate(s: Scenario, profile: Profile | None = None) -> StepResult:
    """Closed-form StepResult of a scenario."""
    from .analytic_stages import stage_breakdowns  # built on this module's StageTimes
    from .stage_costs import StageCosts  # built on this module's cost model

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
    exposed = m * crit.comm + crit.grad_sync
    bubble = max(0.0, step - compute - exposed - crit.optimizer)
    sends = [_pipeline_sends(costs.stage(i), links[i]) for i in range(s.parallel.pp)]
    return step_result(s, step, Breakdown(compute, exposed, bubble, crit.optimizer),
                       stages=stage_breakdowns(costs, stages, sends, m, step))


def step_result(s: Scenario, step: float, breakdown: Breakdown,
                per_stage: list[mem.StageMemory] | None = None,
                fidelity: str = "analytic", stages: list | None = None) -> StepResult:
    """The StepResult of a predicted step time; memory from the closed forms unless given;
    ``stages``, each pipeline stage's breakdown (``stage_breakdown.py``)."""
    gpus = s.cluster.gpus
    tokens = s.training.global_batch * s.model.seq_len
    model_tflops = wl.model_flops_per_step(s) / step / gpus / 1e12
    hardware_tflops = wl.hardware_flops_per_step(s) / step / gpus / 1e12
    # MFU over the dense bf16 peak under fp8 too, so runs in either precision share a scale.
    peak = mean_peak_flops(s.cluster, wl.WIDE.get(s.training.precision, s.training.precision))
    to_train = s.training.tokens / (tokens / step) if s.training.tokens else None
    per_stage = per_stage if per_stage is not None else mem.memory_per_stage(s)
    capacity, per_stage = _capacities(s, per_stage)
    return StepResult(
        name=s.name, gpus=gpus, step_time_s=step, tokens_per_s=tokens / step,
        model_tflops_per_gpu=model_tflops, hardware_tflops_per_gpu=hardware_tflops,
        mfu=model_tflops * 1e12 / peak, breakdown=breakdown,
        capacity_bytes=capacity, per_stage=per_stage,
        time_to_train_s=to_train, fidelity=fidelity,
        extras={"traffic_bytes": traffic.traffic_bytes(s)}, stages=stages or [])


def _capacities(s: Scenario, per_stage: list[mem.StageMemory]
                ) -> tuple[int, list[mem.StageMemory]]:
    """The GPU memory of the result, and its stages: on a cluster of pools, each stage tagged
    with its pool and that pool's GPU memory, and the smallest of those as the result's."""
    if not is_pooled(s.cluster):
        return s.cluster.gpu.memory_bytes, per_stage
    pools = cluster_pools(s.cluster)
    tagged = [replace(st, pool=k, capacity_bytes=pools[k].gpu.memory_bytes)
              for st, k in zip(per_stage, s.parallel.stage_pools, strict=True)]
    return min(st.capacity_bytes for st in tagged), tagged
