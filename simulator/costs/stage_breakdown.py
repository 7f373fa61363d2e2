"""Each pipeline stage's step by cause, and the stage and resource that set the step.

The step's ``breakdown_s`` attributes the critical path of the rank that finishes last; in a
pipeline that is often stage 0, whose last backward comes after every other stage's, so most of
its time reads as "bubble": waiting for the other stages. What it waits for is the busiest
stage: in a pipeline every stage runs at the pace of its slowest, so the stage with the most
busy time (compute, exposed communication, optimizer) sets the step, and its largest part is
the resource to relieve.

Per stage (the rank of the stage with the most busy time, where full fidelity has several): its
compute, its exposed communication by the group it runs over (tp, cp, ep, pp, dp), its optimizer
and, as bubble, everything else up to the step time (waiting for another stage, and idling after
its own last op until the slowest rank is done), so that each stage's parts sum to the step.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

COMM_KINDS = ("tp", "cp", "ep", "pp", "dp")  # as timeline.COMM_KINDS (no import: no cycle)
RESOURCE_NAMES = {"compute": "compute", "tp": "tp collectives", "cp": "cp ring",
                  "ep": "ep all-to-alls", "pp": "pp sends", "dp": "dp gradient/parameter traffic",
                  "optimizer": "optimizer step"}
TIE = 1e-9  # busy times this close (relative) are equal: float sums of the same work


@dataclass(frozen=True, slots=True)
class StageBreakdown:
    """One stage's step: compute, exposed communication by kind, bubble and optimizer, in
    seconds, summing to the step time."""

    stage: int
    compute: float
    comm: dict[str, float]  # exposed communication by kind (COMM_KINDS)
    bubble: float
    optimizer: float

    @property
    def exposed_comm(self) -> float:
        return sum(self.comm.values())

    @property
    def busy(self) -> float:
        """Time the stage's GPU works or waits for its own communication: all but bubble."""
        return self.compute + self.exposed_comm + self.optimizer

    def parts(self) -> dict[str, float]:
        """The busy time's parts: compute, each kind of exposed communication, optimizer."""
        return {"compute": self.compute, **self.comm, "optimizer": self.optimizer}

    def as_dict(self) -> dict[str, Any]:
        """SCENARIO.md's ``breakdown_per_stage`` entry, with the comm by kind beside it."""
        return {"stage": self.stage, "compute": self.compute,
                "exposed_comm": self.exposed_comm, "bubble": self.bubble,
                "optimizer": self.optimizer, "exposed_comm_by_kind": dict(self.comm)}


def stage_breakdown(stage: int, step: float, compute: float, comm: dict[str, float],
                    optimizer: float) -> StageBreakdown:
    """A stage's breakdown from its busy parts: the bubble is the rest of the step."""
    comm = {kind: comm.get(kind, 0.0) for kind in COMM_KINDS}
    busy = compute + sum(comm.values()) + optimizer
    return StageBreakdown(stage, compute, comm, max(0.0, step - busy), optimizer)


def from_totals(stages: Iterable[int], totals: Iterable, step: float) -> list[StageBreakdown]:
    """Per stage, the breakdown of its busiest rank, from the engine's per-rank totals
    (``steady.Totals``) and the stage of each rank."""
    best: dict[int, StageBreakdown] = {}
    for stage, t in zip(stages, totals, strict=True):
        b = stage_breakdown(stage, step, t.compute, {k: getattr(t, k) for k in COMM_KINDS},
                            t.optimizer)
        if stage not in best or b.busy > best[stage].busy:
            best[stage] = b
    return [best[stage] for stage in sorted(best)]


@dataclass(frozen=True, slots=True)
class Bottleneck:
    """The stage that sets the step (the busiest), the largest part of its busy time and its
    largest part other than compute (what communication or optimizer time to relieve)."""

    stage: int
    resource: str  # "compute", a comm kind or "optimizer"
    seconds: float
    busy: float
    overhead: str | None  # the largest non-compute part, None when there is none
    overhead_seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "resource": self.resource, "seconds": self.seconds,
                "busy_s": self.busy, "largest_overhead": self.overhead,
                "largest_overhead_s": self.overhead_seconds}

    def sentence(self) -> str:
        """One line: which stage and which resource set the step."""
        line = (f"stage {self.stage}, {RESOURCE_NAMES[self.resource]}: {self.seconds:.3f} s "
                f"of its {self.busy:.3f} s busy ({100 * self.seconds / self.busy:.0f}%)")
        if self.overhead is not None and self.overhead != self.resource:
            line += f"; then {RESOURCE_NAMES[self.overhead]} {self.overhead_seconds:.3f} s"
        return line


def bottleneck(stages: list[StageBreakdown]) -> Bottleneck | None:
    """The busiest stage (the first of equals) and its largest parts; None without stages."""
    if not stages:
        return None
    most = max(b.busy for b in stages)
    # The first of equals: identical stages differ in their last bits (summation order).
    critical = next(b for b in stages if b.busy >= most * (1 - TIE))
    parts = critical.parts()
    resource = max(parts, key=parts.__getitem__)
    others = {k: v for k, v in parts.items() if k != "compute" and v > 0}
    overhead = max(others, key=others.__getitem__) if others else None
    return Bottleneck(critical.stage, resource, parts[resource], critical.busy, overhead,
                      others.get(overhead, 0.0) if overhead else 0.0)
