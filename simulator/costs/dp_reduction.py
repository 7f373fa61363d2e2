"""Data-parallel traffic, described once for both estimators: what it is and when it runs.

A rank's data-parallel traffic is gradient *reductions* and parameter *gathers*, each a list of
collectives (``DpCollective``: group, collective, bytes per rank):

* groups: dense parameters over ``"dp"`` (the dp*cp replicas), expert parameters over
  ``"edp"`` (the dp*cp/ep replicas holding the same experts; Megatron-Core carves expert
  parallelism out of data parallelism); a group of one rank, or no parameters, has none.
  Under hybrid sharding (``parallel.dp_shard``) the dense states shard over ``"dps"``
  (dp_shard*cp consecutive replicas: a node, typically) and ``"dpr"`` joins the
  ``dp / dp_shard`` ranks holding the same shard in the other copies;
* collectives: a reduction is an all-reduce under ZeRO-0 (DDP) and a reduce-scatter into the
  rank's shard otherwise (ZeRO paper, sec. 5); a gather is an all-gather of the updated (ZeRO-1/2)
  or sharded (ZeRO-3) weights, none under ZeRO-0. Hybrid sharding reduce-scatters over
  ``"dps"``, then all-reduces the shard over ``"dpr"``, and gathers over ``"dps"`` alone
  (FSDP's ``HYBRID_SHARD``: ``foreach_reduce`` all-reduces the reduce-scattered shard over the
  replicate group, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py; Megatron-Core's
  ``finish_grad_sync`` with ``num_distributed_optimizer_instances > 1``, the all-reduce over
  ``inter_distributed_optimizer_instance_group``, megatron/core/distributed/
  param_and_grad_buffer.py);
* dtypes: gradients are reduced in ``training.grad_dtype`` (Megatron-LM reduces fp32 main
  gradients under bf16), weights gathered in ``training.precision``.

``dp_timing`` says when they run (``DpTiming``): reductions per ZeRO-3 unit, per micro-batch
(ZeRO-2 with sharded gradients, DeepSpeed's stage-2 epilogue), or once after each chunk's last
backward, bucket by bucket as the backward produces them (``overlap_grad_reduce``) or all at
once after it (ZeRO-3 under PyTorch's pipelining: ``ParallelSpec.deferred_zero3``); gathers per
ZeRO-3 unit (``prefetch_depth`` ahead, ``gathers_due``; under PyTorch's pipelining only in the
passes that find the unit sharded, ``zero3.gathering_passes``), at the start of the step
(ZeRO-1/2 with ``overlap_param_gather``: each awaited by the first forward that needs it),
after the optimizer step, or never. Between the reduction and the optimizer
step, DualPipe's two copies of the model swap their gradient sums (``cost_model.twin_stage``,
``copy_sum_bytes``).

The closed form (``closed_form/analytic.py``) sums the collectives' times and applies the
timing to a stage's whole backward; ZeRO-3's recurrence (``zero3.run_pass``) and the engine
(``discrete_event/dp_traffic.py``) issue the same collectives as events, in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import TYPE_CHECKING, NamedTuple

from clustersim.topologies import network as net
from clustersim.topologies.collective_registry import collective_named

from ..model import workload as wl

if TYPE_CHECKING:
    from ..inputs.parallel_spec import ParallelSpec
    from ..inputs.scenario import Scenario
    from .cost_model import CostModel

GROUPS = ("dp", "edp")  # dense parameters' group, then the experts': the order of issue

# When reductions run (``DpTiming.reduce``).
PER_UNIT = "per_unit"  # ZeRO-3: each unit's reduce-scatter right after its backward
PER_MICROBATCH = "per_microbatch"  # ZeRO-2, sharded gradients: every backward, awaited after it
PER_STEP = "per_step"  # ZeRO-0/1 (and ZeRO-2 under a pipeline): after each chunk's last backward
# When gathers run (``DpTiming.gather``).
NONE = "none"  # ZeRO-0: every rank keeps whole weights
BEFORE_STEP = "before_step"  # ZeRO-1/2, overlap_param_gather: issued as the step starts
AFTER_STEP = "after_step"  # ZeRO-1/2 without it: after the optimizer step, awaited


class DpCollective(NamedTuple):
    """One collective of a reduction or a gather: its group, its name in the collective
    registry and its bytes per rank."""

    group: str
    op: str
    nbytes: float


class DpTiming(NamedTuple):
    """When a scenario's data-parallel collectives are issued and awaited."""

    reduce: str  # PER_UNIT, PER_MICROBATCH or PER_STEP
    reduce_overlapped: bool  # bucket by bucket as the backward produces them, else after it
    gather: str  # PER_UNIT, BEFORE_STEP, AFTER_STEP or NONE
    prefetch: int  # ZeRO-3: units whose gathers are issued ahead of the running one


def prefetch_depth(p: ParallelSpec) -> int:
    """ZeRO-3 units gathered ahead of the running one (``overlap_param_gather: false``: 0)."""
    return p.zero3_prefetch if p.overlap_param_gather else 0


def dp_timing(p: ParallelSpec) -> DpTiming:
    """When ``p``'s reductions and gathers run (the module's docstring)."""
    if p.deferred_zero3:  # PyTorch's pipelining: once, after the last backward (REDUCE_GRAD)
        return DpTiming(PER_STEP, False, PER_UNIT, prefetch_depth(p))
    if p.zero == 3:  # FSDP reduce-scatters each unit's gradients after its backward
        return DpTiming(PER_UNIT, True, PER_UNIT, prefetch_depth(p))
    reduce = PER_MICROBATCH if p.zero == 2 and p.sharded_gradients else PER_STEP
    gather = NONE if p.zero == 0 else BEFORE_STEP if p.overlap_param_gather else AFTER_STEP
    return DpTiming(reduce, p.overlap_grad_reduce, gather, 0)


def per_step(timing: DpTiming, microbatches: int) -> tuple[int, int]:
    """How often a step reduces and gathers each parameter under ``timing``: once, or every
    micro-batch (ZeRO-2 with sharded gradients, ZeRO-3); ZeRO-3 gathers before each forward
    and each backward (full recomputation runs inside the backward's gather), but under
    PyTorch's pipelining (per-unit gathers, one reduction) ``m + 1`` times: the first pass and
    every pass after a forward, whatever the schedule (``zero3.gathering_passes``)."""
    reductions = 1 if timing.reduce == PER_STEP else microbatches
    per_unit = 2 * microbatches if timing.reduce == PER_UNIT else microbatches + 1
    gathers = {NONE: 0, PER_UNIT: per_unit}.get(timing.gather, 1)
    return reductions, gathers


def reduce_op(p: ParallelSpec) -> str:
    """The collective that reduces gradients: all-reduce under ZeRO-0, else reduce-scatter."""
    return "allreduce" if p.zero == 0 else "reduce_scatter"


def reduction(s: Scenario, dense: float, expert: float,
              size: Callable[[str], int]) -> list[DpCollective]:
    """The collectives reducing the gradients of ``dense`` and ``expert`` parameters; ``size``
    gives a group's rank count."""
    p, width = s.parallel, wl.BYTES[s.training.grad_dtype]
    if p.hybrid_sharded:  # expert parallelism is refused with it (rules._hybrid_sharding)
        return [c for c in (DpCollective("dps", "reduce_scatter", dense * width),
                            DpCollective("dpr", "allreduce", dense / p.state_shards * width))
                if c.nbytes > 0 and size(c.group) > 1]
    return _collectives(reduce_op(p), width, dense, expert, size)


def gather(s: Scenario, dense: float, expert: float,
           size: Callable[[str], int]) -> list[DpCollective]:
    """The collectives gathering the weights of ``dense`` and ``expert`` parameters (none under
    ZeRO-0)."""
    if s.parallel.zero == 0:
        return []
    if s.parallel.hybrid_sharded:  # within the copy only
        gathered = DpCollective("dps", "allgather", dense * gathered_weight_bytes(s))
        return [gathered] if dense > 0 and size("dps") > 1 else []
    return _collectives("allgather", gathered_weight_bytes(s), dense, expert, size)


def gathered_weight_bytes(s: Scenario) -> int:
    """Bytes per gathered weight: the training precision's, or one for FP8 parameters
    (``fp8_param_gather``: Megatron-LM's distributed optimizer gathers the FP8 weights; the
    embedding and output layer, bf16 there, are counted at one byte too, a few percent of a
    large model's gather)."""
    t = s.training
    return wl.GEMM_OPERAND_BYTES["fp8"] if t.fp8_param_gather else wl.BYTES[t.precision]


def _collectives(op: str, width: int, dense: float, expert: float,
                 size: Callable[[str], int]) -> list[DpCollective]:
    return [DpCollective(group, op, params * width)
            for group, params in zip(GROUPS, (dense, expert), strict=True)
            if params > 0 and size(group) > 1]


def group_links(cm: CostModel, group: str) -> net.GroupLinks:
    """The links of ``group`` ("dp", "edp", or hybrid sharding's "dps" and "dpr") in ``cm``'s
    placement."""
    return {"dp": cm.dp, "edp": cm.edp, "dps": cm.dps, "dpr": cm.dpr}[group]


def seconds(links: Callable[[str], net.GroupLinks], collectives: list[DpCollective]) -> float:
    """The closed-form time of ``collectives`` run one after another on ``links(group)``."""
    return sum((collective_named(c.op).time(links(c.group), c.nbytes) for c in collectives), 0.0)


def reduction_seconds(cm: CostModel, dense: float, expert: float) -> float:
    """The closed-form time of reducing ``dense`` and ``expert`` parameters' gradients over
    ``cm``'s groups (as the representative engine costs it)."""
    links = lambda group: group_links(cm, group)  # noqa: E731
    return seconds(links, reduction(cm.s, dense, expert, lambda group: links(group).size))


def gather_seconds(cm: CostModel, dense: float, expert: float) -> float:
    """The closed-form time of gathering ``dense`` and ``expert`` parameters over ``cm``'s
    groups (as the representative engine costs it)."""
    links = lambda group: group_links(cm, group)  # noqa: E731
    return seconds(links, gather(cm.s, dense, expert, lambda group: links(group).size))


def gathers_due(k: int, count: int, depth: int, issued: Container[int]) -> list[int]:
    """ZeRO-3's issue rule: before the unit at position ``k`` of a pass (execution order) of
    ``count`` units runs, the gathers of units ``k .. k+depth`` not yet ``issued`` are queued,
    in that order (FSDP's ``forward_prefetch`` / ``BACKWARD_PRE`` issue the next one)."""
    return [j for j in range(k, min(count, k + depth + 1)) if j not in issued]

