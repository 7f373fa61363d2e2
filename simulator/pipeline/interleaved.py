"""Interleaved 1F1B (Narayanan et al. 2021, sec. 2.2.2) in Megatron-LM's order, at any count of
at least ``pp`` micro-batches per pipeline: on the ``pp`` grid in groups of ``pp``, off it in the
smallest larger groups Megatron-LM accepts (``microbatch_group``).
"""

from __future__ import annotations

from functools import lru_cache

from .list_schedule import list_scheduled_finish
from .schedules import (
    Action,
    Kind,
    PipelineSchedule,
    Schedule,
    _check,
    _interleave,
    register_schedule,
)

# The schedules that run Megatron-LM's interleaved order (its warm-up, micro-batch groups and
# asynchronous sends): what reads ``--num-virtual-stages-per-pipeline-rank`` as interleaving.
INTERLEAVED_ORDER = ("interleaved", "combined-1f1b")


def interleaved_1f1b(pp: int, m: int, v: int) -> Schedule:
    """Interleaved 1F1B (Narayanan et al. 2021, sec. 2.2.2), in Megatron-LM's order.

    Rank r holds chunks ``r, r + pp, ...``. Forwards walk groups of micro-batches
    (``microbatch_group``: ``pp`` of them where ``m`` is a multiple of ``pp``) through the
    rank's chunks in turn, the last group taking the remainder; backwards walk the chunks in
    reverse (``get_schedule_table``, megatron/core/pipeline_parallel/schedules.py). Warm-up
    is ``2(pp - r - 1) + (v - 1) N`` forwards for group size ``N`` (all of them if fewer, or
    if ``m == pp``), as Megatron-LM counts it (``get_pp_rank_microbatches``).
    Needs ``m >= pp``.
    """
    return _interleaved_lists(pp, m, v, extra=0)


def combined_1f1b(pp: int, m: int, v: int) -> Schedule:
    """Megatron-Core's combined 1F1B (``--overlap-moe-expert-parallel-comm``,
    megatron/core/pipeline_parallel/combined_1f1b.py): interleaved 1F1B with one more warm-up
    forward, so that every steady forward is independent of the backward after it, and each
    such pair run as one overlapped pair (``Kind.OVERLAP_F_B``): one half's expert all-to-alls
    behind the other half's compute (``get_pp_rank_microbatches``: "we schedule one extra
    micro-batch forward step before the 1f1b stages"). Without a pipeline it is Megatron-Core's
    ``combined_1f1b_schedule_for_no_pipelining``: a forward, then pairs of the next forward
    and the last backward. Needs ``m >= pp``."""
    lists = _interleaved_lists(pp, m, v, extra=1)
    marker = Action(0, Kind.OVERLAP_F_B, 0)
    for r, actions in lists.items():
        warmup = min(_interleaved_warmup(r, pp, m, v) + 1, m * v)
        steady = m * v - warmup
        paired = actions[:warmup]
        for i in range(steady):
            paired += [marker, *actions[warmup + 2 * i:warmup + 2 * i + 2]]
        lists[r] = paired + actions[warmup + 2 * steady:]
    return lists


def _interleaved_lists(pp: int, m: int, v: int, extra: int) -> Schedule:
    """Interleaved 1F1B's lists with ``extra`` more warm-up forwards on every rank."""
    _check(pp, m, v, allowed_v=None)
    group = microbatch_group(pp, m)
    order = _interleaved_order(m, v, group)  # (chunk turn, micro-batch) of each forward
    make = tuple.__new__  # Action(c, kind, m) without the NamedTuple's Python-level __new__
    schedule: Schedule = {}
    for r in range(pp):
        forwards = [make(Action, (t * pp + r, Kind.FORWARD, mb)) for t, mb in order]
        backwards = [make(Action, ((v - 1 - t) * pp + r, Kind.BACKWARD, mb)) for t, mb in order]
        warmup = min(_interleaved_warmup(r, pp, m, v) + extra, m * v)
        schedule[r] = _interleave(forwards, backwards, warmup)
    return schedule


def microbatch_group(pp: int, m: int) -> int:
    """Micro-batches an interleaved rank runs through one chunk before the next: Megatron-LM's
    ``--microbatch-group-size-per-virtual-pipeline-stage``, ``pp`` by default. Megatron-LM
    accepts ``N`` in ``[pp, m]`` whose remainder ``m % N`` is 0 or at least ``pp``: a last
    group shorter than the pipeline would stall it (``forward_backward_pipelining_with_
    interleaving``'s check, megatron/core/pipeline_parallel/schedules.py). So a run whose
    count is no multiple of ``pp`` set one; this is the smallest, whose warm-up (``(v - 1) N``
    more forwards) holds the fewest activations."""
    if m < pp:
        raise ValueError(f"interleaved 1F1B needs at least pp ({pp}) micro-batches (got {m})")
    return next(n for n in range(pp, m + 1) if m % n == 0 or m % n >= pp)


@lru_cache(maxsize=256)
def _interleaved_order(m: int, v: int, group: int) -> tuple[tuple[int, int], ...]:
    """(chunk turn, micro-batch) of a rank's forwards in order: Megatron-LM's
    ``get_schedule_table``, groups of ``group`` micro-batches, the last one to ``m``."""
    order = []
    for start in range(0, m, group):
        end = m if start + group >= m else start + group
        order += [(turn, mb) for turn in range(v) for mb in range(start, end)]
    return tuple(order)


def _interleaved_warmup(rank: int, pp: int, m: int, v: int) -> int:
    """Megatron-LM's warm-up forwards; with exactly ``pp`` micro-batches it runs them all first."""
    if m == pp:
        return m * v
    return min(2 * (pp - rank - 1) + (v - 1) * microbatch_group(pp, m), m * v)


def _interleaved_held(pp: int, m: int, v: int, stage: int, extra: int = 0) -> list[int]:
    """Megatron-LM's warm-up count plus one, ``2(p - stage - 1) + (v - 1)N + 1``
    chunk-micro-batches for group size ``N`` (at most ``m v``; all of them when ``m == p``, as
    Megatron-LM then runs every forward first), spread over the chunks in schedule order;
    ``extra`` more warm-up forwards hold as many more (combined 1F1B's one)."""
    held = min(_interleaved_warmup(stage, pp, m, v) + 1 + extra, m * v)
    counts = [0] * v
    for turn, _ in _interleaved_order(m, v, microbatch_group(pp, m))[:held]:
        counts[turn] += 1
    return counts


def _at_least_pp(pp: int, m: int) -> str | None:
    if m < pp:  # Megatron-LM's interleaved order walks groups of at least pp micro-batches
        return f"needs at least pp = {pp} micro-batches per pipeline (got {m})"
    return None


# At least pp; m = pp runs every forward first, so the steady state starts at 2 pp, and grows
# by groups of pp. Counts off that grid run in larger groups (``microbatch_group``): walked
# whole, and a larger micro-batch may hold less (m = 25 at pp 2 warms up with 5 a group, 20
# with 2).
register_schedule(PipelineSchedule("interleaved", interleaved_1f1b, _interleaved_held,
                                   chunks_per_rank=True, microbatch_rule=_at_least_pp,
                                   steady_from=lambda pp: (2 * pp, pp),
                                   held_grows=lambda pp, m: m % pp == 0))
# Steady as interleaved 1F1B's lists are, from 2 pp in steps of pp. The planner does not try
# it: the pairs' overlap is costed at its best (``segments._into_pair``), which no published
# A/B of Megatron-Core's combined 1F1B measures; ``--fix parallel.schedule=combined-1f1b`` asks.
register_schedule(PipelineSchedule(
    "combined-1f1b", combined_1f1b, lambda pp, m, v, stage: _interleaved_held(pp, m, v, stage, 1),
    finish=list_scheduled_finish("combined-1f1b"), chunks_per_rank=True,
    microbatch_rule=_at_least_pp, steady_from=lambda pp: (2 * pp, pp),
    held_grows=lambda pp, m: m % pp == 0, searched=False))
