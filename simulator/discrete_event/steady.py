"""A step of many identical micro-batches from three short simulations of it.

Past a schedule's warm-up, one more micro-batch adds one more identical steady-state unit to
every rank's action list (a forward and a backward per chunk), and the pipeline settles into a
periodic regime: each rank's finish time, its time by cause and its peak activation memory then
grow by the same amount per micro-batch, i.e. they are affine in the micro-batch count ``m``
(the periodic regime of a max-plus linear system; Baccelli et al., *Synchronization and
Linearity*, 1992, ch. 3). ``extrapolated`` simulates the counts ``a``, ``a + d`` and ``a + 2d``
past the warm-up, checks that every one of those numbers lies on a line through them, and
extends the line to ``m``. When any number leaves the line (a regime that has not settled yet,
contention in full fidelity that is not periodic) it answers ``None`` and the caller simulates
all ``m``: the shortcut is exact or not taken, never an approximation.

Three counts on a line cannot show a change that starts after them: a stage whose sends start
to queue behind a neighbour's some counts later (DualPipeV on 8 stages from m = 24, ZB-V from
m = 20; docs/steady-state.md). So where the budget allows it, a fourth count about twice as far
(``far_count``) must lie on the same line too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ..costs.result import Breakdown
from ..inputs.scenario import Scenario
from ..pipeline.schedules import schedule_named

# Extrapolate when the three short runs cost at most this share of the full one (in
# micro-batches; a fourth, the far check, only where it fits in the same share).
WORTH_IT = 0.5
RELATIVE_TOLERANCE = 1e-9  # off the line by more than this (relative) counts as not affine


class Totals(NamedTuple):
    """What a rank's part of a StepResult is made of: its finish time, its main thread's
    seconds by cause (``timeline.CAUSES`` order), its peak activation bytes and its exposed
    communication by kind (``timeline.COMM_KINDS`` order; they sum to ``exposed_comm``)."""

    finish: float
    compute: float
    exposed_comm: float
    bubble: float
    optimizer: float
    peak_activations: float
    tp: float = 0.0
    cp: float = 0.0
    ep: float = 0.0
    pp: float = 0.0
    dp: float = 0.0

    def breakdown(self) -> Breakdown:
        return Breakdown(self.compute, self.exposed_comm, self.bubble, self.optimizer)


def sample_counts(s: Scenario) -> tuple[int, int, int] | None:
    """The three micro-batch counts to simulate for ``s``, or None when simulating all of
    them is as cheap (few micro-batches) or the schedule declares no steady state
    (``PipelineSchedule.steady_from``: the first count from which its action lists only grow
    in their steady part, and the step they grow by; 1F1B from pp, where every rank's warm-up
    and peak are whole)."""
    p = s.parallel
    rule = schedule_named(p.schedule).steady_from
    if rule is None:
        return None
    first, step = rule(p.pp)
    counts = (first, first + step, first + 2 * step)
    if (s.microbatches - first) % step:  # off the grid the lists are built otherwise
        return None                      # (interleaved: ``interleaved.microbatch_group``)
    if sum(counts) > WORTH_IT * s.microbatches:
        return None
    return counts


def far_count(s: Scenario, counts: tuple[int, int, int]) -> int | None:
    """A fourth count to check the line at: twice the last of ``counts``, or as far as the
    budget (``WORTH_IT`` of the whole run) leaves, on their grid; None when not even one step
    past them fits (then three counts decide, as they did before the fourth was added)."""
    a, b, c = counts
    step = b - a
    budget = WORTH_IT * s.microbatches - (a + b + c)
    far = c + step * int(min(c, budget - c) // step)
    return far if far > c else None


def extrapolated(s: Scenario, simulate: Callable[[int], list[Totals]]) -> list[Totals] | None:
    """Every rank's totals at ``s.microbatches``, extended from ``simulate`` at three counts
    (and checked at a fourth, ``far_count``); None when the counts are not worth it or the
    numbers are not affine in the count."""
    counts = sample_counts(s)
    if counts is None:
        return None
    a, b, c = (simulate(m) for m in counts)
    if not all(_on_a_line(x, y, z) for x, y, z in zip(a, b, c, strict=True)):
        return None
    far = far_count(s, counts)
    if far is not None and not _on_the_line(a, b, counts, far, simulate(far)):
        return None
    return _extended(a, b, counts, s.microbatches)


def _extended(a: list[Totals], b: list[Totals], counts: tuple[int, ...], m: int) -> list[Totals]:
    """The line through the totals at the first two counts, at ``m``."""
    steps = (m - counts[0]) / (counts[1] - counts[0])
    return [Totals(*(u + steps * (v - u) for u, v in zip(x, y, strict=True)))
            for x, y in zip(a, b, strict=True)]


def _on_the_line(a: list[Totals], b: list[Totals], counts: tuple[int, ...], far: int,
                 seen: list[Totals]) -> bool:
    """Whether the totals ``seen`` at count ``far`` are where the line through the first two
    counts puts them (relative ``RELATIVE_TOLERANCE``)."""
    return all(abs(w - p) <= RELATIVE_TOLERANCE * max(abs(p), abs(w), 1e-30)
               for x, y in zip(_extended(a, b, counts, far), seen, strict=True)
               for p, w in zip(x, y, strict=True))


def _on_a_line(x: Totals, y: Totals, z: Totals) -> bool:
    """Equally spaced samples lie on a line: their second difference vanishes."""
    return all(abs(w - 2 * v + u) <= RELATIVE_TOLERANCE * max(abs(u), abs(v), abs(w), 1e-30)
               for u, v, w in zip(x, y, z, strict=True))
