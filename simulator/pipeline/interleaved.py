"""Interleaved 1F1B (Narayanan et al. 2021, sec. 2.2.2) in Megatron-LM's order, at any count of
at least ``pp`` micro-batches per pipeline: on the ``pp`` grid in groups of ``pp``, off it in the
smallest larger groups Megatron-LM accepts (``microbatch_group``).
"""

from __future__ import annotations

from functools import lru_cache

from .schedules import (
    Action,
    Kind,
    PipelineSchedule,
    Schedule,
    _check,
    _interleave,
    register_schedule,
)


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
    _check(pp, m, v, allowed_v=None)
    group = microbatch_group(pp, m)
    order = _interleaved_order(m, v, group)  # (chunk turn, micro-batch) of each forward
    make = tuple.__new__  # Action(c, kind, m) without the NamedTuple's Python-level __new__
    schedule: Schedule = {}
    for r in range(pp):
        forwards = [make(Action, (t * pp + r, Kind.FORWARD, mb)) for t, mb in order]
        backwards = [make(Action, ((v - 1 - t) * pp + r, Kind.BACKWARD, mb)) for t, mb in order]
        warmup = _interleaved_warmup(r, pp, m, v)
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


def _interleaved_held(pp: int, m: int, v: int, stage: int) -> list[int]:
    """Megatron-LM's warm-up count plus one, ``2(p - stage - 1) + (v - 1)N + 1``
    chunk-micro-batches for group size ``N`` (at most ``m v``; all of them when ``m == p``, as
    Megatron-LM then runs every forward first), spread over the chunks in schedule order."""
    held = min(_interleaved_warmup(stage, pp, m, v) + 1, m * v)
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
