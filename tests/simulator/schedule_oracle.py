"""A minimal list-scheduling oracle for pipeline schedules, shared by the schedule tests."""

from __future__ import annotations

from clustersim.simulator.pipeline.schedules import Action, Kind

F, B, I, W = Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT
HELD = {F: 1, I: 0, W: -1, B: -1}  # micro-batches' activations held: from F until W or B


def produces(kind: Kind) -> Kind:
    """What an action makes for others: a whole backward, like an input half, the gradient."""
    return I if kind is B else kind


def dependency(a: Action, per_copy: int) -> tuple[int, Kind, int] | None:
    """What an action waits for: a forward the previous chunk's forward, an input-gradient
    (or whole) backward the next chunk's gradient, whole or input half (the last chunk its own
    forward), a weight-gradient half its own input half. The chunks are copies of the model,
    ``per_copy`` chunks each: a copy's first chunk waits for nothing, its last turns."""
    part = a.chunk % per_copy
    if a.kind is F:
        return (a.chunk - 1, F, a.microbatch) if part > 0 else None
    if a.kind is W:
        return (a.chunk, I, a.microbatch)
    if part < per_copy - 1:
        return (a.chunk + 1, I, a.microbatch)
    return (a.chunk, F, a.microbatch)


def execute(schedule, chunks: int, times: dict[Kind, float],
            copies: int = 1) -> tuple[float, dict[int, int]]:
    """Each rank runs its actions in order, each after its dependency; sends are free.
    Returns the makespan and each rank's peak count of micro-batches held."""
    ends, peak = finish_times(schedule, chunks, times, copies)
    return max(ends.values()), peak


def finish_times(schedule, chunks: int, times: dict[Kind, float],
                 copies: int = 1) -> tuple[dict[int, float], dict[int, int]]:
    """``execute``, with when each rank ends its last action."""
    done: dict[tuple[int, Kind, int], float] = {}
    clock, position = dict.fromkeys(schedule, 0.0), dict.fromkeys(schedule, 0)
    live, peak = dict.fromkeys(schedule, 0), dict.fromkeys(schedule, 0)
    progressed = True
    while progressed:
        progressed = False
        for r, actions in schedule.items():
            while position[r] < len(actions):
                a = actions[position[r]]
                if a.kind is Kind.OVERLAP_F_B:  # runs its pair in order: no time of its own
                    position[r] += 1
                    continue
                dep = dependency(a, chunks // copies)
                if dep is not None and dep not in done:
                    break
                clock[r] = max(clock[r], done.get(dep, 0.0)) + times[a.kind]
                done[(a.chunk, produces(a.kind), a.microbatch)] = clock[r]
                live[r] += HELD[a.kind]
                peak[r] = max(peak[r], live[r])
                position[r] += 1
                progressed = True
    assert all(position[r] == len(schedule[r]) for r in schedule), "schedule deadlocked"
    return clock, peak
