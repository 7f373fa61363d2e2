"""Per-rank memory: model states under TP/PP/DP and ZeRO, activations, communication buffers.

Model states follow Rajbhandari et al. 2020 (ZeRO, sec. 3.1 and Figure 1): mixed-precision
Adam keeps 2 + 2 + 12 = 16 bytes per parameter with bf16 gradients (2 + 4 + 12 = 18 with
Megatron-LM's fp32 main gradients, the bf16 default), of which ZeRO-1 shards the 12 of optimizer
state, ZeRO-2 also the gradients and ZeRO-3 all of it over the data-parallel ranks (the bytes
per parameter, by stack: ``optimizer_states.py``). Activations are the tensors Megatron-Core
and Transformer Engine save for backward, one by one (``activations.py``; docs/memory.md lists
each with its source): with ``kv_heads == heads``,
``ffn_hidden == 4h``, GELU and dropout in bf16 they sum to Korthikanti et al. 2022's
``sbh(34 + 5as/h)`` (sec. 4). A model with dense first layers (``dense_layers``) counts each
kind of layer apart (``pc.layer_kinds``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..inputs import frameworks
from ..inputs.specs import ModelSpec
from ..model import activations as act
from ..model import context_messages as cpm
from ..model import param_counts as pc
from ..model import workload as wl
from ..model.activations import (  # noqa: F401 (layer_activation_bytes re-exported: memory's callers)
    layer_activation_bytes,
    scenario_layer_bytes,
)
from ..model.param_counts import layer_params_per_rank
from ..pipeline.schedules import schedule_named
from ..pipeline.stages import (
    chunk_mix,
    chunks_of_stage,
    dense_layer_scenario,
    embedding_chunks,
    head_apart,
    head_chunks,
    stage_layers,  # noqa: F401 (re-exported: callers ask memory for a stage's layers)
    stage_mix,
)
from .dp_reduction import prefetch_depth
from .last_scenario import per_scenario
from .optimizer_states import (
    MOMENTS_BYTES,
    SUB_GROUP,
    fp32_gradient_copy_bytes,
    model_state_bytes,
)
from .split_backward import deferred_bytes

if TYPE_CHECKING:
    from ..inputs.scenario import Scenario
    from ..inputs.specs import ParallelSpec, TrainingSpec

BUCKET_PARAMS = 40_000_000  # Megatron-LM's default DDP bucket size, in parameters
# DeepSpeed's ZeRO gradient bucket, in elements of the model's dtype: the default
# ``reduce_bucket_size`` (deepspeed/runtime/zero/config.py)
DEEPSPEED_REDUCE_BUCKET = 500_000_000


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Peak bytes on the busiest rank of one pipeline stage, by component."""

    stage: int
    params: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    pool: int | None = None  # on a cluster of pools: the stage's pool (index into cluster.pools)
    capacity_bytes: int | None = None  # ... and its GPU's memory
    optimizer_step: float = 0.0  # the optimizer step's temporaries (``optimizer_step_bytes``)

    @property
    def peak_bytes(self) -> float:
        """The model states and buffers, plus the larger of the activations (forward and
        backward) and the optimizer step's temporaries (after the last backward, when the
        activations are gone)."""
        return (self.params + self.grads + self.optimizer + self.buffers
                + max(self.activations, self.optimizer_step))


# --- model states ----------------------------------------------------------------------------

def embedding_params_per_rank(m: ModelSpec, tp: int) -> float:
    """Input embedding on one tp rank: ``V h / t`` plus the replicated learned positions.

    Megatron-LM splits the word embedding by vocabulary (VocabParallelEmbedding) but keeps the
    position embedding whole on every rank, so only ``V h`` divides by tp.
    """
    words = m.vocab * m.hidden
    return words / tp + (pc.embedding_params(m) - words)


def head_params_per_rank(m: ModelSpec, tp: int, apart: bool) -> float:
    """Final norm plus the output layer ``V h / t`` on the ranks of the head's stage.

    A tied output layer shares the embedding when both sit on one stage (pp = 1, or the V
    placement's stage 0); ``apart`` (another stage) it keeps its own copy, kept equal by an
    all-reduce of the two gradients.
    """
    own_output = not m.tie_embeddings or apart
    # each MTP module's two input norms, its final norm and its projection of 2h to h
    mtp = m.mtp_layers * (3 * pc.norm_params(m) + 2 * m.hidden * m.hidden / tp)
    return pc.norm_params(m) + (m.vocab * m.hidden / tp if own_output else 0) + mtp


def mixed_layer_params(s: Scenario, dense_layers: int, others: int) -> tuple[float, float]:
    """(dense, expert) parameters on one rank of ``dense_layers`` of the model's dense first
    layers and ``others`` of its other layers."""
    m, p = s.model, s.parallel
    dense, expert = layer_params_per_rank(m, p.tp, p.ep, p.etp)
    dense, expert = dense * others, expert * others
    if dense_layers:
        dense += dense_layers * sum(layer_params_per_rank(m.dense_layer_spec(), p.tp, p.ep))
    return dense, expert


def stage_params_per_rank(s: Scenario, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters on one rank of ``stage``: its layers, embeddings and heads
    (DualPipe's end stages hold an embedding and a head, one of each copy of the model)."""
    m, p = s.model, s.parallel
    dense, expert = mixed_layer_params(s, *stage_mix(s)[stage])
    dense += len(embedding_chunks(s, stage)) * embedding_params_per_rank(m, p.tp)
    for c in head_chunks(s, stage):
        dense += head_params_per_rank(m, p.tp, apart=head_apart(s, c))
    return dense, expert


def stage_model_states(s: Scenario, stage: int, params: tuple[float, float] | None = None
                       ) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes on one rank of ``stage`` after ZeRO sharding;
    ``params``: its ``stage_params_per_rank``, where the caller has them.

    Dense parameters shard over the dp*cp ranks that replicate them, expert parameters over
    the dp*cp/ep ranks that replicate each expert (Megatron-LM's distributed optimizer).
    """
    t = s.training
    dense, expert = params or stage_params_per_rank(s, stage)
    zero, dense_shards, expert_shards = _state_shards(s)
    a = model_state_bytes(dense, dense_shards, zero, t.precision, t.optimizer, t.grad_dtype,
                          t.master_weights, t.optimizer_moments)
    b = model_state_bytes(expert, expert_shards, zero, t.precision, t.optimizer,
                          t.grad_dtype, t.master_weights, t.optimizer_moments)
    return a[0] + b[0] + fp8_weight_cache_bytes(s, stage), a[1] + b[1], a[2] + b[2]


def _state_shards(s: Scenario) -> tuple[int, int, int]:
    """(ZeRO stage as the states see it, ranks the dense states shard over, ranks the expert
    states shard over)."""
    p = s.parallel
    # ZeRO-2 under a pipeline, and ZeRO-3 as PyTorch's pipelining runs it (``deferred_zero3``):
    # whole gradients through the step, and whole weights from a backward to the next forward
    zero = p.zero if p.sharded_gradients or p.zero < 2 else 1
    return zero, p.state_shards, p.expert_dp if p.ep > 1 or p.folded else p.state_shards


def optimizer_shard(s: Scenario, stage: int, params: tuple[float, float] | None = None
                    ) -> tuple[float, float]:
    """(dense, expert) parameters one rank of ``stage`` steps: its own under ZeRO-0, else its
    shard (dense over ``state_shards`` ranks, experts over those / ep); ``params`` as in
    ``stage_model_states``."""
    dense, expert = params or stage_params_per_rank(s, stage)
    if s.parallel.zero == 0:
        return dense, expert
    _, dense_shards, expert_shards = _state_shards(s)
    return dense / dense_shards, expert / expert_shards


def optimizer_step_bytes(s: Scenario, stage: int,
                         params: tuple[float, float] | None = None) -> float:
    """What the optimizer step holds on one rank of ``stage`` beyond the model states of
    forward and backward (``StageMemory.peak_bytes`` takes the larger of it and the
    activations, which are gone by then).

    torch.optim's foreach Adam takes the square root of every second moment at once
    (``_multi_tensor_adam``: ``exp_avg_sq_sqrt = torch._foreach_sqrt(...)``,
    torch/optim/adam.py): one tensor of the moment's type per parameter of the rank's optimizer
    shard (fp32 unless ``optimizer_moments`` says otherwise), alive
    until the update; fused kernels update in place, and then the step never holds more than
    forward and backward did (0). Where the fp32 parameters are the master (``master_weights:
    params`` below ZeRO-3: autocast, FSDP), the training-precision weights forward and
    backward use are per-use casts, freed by the step: they come off. Measured on an H200
    (docs/memory.md): GPT 6.7B under autocast and foreach AdamW peaked in the step at 20.0
    bytes per parameter: 4 + 4 + 8 of states and this 4.

    An fp32 master stepped on narrower gradients (fp16 training, or ``grad_dtype`` bf16) is
    given an fp32 copy of its shard's gradients first, alive through the step
    (``fp32_gradient_copy_bytes``). ``params`` as in ``stage_model_states``."""
    params = params or stage_params_per_rank(s, stage)
    t, zero, shard = s.training, _state_shards(s)[0], sum(optimizer_shard(s, stage, params))
    held = fp32_gradient_copy_bytes(s) * (min(shard, SUB_GROUP) if zero == 3 else shard)
    if t.optimizer_impl != "foreach" or t.optimizer != "adam":
        return held
    scratch = MOMENTS_BYTES[t.optimizer_moments] * shard
    cast = t.master_weights == "params" and t.precision != "fp32" and zero < 3
    whole = sum(params)
    return held + scratch - (wl.BYTES[t.precision] * whole if cast else 0.0)


def fp8_weight_cache_bytes(s: Scenario, stage: int) -> float:
    """Under fp8, the FP8 copy of each layer weight and of its transpose (for the data
    gradient), one byte each, that Transformer Engine keeps beside the bf16 weights through
    the step; ZeRO-3 gathers a unit for its use, so its copies live only then (not counted).
    Embedding and output layer stay bf16. With ``fp8_param_gather`` the FP8 weight is the
    parameter and no bf16 copy is kept: it and its transpose take the two bytes counted as
    the weight (``model_state_bytes``), and nothing more."""
    t = s.training
    if t.precision != "fp8" or s.parallel.zero == 3 or t.fp8_param_gather:
        return 0.0
    return 2 * sum(mixed_layer_params(s, *stage_mix(s)[stage]))


# --- activations -----------------------------------------------------------------------------

def inflight_microbatches(s: Scenario, stage: int) -> list[int]:
    """Micro-batches whose activations each chunk of ``stage`` holds at the stage's peak, as
    its schedule declares (``schedules.PipelineSchedule.held``): GPipe all m; 1F1B
    ``min(p - stage, m)`` (Narayanan et al. 2021, sec. 2.2.1); ZB-H1 ``min(p, m)`` on every
    stage; interleaved Megatron-LM's warm-up count plus one, spread over the chunks."""
    p = s.parallel
    return schedule_named(p.schedule).held(p.pp, s.microbatches, p.virtual_stages, stage)


def stage_activation_bytes(s: Scenario, stage: int) -> float:
    """Activations held at the peak of ``stage``: layers x in-flight micro-batches, plus the
    embedding dropout mask ``sbh/t`` per micro-batch in flight on the first chunk and the output
    layer's ``4sbh/t + 4sbv/t`` per micro-batch in flight on the last (Korthikanti sec. 4.3)."""
    m, p, t = s.model, s.parallel, s.training
    mix = chunk_mix(s)
    chunks = [mix[c] for c in chunks_of_stage(s, stage)]
    inflight = inflight_microbatches(s, stage)
    kept, whole = _kind_bytes(s)
    total = sum(k * sum(n * b for n, b in zip(counts, kept, strict=True))
                for counts, k in zip(chunks, inflight, strict=True))
    # Backward re-materialises what recomputation dropped, one layer and micro-batch at a time;
    # the loss's backward allocates its gradients first, at another moment of the same peak.
    transient = max(w - b for n, w, b in zip(stage_mix(s)[stage], whole, kept, strict=True) if n)
    tokens = t.micro_batch * m.seq_len // p.cp
    outer = p.tp if p.sequence_parallel else 1
    mine = chunks_of_stage(s, stage)
    for c in embedding_chunks(s, stage):
        total += act.embedding_bytes(m, tokens, outer) * inflight[mine.index(c)]
    for c in head_chunks(s, stage):
        # Held per micro-batch until its backward: once under 1F1B, m times under GPipe.
        total += (act.head_bytes(m, tokens, p.tp, outer, t.precision, t.autocast,
                                 t.loss_kernel, p.gathered_inputs_kept)
                  * inflight[mine.index(c)])
        transient = max(transient, act.loss_backward_bytes(m, tokens, p.tp, t.precision,
                                                           t.loss_kernel))
    total += transient
    # A split backward's deferred weight halves keep their GEMMs' operands instead.
    return total + deferred_bytes(s, stage)


@per_scenario
def _kind_bytes(s: Scenario) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per kind of layer (``_layer_kinds``), the bytes it keeps under the scenario's
    recomputation and without any: the same for every stage (``per_scenario``)."""
    kinds = _layer_kinds(s)
    return (tuple(scenario_layer_bytes(kind, s.parallel.recompute) for kind in kinds),
            tuple(scenario_layer_bytes(kind, "none") for kind in kinds))


def _layer_kinds(s: Scenario) -> tuple[Scenario, Scenario]:
    """The scenario of each kind of layer, in ``stage_mix`` order: (dense first layers,
    others); without dense layers the first is never counted."""
    return (dense_layer_scenario(s) if s.model.dense_layers else s), s


# --- buffers and the total ---------------------------------------------------------------------

def deepspeed_reduce_buffers(training: TrainingSpec, parallel: ParallelSpec) -> int:
    """How many gradient buckets of ``reduce_bucket_size`` elements DeepSpeed's ZeRO optimizer
    holds through a backward (``contiguous_gradients`` on by default). ZeRO-3: one, allocated
    with the optimizer (``DeepSpeedZeroOptimizer_Stage3.__init__``, "IPG",
    deepspeed/runtime/zero/stage3.py). ZeRO-1/2: one, two with ``overlap_comm`` ("double
    buffers to avoid data access conflict", ``DeepSpeedZeroOptimizer.setup_buckets``,
    zero/stage_1_and_2.py), from the first gradient hook to the step; none under a pipeline,
    whose engine reduces after the last backward, the activations freed
    (``reduce_gradients(pipeline_parallel=True)``), nor where the engine picks the
    BF16_Optimizer instead: a bf16 model with fp32 gradient accumulation at stage 1
    (``_do_optimizer_sanity_check``, deepspeed/runtime/engine.py; stage 0 here runs as that,
    ``frameworks.zero_as_run``). None on another stack."""
    if training.framework != "deepspeed" or parallel.zero == 0:
        return 0
    if parallel.zero == 3:
        return 1
    if parallel.pp > 1:
        return 0
    if (parallel.zero == 1 and training.precision in frameworks.LOW_PRECISION
            and training.grad_dtype == "fp32"):
        return 0
    return 2 if parallel.overlap_grad_reduce else 1


def stage_buffer_bytes(s: Scenario, stage: int) -> float:
    """Communication buffers: pipeline send/recv, all-gathered K/V, ZeRO-2 gradient buckets,
    ZeRO-3 gathered units.

    Pipeline: one activation and one gradient tensor each way (``b s h`` / tp with Megatron's
    scatter-gather). Context parallelism by all-gather: one layer's whole-sequence K and V,
    and in backward their gradients beside them. DeepSpeed's ZeRO optimizer: its gradient
    buckets of 500M elements in the model's dtype (``deepspeed_reduce_buffers``),
    allocated whole however small the model; under ZeRO-1/2 they stand for the next term.
    Otherwise ZeRO-2: two gradient buckets of 40M parameters in flight (never more than the
    stage's gradients), in ``grad_dtype``. ZeRO-3: the running unit's gathered weights and
    unsharded gradients plus the ``zero3_prefetch`` layers gathered ahead (none without
    ``overlap_param_gather``), where a unit is a layer or, when larger, the embedding or output
    layer; none under PyTorch's pipelining, whose states hold the whole weights
    (``deferred_zero3``). With one data-parallel replica ZeRO shards nothing, so it needs no
    buffers.
    """
    m, p, t = s.model, s.parallel, s.training
    act, grad = wl.BYTES[t.precision], wl.BYTES[t.grad_dtype]
    total = 0.0
    if p.pp > 1:
        total += 4 * t.micro_batch * (m.seq_len // p.cp) * m.hidden * act / p.tp
    if p.cp > 1 and p.cp_comm == "allgather":  # a layer's gathered K/V and, backward, their
        total += 2 * cpm.cp_gathered_kv_bytes(s)  # gradients (context_parallel.py's k_ag, dk)
    deepspeed_buffers = deepspeed_reduce_buffers(t, p)
    total += deepspeed_buffers * DEEPSPEED_REDUCE_BUCKET * act  # whatever the replicas
    if deepspeed_buffers and p.zero < 3:  # in place of ZeRO-2's buckets below
        return total
    if p.dp * p.cp == 1:
        return total
    if p.zero == 2 and p.sharded_gradients:
        total += min(2 * BUCKET_PARAMS, sum(stage_params_per_rank(s, stage))) * grad
    if p.zero == 3 and not p.deferred_zero3:  # deferred: the gathered weights are the states
        layer = _largest_layer(s, stage)
        # In flight: the running unit (weights and unsharded gradients) and the prefetched.
        total += _largest_unit(s, stage, layer) * (act + grad) + prefetch_depth(p) * layer * act
    return total


def _largest_layer(s: Scenario, stage: int) -> float:
    """Parameters on one rank of the largest layer on ``stage`` (its dense first layers and
    its other layers may differ)."""
    dense_layers, others = stage_mix(s)[stage]
    return max(sum(mixed_layer_params(s, 1, 0)) if dense_layers else 0.0,
               sum(mixed_layer_params(s, 0, 1)) if others else 0.0)


def _largest_unit(s: Scenario, stage: int, layer: float) -> float:
    """Parameters of the largest unit ZeRO-3 gathers whole on ``stage`` (one rank's tp shard).

    The embedding (and an untied or pp > 1 output layer) is gathered whole like a layer, and
    with a large vocabulary it is the bigger one: llama3-8b's 525M against 218M per layer.
    """
    m, p = s.model, s.parallel
    units = [layer]
    if embedding_chunks(s, stage):
        units.append(embedding_params_per_rank(m, p.tp))
    for c in head_chunks(s, stage):
        units.append(head_params_per_rank(m, p.tp, head_apart(s, c)) - pc.norm_params(m))
    return max(units)


def stage_memory(s: Scenario, stage: int) -> StageMemory:
    """Every component of one stage's peak, on its busiest rank (``shared_memory.py``: the
    same for the planner, with what splits alike in part share computed once)."""
    params = stage_params_per_rank(s, stage)  # (dense, expert), for the three below
    weights, grads, optimizer = stage_model_states(s, stage, params)
    return StageMemory(stage, weights, grads, optimizer, stage_activation_bytes(s, stage),
                       stage_buffer_bytes(s, stage),
                       optimizer_step=optimizer_step_bytes(s, stage, params))


def memory_per_stage(s: Scenario) -> list[StageMemory]:
    """``stage_memory`` for every pipeline stage, first to last."""
    return [stage_memory(s, stage) for stage in range(s.parallel.pp)]
