"""The engine's step without SimPy: each rank's action list walked in plain arithmetic.

In ``representative`` fidelity every duration the engine waits for is known when the wait
starts (closed-form collectives, nothing contends), so its event loop only orders work that
arithmetic can order. ``walked_totals`` runs the engine's own rules on the engine's own lists
and costs, rank by rank as far as each can go, and returns the ranks' totals
(``steady.Totals``) the SimPy run (``Engine.totals``) would give:

- a receive waits (bubble) until its message arrives; a blocking send holds its sender until
  the message is through, each rank receiving one message at a time, in the order the sends
  were called (``transfers.py``);
- a forward or backward runs its segments as ``segments.py`` does: compute, then its exposed
  collectives, or, where TP collectives overlap the compute, the compute beside them;
- gradient reductions and parameter gathers queue on the rank's DP stream
  (``dp_traffic.py``), and while a collective runs on its DP or TP stream the rank's compute
  goes at ``1 - comm_compute_slowdown`` of its speed (``shared_compute.py``);
- memory is allocated and freed as the engine does, so the peak is the same.

Times are computed in the engine's own arithmetic (each SimPy timeout's ``now + delay``, the
fluid re-rating's steps), so they are the engine's to the last bit. The only choice the event
loop makes that arithmetic must reproduce is the order of two sends into one rank: the one
called first goes first, and of two called at one instant, the one whose rank was resumed by
the event scheduled first (SimPy runs the events of an instant in the order they were
scheduled). A send is granted once no other sender into that rank can call before it (each
rank's clock, or the earliest its blocking receive can be answered, bounds its next call).
Two sends called at one instant by ranks resumed by events scheduled at one instant (their
order is SimPy's event ids, which the walk does not keep), a compute ending at the instant a
collective starts or ends beside it, a state where no send can be decided, or a feature the
walk does not model (overlapped forward-backward pairs, ZeRO-3, ZeRO-2's per-micro-batch
reduction, two copies of the model, full fidelity, a recorded timeline) give ``None``: the
caller runs the engine. The answer is the engine's or none
(``tests/simulator/test_steady_walk.py`` checks it equal to ``Engine.totals`` on every
schedule).
"""

from __future__ import annotations

from collections import Counter, deque
from typing import TYPE_CHECKING

from clustersim.topologies import network as net

from . import progress
from .cost_model import optimizer_time, twin_stage
from .schedules import Kind
from .steady import Totals
from .timeline import Attribution, MemoryTracker

if TYPE_CHECKING:
    from .work import ChunkWork, Segment

INF = float("inf")
F, B, I, W = Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT  # noqa: E741
SEND_F, SEND_B, RECV_F, RECV_B = Kind.SEND_F, Kind.SEND_B, Kind.RECV_F, Kind.RECV_B
WAYS = {B: "backward", I: "input", W: "weight"}


class Undecided(Exception):
    """The walk cannot order two events as SimPy would: run the engine."""


def walked_totals(engine) -> list[Totals] | None:
    """Every rank's totals of ``engine``'s step (as ``engine.totals()``), or None where the
    walk does not model the step or cannot order it (then run ``engine.totals()``)."""
    if not walkable(engine):
        return None
    try:
        totals = _Walk(engine).run()
    except Undecided:
        return None
    listener = progress.current()  # a progress bar: every action has run
    if listener is not None:
        actions = sum(len(engine.schedule[r.stage]) for r in engine.ranks)
        listener(actions, actions)
    return totals


def walkable(engine) -> bool:
    """Whether the walk models every feature of ``engine``'s step."""
    p = engine.s.parallel
    return (engine.fidelity == "representative" and not engine.record
            and p.zero != 3 and not (p.zero == 2 and p.sharded_gradients)
            and all(twin_stage(engine.s, r.stage) is None for r in engine.ranks)
            and not any(a.kind is Kind.OVERLAP_F_B
                        for acts in engine.schedule.values() for a in acts))


class _Rank:
    """One rank's walk: where it is in its list, its clock, memory and DP stream."""

    __slots__ = ("rid", "stage", "actions", "i", "now", "clock", "memory", "forwards",
                 "backwards", "factor", "slowdown", "dp_free", "busy", "busy_from", "pending",
                 "gathers", "waits_for", "call", "finished", "made")

    def __init__(self, rank, actions) -> None:
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
        self.call: tuple | None = None  # its send waiting to be granted: (dst, seconds, key)


class _Walk:
    """The engine's rules in arithmetic (``engine.py``, ``segments.py``, ``transfers.py``,
    ``dp_traffic.py``, ``shared_compute.py``)."""

    def __init__(self, e) -> None:
        self.e, self.s, self.work = e, e.s, e.work
        self.ranks = [_Rank(r, e.schedule[r.stage]) for r in e.ranks]
        self.by_id = {r.rid: r for r in self.ranks}
        self.peers = e.ranks[0].peers  # stage -> rank (one pipeline)
        self.arrivals: dict[tuple, float] = {}
        self.waiting: dict[tuple, _Rank] = {}
        self.recv_free: dict[int, float] = {}
        self.calls: dict[int, dict[int, tuple]] = {}  # dst -> src -> (called at, seconds, key)
        self.p2p: dict[tuple, float] = {}  # (src, dst, chunk) -> a transfer's seconds
        self.senders: dict[int, set[int]] = {}  # dst -> the ranks that ever send to it
        for r in self.ranks:
            for a in {a._replace(microbatch=0) for a in r.actions
                      if a.kind is SEND_F or a.kind is SEND_B}:
                self.senders.setdefault(self._send_of(r, a)[0], set()).add(r.rid)
        self.ready = deque(self.ranks)
        self.recipes: dict[tuple, tuple] = {}  # what ``_recipe`` worked out
        self.advancing: _Rank | None = None  # the rank whose send is being granted in line
        self.watch: dict[int, set[int]] = {}  # rank -> the receivers whose sends wait on it
        self.retry: set[int] = set()  # receivers whose sends may be decided now

    # --- the loop -----------------------------------------------------------------------------

    def run(self) -> list[Totals]:
        p = self.s.parallel
        if p.zero in (1, 2) and p.overlap_param_gather:
            for r in self.ranks:
                self._gather_all(r)
        while self.ready or self.retry:
            while self.ready:
                r = self.ready.popleft()
                self._advance(r)
                self._moved(r)
            while self.retry and not self.ready:
                self._grant(self.retry.pop())
        if not all(r.finished for r in self.ranks):
            raise Undecided  # no send can be ordered: let the event loop order them
        return [Totals(r.now, *r.clock.seconds.values(), r.memory.peak, *r.clock.comm.values())
                for r in self.ranks]

    def _moved(self, r: _Rank) -> None:
        """``r``'s clock moved on: the sends that waited to see when it calls are tried again."""
        watchers = self.watch.pop(r.rid, None)
        if watchers:
            self.retry |= watchers

    def _advance(self, r: _Rank) -> None:
        """Run ``r``'s actions until it waits for a message or a send, or ends."""
        actions = r.actions
        while r.i < len(actions):
            a = actions[r.i]
            kind = a.kind
            if kind is RECV_F or kind is RECV_B:
                key = ("act" if kind is RECV_F else "grad", a.chunk, a.microbatch, r.rid)
                t = self.arrivals.get(key)
                if t is None:
                    r.waits_for = key
                    self.waiting[key] = r
                    return
                self._wait(r, t, "bubble")
            elif kind is F:
                self._forward(r, a)
            elif kind in WAYS:
                self._backward(r, a, WAYS[kind])
            elif kind is SEND_F or kind is SEND_B:
                dst, seconds, key = self._send_of(r, a)
                r.call = (dst, seconds, key)
                self.calls.setdefault(dst, {})[r.rid] = (r.now, seconds, key, r.made)
                self.advancing = r
                self._grant(dst)
                self.advancing = None
                if r.call is not None:
                    return  # to wait for its turn
                continue  # granted at once: on with the list (``_grant`` moved ``i`` on)
            r.i += 1
        self._finish(r)
        r.finished = True

    def _send_of(self, r: _Rank, a) -> tuple[int, float, tuple]:
        """(the receiving rank, the transfer's seconds, the arrival key) of a send."""
        what, to = ("act", a.chunk + 1) if a.kind is SEND_F else ("grad", a.chunk - 1)
        dst = self.peers[self.work[to].stage]
        w = self.work[a.chunk]
        seconds = self.p2p.get((r.rid, dst, a.chunk))
        if seconds is None:
            seconds = self.p2p[(r.rid, dst, a.chunk)] = (
                self.e.comm.p2p_seconds(r.rid, dst, w.message_bytes) + w.message_gather_s)
        return dst, seconds, (what, to, a.microbatch, dst)

    # --- sends --------------------------------------------------------------------------------

    def _grant(self, dst: int) -> None:
        """Start the sends into ``dst`` whose turn is certain: the earliest called, of two
        called at one instant the one resumed by the earlier-made event (SimPy's order)."""
        calls = self.calls[dst]
        while calls:
            src = min(calls, key=lambda k: calls[k][::3]) if len(calls) > 1 else next(iter(calls))
            t, seconds, key, made = calls[src]
            for other in self.senders[dst]:
                if other == src:
                    continue
                if other in calls:
                    if calls[other][0] == t and calls[other][3] == made:
                        raise Undecided  # resumed by events made at one instant: unknown order
                    continue
                bound, chain = self._earliest_call(self.by_id[other])
                if bound <= t:  # it may still call first: ask again once it moves
                    for rid in chain:
                        self.watch.setdefault(rid, set()).add(dst)
                    return
            del calls[src]
            begin = max(t, self.recv_free.get(dst, 0.0))
            self.recv_free[dst] = begin + seconds
            end = t + (begin + seconds - t)  # the sender's timeout (``transfers.send``)
            sender = self.by_id[src]
            sender.clock.add("pp", end - t)
            sender.now, sender.made, sender.call = end, t, None
            sender.i += 1
            if sender is not self.advancing:
                self.ready.append(sender)
            self.arrivals[key] = end
            waiter = self.waiting.pop(key, None)
            if waiter is not None:
                waiter.waits_for = None
                self.ready.append(waiter)

    def _earliest_call(self, r: _Rank) -> tuple[float, list[int]]:
        """A lower bound on when ``r`` next calls a send: its clock, or past the earliest its
        receive can be answered (following the chain of ranks waiting on each other); and the
        ranks of that chain, whose moves may raise it."""
        if r.call is not None:  # sending elsewhere: nothing else until that is through
            return r.now + r.call[1], [r.rid]
        bound, chain = r.now, [r.rid]
        while not r.finished and r.call is None and r.waits_for is not None:
            what, chunk, _, _ = r.waits_for
            sender = self.by_id[self.peers[self.work[chunk - 1 if what == "act"
                                                     else chunk + 1].stage]]
            if sender.rid in chain:
                return bound, chain
            chain.append(sender.rid)
            if sender.call is not None:  # no message of its comes before the one it sends
                return max(bound, sender.now + sender.call[1]), chain
            bound = max(bound, sender.now)
            r = sender
        return (INF if r.finished else bound), chain

    # --- compute ------------------------------------------------------------------------------

    def _forward(self, r: _Rank, a) -> None:
        w = self.work[a.chunk]
        r.memory.alloc(0.0, w.activation_bytes)
        first = r.forwards[a.chunk] == 0
        r.forwards[a.chunk] += 1
        if first and r.gathers:
            self._pass(r, w, "forward", gated=True, reduce=False)
        else:
            self._segment(r, w.whole, "forward")

    def _backward(self, r: _Rank, a, way: str) -> None:
        p, w = self.s.parallel, self.work[a.chunk]
        grads = way != "input"
        if way != "weight":
            r.memory.alloc(0.0, w.transient_bytes)
        if grads:
            r.backwards[a.chunk] += 1
        last = grads and r.backwards[a.chunk] == self.e.passes[a.chunk]
        if last and p.overlap_grad_reduce:
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

    def _pass(self, r: _Rank, w: ChunkWork, way: str, gated: bool, reduce: bool) -> None:
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

    def _segment(self, r: _Rank, seg: Segment, way: str) -> None:
        """``SegmentRunner._segment`` in representative fidelity."""
        key = (id(seg), way, r.factor)
        recipe = self.recipes.get(key)
        if recipe is None:
            recipe = self.recipes[key] = self._recipe(r, seg, way)
        compute, tp, hide, rest, parts, exposed = recipe
        if hide:  # the TP collectives beside the GEMMs they overlap
            start = r.now
            tp_end = start + tp  # the TP stream's timeout, from the same instant
            self._compute(r, hide, "compute", (start, tp_end))
            self._wait(r, tp_end, "tp")
            self._busy(r, rest, parts, exposed, "compute")
        else:
            self._busy(r, compute, parts, exposed, "compute")

    @staticmethod
    def _recipe(r: _Rank, seg: Segment, way: str) -> tuple:
        """(compute, TP seconds, compute they overlap or 0, the compute after it, the exposed
        collectives [(kind, seconds)] and their sum) of one way of ``seg`` on ``r``."""
        compute, tp, hide, _ = seg.pass_times(way)
        compute, hide = compute * r.factor, hide * r.factor
        other = {"cp": seg.cp_traffic(way)[0], "ep": seg.alltoalls(way)[0]}
        comm = other if tp > 0 and hide > 0 else {"tp": tp, **other}
        parts = [(kind, t) for kind, t in comm.items() if t > 0]
        return (compute, tp, hide if tp > 0 and hide > 0 else 0.0, compute - hide, parts,
                sum(t for _, t in parts))

    def _busy(self, r: _Rank, seconds: float, parts: list[tuple[str, float]],
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

    def _compute(self, r: _Rank, seconds: float, cause: str,
                 tp_op: tuple[float, float] | None) -> None:
        """``seconds`` of compute at full speed, slowed while a collective runs on the rank's
        DP stream or the TP op ``tp_op`` (start, end) runs (``SharedCompute._compute``)."""
        if seconds <= 0:
            return
        start = r.now
        if r.slowdown == 0:
            r.now, r.made = start + seconds, start  # one timeout, made at the start
        else:
            r.now = r.made = self._fluid(r, start, seconds, tp_op)  # a condition at the end
        r.clock.add(cause, r.now - start)

    def _fluid(self, r: _Rank, t: float, remaining: float,
               tp_op: tuple[float, float] | None) -> float:
        """When compute of ``remaining`` full-speed seconds from ``t`` ends, re-rated at each
        start and end of a collective beside it, in ``SharedCompute._fluid``'s arithmetic."""
        busy = r.busy
        while r.busy_from < len(busy) and busy[r.busy_from][1] <= t:
            r.busy_from += 1
        if r.busy_from == len(busy):  # nothing on the DP stream (NOTE: the common case)
            if tp_op is None:
                return t + remaining / 1.0
            ops = [tp_op]
        else:
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

    def _wait(self, r: _Rank, until: float, cause: str) -> None:
        """The main thread waits for an event at ``until``; one already past is not waited
        for, and one at this instant resumes it by an event made now."""
        if until >= r.now:
            r.clock.add(cause, until - r.now)
            r.now = r.made = until

    # --- the DP stream ------------------------------------------------------------------------

    def _dp_ops(self, r: _Rank, seg: Segment, op: str, width: int) -> float | None:
        """Queue one segment's collectives of ``op`` on the DP stream (dense and expert
        parameters each over their group); when the last ends, None if there are none."""
        end = None
        for group, params in (("dp", seg.dense_params), ("edp", seg.expert_params)):
            if params > 0 and self.e.comm.group_size(r.rid, group) > 1:
                seconds = net.COLLECTIVE_TIMES[op](self.e.comm.links(r.rid, group),
                                                   params * width)
                start = max(r.now, r.dp_free)
                end = r.dp_free = start + seconds
                r.busy.append((start, end))
        return end

    def _reduce(self, r: _Rank, seg: Segment) -> None:
        op = "allreduce" if self.s.parallel.zero == 0 else "reduce_scatter"
        end = self._dp_ops(r, seg, op, self.e.grad_bytes)
        if end is not None:
            r.pending = max(r.pending, end)

    def _gather_all(self, r: _Rank) -> None:
        for w in self._own_chunks(r):
            for k, seg in enumerate(w.segments):
                end = self._dp_ops(r, seg, "allgather", self.e.weight_bytes)
                if end is not None:
                    r.gathers[(w.chunk, k)] = end

    def _own_chunks(self, r: _Rank) -> list[ChunkWork]:
        return [w for w in self.work if w.stage == r.stage]

    def _finish(self, r: _Rank) -> None:
        """Gradients reduced, optimizer stepped, parameters gathered (``_finish``)."""
        p = self.s.parallel
        if not p.sharded_gradients and not p.overlap_grad_reduce:
            for w in self._own_chunks(r):
                for seg in w.segments:
                    self._reduce(r, seg)
        self._wait(r, r.pending, "dp")
        seconds = optimizer_time(self.e.costs.stage(r.stage), r.stage) * r.factor
        self._busy(r, seconds, [], 0.0, "optimizer")
        if p.zero in (1, 2) and not p.overlap_param_gather:
            r.gathers = {}
            self._gather_all(r)
            if r.gathers:
                self._wait(r, max(r.gathers.values()), "dp")
