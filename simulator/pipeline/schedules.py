"""Pipeline schedules as ordered action lists, one list per pipeline rank.

As in ``torch.distributed.pipelining``, a schedule is data: for each rank, the order in which it
runs the forward (``F``) and backward (``B``) of each micro-batch on each of its model chunks.
Chunk ``c`` of ``pp * v`` runs on rank ``c % pp`` (Megatron-LM's interleaved placement) unless
the schedule places its chunks otherwise (``stages.chunk_layout``), and a micro-batch's
forward visits chunks 0, 1, ..., its backward the reverse (with two copies of the model among
the chunks, as DualPipe's, those of one copy). The runtime executes
actions in list order; it knows nothing of which generator made the list. Generators emit
the computation; ``with_communication`` lowers it to lists with explicit sends and receives
(``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B``), which the engine executes.

A schedule is registered as a ``PipelineSchedule``: its generator and what the rest of
clustersim asks of it — the micro-batches each stage holds at its peak (the memory model), its
closed-form pipeline time (the analytic estimate and the planner's pre-filter), its rules on
micro-batches, whether it runs several chunks per rank, when its steady state starts (the
engine's shortcut) and whether the planner tries it. Adding a schedule is one
``register_schedule`` call, from any module (``docs/extending.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache, wraps
from typing import NamedTuple, Protocol


class Kind(str, Enum):
    """What an action does; the values are PyTorch's action strings."""

    FORWARD = "F"
    BACKWARD = "B"  # a whole backward (PyTorch's FULL_BACKWARD)
    BACKWARD_INPUT = "I"  # its input-gradient half, sent upstream (zero-bubble schedules)
    BACKWARD_WEIGHT = "W"  # its weight-gradient half: no communication, frees the activations
    SEND_F = "SEND_F"  # the forward's output to the next chunk
    RECV_F = "RECV_F"  # the forward's input from the previous chunk
    SEND_B = "SEND_B"  # the backward's input gradient to the previous chunk
    RECV_B = "RECV_B"  # the backward's output gradient from the next chunk
    # The next forward and the backward after it run as one overlapped pair, each one's
    # communication behind the other's compute (PyTorch's OVERLAP_F_B; DualPipe's "F&B").
    OVERLAP_F_B = "OVERLAP_F_B"

    def __str__(self) -> str:
        return self.value


class Action(NamedTuple):
    """Run ``kind`` of ``microbatch`` on model chunk ``chunk`` (PyTorch's stage index)."""

    chunk: int
    kind: Kind
    microbatch: int

    def __str__(self) -> str:  # PyTorch's form: "2F0" is chunk 2, forward, micro-batch 0
        if self.kind is Kind.OVERLAP_F_B:
            return str(self.kind)
        return f"{self.chunk}{self.kind}{self.microbatch}"


Schedule = dict[int, list[Action]]  # rank -> ordered actions


def cached(build: Callable[[int, int, int], Schedule]) -> Callable[[int, int, int], Schedule]:
    """``build`` remembered per (pp, m, v): the memory model, the closed form and the engine
    each ask for the same lists, and the planner for thousands. Callers get their own lists."""
    memo = lru_cache(maxsize=256)(
        lambda *args: tuple((r, tuple(a)) for r, a in build(*args).items()))

    @wraps(build)
    def lists(*args: int) -> Schedule:  # (pp, m[, v]), the build's own default v kept
        return {r: list(actions) for r, actions in memo(*args)}

    return lists


def gpipe(pp: int, m: int, v: int = 1) -> Schedule:
    """GPipe (Huang et al. 2019): every forward, then every backward."""
    _check(pp, m, v, allowed_v=(1,))
    return {r: [Action(r, Kind.FORWARD, i) for i in range(m)]
            + [Action(r, Kind.BACKWARD, i) for i in range(m)] for r in range(pp)}


def one_f_one_b(pp: int, m: int, v: int = 1) -> Schedule:
    """1F1B (PipeDream-Flush, Narayanan et al. 2021): rank r runs ``pp - r - 1`` warm-up
    forwards, then alternates one forward and one backward, then drains the backwards."""
    _check(pp, m, v, allowed_v=(1,))
    schedule: Schedule = {}
    for r in range(pp):
        warmup = min(pp - r - 1, m)
        forwards = [Action(r, Kind.FORWARD, i) for i in range(m)]
        backwards = [Action(r, Kind.BACKWARD, i) for i in range(m)]
        schedule[r] = _interleave(forwards, backwards, warmup)
    return schedule


def zero_bubble_h1(pp: int, m: int, v: int = 1) -> Schedule:
    """ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", sec. 3.1), as PyTorch's
    ``ScheduleInterleavedZeroBubble`` orders it with one chunk per rank (its ZB1P,
    ``torch/distributed/pipelining/schedules.py:_get_1f1b_rank_ops``).

    Backwards are split into an input-gradient half (``I``), which goes upstream at once, and
    a weight-gradient half (``W``). Rank r warms up with 1F1B's ``pp - r - 1`` forwards, then
    runs a forward and an ``I`` per step; it defers its first ``r`` ``W`` s, after which one
    follows each ``I``, and the deferred ones fill the cool-down. Every rank then holds at most
    ``min(pp, m)`` micro-batches' activations (freed by ``W``): 1F1B's peak, that of its first
    stage. With equal stages and free communication the bubble is
    ``(pp - 1)(T_F + T_I - T_W)``, against 1F1B's ``(pp - 1)(T_F + T_I + T_W)``.
    """
    _check(pp, m, v, allowed_v=(1,))
    schedule: Schedule = {}
    for r in range(pp):
        warmup = min(pp - r - 1, m)
        order = [Action(r, Kind.FORWARD, i) for i in range(warmup)]
        weights = 0
        for b in range(m):  # the b-th input-gradient half, after the forward it pairs with
            if warmup + b < m:
                order.append(Action(r, Kind.FORWARD, warmup + b))
            order.append(Action(r, Kind.BACKWARD_INPUT, b))
            if b >= r:
                order.append(Action(r, Kind.BACKWARD_WEIGHT, weights))
                weights += 1
        order += [Action(r, Kind.BACKWARD_WEIGHT, i) for i in range(weights, m)]
        schedule[r] = order
    return schedule


def _interleave(forwards: list[Action], backwards: list[Action], warmup: int) -> list[Action]:
    """Warm-up forwards, then one forward / one backward pairs, then the remaining backwards."""
    steady = len(forwards) - warmup
    order = forwards[:warmup] + [None] * (2 * steady) + backwards[steady:]
    order[warmup:warmup + 2 * steady:2] = forwards[warmup:]
    order[warmup + 1:warmup + 2 * steady:2] = backwards[:steady]
    return order


def _check(pp: int, m: int, v: int, allowed_v: tuple[int, ...] | None) -> None:
    if pp < 1 or m < 1 or v < 1:
        raise ValueError(f"pp, m and v must be positive (got {pp}, {m}, {v})")
    if allowed_v is not None and v not in allowed_v:
        raise ValueError(f"this schedule runs one chunk per rank (got v = {v})")


class StageCosts(Protocol):
    """What a schedule's closed form reads of each pipeline stage (``analytic.StageTimes``)."""

    backward: float  # compute of one micro-batch's backward (both halves)
    comm: float  # exposed collectives and sends, per micro-batch
    weight_grad: float  # the weight-gradient GEMMs among the backward
    split_cost: float  # exposed time a backward split into I and W adds (split_backward.py)
    grad_sync: float  # exposed data-parallel traffic, once per step
    optimizer: float
    slowdown: float  # compute lost beside communication (overlap.exposed_beside)
    pair_hidden: float  # of ``comm``, what an overlapped F&B pair's other half can hide

    @property
    def per_microbatch(self) -> float: ...


def one_f_one_b_finish(stages: Sequence[StageCosts], m: int, v: int) -> list[float]:
    """When each stage ends under GPipe and the 1F1B family: ``m T_max + (sum T_i - T_max)/v``
    (Narayanan et al. 2021, sec. 2.2: the bubble ``(p - 1)/(m + p - 1)`` of the step for equal
    stages, ``1/v`` of it when interleaved); stage i ends its last backward while stages
    i-1..0 still run theirs, one chunk's backward each, then reduces and steps."""
    per_mb = [st.per_microbatch for st in stages]
    slowest = max(per_mb)
    pipeline = m * slowest + (sum(per_mb) - slowest) / v
    return [pipeline - sum(stages[j].backward + stages[j].comm / 2 for j in range(i)) / v
            + st.grad_sync + st.optimizer for i, st in enumerate(stages)]


def zero_bubble_finish(stages: Sequence[StageCosts], m: int, v: int) -> list[float]:
    """When each stage ends under ZB-H1: the slowest stage's m micro-batches plus, for every
    other stage, its ``T_F + T_I - T_W`` (Qi et al. 2024, sec. 3.1: the bubble
    ``(p - 1)(T_F + T_B - T_W)``, B the input-gradient half); the deferred weight-gradient
    halves fill the cool-down, so every stage works until then. Every backward is split, so
    each input half carries the split's cost (``split_backward.lost_cover``)."""
    per_mb = [st.per_microbatch + st.split_cost for st in stages]
    slowest = max(range(len(stages)), key=lambda i: per_mb[i])
    bubble = sum(max(0.0, per_mb[i] - 2 * st.weight_grad)
                 for i, st in enumerate(stages) if i != slowest)
    pipeline = m * per_mb[slowest] + bubble
    return [pipeline + st.grad_sync + st.optimizer for st in stages]


def _all_held(pp: int, m: int, v: int, stage: int) -> list[int]:
    return [m] * v


def _one_f_one_b_held(pp: int, m: int, v: int, stage: int) -> list[int]:
    return [min(pp - stage, m)] * v


def _zero_bubble_held(pp: int, m: int, v: int, stage: int) -> list[int]:
    return [min(pp, m)] * v


@dataclass(frozen=True)
class PipelineSchedule:
    """A pipeline schedule: its action lists and what the rest of clustersim asks of it."""

    name: str
    build: Callable[[int, int, int], Schedule]  # (pp, m, v) -> every rank's actions
    # (pp, m, v, stage) -> micro-batches whose activations each chunk of the stage holds at
    # the stage's peak (the engine measures it; the memory model and planner read this)
    held: Callable[[int, int, int, int], list[int]]
    # (stage costs, m, v) -> when each stage ends: the analytic estimate's pipeline
    finish: Callable[[Sequence[StageCosts], int, int], list[float]] = one_f_one_b_finish
    chunks_per_rank: bool = False  # takes parallel.virtual_stages > 1
    chunk_counts: tuple[int, ...] | None = None  # the only virtual_stages it runs; None: any
    microbatch_rule: Callable[[int, int], str | None] | None = None  # (pp, m) -> why not
    pp_rule: Callable[[int], str | None] | None = None  # pp -> why not (DualPipe: even pp)
    # pp -> (first micro-batch count from which the lists only grow in their steady part,
    # the step they grow by); None: always simulated whole
    steady_from: Callable[[int], tuple[int, int]] | None = None
    searched: bool = True  # the planner tries it
    placement: str = "loop"  # chunks on stages: "loop" (c % pp) or "v" (stages.chunk_stages)
    # pp -> (first count from which the lists only grow in their steady part, the step), for a
    # schedule whose lists grow so but whose times the engine does not extend (no
    # ``steady_from``): the memory model's ``list_schedule.repeating_count`` reads it
    lists_grow_from: Callable[[int], tuple[int, int]] | None = None
    # (pp, m) -> whether fewer, larger micro-batches hold at least as many activations as
    # ``m``'s (the planner skips a split's larger micro-batches once one is out of memory);
    # a split backward never does (``memory_grows_with_microbatch``)
    held_grows: Callable[[int, int], bool] = lambda pp, m: True

    def list_growth(self, pp: int) -> tuple[int, int] | None:
        """(first count, step) from which the lists only grow in their steady part, or None
        where the schedule declares neither ``steady_from`` nor ``lists_grow_from``."""
        rule = self.lists_grow_from or self.steady_from
        return None if rule is None else rule(pp)


SCHEDULES: dict[str, PipelineSchedule] = {}


def register_schedule(schedule: PipelineSchedule) -> PipelineSchedule:
    """Make ``schedule`` available by its name to scenarios, the engine, the memory model, the
    closed form and the planner."""
    SCHEDULES[schedule.name] = schedule
    return schedule


def unregister_schedule(name: str) -> None:
    """Forget schedule ``name`` (a test's or a notebook's toy), and what was probed of it."""
    SCHEDULES.pop(name, None)
    splits_backward.cache_clear()


def schedule_named(name: str) -> PipelineSchedule:
    """The registered schedule ``name``; an unknown name lists the valid ones."""
    try:
        return SCHEDULES[name]
    except KeyError:
        raise ValueError(f"Unknown schedule name {name!r}. The valid options are "
                         f"{sorted(SCHEDULES)}") from None


register_schedule(PipelineSchedule("gpipe", gpipe, _all_held, steady_from=lambda pp: (1, 1),
                                   searched=False))  # 1F1B's bubble, more memory: never wins
register_schedule(PipelineSchedule("1f1b", one_f_one_b, _one_f_one_b_held,
                                   steady_from=lambda pp: (pp, 1)))
# Rank r defers r < pp weight-gradient halves: as 1F1B from m = pp.
register_schedule(PipelineSchedule("zb-h1", zero_bubble_h1, _zero_bubble_held,
                                   finish=zero_bubble_finish, steady_from=lambda pp: (pp, 1)))
@lru_cache(maxsize=64)
def splits_backward(name: str) -> bool:
    """Whether schedule ``name`` splits backwards, tried on a few small pipelines (NOTE: so
    that the memory model never builds the lists of a schedule that does not)."""
    for pp, m, v in ((2, 8, 1), (2, 8, 2), (4, 16, 2), (4, 16, 1)):
        try:
            lists = schedule_named(name).build(pp, m, v)
        except ValueError:
            continue
        return any(a.kind is Kind.BACKWARD_INPUT for acts in lists.values() for a in acts)
    return True  # none of the probes is valid for it: walk its real lists


def memory_grows_with_microbatch(name: str, pp: int, m: int) -> bool:
    """Whether a split of schedule ``name`` at ``m`` micro-batches per pipeline needs no less
    memory at any larger micro-batch (fewer of them): the activations held scale with the
    micro-batch, and the count in flight shrinks no faster than ``m`` (``held_grows``). Not
    under a split backward: it defers more weight halves the more micro-batches there are
    (ZB-V up to ``2p - 1`` once ``m >= 2p``), and a weight half can keep more than the
    activations (``split_backward.py``)."""
    return not splits_backward(name) and schedule_named(name).held_grows(pp, m)


def build_schedule(name: str, pp: int, m: int, v: int = 1) -> Schedule:
    """The action lists of schedule ``name``; an unknown name lists the valid ones."""
    return schedule_named(name).build(pp, m, v)


def with_communication(schedule: Schedule, chunks: int,
                       stages: Sequence[int] | None = None, copies: int = 1) -> Schedule:
    """The lists with their sends and receives made explicit (PyTorch's ``_add_send_recv``).

    A forward of any chunk but the first receives its input first; of any chunk but the last,
    sends its output after. A backward mirrors it: receives unless on the last chunk, sends
    unless on the first. ``chunks`` is ``pp * v``; ``stages`` (chunk -> stage, default
    ``c % pp`` of loop placement) drops the hand-over between two chunks of one stage, which
    the rank's own order already sequences (the turn of a V). With ``copies`` copies of the
    model among the chunks (``stages.ChunkLayout``), the first and last chunk of each copy
    count as the first and last: nothing passes from one copy to the next.
    """
    pp = len(schedule)
    owner = list(stages) if stages is not None else [c % pp for c in range(chunks)]
    per_copy = chunks // copies
    crosses = [owner[c] != owner[c + 1] and (c + 1) % per_copy != 0  # c -> c + 1 is a send
               for c in range(chunks - 1)]
    from_before = [c > 0 and crosses[c - 1] for c in range(chunks)]  # receives its input
    to_next = [c < chunks - 1 and crosses[c] for c in range(chunks)]  # sends its output
    forward, backward, backward_input = Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT
    make = tuple.__new__  # Action(c, kind, m) without the NamedTuple's Python-level __new__
    lowered: Schedule = {}
    for rank, actions in schedule.items():
        out: list[Action] = []
        add = out.append
        for a in actions:
            c, kind, m = a
            if kind is forward:
                if from_before[c]:
                    add(make(Action, (c, Kind.RECV_F, m)))
                add(a)
                if to_next[c]:
                    add(make(Action, (c, Kind.SEND_F, m)))
            elif kind is backward or kind is backward_input:
                if to_next[c]:
                    add(make(Action, (c, Kind.RECV_B, m)))
                add(a)
                if from_before[c]:
                    add(make(Action, (c, Kind.SEND_B, m)))
            else:
                add(a)
        lowered[rank] = out
    return lowered


def format_schedule(schedule: Schedule) -> str:
    """CSV, one row per rank, PyTorch's action strings: ``0F0,0F1,0B0,...``."""
    return "\n".join(",".join(str(a) for a in schedule[r]) for r in sorted(schedule))

