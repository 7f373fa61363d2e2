"""Pipeline schedules as ordered action lists, one list per pipeline rank.

As in ``torch.distributed.pipelining``, a schedule is data: for each rank, the order in which it
runs the forward (``F``) and backward (``B``) of each micro-batch on each of its model chunks.
Chunk ``c`` of ``pp * v`` runs on rank ``c % pp`` (Megatron-LM's interleaved placement), so a
micro-batch's forward visits chunks 0, 1, ..., its backward the reverse. The runtime executes
actions in list order; it knows nothing of which generator made the list. Generators emit
the computation; ``with_communication`` lowers it to lists with explicit sends and receives
(``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B``), which the engine executes. Adding a schedule
means adding one generator to ``SCHEDULES``.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import NamedTuple


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

    def __str__(self) -> str:
        return self.value


class Action(NamedTuple):
    """Run ``kind`` of ``microbatch`` on model chunk ``chunk`` (PyTorch's stage index)."""

    chunk: int
    kind: Kind
    microbatch: int

    def __str__(self) -> str:  # PyTorch's form: "2F0" is chunk 2, forward, micro-batch 0
        return f"{self.chunk}{self.kind}{self.microbatch}"


Schedule = dict[int, list[Action]]  # rank -> ordered actions


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


def interleaved_1f1b(pp: int, m: int, v: int) -> Schedule:
    """Interleaved 1F1B (Narayanan et al. 2021, sec. 2.2.2), in Megatron-LM's order.

    Rank r holds chunks ``r, r + pp, ...``. Forwards walk groups of ``pp`` micro-batches through
    the rank's chunks in turn; backwards walk the chunks in reverse. Warm-up is
    ``2(pp - r - 1) + (v - 1) pp`` forwards (all of them if fewer, or if ``m == pp``), as
    Megatron-LM counts it.
    Needs ``m`` to be a multiple of ``pp``.
    """
    _check(pp, m, v, allowed_v=None)
    if m % pp:
        raise ValueError(f"interleaved 1F1B needs micro-batches ({m}) in multiples of pp ({pp})")
    total = m * v
    schedule: Schedule = {}
    for r in range(pp):
        forwards = [_interleaved_action(r, k, pp, v, Kind.FORWARD) for k in range(total)]
        backwards = [_interleaved_action(r, k, pp, v, Kind.BACKWARD) for k in range(total)]
        warmup = _interleaved_warmup(r, pp, m, v)
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


def _interleaved_warmup(rank: int, pp: int, m: int, v: int) -> int:
    """Megatron-LM's warm-up forwards; with exactly ``pp`` micro-batches it runs them all first."""
    if m == pp:
        return m * v
    return min(2 * (pp - rank - 1) + (v - 1) * pp, m * v)


def _interleaved_action(rank: int, k: int, pp: int, v: int, kind: Kind) -> Action:
    """The k-th forward (or backward) of a rank: micro-batch group ``k // (pp v)``, chunk turn
    ``(k // pp) % v`` (reversed for backward), micro-batch ``k % pp`` within the group."""
    turn = (k // pp) % v
    local_chunk = turn if kind is Kind.FORWARD else v - 1 - turn
    microbatch = (k // (pp * v)) * pp + k % pp
    return Action(local_chunk * pp + rank, kind, microbatch)


def _interleave(forwards: list[Action], backwards: list[Action], warmup: int) -> list[Action]:
    """Warm-up forwards, then one forward / one backward pairs, then the remaining backwards."""
    order = forwards[:warmup]
    steady = len(forwards) - warmup
    for i in range(steady):
        order += [forwards[warmup + i], backwards[i]]
    return order + backwards[steady:]


def _check(pp: int, m: int, v: int, allowed_v: tuple[int, ...] | None) -> None:
    if pp < 1 or m < 1 or v < 1:
        raise ValueError(f"pp, m and v must be positive (got {pp}, {m}, {v})")
    if allowed_v is not None and v not in allowed_v:
        raise ValueError(f"this schedule runs one chunk per rank (got v = {v})")


SCHEDULES: dict[str, Callable[[int, int, int], Schedule]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved": interleaved_1f1b,
    "zb-h1": zero_bubble_h1,
}


def build_schedule(name: str, pp: int, m: int, v: int = 1) -> Schedule:
    """The action lists of schedule ``name``; an unknown name lists the valid ones."""
    try:
        generator = SCHEDULES[name]
    except KeyError:
        raise ValueError(f"Unknown schedule name {name!r}. The valid options are "
                         f"{sorted(SCHEDULES)}") from None
    return generator(pp, m, v)


def with_communication(schedule: Schedule, chunks: int) -> Schedule:
    """The lists with their sends and receives made explicit (PyTorch's ``_add_send_recv``).

    A forward of any chunk but the first receives its input first; of any chunk but the last,
    sends its output after. A backward mirrors it: receives unless on the last chunk, sends
    unless on the first. ``chunks`` is ``pp * v``.
    """
    lowered: Schedule = {}
    last = chunks - 1
    for rank, actions in schedule.items():
        out: list[Action] = []
        for a in actions:
            if a.kind is Kind.FORWARD:
                if a.chunk > 0:
                    out.append(Action(a.chunk, Kind.RECV_F, a.microbatch))
                out.append(a)
                if a.chunk < last:
                    out.append(Action(a.chunk, Kind.SEND_F, a.microbatch))
            elif a.kind is Kind.BACKWARD or a.kind is Kind.BACKWARD_INPUT:
                if a.chunk < last:
                    out.append(Action(a.chunk, Kind.RECV_B, a.microbatch))
                out.append(a)
                if a.chunk > 0:
                    out.append(Action(a.chunk, Kind.SEND_B, a.microbatch))
            else:
                out.append(a)
        lowered[rank] = out
    return lowered


def format_schedule(schedule: Schedule) -> str:
    """CSV, one row per rank, PyTorch's action strings: ``0F0,0F1,0B0,...``."""
    return "\n".join(",".join(str(a) for a in schedule[r]) for r in sorted(schedule))
