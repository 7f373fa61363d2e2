"""The cost model both estimators share: what one scenario's kernels, collectives and
optimizer step cost on its cluster, from a calibration profile.

``CostModel`` holds the rates (the GPU's peaks kept at the profile's ``sustained_fraction``,
HBM bandwidth at its efficiency) and the link tiers each parallel group spans
(``topologies/network.py:group_links`` over ``placement.py``'s rank numbering), and caches what
the cost modules derive from them: one layer's compute by kernel family (``compute.py``), its
exposed tensor/context/expert-parallel communication (``layer_comm.py``, the expert all-to-alls'
``token_dispatch.py``), the cover a split backward loses (``split_backward.py``) and every
chunk's per-micro-batch work for the engine (``work.py``). Those modules take a ``CostModel``
and read its rates; they name its type only for the type checker, so the imports point one way:
this module over the cost modules, the analytic estimator (``analytic.py``) and the engine
(``engine.py``, through ``stage_costs.py``) over this module (docs/architecture.md).

Also here, once a step: the optimizer step (``optimizer_time``), the gradient sum of
DualPipe's two copies of the model (``twin_stage``, ``copy_sum_bytes``), and what
``finalize_grads_time`` sums after the data-parallel reduction: a tied word embedding's two
copies on the end stages (``embedding_sync_time``) and the weights every TP rank holds whole
under sequence parallelism (``tp_grad_sum_bytes``), which both estimators charge.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any

from clustersim.topologies import network as net
from clustersim.topologies.collective_registry import collective_named
from clustersim.topologies.profile import Profile, profile_for_gpu

from ..inputs import variability
from ..inputs.placement import Placement, expert_strides
from ..model import param_counts as pc
from ..model import workload as wl
from ..pipeline.stages import dense_layer_scenario, scenario_layout, stage_layers, stage_mix
from . import compute, split_backward
from . import memory as mem
from . import optimizer_states as states
from .compute import kernel_times
from .last_scenario import Same, parallel_key
from .layer_comm import context_comm, layer_comm, tensor_comm
from .token_dispatch import expert_comm
from .work import chunk_work

if TYPE_CHECKING:
    from ..inputs.scenario import Scenario
    from .work import ChunkWork


class CostModel:
    """Kernel and collective times of one scenario on its cluster, from a profile."""

    def __init__(self, s: Scenario, profile: Profile | None = None,
                 shared: dict | None = None) -> None:
        self.s = s
        # ``per_layer`` of other scenarios alike but for their schedule, and the links of those
        # of the same shape (the planner's, ``reports/plan_search.py``): keyed by
        # ``layer_key`` and the shape; None: every value its own.
        self.shared = shared
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
        p = s.parallel
        # The groups' links depend on the cluster, the profile and the split's shape alone:
        # scenarios of one shape share them where a ``shared`` cache is given.
        key = ("links", Same(s.cluster), Same(self.profile), p.tp, p.cp, p.dp, p.pp, p.ep,
               p.etp, p.order, p.state_shards)
        links = shared.get(key) if shared is not None else None
        if links is None:
            links = self._links()
            if shared is not None:
                shared[key] = links
        (self.links_cluster, self.placement, self.tp, self.cp, self.ep, self.dp, self.edp,
         self.dps, self.dpr, self.pp) = links
        self.stage_layers = stage_layers(s)
        self.stage_mix = stage_mix(s)  # (dense first layers, other layers) per stage

    def _links(self) -> tuple:
        """The cluster its closed forms cost collectives on, the ranks' placement and the
        links of each parallel group: tp, cp, ep, dp, edp, dps, dpr and pp."""
        p, c = self.s.parallel, variability.with_link_jitter(self.s.cluster)
        placement = Placement.of(p.tp, p.cp, p.dp, p.pp, p.order)
        st, replicas = placement.strides, placement.replica_stride()
        tp = net.group_links(c, self.profile, p.tp, st["tp"])
        cp = net.group_links(c, self.profile, p.cp, st["cp"])
        # Dense gradients reduce over every replica, dp*cp of them; each expert's over the
        # expert_dp ranks holding it.
        ep_stride, edp_stride = expert_strides(placement, p.folded, p.ep)
        ep = net.group_links(c, self.profile, p.ep, ep_stride)
        dp = net.group_links(c, self.profile, p.dp * p.cp, replicas)
        edp = net.group_links(c, self.profile, p.expert_dp, edp_stride)
        # Hybrid sharding: one copy of the states over consecutive replicas, the copies'
        # same shards dp_shard ranks apart (the plain dp group's, where there is one copy).
        dps = net.group_links(c, self.profile, p.state_shards, replicas)
        dpr = net.group_links(c, self.profile, p.state_copies, st["dp"] * (p.dp // p.state_copies))
        # Pipeline sends go between neighbours only: the tier that one pair crosses.
        pp = net.group_links(c, self.profile, min(p.pp, 2), st["pp"])
        return c, placement, tp, cp, ep, dp, edp, dps, dpr, pp

    @cached_property
    def per_layer(self) -> tuple[float, float, float]:
        """``layer_times`` once: every layer of the model costs the same, but for its dense
        first layers (``dense_layers``), whose costs are ``dense_layer_costs``'. With a
        ``shared`` cache, once for every scenario of the same ``layer_key``."""
        return self._shared_once(self.shared_key, layer_times)

    @cached_property
    def shared_key(self) -> tuple:
        """``layer_key`` once: ``per_layer`` and ``head_times`` both look it up."""
        return layer_key(self)

    def _shared_once(self, key: tuple, make: Callable[[CostModel], Any]) -> Any:
        """``make(self)``, kept in the ``shared`` cache under ``key`` where there is one."""
        if self.shared is None:
            return make(self)
        if key not in self.shared:
            self.shared[key] = make(self)
        return self.shared[key]

    @cached_property
    def head_times(self) -> tuple[float, float]:
        """``compute.logits_times`` once: the output layer's (forward, backward) per
        micro-batch; with a ``shared`` cache, once for every scenario of the same
        ``layer_key`` (it reads no schedule field either)."""
        return self._shared_once(("head", self.shared_key), compute.logits_times)

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
        """``per_layer_comm`` by group, forward plus backward: {"tp", "cp", "ep"} seconds;
        with a ``shared`` cache, once per ``layer_key`` (one layer's, as ``per_layer``)."""
        return self._shared_once(("comm kinds", self.shared_key), _comm_kinds)

    @cached_property
    def chunks(self) -> list[ChunkWork]:
        """Every model chunk's per-micro-batch work (``work.py:ChunkWork``), built once."""
        return chunk_work(self)

    @cached_property
    def weight_gradients(self) -> tuple[float, float]:
        """Weight-gradient GEMMs of one layer and of the output layer, per micro-batch; with
        a ``shared`` cache, once per ``layer_key``."""
        return self._shared_once(("weight gradients", self.shared_key),
                                 compute.weight_gradient_times)

    @cached_property
    def split_cost(self) -> float:
        """Exposed time a split backward adds to one layer, per micro-batch (whatever the
        schedule: ``stage_times`` charges it under a split backward only); with a ``shared``
        cache, once per ``layer_key``."""
        return self._shared_once(("split cost", self.shared_key), split_backward.lost_cover)

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


# What one layer's costs never read (``layer_times``, ``compute.logits_times``,
# ``compute.weight_gradient_times``, ``split_backward.lost_cover``, ``_comm_kinds`` and all
# they call: compute.py, layer_comm.py, the kernels): how the stages are scheduled,
# interleaved and laid out.
_SCHEDULE_FIELDS = frozenset({"schedule", "virtual_stages", "stage_layers", "stage_pools"})
# ... nor how data parallelism shards and overlaps, but for what
# ``compute.weight_traffic_bytes`` reads of it (``compute.sharding_reads``).
_DATA_PARALLEL_FIELDS = frozenset({"zero", "overlap_grad_reduce", "overlap_param_gather",
                                   "zero3_prefetch", "zero3_pipeline_reduce"})
_LAYER_IGNORES = _SCHEDULE_FIELDS | _DATA_PARALLEL_FIELDS  # what `layer_key` leaves out, made once


def layer_key(cm: CostModel) -> tuple:
    """Everything ``layer_times`` may read: the scenario's model, cluster and profile (by
    identity), its training section (by value), its parallel section but for
    ``_SCHEDULE_FIELDS`` and ``_DATA_PARALLEL_FIELDS``, and what it reads of the latter
    (``compute.sharding_reads``). ``tests/reports/test_plan_build.py`` checks that every
    candidate of two problems gets from a shared cache the value it computes alone,
    ``tests/reports/test_plan_keys.py`` that leaving a field it reads out fails."""
    s = cm.s
    return (Same(s.model), Same(s.cluster), Same(cm.profile), s.training,
            parallel_key(s, _LAYER_IGNORES),
            compute.sharding_reads(s.parallel))


def _comm_kinds(cm: CostModel) -> dict[str, float]:
    """``CostModel.per_layer_comm_kinds`` worked out."""
    gemms, attention = kernel_times(cm)
    return {"tp": sum(tensor_comm(cm, gemms)), "cp": sum(context_comm(cm, attention)),
            "ep": sum(expert_comm(cm))}


def layer_times(cm: CostModel) -> tuple[float, float, float]:
    """(forward, backward, exposed comm) of one layer for one micro-batch on one rank.

    Full recomputation re-runs the forward in backward; selective re-runs the attention core
    (fused or not: ``compute.kernel_times``) and what its other ``recompute_modules`` cover
    (``recompute.py``)."""
    s, p = cm.s, cm.s.parallel
    fwd, bwd = cm.passes
    forward, backward = fwd.total, bwd.total
    if p.recompute == "full":
        backward += forward
    elif p.recompute == "selective":
        backward += compute.rerun_attention_time(cm)
        # Megatron-Core's other modules: MLA's up-projections, norms, the experts' activation.
        backward += compute.rerun_gemm_time(cm) + cm.memory_bound(compute.rerun_bytes(s))
    return forward, backward, sum(cm.per_layer_comm)


def optimizer_time(cm: CostModel, stage: int) -> float:
    """Optimizer step over the locally owned parameters, HBM-bound.

    Adam reads the gradient (``grad_dtype``), reads and writes master weights and both moments
    (fp32) and writes the low-precision weights: ``g + 8*3 + w`` bytes per parameter; SGD
    ``g + 8*2 + w``. Moments kept in 16 bits and a master kept as its remainder bits or not at
    all (``training.optimizer_moments``, ``master_weights``: ``optimizer_states.MASTER_KEPT``) move
    fewer, and the step then also reads the low-precision weight (the master's high half, or
    the weight updated in place). Around it Megatron-LM's optimizer reads every gradient once
    more for the clipping norm (``clip_grad_norm_fp32``, megatron/core/optimizer/clip_grads.py)
    and zeroes the gradient buffer for the next step (``zero_grad_buffer``): ``2 g`` more. The
    profile's ``step_overhead_s`` adds the host's once-a-step work.
    ZeRO >= 1 leaves each rank its shard: dense over ``state_shards`` ranks (dp*cp, or
    dp_shard*cp under hybrid sharding), experts over dp*cp/ep.
    """
    s = cm.s
    dense, expert = mem.optimizer_shard(s, stage)
    t = s.training
    w, g = wl.BYTES[t.precision], wl.BYTES[t.grad_dtype]
    partial = t.precision != "fp32" and t.master_weights in ("remainders", "none")
    master = states.MASTER_KEPT[t.master_weights] if partial else states.MASTER_BYTES
    state = master + states.moments_bytes(t.optimizer, t.optimizer_moments)
    per_param = 3 * g + 2 * state + w + (w if partial else 0)
    hbm = (dense + expert) * per_param / (cm.hbm_peak * cm.profile.optimizer_eff)
    return hbm + cm.profile.step_overhead_s


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
    return sum(mem.optimizer_shard(s, stage)) * wl.BYTES[s.training.grad_dtype]


def embedding_sync_bytes(s: Scenario, stage: int) -> float:
    """Gradient bytes a stage all-reduces with the stage holding the other copy of a tied word
    embedding: the whole table's gradient, ``V h / t`` in ``grad_dtype`` whatever the ZeRO
    stage, where the input embedding and the output layer share weights and sit on different
    stages (the first and the last of a pipeline; the V placements keep both on stage 0).
    Megatron-LM all-reduces it over the embedding group after the data-parallel reduction
    (``_allreduce_word_embedding_grads``, megatron/core/distributed/finalize_model_grads.py),
    DeepSpeed's pipeline engine as its ``ReduceTiedGrads`` step (deepspeed/runtime/pipe/
    engine.py, ``_exec_reduce_tied_grads``). Not under DualPipe's two copies (``twin_stage``
    sums those)."""
    if not s.model.tie_embeddings or s.parallel.pp == 1:
        return 0.0
    layout = scenario_layout(s)
    embedding, head = layout.stages[0], layout.stages[-1]
    if layout.copies > 1 or embedding == head or stage not in (embedding, head):
        return 0.0
    table = s.model.vocab * s.model.hidden / s.parallel.tp
    return table * wl.BYTES[s.training.grad_dtype]


def embedding_sync_time(cm: CostModel, stage: int) -> float:
    """Seconds of the tied embedding's gradient all-reduce between the two stages that hold it
    (``embedding_sync_bytes``), in closed form: two ranks exchange the whole gradient both ways
    at once, as DualPipe's copies do (``net.p2p_time`` over the pipeline's links). Exposed: the
    optimizer step waits for it."""
    nbytes = embedding_sync_bytes(cm.s, stage)
    return net.p2p_time(cm.pp, nbytes) if nbytes > 0 else 0.0


def tp_grad_sum_bytes(s: Scenario, stage: int) -> float:
    """Gradient bytes a stage all-reduces over its TP group once a step under sequence
    parallelism: its layers' ``param_counts.tp_summed_params`` in ``grad_dtype``."""
    p = s.parallel
    if p.tp == 1 or not p.sequence_parallel:
        return 0.0
    dense, others = stage_mix(s)[stage]
    params = others * pc.tp_summed_params(s.model)
    if dense:
        params += dense * pc.tp_summed_params(s.model.dense_layer_spec())
    return params * wl.BYTES[s.training.grad_dtype]


def finalize_grads_time(cm: CostModel, stage: int) -> float:
    """Seconds of what Megatron-LM's ``finalize_model_grads`` adds after the data-parallel
    reduction, exposed before the optimizer step: the tied embedding's gradient sum
    (``embedding_sync_time``) and the TP all-reduce of ``tp_grad_sum_bytes``."""
    summed = tp_grad_sum_bytes(cm.s, stage)
    tp_sum = collective_named("allreduce").time(cm.tp, summed) if summed > 0 else 0.0
    return embedding_sync_time(cm, stage) + tp_sum
