"""ZeRO-3 (FSDP, DeepSpeed stage 3): per-unit gathers and reduce-scatters beside the compute.

What is modelled, per micro-batch and model chunk, as FSDP does it with one unit per
transformer layer (the first layer's unit also holds the embedding, the last the output layer):

* forward: each unit's weights are all-gathered (training precision) before its forward and
  freed after it (``reshard_after_forward``); the first gather of a pass overlaps nothing
  ("The 1st all-gather will not be able to overlap with anything",
  https://docs.pytorch.org/docs/stable/notes/fsdp.html, FSDP Prefetch Nuances);
* backward: each unit is gathered again before its backward, and its gradients are
  reduce-scattered (``grad_dtype``) right after it, every micro-batch (DeepSpeed stage 3, FSDP
  without ``no_sync``; https://docs.pytorch.org/tutorials/intermediate/FSDP_tutorial.html,
  "Before forward and backward, sharded parameters are all-gathered ... Inside backward, local
  unsharded gradients are reduce-scattered");
* full recomputation: the recomputed forward runs inside the unit's backward, after FSDP's
  pre-backward hook has unsharded the unit, so one gather covers recomputation and backward
  (the recomputation's cost is in the unit's backward compute);
* prefetch: ``parallel.zero3_prefetch`` units ahead of the running one are issued before it
  runs (FSDP's ``BACKWARD_PRE`` / ``forward_prefetch`` issue one); 0 issues each gather only
  when its unit is due. ``overlap_param_gather: false`` means 0.

All of a rank's ZeRO-3 traffic runs on one data-parallel stream in issue order, so an
all-gather queues behind the reduce-scatter issued before it: they share the same NICs, and
their sum is what the links must carry. A gather over ``n`` ranks costs the two-level
alpha-beta form of ``topologies/network.py``: ``nodes - 1`` ring steps of inter-node latency
plus the node's ring, on ``1/local`` shards across nodes. With many ranks and a small unit the
latency term dominates and, once a unit's gather outlasts its compute, every unit pays the
difference: the point where data parallelism alone stops scaling (``hidden_gather_limit``).

``run_pass`` is that schedule in closed form (a recurrence over the units); the engine runs
the same per-unit times as events, so the analytic estimate and the engine agree. Both take a
unit's collectives and bytes (``dp_reduction.gather``, ``reduction``) and the prefetch issue
rule (``dp_reduction.gathers_due``) from ``dp_reduction.py``.
``stage_exposure`` gives the analytic estimate its per-micro-batch and per-step parts.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.topologies import network as net

from ..pipeline.schedules import Kind, schedule_named
from ..pipeline.stages import chunks_of_stage
from .dp_reduction import (
    gather_seconds,
    gathered_weight_bytes,
    gathers_due,
    prefetch_depth,
    reduction_seconds,
)
from .layer_comm import overlapped
from .memory import stage_params_per_rank


@dataclass(frozen=True, slots=True)
class UnitTimes:
    """One unit in one pass: its gather, its compute (exposed TP/CP/EP collectives included)
    and the reduce-scatter issued after it (backward only)."""

    gather: float
    compute: float
    reduce: float = 0.0


@dataclass(frozen=True, slots=True)
class PassTimes:
    """A forward or backward pass of one chunk on one rank."""

    busy: float  # main thread, from the pass's start to its end
    exposed: float  # of which waiting for gathers
    backlog: float  # the DP stream is still busy this long after the pass ends


def run_pass(units: list[UnitTimes], depth: int, backlog: float = 0.0) -> PassTimes:
    """The pass's units in execution order on a main thread and a FIFO DP stream.

    Before unit ``k`` runs, the gathers of units ``k .. k+depth`` not yet issued are queued;
    the thread waits for unit ``k``'s, computes, then queues its reduce-scatter. The stream
    starts busy for ``backlog`` (the previous pass's reduce-scatters). With ``depth = 1``, no
    reduce-scatters and no backlog this is ``g_0 + sum_k max(0, g_(k+1) - c_k)`` of exposure.
    """
    now, free, exposed = 0.0, backlog, 0.0
    ready: dict[int, float] = {}
    for k, unit in enumerate(units):
        for j in gathers_due(k, len(units), depth, ready):  # the engine's issue rule
            if units[j].gather > 0:
                free = max(free, now) + units[j].gather
                ready[j] = free
            else:
                ready[j] = 0.0
        wait = max(0.0, ready[k] - now)
        exposed += wait
        now += wait + unit.compute
        if unit.reduce > 0:
            free = max(free, now) + unit.reduce
    return PassTimes(now, exposed, max(0.0, free - now))


def chunk_units(cm, w) -> tuple[list[UnitTimes], list[UnitTimes]]:
    """A chunk's units for its forward (model order) and backward (reverse order)."""
    forward, backward = [], []
    costed: dict = {}  # a chunk repeats one layer's segment: each distinct one costed once
    for seg in w.segments:
        if seg not in costed:
            costed[seg] = _unit_times(cm, seg)
        ahead, back = costed[seg]
        forward.append(ahead)
        backward.append(back)
    return forward, backward[::-1]


def _unit_times(cm, seg) -> tuple[UnitTimes, UnitTimes]:
    """One unit's forward and backward: its gathers, compute and reduce-scatters (none here
    under PyTorch's pipelining, which reduces once a step: ``deferred_exposure``)."""
    gather = gather_seconds(cm, seg.dense_params, seg.expert_params)
    reduce = (0.0 if cm.s.parallel.deferred_zero3 else
              reduction_seconds(cm, seg.dense_params, seg.expert_params))
    return (UnitTimes(gather, _pass_time(cm, seg, forward=True)),
            UnitTimes(gather, _pass_time(cm, seg, forward=False), reduce))


def _pass_time(cm, seg, forward: bool) -> float:
    """A unit's compute plus the TP collectives it exposes (all of them, or what outlasts the
    GEMMs they overlap) plus its exposed CP/EP traffic: its main-thread time, DP aside."""
    compute, tp, hide, other = seg.pass_times("forward" if forward else "backward")
    return compute + overlapped(cm, tp, hide) + other


def stage_exposure(cm, stage: int) -> tuple[float, float]:
    """Seconds a ZeRO-3 stage waits on its data-parallel traffic: (per micro-batch, once).

    Each micro-batch runs the forward of the stage's chunks, then their backward, the DP
    stream's backlog carried from one pass to the next (as with one pipeline stage, where the
    passes follow each other; between pipeline stages the sends give the stream slack, so
    this is an upper bound there). The waits recur every micro-batch, on the pipeline's
    critical path like tensor-parallel collectives; once per step come the first micro-batch's
    difference (it starts on an idle stream) and the reduce-scatters still running after the
    last backward, which finish before the optimizer step. Once a micro-batch leaves the same
    backlog it found, every later one costs the same, so the loop stops early.
    """
    depth = prefetch_depth(cm.s.parallel)
    works = [cm.chunks[c] for c in chunks_of_stage(cm.s, stage)]
    passes = [chunk_units(cm, w) for w in works]
    total, backlog, m = 0.0, 0.0, cm.s.microbatches
    exposed, done = 0.0, 0
    while done < m:
        exposed, after = _microbatch(passes, depth, backlog)
        total += exposed
        done += 1
        if done > 1 and abs(after - backlog) <= 1e-12:
            total += (m - done) * exposed
            done = m
        backlog = after
    return exposed, total - m * exposed + backlog


def _microbatch(passes, depth: int, backlog: float) -> tuple[float, float]:
    exposed = 0.0
    for units in [f for f, _ in passes] + [b for _, b in passes]:
        times = run_pass(units, depth, backlog)
        exposed, backlog = exposed + times.exposed, times.backlog
    return exposed, backlog


def hidden_gather_limit(cm, unit_params: float, compute: float, sizes: list[int]) -> int | None:
    """The largest data-parallel size in ``sizes`` whose gather of a ``unit_params`` unit still
    fits in ``compute`` seconds (the unit's forward), placed as ``cm``'s DP groups are; None
    when none does. Past it every unit of every forward exposes ``gather - compute``."""
    best = None
    c = cm.links_cluster
    stride = cm.placement.replica_stride()
    for n in sorted(sizes):
        links = net.group_links(c, cm.profile, n, stride)
        if net.allgather_time(links, unit_params * gathered_weight_bytes(cm.s)) <= compute:
            best = n
    return best


def gathering_passes(s, stage: int) -> dict[int, tuple[int, int]]:
    """ZeRO-3 under PyTorch's pipelining (``ParallelSpec.deferred_zero3``): per chunk of
    ``stage``, how many of its (forwards, backwards) in a step find its units sharded and so
    gather them. FSDP reshards a unit after its forward (``reshard_after_forward``) but, under
    the pipelining's ``set_reshard_after_backward(False)``, not after its backward
    (torch/distributed/pipelining/stage.py), and a pass over a unit left gathered issues no
    all-gather (``FSDPParamGroup.unshard`` returns at once). So a forward gathers after a
    forward or at the step's start, a backward (or its input half) after a forward; a
    weight half needs no weights. In 1F1B, ``m + 1`` a chunk: its warm-up forwards and the
    first steady one, then every backward that follows a forward."""
    p = s.parallel
    actions = schedule_named(p.schedule).build(p.pp, s.microbatches, p.virtual_stages)[stage]
    sharded: dict[int, bool] = {}
    counts: dict[int, list[int]] = {}
    for a in actions:
        if a.kind is Kind.BACKWARD_WEIGHT or a.kind is Kind.OVERLAP_F_B:
            continue
        forward = a.kind is Kind.FORWARD
        count = counts.setdefault(a.chunk, [0, 0])
        if sharded.get(a.chunk, True):
            count[0 if forward else 1] += 1
        sharded[a.chunk] = forward
    return {chunk: (f, b) for chunk, (f, b) in counts.items()}


def deferred_exposure(cm, stage: int) -> tuple[float, float]:
    """Seconds a stage under ``deferred_zero3`` waits on its data-parallel traffic: (per
    micro-batch, once). Each gathering pass (``gathering_passes``) exposes what its units'
    gathers outlast (``run_pass``, nothing queued before it: no reduce-scatters run in the
    step), spread over the micro-batches; once, the whole gradients' reduction after the last
    backward, which nothing hides (the schedule's ``REDUCE_GRAD`` follows every pass)."""
    depth = prefetch_depth(cm.s.parallel)
    counts = gathering_passes(cm.s, stage)
    exposed = 0.0
    for chunk in chunks_of_stage(cm.s, stage):
        forward, backward = chunk_units(cm, cm.chunks[chunk])
        gathers_f, gathers_b = counts.get(chunk, (0, 0))
        exposed += (gathers_f * run_pass(forward, depth).exposed
                    + gathers_b * run_pass(backward, depth).exposed)
    dense, expert = stage_params_per_rank(cm.s, stage)
    return exposed / cm.s.microbatches, reduction_seconds(cm, dense, expert)
