"""A step of many micro-batches from one short walk that reaches its periodic regime.

``steady.py`` extends a step from three whole simulations at counts ``a``, ``a + d``,
``a + 2d``. Where those cost more than half the step (interleaved 1F1B at Korthikanti et al.'s
``m = 8 pp``: its grid step ``d`` is ``pp``), or one walk costs less than half of them (1F1B on
64 stages: 66 micro-batches against 64 + 65 + 66), this module walks one count ``c`` instead
and looks for the periodic regime inside that run. Past a schedule's warm-up every rank's list
repeats one unit per ``d`` micro-batches (``L`` actions: the same chunks and kinds,
micro-batches ``d`` later), and one more ``d`` micro-batches insert one more unit there
(``PipelineSchedule.steady_from``). The walk notes each rank's state (its clock, time by cause,
exposed communication by kind, activations held and their peak) at each unit boundary of that
repeating stretch (``WalkRank.marked``). When, on every rank, the latest ``PERIODS`` successive
units that add the same amounts (relative ``RELATIVE_TOLERANCE``, as ``steady.py``'s line)
hold the same activations at each boundary, leave the peak where it is, and add time at one
rate on every rank (one cycle time: the pipeline runs in lockstep), the regime is periodic (a
max-plus system whose state repeats up to a shift repeats from there on; Baccelli et al.,
*Synchronization and Linearity*, 1992, ch. 3): each of the ``(m - c) / d`` units the whole step
has more adds the same amounts, and the rest is the walk's, shifted. The latest such units,
not the last: a rank's last units may already run beside the step's gradient reduction, its
first ones still fill the pipeline. Anything else (a rank whose list has no stretch long
enough, increments that still change on every rank's stretch, a walk that refuses) answers
``None``, after longer walks while they fit the budget: the caller takes the three counts or
the whole step. Exact or not taken, as ``steady.py``; ``docs/steady-state.md``.

Only walked steps (``walk.py``: representative fidelity, no ZeRO-3, no trace) take it; the
SimPy engine keeps the three counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

from ..inputs.scenario import Scenario
from ..pipeline.schedules import PipelineSchedule, schedule_named
from . import walk
from .steady import RELATIVE_TOLERANCE, WORTH_IT, Totals

# Successive units whose increments must agree (three boundaries): the evidence that the
# regime repeats, as the three counts are for ``steady.py``.
PERIODS = 2
ACTIVATIONS_HELD = len(Totals._fields)  # the last item of a noted state (``marked``)
PEAK = Totals._fields.index("peak_activations")


def short_count(s: Scenario) -> tuple[int, int] | None:
    """(the count ``c`` to walk, the grid step ``d``): the smallest count on the schedule's
    grid from which ``m`` is whole units away and whose lists hold, on every rank, a
    repeating stretch of ``PERIODS`` units (each count past the warm-up adds one unit to it;
    ``extended`` counts again on the lists walked), and one unit more where that fits; None
    when there is none within ``WORTH_IT`` of the step, or the schedule declares no steady
    state."""
    p = s.parallel
    return _short_count(schedule_named(p.schedule), p.pp, s.microbatches, p.virtual_stages)


@lru_cache(maxsize=256)
def _short_count(schedule: PipelineSchedule, pp: int, m: int, v: int) -> tuple[int, int] | None:
    """``short_count`` of a shape (NOTE: remembered: a plan asks it of thousands of splits,
    a benchmark of one shape again and again)."""
    rule = schedule.steady_from
    if rule is None:
        return None
    first, step = rule(pp)
    if m < first or (m - first) % step:
        return None
    known = first + step  # a lone unit does not repeat: the stretch shows from one step on
    more = 0  # units the shortest stretch lacks at ``known``
    for actions in schedule.build(pp, known, v).values():
        unit = _unit(actions, known, step)
        if unit is None:
            return None
        first_mark, last_mark = _stretch(actions, unit, step)
        more = max(more, -(-(PERIODS * unit - (last_mark - first_mark)) // unit))
    count = known + more * step
    if count + step <= WORTH_IT * m:  # a unit more, where it fits: past the transient
        count += step                 # (1F1B's first stage settles one unit after it)
    return (count, step) if count <= WORTH_IT * m else None


def extended(s: Scenario, engine_at: Callable[[int], object],
             budget: float | None = None) -> list[Totals] | None:
    """Every rank's totals at ``s.microbatches`` from a walk of ``engine_at(c)`` at the count
    ``short_count`` picks, or at the next counts on the grid while the walks so far and the
    next fit ``budget`` micro-batches (default ``WORTH_IT`` of the step; a rank's first
    units may still carry the warm-up's transient); None when no walk shows the regime
    periodic (or none is walked)."""
    picked = short_count(s)
    if picked is None:
        return None
    count, step = picked
    budget = WORTH_IT * s.microbatches if budget is None else budget
    spent, further = 0, step  # each retry walks twice as much further as the one before
    while spent + count <= budget:
        found = _periodic_walk(s, engine_at(count), count, step)
        if found is not False:
            return found
        spent, count, further = spent + count, count + further, 2 * further
    return None


def _periodic_walk(s: Scenario, engine, count: int, step: int) -> list[Totals] | None | bool:
    """The totals at ``s.microbatches`` from ``engine``'s walk at ``count``: None where it is
    not walked or a rank's list has no stretch of ``PERIODS`` units (a longer walk would not
    change that), False where the increments still change (a longer one may settle)."""
    marks = {}
    shape = _shape(engine, count, step)
    for r in engine.ranks:
        marks[r.rid] = _marks(shape, r.stage, engine.schedule[r.stage], count, step)
        if marks[r.rid] is None:
            return None
    walked = walk.walked_marked(engine, marks)
    if walked is None:
        return None
    totals, seen = walked
    increments = [_latest_increment(states) for states in seen]
    if any(inc is None for inc in increments) or not _one_cycle_time(seen, increments):
        return False
    units = (s.microbatches - count) // step
    return [Totals(*(x + units * dx if k != PEAK else x
                     for k, (x, dx) in enumerate(zip(t, inc, strict=False))))
            for t, inc in zip(totals, increments, strict=True)]


# Each stage's unit boundaries by the shape of its list (``_shape``): a plan or a benchmark
# walks one shape again and again, and finding them scans every action (a tenth of the 175B
# interleaved walk). At most ``MARKS_KEPT`` shapes' stages, as ``lowered_lists`` keeps lists.
MARKS_KEPT = 512
_MARKS: dict[tuple, list[int] | None] = {}


def _shape(engine, count: int, step: int) -> tuple:
    """What an engine's lists are built from (``lowered.lowered_lists``'s key: the schedule, its
    depth, count and chunks per rank, each chunk's stage, each chunk's backward passes), and
    the grid step: one key for the lists of every stage."""
    p = engine.s.parallel
    return (p.schedule, p.pp, count, p.virtual_stages, step,
            tuple(w.stage for w in engine.work), tuple(sorted(engine.passes.items())))


def _marks(shape: tuple, stage: int, actions: Sequence, count: int,
           step: int) -> list[int] | None:
    """The action indices of the unit boundaries of the repeating stretch of a stage's list
    for ``count`` micro-batches, counted back from the stretch's end (the latest units,
    furthest from the warm-up's transient); None where it holds no ``PERIODS`` units.
    Remembered by ``shape`` and stage (the list's length checked too)."""
    key = (shape, stage, len(actions))
    if key in _MARKS:
        return _MARKS[key]
    unit = _unit(actions, count, step)
    marks = None
    if unit is not None:
        first_mark, last_mark = _stretch(actions, unit, step)
        marks = list(range(last_mark - (last_mark - first_mark) // unit * unit,
                           last_mark + 1, unit))
        marks = marks if len(marks) > PERIODS else None
    if len(_MARKS) >= MARKS_KEPT:
        _MARKS.clear()
    _MARKS[key] = marks
    return marks


def _unit(actions: Sequence, count: int, step: int) -> int | None:
    """Actions per unit (``step`` micro-batches) of a list for ``count`` micro-batches: each
    micro-batch brings a rank the same actions; None where the length says otherwise."""
    if (len(actions) * step) % count:
        return None
    return len(actions) * step // count


def _stretch(actions: Sequence, unit: int, step: int) -> tuple[int, int]:
    """(first, last) unit boundary of the longest stretch of the list that repeats itself
    ``unit`` places on as the same chunks and kinds ``step`` micro-batches later (the last of
    equally long ones): the actions from ``first`` to ``last`` are whole repeated units, so
    a rank's state at ``first``, ``first + unit``, ... ``last`` may be compared."""
    # where action i is not repeated ``unit`` places on (an Action is (chunk, kind,
    # micro-batch)), with the ends as bounds: the runs between are the repeating stretches
    pairs = zip(actions, actions[unit:], strict=False)
    breaks = [-1, *(i for i, (a, b) in enumerate(pairs)
                    if not (b[0] == a[0] and b[1] is a[1] and b[2] == a[2] + step)),
              max(len(actions) - unit, 0)]
    best = (0, 0)
    for before, after in zip(breaks, breaks[1:], strict=False):
        if after - before - 1 > 0 and after - before - 1 >= best[1] - best[0]:
            best = (before + 1, after)
    if best[1] == best[0]:
        return 0, 0
    return best[0], best[1] + unit  # actions [first, last) repeat the unit before them


def _increment(states: list[tuple]) -> tuple | None:
    """What each of the last units added to a rank's state, or None unless every one added
    the same (relative ``RELATIVE_TOLERANCE`` of the state), the activations held at each
    boundary are the same and the peak no longer grows."""
    if len(states) <= PERIODS:
        return None
    steps = [tuple(y - x for x, y in zip(u, v, strict=True))
             for u, v in zip(states, states[1:], strict=False)]
    bounds = [RELATIVE_TOLERANCE * max(max(map(abs, column)), 1e-30)
              for column in zip(*states, strict=True)]
    for first, later in zip(steps, steps[1:], strict=False):
        for dx, dy, bound in zip(first, later, bounds, strict=True):
            if abs(dy - dx) > bound:
                return None
    last = steps[-1]
    flat = (last[PEAK], last[ACTIVATIONS_HELD])
    if any(abs(d) > RELATIVE_TOLERANCE * max(abs(states[-1][PEAK]), 1e-30) for d in flat):
        return None
    return last[:ACTIVATIONS_HELD]


def _latest_increment(states: list[tuple]) -> tuple | None:
    """``_increment`` of the latest ``PERIODS`` units of a rank that repeat: the last ones
    may already overlap the step's tail (gradients reduced beside the last backwards, compute
    slowed by them), the first the warm-up's transient; a unit inserted anywhere in a
    repeating stretch adds the same."""
    for end in range(len(states), PERIODS, -1):
        found = _increment(states[end - PERIODS - 1:end])
        if found is not None:
            return found
    return None


def _one_cycle_time(seen: list[list[tuple]], increments: list[tuple]) -> bool:
    """Every rank's clock advances by one amount per unit: the stages run in lockstep."""
    cycle = increments[0][0]
    scale = max(abs(states[-1][0]) for states in seen)
    return all(abs(inc[0] - cycle) <= RELATIVE_TOLERANCE * scale for inc in increments)
