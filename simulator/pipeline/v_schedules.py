"""Schedules whose two chunks per rank sit in a V: ZB-V and DualPipeV.

Both place ``2 pp`` chunks down the ranks and back up (``stages.chunk_stages(..., "v")``): rank
r holds chunk r and chunk ``2 pp - 1 - r``, so rank 0 runs both the embedding and the loss, and
the hand-over at the bottom of the V stays on rank ``pp - 1``. Each is written as PyTorch
orders it (``torch/distributed/pipelining/schedules.py``), so that a run with PyTorch's
schedule and a clustersim prediction mean the same list of actions.
"""

from __future__ import annotations

from collections import Counter

from .list_schedule import list_scheduled_finish, walked_held
from .schedules import (
    Action,
    Kind,
    PipelineSchedule,
    Schedule,
    _check,
    cached,
    register_schedule,
)

F, B, I, W = Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT  # noqa: E741


class _RankOrder:
    """One rank's action list under construction, numbering each chunk's actions of a kind
    in turn (PyTorch's per-stage counters)."""

    def __init__(self, m: int) -> None:
        self.m = m
        self.actions: list[Action] = []
        self.count: Counter[tuple[int, Kind]] = Counter()

    def add(self, chunk: int, *kinds: Kind) -> None:
        """Append ``chunk``'s next action of each kind in turn; a whole backward also counts
        as its two halves."""
        for kind in kinds:
            key = (chunk, I if kind is B else kind)
            mb = self.count[key]
            self.count[key] += 1
            if kind is B:
                self.count[(chunk, W)] += 1
            if mb < self.m:  # PyTorch pads small m to the warm-up's need, drops the extra
                self.actions.append(Action(chunk, kind, mb))

    def pair(self) -> None:
        """The next forward and the backward after it overlap (``Kind.OVERLAP_F_B``)."""
        self.actions.append(Action(0, Kind.OVERLAP_F_B, 0))


@cached
def zero_bubble_v(pp: int, m: int, v: int = 2) -> Schedule:
    """ZB-V (Qi et al. 2024, sec. 6), in PyTorch's ``ScheduleZBVZeroBubble`` order.

    Rank r warms up with ``2(pp - r) - 1`` forwards of its first chunk, then ``r`` pairs of
    both chunks' forwards, then ``pp - r`` rounds of the second chunk's forward, input- and
    weight-gradient; in the steady state each chunk alternates F, I, W; the cool-down runs
    the remaining input-gradient halves and lets the deferred weight-gradient halves fill it.
    With ``T_F = T_I = T_W`` it has (almost) no bubble and every rank holds 1F1B's first-stage
    peak of activations, ``pp`` micro-batches of a whole stage (published: sail-sg's table,
    "ZBV: bubble rate 0, activation memory 1x").
    """
    _check(pp, m, v, allowed_v=(2,))
    n = max(2 * pp - 1, m)  # as PyTorch: enough micro-batches to fill the V, the extra dropped
    schedule: Schedule = {}
    for r in range(pp):
        down, up = r, 2 * pp - 1 - r
        o = _RankOrder(m)
        for _ in range(2 * (pp - r) - 1):
            o.add(down, F)
        for _ in range(r):
            o.add(up, F)
            o.add(down, F)
        for _ in range(pp - r):
            o.add(up, F, I, W)
        while o.count[(up, F)] < o.count[(down, F)] or o.count[(down, F)] < n:
            if o.count[(down, F)] < n:
                o.add(down, F)
            o.add(down, I, W)
            o.add(up, F, I, W)
        for _ in range(r):
            o.add(down, I)
            o.add(up, I)
        for _ in range(pp - r):
            o.add(down, I, W)
        while o.count[(up, W)] < o.count[(up, I)]:
            o.add(up, W)
        while o.count[(down, W)] < o.count[(down, I)]:
            o.add(down, W)
        schedule[r] = o.actions
    return schedule


@cached
def dualpipe_v(pp: int, m: int, v: int = 2) -> Schedule:
    """DualPipeV (DeepSeek-AI 2024, DualPipe "cut in half"), in PyTorch's ``ScheduleDualPipeV``
    order, each overlapped forward-backward pair (``OVERLAP_F_B``) as that marker, its forward,
    then its whole backward.

    Rank r: ``2(pp - r - 1)`` forwards of its first chunk, ``r + 1`` forwards of both chunks,
    ``pp - r - 1`` zero-bubble rounds on the second chunk (I, a deferred W, F), then the main
    phase pairs a forward of one chunk with the whole backward of the other; the tail runs
    the remaining backwards, half of them split so that deferred weight halves fill the end.
    Needs at least ``2 pp`` micro-batches.
    """
    _check(pp, m, v, allowed_v=(2,))
    if m < 2 * pp:
        raise ValueError(f"DualPipeV needs at least 2 * pp = {2 * pp} micro-batches (got {m})")
    return {r: dual_rank_order(pp, r, m, r, 2 * pp - 1 - r) for r in range(pp)}


def dual_rank_order(half: int, h: int, m: int, near: int, far: int) -> list[Action]:
    """One rank's DualPipe order: DualPipeV's rank ``h`` of ``half`` ranks, or DualPipe's rank
    ``h`` or ``2 half - 1 - h`` of ``2 half`` (deepseek-ai/DualPipe dualpipe/dualpipe.py,
    ``DualPipe.step``, steps 1-8, its ``half_rank`` and ``num_half_ranks``), each of its two
    chunks running ``m`` micro-batches. ``near`` is the chunk whose micro-batches enter
    nearer this rank (the repo's phase 0), ``far`` the other (phase 1)."""
    o = _RankOrder(m)
    deferred: list[int] = []  # chunks whose input half ran and weight half waits, in order

    def split(chunk: int) -> None:  # a backward with its weight half deferred (enable_zb)
        o.add(chunk, I)
        deferred.append(chunk)

    def weight() -> None:  # WeightGradStore.pop(): the oldest deferred weight half
        if deferred:
            o.add(deferred.pop(0), W)

    for _ in range(2 * (half - h - 1)):  # step 1: nF0
        o.add(near, F)
    for _ in range(h + 1):  # step 2: nF0F1
        o.add(near, F)
        o.add(far, F)
    for _ in range(half - h - 1):  # step 3: nB1W1F1, zero bubble
        split(far)
        weight()
        o.add(far, F)
    for i in range(m - 2 * half + h + 1):  # step 4: nF0B1F1B0, overlapped pairs
        if not (i == 0 and h == half - 1):  # the middle ranks run their first pair apart
            o.pair()
        o.add(near, F)
        o.add(far, B)
        o.pair()
        o.add(far, F)
        o.add(near, B)
    for _ in range(half - h - 1):  # step 5: nB1F1B0
        o.add(far, B)
        o.pair()
        o.add(far, F)
        o.add(near, B)
    zero_bubble = False
    for i in range(h + 1):  # step 6: nB1B0, from the middle on split (odd ranks one earlier)
        zero_bubble |= i == (h + 1) // 2 and h % 2 == 1
        split(far) if zero_bubble else o.add(far, B)
        zero_bubble |= i == (h + 1) // 2 and h % 2 == 0
        split(near) if zero_bubble else o.add(near, B)
    for _ in range(half - h - 1):  # step 7: nWB0, zero bubble
        weight()
        split(near)
    for _ in range(h + 1):  # step 8: nW
        weight()
    return o.actions


def _two_per_rank(pp: int, m: int) -> str | None:
    if m < 2 * pp:
        return f"needs at least 2 * pp = {2 * pp} micro-batches per pipeline (got {m})"
    return None


# No steady state for the engine's shortcut: from 2 pp - 1 its lists only grow in the middle,
# but a stage's time blocked in sends can grow by a little more with every micro-batch (its
# sends queue behind a neighbour's, the wait taken from its bubble), so its breakdown is not
# affine in m even where its finish is, and three short runs can all lie before that starts
# (pp = 8, full recomputation: from m = 20; tests/simulator/test_steady_schedules.py). Its
# lists' growth (``lists_grow_from``) still lets the memory model walk them short.
register_schedule(PipelineSchedule(
    "zb-v", zero_bubble_v, walked_held("zb-v"), finish=list_scheduled_finish("zb-v"),
    chunks_per_rank=True, chunk_counts=(2,), placement="v",
    lists_grow_from=lambda pp: (2 * pp - 1, 1)))
# Steady from 3 pp: each micro-batch more is one more pair of step 4 from 2 pp, its smallest
# count, but until 3 pp a stage's sends may still change how they queue (Llama 3 70B on 8
# stages: a kink at m = 24; smaller models with ZeRO-3 or full recomputation: at 2 pp;
# tests/simulator/test_steady_schedules.py).
register_schedule(PipelineSchedule(
    "dualpipev", dualpipe_v, walked_held("dualpipev"), finish=list_scheduled_finish("dualpipev"),
    chunks_per_rank=True, chunk_counts=(2,), placement="v", microbatch_rule=_two_per_rank,
    steady_from=lambda pp: (3 * pp, 1)))
