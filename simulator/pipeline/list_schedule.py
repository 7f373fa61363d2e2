"""The analytic estimate of a schedule without a closed form: its action lists run in order.

Each rank runs its actions one after another, each once its input exists: a forward after the
previous chunk's forward of that micro-batch, a backward (whole, or its input-gradient half)
after the next chunk's backward (the last chunk after its own forward), a weight-gradient half
after its input half. Durations come from the stage costs, split evenly over a stage's chunks;
sends cost what the stage's exposed communication says, with no queueing. This is the
list-scheduling bound the published bubble formulas describe, for any action list.

It is the one way the closed form (and so the planner's pre-filter) times a schedule without a
formula: ZB-H2, ZB-V, DualPipe and DualPipeV declare ``list_scheduled_finish`` as their
``finish``. On equal stages with free communication it ends each stage where the engine does
(``tests/simulator/test_list_schedule.py``, within 1e-4).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

from .overlap import exposed_beside
from .schedules import Action, Kind, StageCosts, schedule_named
from .stages import chunk_layout

F, B, I, W = Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT  # noqa: E741


Step = tuple[Kind, bool, tuple | None, tuple]  # kind, paired, what it needs, what it makes


def compile_lists(lists: dict[int, list[Action]], chunks: int,
                  copies: int = 1) -> dict[int, list[Step]]:
    """Each rank's actions as (kind, paired, dependency, product), pair markers folded into
    the two halves they mark, once per schedule shape (``run_steps`` runs them per call).
    The chunks hold ``copies`` copies of the model, ``chunks // copies`` chunks each
    (``stages.ChunkLayout``): a micro-batch enters at its copy's first and turns at its last."""
    out: dict[int, list[Step]] = {}
    for r, actions in lists.items():
        steps, paired = [], 0
        for a in actions:
            if a.kind is Kind.OVERLAP_F_B:
                paired = 2
                continue
            steps.append((a.kind, paired > 0, _needs(a, chunks // copies),
                          (a.chunk, _what(a.kind), a.microbatch)))
            paired = max(0, paired - 1)
        out[r] = steps
    return out


def run_steps(steps_of: dict[int, list[Step]],
              seconds: Callable[[int, Kind, bool], float]) -> dict[int, float]:
    """When each rank ends its compiled list, ``seconds(rank, kind, paired)`` for each action;
    ``paired`` for the two halves of an overlapped pair (``Kind.OVERLAP_F_B``)."""
    done: dict[tuple, float] = {}
    clock, at = dict.fromkeys(steps_of, 0.0), dict.fromkeys(steps_of, 0)
    took = {r: {} for r in steps_of}  # (kind, paired) -> seconds, asked once per rank
    progressed = True
    while progressed:
        progressed = False
        for r, steps in steps_of.items():
            i, now, mine = at[r], clock[r], took[r]
            while i < len(steps):
                kind, paired, need, made = steps[i]
                if need is not None:
                    ready = done.get(need)
                    if ready is None:
                        break
                    now = max(now, ready)
                if (kind, paired) not in mine:
                    mine[(kind, paired)] = seconds(r, kind, paired)
                now += mine[(kind, paired)]
                done[made] = now
                i += 1
            progressed |= i > at[r]
            at[r], clock[r] = i, now
    stuck = [r for r in steps_of if at[r] < len(steps_of[r])]
    if stuck:
        raise ValueError(f"the action lists deadlock (rank {stuck[0]} waits forever)")
    return clock


def _what(kind: Kind) -> str:
    return "grad" if kind in (B, I) else kind.value


def _needs(a: Action, per_copy: int) -> tuple[int, str, int] | None:
    part = a.chunk % per_copy  # the chunk's place in its copy of the model
    if a.kind is F:
        return (a.chunk - 1, "F", a.microbatch) if part > 0 else None
    if a.kind is W:
        return (a.chunk, "grad", a.microbatch)
    if part < per_copy - 1:
        return (a.chunk + 1, "grad", a.microbatch)
    return (a.chunk, "F", a.microbatch)


def list_scheduled_finish(name: str) -> Callable[[Sequence[StageCosts], int, int], list[float]]:
    """``PipelineSchedule.finish`` for schedule ``name`` by running its lists (``run_steps``);
    then each stage reduces its gradients and steps. A stage's costs per micro-batch are split
    evenly over the chunks of it that one micro-batch runs through (all ``v`` of them, or one
    of each copy's when the chunks hold several copies of the model)."""

    @lru_cache(maxsize=256)
    def compiled(pp: int, m: int, v: int) -> tuple[dict[int, list[Step]], int]:
        copies = chunk_layout(pp, v, schedule_named(name).placement).copies
        return compile_lists(schedule_named(name).build(pp, m, v), pp * v, copies), v // copies

    def finish(stages: Sequence[StageCosts], m: int, v: int) -> list[float]:
        steps, visits = compiled(len(stages), m, v)

        def seconds(rank: int, kind: Kind, paired: bool) -> float:
            st = stages[rank]
            send = st.comm / (2 * visits)  # exposed per micro-batch: half with F, half with B
            forward = (st.per_microbatch - st.backward - st.comm) / visits
            if paired:  # F&B: each half's all-to-alls and sends behind the other's compute
                hidden = st.pair_hidden / (2 * visits)  # (segments._into_pair)
                if kind is F:
                    return forward + send - hidden
                backward = st.backward / visits
                return (backward + send - hidden + exposed_beside(hidden, backward, st.slowdown)
                        + exposed_beside(hidden, forward, st.slowdown))
            if kind is F:
                return forward + send
            if kind is W:
                return st.weight_grad / visits
            if kind is I:  # the rest of the backward, its TP collectives less hidden
                return (st.backward - st.weight_grad + st.split_cost) / visits + send
            return st.backward / visits + send

        ends = run_steps(steps, seconds)
        return [ends[i] + st.grad_sync + st.optimizer for i, st in enumerate(stages)]

    return finish


def walked_held(name: str) -> Callable[[int, int, int, int], list[int]]:
    """``PipelineSchedule.held`` read off the action lists: each chunk's micro-batches in
    flight (forward run, weights' gradient not yet) when the stage holds the most. Exact in
    counts; with chunks of unequal size the byte peak may fall at another moment. Walked at
    ``repeating_count``: the same answer from shorter lists."""

    @lru_cache(maxsize=8192)  # a plan asks every stage of thousands of splits
    def walked(pp: int, m: int, v: int, stage: int) -> list[int]:
        peak = first_peak(memory_states(schedule_named(name).build(pp, m, v)[stage]))
        return [] if peak is None else [h + w for h, w in zip(*peak, strict=True)]

    def held(pp: int, m: int, v: int, stage: int) -> list[int]:
        return walked(pp, repeating_count(name, pp, m, v), v, stage)

    return held


def memory_states(actions: Sequence[Action]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The states a rank passes through as it runs ``actions``, one after each forward or
    backward: per chunk (in chunk order), the micro-batches holding activations (forward
    run, backward or its input half not yet) and those holding a weight half (input half
    run, weight half not yet)."""
    chunks = sorted({a.chunk for a in actions if a.kind is not Kind.OVERLAP_F_B})
    index = {c: i for i, c in enumerate(chunks)}
    held, halves = [0] * len(chunks), [0] * len(chunks)
    states = []
    for a in actions:
        if a.kind is F:
            held[index[a.chunk]] += 1
        elif a.kind is I:
            held[index[a.chunk]] -= 1
            halves[index[a.chunk]] += 1
        elif a.kind is W:
            halves[index[a.chunk]] -= 1
        elif a.kind is B:
            held[index[a.chunk]] -= 1
        else:
            continue
        states.append((tuple(held), tuple(halves)))
    return states


@lru_cache(maxsize=4096)
def repeating_count(name: str, pp: int, m: int, v: int) -> int:
    """The fewest micro-batches whose action lists take every rank through the same memory
    states as ``m``'s (``memory_states``), the same first state at the peak among them: what
    the memory model walks instead of ``m``'s lists. From ``first + step`` on
    (``PipelineSchedule.list_growth``) one more ``step`` inserts into each rank's list one
    more copy of a unit it already runs; a unit runs a forward and a backward per chunk and
    micro-batch, so it ends in the state it began in and passes through states already seen,
    in their order. Taken where the lists at ``first + step`` and one step later show it
    (GPipe's, whose forwards and backwards grow apart, do not: ``m`` itself), and where
    those two are shorter than ``m``'s; ``tests/simulator/test_memory_states.py`` compares
    the shortcut with the whole lists."""
    growth = schedule_named(name).list_growth(pp)
    if growth is None:
        return m
    first, step = growth
    base = first + step
    if m <= 2 * base + step or (m - first) % step or not _repeats(name, pp, v, base, step):
        return m
    return base


@lru_cache(maxsize=1024)
def _repeats(name: str, pp: int, v: int, base: int, step: int) -> bool:
    """Whether one step past ``base`` leaves every rank's memory states and its first state
    at the peak as they were."""
    try:
        now, later = (schedule_named(name).build(pp, m, v) for m in (base, base + step))
    except ValueError:
        return False
    return all(_states_and_peak(now[r]) == _states_and_peak(later[r]) for r in now)


def _states_and_peak(actions: Sequence[Action]) -> tuple[frozenset, tuple | None]:
    """A rank's set of memory states, and the first at which it holds the most."""
    states = memory_states(actions)
    return frozenset(states), first_peak(states)


def first_peak(states: Sequence[tuple[tuple[int, ...], tuple[int, ...]]]) -> tuple | None:
    """The first of ``memory_states`` at which a rank holds the most micro-batches in flight
    (activations and weight halves together: forward run, weight gradient not yet); None
    for no state."""
    if not states:
        return None
    totals = [sum(h) + sum(w) for h, w in states]
    return states[totals.index(max(totals))]
