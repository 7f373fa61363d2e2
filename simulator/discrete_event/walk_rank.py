"""One rank's part of the walk (``walk.py``): its compute, collectives and DP stream in the
engine's arithmetic.

A forward or backward runs its segments as ``segments.py`` does (compute, then its exposed
collectives, or the compute beside the TP collectives it overlaps); gradient reductions and
parameter gathers queue on the rank's DP stream (``dp_traffic.py``); while a collective runs on
its DP or TP stream the compute goes at ``1 - comm_compute_slowdown`` of its speed, re-rated at
each start and end (``shared_compute.py``); memory is allocated and freed as the engine does.
Each time is computed as the engine's SimPy timeouts compute it (``now + delay``), and each
rank remembers when the event that last resumed it was scheduled (``made``), which orders two
sends called at one instant (``walk.py``).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from clustersim.topologies.collective_registry import collective_named

from ..costs import dp_reduction as dp
from ..costs.cost_model import finalize_grads_time, optimizer_time
from .timeline import Attribution, MemoryTracker

if TYPE_CHECKING:
    from ..costs.work import ChunkWork, Segment

INF = float("inf")


class Undecided(Exception):
    """The walk cannot order two events as SimPy would: run the engine."""


class WalkRank:
    """One rank's walk: where it is in its list, its clock, memory and DP stream."""

    __slots__ = ("rid", "stage", "actions", "i", "now", "clock", "memory", "forwards",
                 "backwards", "factor", "slowdown", "dp_free", "busy", "busy_from", "pending",
                 "gathers", "waits_for", "call", "finished", "made", "recipes", "marks",
                 "mark", "seen", "plain")

    def __init__(self, rank, actions, marks: list[int] = ()) -> None:
        self.rid, self.stage, self.actions = rank.rid, rank.stage, actions
        self.i, self.now, self.finished = 0, 0.0, False
        # When the event that last resumed it was scheduled: SimPy runs events of one instant
        # in the order they were scheduled, so of two sends called at one instant the one
        # whose rank was resumed by the earlier-made event is called first.
        self.made = 0.0
        self.clock, self.memory = Attribution(), MemoryTracker()
        self.forwards: Counter = Counter()
        self.backwards: Counter = Counter()
        self.factor, self.slowdown = rank.factor, rank.slowdown
        self.dp_free = 0.0  # when the DP stream is next free
        self.busy: list[tuple[float, float]] = []  # its DP ops, (start, end), in order
        self.busy_from = 0  # the first of them not over before ``now``
        self.pending = -INF  # when the last gradient reduction ends
        self.gathers: dict[tuple[int, int], float] = {}  # (chunk, segment) -> gathered at
        self.waits_for: tuple | None = None  # the arrival its receive waits for
        self.call: tuple | None = None  # its send waiting to be granted: (dst, its wait, key)
        self.recipes: dict[tuple, tuple] = {}  # (segment id, way) -> what ``_recipe`` worked out
        self.plain: dict[int, tuple] = {}  # chunk -> its costs in one step (``walk._plain``)
        # Action indices at which to note the rank's state (``periodic.py``), the next of
        # them (-1: none left) and the states noted (``marked``).
        self.marks, self.seen = list(marks), []
        self.mark = self.marks[0] if self.marks else -1

    def marked(self) -> None:
        """Note the state before action ``i`` (a period boundary): (finish so far, seconds by
        cause, peak activations, comm by kind, in ``steady.Totals`` order; activations held)."""
        self.seen.append((self.now, *self.clock.seconds.values(), self.memory.peak,
                          *self.clock.comm.values(), self.memory.current))
        left = len(self.seen)
        self.mark = self.marks[left] if left < len(self.marks) else -1


class RankArithmetic:
    """A rank's actions in the engine's arithmetic (mixed into ``walk._Walk``: it uses the
    walk's engine ``e``, scenario ``s``, chunk work ``work`` and ``recipes``)."""

    def _send_times(self, rid: int, chunk: int, dst: int) -> tuple[float, float]:
        """A send's transfer (its reassembly included) and its sender's wait, as
        ``transfers.send`` times them: all of the transfer for a blocking send, the stage's
        ``send_hold`` of it for an asynchronous one."""
        w = self.work[chunk]
        seconds = self.e.comm.p2p_seconds(rid, dst, w.message_bytes) + w.message_gather_s
        hold = self.e.send_holds[w.stage]
        return seconds, seconds if hold == 1 else hold * seconds

    def _forward(self, r: WalkRank, a) -> None:
        w = self.work[a.chunk]
        r.memory.alloc(0.0, w.activation_bytes)
        first = r.forwards[a.chunk] == 0
        r.forwards[a.chunk] += 1
        if first and r.gathers:
            self._pass(r, w, "forward", gated=True, reduce=False)
        else:
            self._segment(r, w.whole, "forward")

    def _backward(self, r: WalkRank, a, way: str) -> None:
        w = self.work[a.chunk]
        grads = way != "input"
        if way != "weight":
            r.memory.alloc(0.0, w.transient_bytes)
        if grads:
            r.backwards[a.chunk] += 1
        last = grads and r.backwards[a.chunk] == self.e.passes[a.chunk]
        if last and self.e.dp_timing.reduce_overlapped:
            self._pass(r, w, way, gated=False, reduce=True)
        else:
            self._segment(r, w.whole, way)
        held = w.transient_bytes + w.activation_bytes
        if way == "input":
            r.memory.alloc(0.0, w.weight_half_bytes - held)
        elif way == "weight":
            r.memory.free(0.0, w.weight_half_bytes)
        else:
            r.memory.free(0.0, held)

    def _plain_costs(self, r: WalkRank, chunk: int) -> tuple:
        """What ``_plain`` needs of a chunk on ``r``, worked out once: its forward's and
        backward's recipes and the method that runs each (``_slowed`` directly where compute
        is slowed beside NCCL, ``_run_recipe``'s first case), its activation, transient and
        held bytes, and the count of the backward that reduces as it goes (-1: none)."""
        w = self.work[chunk]
        forward = self._recipe(r, w.whole, "forward")
        backward = self._recipe(r, w.whole, "backward")
        run_forward = self._slowed if r.slowdown and forward[0] > 0 else self._run_recipe
        run_backward = self._slowed if r.slowdown and backward[0] > 0 else self._run_recipe
        last = self.e.passes[chunk] if self.e.dp_timing.reduce_overlapped else -1
        return (forward, backward, run_forward, run_backward, w.activation_bytes,
                w.transient_bytes, w.transient_bytes + w.activation_bytes, last)

    def _pass(self, r: WalkRank, w: ChunkWork, way: str, gated: bool, reduce: bool) -> None:
        """Segment by segment: each waits for its gathered parameters, or starts reducing its
        gradients after it (``segments.SegmentRunner._pass``)."""
        count = len(w.segments)
        for k in range(count) if way == "forward" else reversed(range(count)):
            seg = w.segments[k]
            gate = r.gathers.get((w.chunk, k)) if gated else None
            if gate is not None:
                self._wait(r, gate, "dp")
            self._segment(r, seg, way)
            if reduce:
                self._reduce(r, seg)

    def _segment(self, r: WalkRank, seg: Segment, way: str) -> None:
        """``SegmentRunner._segment`` in representative fidelity."""
        key = (id(seg), way)
        recipe = r.recipes.get(key)
        if recipe is None:
            recipe = r.recipes[key] = self._recipe(r, seg, way)
        self._run_recipe(r, recipe)

    def _run_recipe(self, r: WalkRank, recipe: tuple) -> None:
        """One way of a segment, from what ``_recipe`` worked out of it."""
        compute, tp, hide, rest, parts, exposed = recipe
        if r.slowdown and compute > 0:  # compute slowed beside NCCL: Table 5's cases, inlined
            self._slowed(r, recipe)
        elif hide:  # the TP collectives beside the GEMMs they overlap
            start = r.now
            tp_end = start + tp  # the TP stream's timeout, from the same instant
            self._compute(r, hide, "compute", (start, tp_end))
            self._wait(r, tp_end, "tp")
            self._busy(r, rest, parts, exposed, "compute")
        elif r.slowdown == 0 or exposed > 0 or compute <= 0:
            self._busy(r, compute, parts, exposed, "compute")
        else:  # compute alone (``_busy``, ``_compute``), inlined: the walk's commonest step
            start = r.now
            busy = r.busy
            while r.busy_from < len(busy) and busy[r.busy_from][1] <= start:
                r.busy_from += 1
            end = (start + compute / 1.0 if r.busy_from == len(busy)
                   else self._fluid(r, start, compute, None))
            r.now = r.made = end
            r.clock.seconds["compute"] += end - start

    def _slowed(self, r: WalkRank, recipe: tuple) -> None:
        """``_run_recipe`` where compute is slowed beside NCCL (``r.slowdown``) and there is
        some: ``_compute``, ``_wait`` and ``_busy`` inlined, each time in their arithmetic
        (NOTE: the walk's commonest step on Korthikanti et al.'s runs, a forward with its
        exposed TP collectives or a backward beside the TP collectives it overlaps)."""
        compute, tp, hide, rest, parts, exposed = recipe
        busy = r.busy
        start = r.now
        while r.busy_from < len(busy) and busy[r.busy_from][1] <= start:
            r.busy_from += 1
        idle = r.busy_from == len(busy)  # nothing on the DP stream (``_fluid``'s common case)
        seconds = r.clock.seconds
        if hide:
            tp_end = start + tp  # the TP stream's timeout, from the same instant
            # ``_compute`` beside the TP op (``hide`` > 0: ``_recipe`` keeps no other)
            end = (self._beside(r, start, hide, start, tp_end) if idle
                   else self._fluid(r, start, hide, (start, tp_end)))
            seconds["compute"] += end - start
            if tp_end >= end:  # ``_wait`` for the TP stream
                r.clock.comm["tp"] += tp_end - end
                seconds["exposed_comm"] += tp_end - end
                end = tp_end
            r.now = r.made = end
            if rest > 0:  # the compute after the GEMMs they overlap (``_busy``, ``_compute``)
                start = end
                while r.busy_from < len(busy) and busy[r.busy_from][1] <= start:
                    r.busy_from += 1
                end = (start + rest / 1.0 if r.busy_from == len(busy)
                       else self._fluid(r, start, rest, None))
                seconds["compute"] += end - start
                r.now = r.made = end
        else:
            end = start + compute / 1.0 if idle else self._fluid(r, start, compute, None)
            seconds["compute"] += end - start
        if exposed > 0:  # the exposed collectives after it (``_busy``)
            r.now, r.made = end + exposed, end
            comm = r.clock.comm
            for kind, t in parts:
                comm[kind] += t
                seconds["exposed_comm"] += t
        else:
            r.now = r.made = end

    @staticmethod
    def _recipe(r: WalkRank, seg: Segment, way: str) -> tuple:
        """(compute, TP seconds, compute they overlap or 0, the compute after it, the exposed
        collectives [(kind, seconds)] and their sum) of one way of ``seg`` on ``r``."""
        compute, tp, hide, _ = seg.pass_times(way)
        compute, hide = compute * r.factor, hide * r.factor
        other = {"cp": seg.cp_traffic(way)[0], "ep": seg.alltoalls(way)[0]}
        overlapped = tp > 0 and hide > 0
        tail = seg.tp_tail(way)[0] if overlapped else 0.0  # sent, and exposed, after the GEMMs
        comm = {"tp": tail if overlapped else tp, **other}
        tp -= tail
        parts = [(kind, t) for kind, t in comm.items() if t > 0]
        return (compute, tp, hide if overlapped else 0.0, compute - hide, parts,
                sum(t for _, t in parts))

    def _busy(self, r: WalkRank, seconds: float, parts: list[tuple[str, float]],
              exposed: float, cause: str) -> None:
        """Compute, then the exposed collectives ``parts`` one after the other
        (``Engine._busy``: at full speed both in one timeout)."""
        comm, by_cause = r.clock.comm, r.clock.seconds
        if r.slowdown == 0 and seconds > 0 and exposed > 0:
            start = r.now
            r.now, r.made = start + (seconds + exposed), start
            by_cause[cause] += (start + seconds) - start
            for kind, t in parts:
                comm[kind] += t
                by_cause["exposed_comm"] += t
            return
        self._compute(r, seconds, cause, None)
        if exposed > 0:
            start = r.now
            r.now, r.made = start + exposed, start
            for kind, t in parts:
                comm[kind] += t
                by_cause["exposed_comm"] += t

    def _compute(self, r: WalkRank, seconds: float, cause: str,
                 tp_op: tuple[float, float] | None) -> None:
        """``seconds`` of compute at full speed, slowed while a collective runs on the rank's
        DP stream or the TP op ``tp_op`` (start, end) runs (``SharedCompute._compute``)."""
        if seconds <= 0:
            return
        start = r.now
        if r.slowdown == 0:
            r.now, r.made = start + seconds, start  # one timeout, made at the start
        else:  # a condition at the end
            r.now = r.made = self._fluid(r, start, seconds, tp_op)
        r.clock.seconds[cause] += r.now - start  # "compute" or "optimizer": no comm kind

    def _fluid(self, r: WalkRank, t: float, remaining: float,
               tp_op: tuple[float, float] | None) -> float:
        """When compute of ``remaining`` full-speed seconds from ``t`` ends, re-rated at each
        start and end of a collective beside it, in ``SharedCompute._fluid``'s arithmetic."""
        busy = r.busy
        while r.busy_from < len(busy) and busy[r.busy_from][1] <= t:
            r.busy_from += 1
        if r.busy_from == len(busy):  # nothing on the DP stream: the common case
            if tp_op is None:
                return t + remaining / 1.0
            return self._beside(r, t, remaining, *tp_op)
        ops = busy[r.busy_from:] + ([tp_op] if tp_op is not None else [])
        while True:
            active = any(s <= t < e for s, e in ops)
            change = min([x for s, e in ops for x in (s, e) if x > t], default=INF)
            rate = 1.0 - r.slowdown if active else 1.0
            end = t + remaining / rate
            if end < change:
                return end
            if end == change:
                raise Undecided  # done as a collective starts or ends: SimPy's order decides
            remaining -= (change - t) * rate
            t = change

    @staticmethod
    def _beside(r: WalkRank, t: float, remaining: float, start: float, end: float) -> float:
        """``_fluid`` beside one op, from ``start`` to ``end`` (the TP collectives a backward
        overlaps, the DP stream idle), in the same steps: the walk's commonest re-rating."""
        while True:
            active = start <= t < end
            change = start if start > t else INF  # the next of its ends after ``t``
            if t < end < change:
                change = end
            rate = 1.0 - r.slowdown if active else 1.0
            done = t + remaining / rate
            if done < change:
                return done
            if done == change:
                raise Undecided  # done as a collective starts or ends: SimPy's order decides
            remaining -= (change - t) * rate
            t = change

    def _wait(self, r: WalkRank, until: float, cause: str) -> None:
        """The main thread waits for an event at ``until``; one already past is not waited
        for, and one at this instant resumes it by an event made now."""
        if until >= r.now:
            seconds = r.clock.seconds
            if cause == "bubble":
                seconds["bubble"] += until - r.now
            else:  # a comm kind (``Attribution.add``): its exposed communication
                r.clock.comm[cause] += until - r.now
                seconds["exposed_comm"] += until - r.now
            r.now = r.made = until

    # --- the DP stream ------------------------------------------------------------------------

    def _dp_ops(self, r: WalkRank, collectives: list[dp.DpCollective]) -> float | None:
        """Queue ``collectives`` on the DP stream one after another (``dp_reduction``'s
        description, as the engine's ``dp_traffic.py`` runs it); when the last ends, None if
        there are none."""
        end = None
        for c in collectives:
            seconds = collective_named(c.op).time(self.e.comm.links(r.rid, c.group), c.nbytes)
            start = max(r.now, r.dp_free)
            end = r.dp_free = start + seconds
            r.busy.append((start, end))
        return end

    def _group_size(self, r: WalkRank):
        return lambda group: self.e.comm.group_size(r.rid, group)

    def _reduce(self, r: WalkRank, seg: Segment) -> None:
        end = self._dp_ops(r, dp.reduction(self.s, seg.dense_params, seg.expert_params,
                                           self._group_size(r)))
        if end is not None:
            r.pending = max(r.pending, end)

    def _gather_all(self, r: WalkRank) -> None:
        for w in self._own_chunks(r):
            for k, seg in enumerate(w.segments):
                end = self._dp_ops(r, dp.gather(self.s, seg.dense_params, seg.expert_params,
                                                self._group_size(r)))
                if end is not None:
                    r.gathers[(w.chunk, k)] = end

    def _own_chunks(self, r: WalkRank) -> list[ChunkWork]:
        return [w for w in self.work if w.stage == r.stage]

    def _finish(self, r: WalkRank) -> None:
        """Gradients reduced, optimizer stepped, parameters gathered (``_finish``)."""
        t = self.e.dp_timing
        if t.reduce == dp.PER_STEP and not t.reduce_overlapped:
            for w in self._own_chunks(r):
                for seg in w.segments:
                    self._reduce(r, seg)
        self._wait(r, r.pending, "dp")
        finalize = finalize_grads_time(self.e.costs.stage(r.stage), r.stage)
        if finalize > 0:
            self._busy(r, 0.0, [("dp", finalize)], finalize, "optimizer")
        seconds = optimizer_time(self.e.costs.stage(r.stage), r.stage) * r.factor
        self._busy(r, seconds, [], 0.0, "optimizer")
        if t.gather == dp.AFTER_STEP:
            r.gathers = {}
            self._gather_all(r)
            if r.gathers:
                self._wait(r, max(r.gathers.values()), "dp")
