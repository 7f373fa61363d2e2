"""The engine's step without SimPy: each rank's action list walked in plain arithmetic.

In ``representative`` fidelity every duration the engine waits for is known when the wait
starts (closed-form collectives, nothing contends), so its event loop only orders work that
arithmetic can order. ``walked_totals`` runs the engine's own rules on the engine's own lists
and costs, rank by rank as far as each can go, and returns the ranks' totals
(``steady.Totals``) the SimPy run (``Engine.totals``) would give:

- a receive waits (bubble) until its message arrives; a send holds its sender until the message
  is through (or, asynchronous, its share of it), each rank receiving one message at a time, in
  the order the sends were called (``transfers.py``);
- a forward or backward runs its segments as ``segments.py`` does: compute, then its exposed
  collectives, or, where TP collectives overlap the compute, the compute beside them;
- gradient reductions and parameter gathers queue on the rank's DP stream
  (``dp_traffic.py``), and while a collective runs on its DP or TP stream the rank's compute
  goes at ``1 - comm_compute_slowdown`` of its speed (``shared_compute.py``);
- memory is allocated and freed as the engine does, so the peak is the same (each rank's
  arithmetic: ``walk_rank.py``).

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
schedule). A long step's fixed durations run as arrays instead (``walk_rows.py``).
"""

from __future__ import annotations

from collections import deque
from operator import itemgetter

from ..costs import dp_reduction as dp
from ..costs.cost_model import twin_stage
from ..pipeline.schedules import Action, Kind
from . import progress
from .steady import Totals
from .walk_rank import INF, RankArithmetic, Undecided, WalkRank

__all__ = ["Undecided", "may_walk", "walkable", "walked_marked", "walked_totals"]
F, B, I, W = Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT  # noqa: E741
SEND_F, SEND_B, RECV_F, RECV_B = Kind.SEND_F, Kind.SEND_B, Kind.RECV_F, Kind.RECV_B
WAYS = {B: "backward", I: "input", W: "weight"}
# Steps of at least this many actions run in arrays (``walk_rows``); shorter ones walk faster
# (3-4 us an action) than numpy imports (about 80 ms).
ROWS_FROM = 20_000
CHUNK_KIND = itemgetter(0, 1)  # an Action's (chunk, kind), read at C speed


def walked_totals(engine, rows: bool = True) -> list[Totals] | None:
    """Every rank's totals of ``engine``'s step (as ``engine.totals()``), or None where the
    walk does not model the step or cannot order it (then run ``engine.totals()``); a long
    step's fixed durations in arrays where ``rows`` allows it (``walk_rows.py``)."""
    found = walked_marked(engine, {}, rows)
    if found is None:
        return None
    listener = progress.current()  # a progress bar: every action has run
    if listener is not None:
        actions = sum(len(engine.schedule[r.stage]) for r in engine.ranks)
        listener(actions, actions)
    return found[0]


def walked_marked(engine, marks: dict[int, list[int]], rows: bool = True
                  ) -> tuple[list[Totals], list[list]] | None:
    """``walked_totals``, and each rank's states noted before the action indices ``marks``
    gives it (``WalkRank.marked``), in ``engine.ranks`` order; None where the walk refuses."""
    if not walkable(engine):
        return None
    found = _in_rows(engine, marks) if rows else None
    if isinstance(found, tuple):
        return found
    if found is not None:  # the fixed part in arrays, the walk from there
        walked = _walked_from(engine, marks, found)
        if walked is not None:
            return walked
    try:
        w = _Walk(engine, marks)
        return w.run(), [r.seen for r in w.ranks]
    except Undecided:
        return None


def _walked_from(engine, marks: dict[int, list[int]], prefix):
    """The walk from a step's fixed part (``walk_prefix.Prefix``), or None where it cannot
    order its events or a send of its overlaps one of the fixed part's (walk all of it)."""
    from .walk_prefix import clashes

    w = _Walk(engine, marks, prefix)
    try:
        totals = w.run()
    except Undecided:
        return None
    if clashes(prefix, w.granted):
        return None
    return totals, [r.seen for r in w.ranks]


def _in_rows(engine, marks: dict[int, list[int]] | None = None):
    """``walk_rows.row_totals`` of a step of at least ``ROWS_FROM`` actions, else None."""
    if sum(len(engine.schedule[r.stage]) for r in engine.ranks) < ROWS_FROM:
        return None
    from . import walk_rows  # numpy, which a representative step otherwise never imports

    return walk_rows.row_totals(engine, marks)


def may_walk(s, fidelity: str) -> bool:
    """Whether the walk models the features of scenario ``s`` at ``fidelity`` (``walkable``
    asks the rest of the engine built for it)."""
    timing = dp.dp_timing(s.parallel)  # not ZeRO-3's per-unit gathers, whenever it reduces
    return (fidelity == "representative" and timing.reduce == dp.PER_STEP
            and timing.gather != dp.PER_UNIT)


def walkable(engine) -> bool:
    """Whether the walk models every feature of ``engine``'s step."""
    return (may_walk(engine.s, engine.fidelity) and not engine.record
            and all(twin_stage(engine.s, r.stage) is None for r in engine.ranks)
            and Kind.OVERLAP_F_B not in engine.kinds)


class _Walk(RankArithmetic):
    """The engine's rules in arithmetic (``engine.py``, ``segments.py``, ``transfers.py``,
    ``dp_traffic.py``, ``shared_compute.py``)."""

    def __init__(self, e, marks: dict[int, list[int]] | None = None, prefix=None) -> None:
        self.e, self.s, self.work = e, e.s, e.work
        # from a fixed part (``walk_prefix``): its ranks, and the sends granted to ``clashes``
        self.ranks = prefix.ranks if prefix else [
            WalkRank(r, e.schedule[r.stage], (marks or {}).get(r.rid, [])) for r in e.ranks]
        self.granted: list[tuple[int, float, float]] | None = [] if prefix else None
        self.by_id = {r.rid: r for r in self.ranks}
        self.peers = e.ranks[0].peers  # stage -> rank (one pipeline)
        self.arrivals: dict[tuple, float] = dict(prefix.arrivals) if prefix else {}
        self.waiting: dict[tuple, WalkRank] = {}
        self.recv_free: dict[int, float] = {}
        self.calls: dict[int, dict[int, tuple]] = {}  # dst -> src -> (called at, seconds, key)
        # (src, chunk, send kind) -> (what, to chunk, dst, a transfer's seconds)
        self.p2p: dict[tuple, tuple] = {}
        self.senders: dict[int, set[int]] = {}  # dst -> the ranks that ever send to it
        for r in self.ranks:
            for chunk, kind in set(map(CHUNK_KIND, r.actions)):  # each (chunk, kind) once
                if kind is SEND_F or kind is SEND_B:
                    dst = self._send_of(r, Action(chunk, kind, 0))[0]
                    self.senders.setdefault(dst, set()).add(r.rid)
                    self.calls.setdefault(dst, {})
        self.ready = deque(self.ranks)
        self.advancing: WalkRank | None = None  # the rank whose send is being granted in line
        self.watch: dict[int, set[int]] = {}  # rank -> the receivers whose sends wait on it
        self.retry: set[int] = set()  # receivers whose sends may be decided now

    # --- the loop -----------------------------------------------------------------------------

    def run(self) -> list[Totals]:
        if dp.dp_timing(self.s.parallel).gather == dp.BEFORE_STEP:
            for r in self.ranks:
                self._gather_all(r)
        ready, watch, advance = self.ready, self.watch, self._advance
        while ready or self.retry:
            while ready:
                r = ready.popleft()
                advance(r)
                if watch:  # its clock moved on: the sends that waited to see it call, again
                    watchers = watch.pop(r.rid, None)
                    if watchers:
                        self.retry |= watchers
            while self.retry and not self.ready:
                self._grant(self.retry.pop())
        if not all(r.finished for r in self.ranks):
            raise Undecided  # no send can be ordered: let the event loop order them
        return [Totals(r.now, *r.clock.seconds.values(), r.memory.peak, *r.clock.comm.values())
                for r in self.ranks]

    def _advance(self, r: WalkRank) -> None:
        """Run ``r``'s actions until it waits for a message or a send, or ends. (NOTE: the
        walk's hot loop, one pass per action: an Action is read as the tuple (chunk, kind,
        micro-batch) and its kind compared by identity, the common forward and backward run
        inline (``_plain``), each chunk's costs and each send's destination looked up once.)"""
        actions, arrivals, bubble = r.actions, self.arrivals, r.clock.seconds
        p2p, calls, plain, rid = self.p2p, self.calls, self._plain, r.rid
        recv_free, pp = self.recv_free, r.clock.comm
        count = len(actions)
        i = r.i  # ``r.i``, written back before anything that reads or moves it
        while i < count:
            if i == r.mark:  # a period boundary (``periodic.py``): the state before it
                r.marked()
            a = actions[i]
            kind = a[1]
            if kind is RECV_F or kind is RECV_B:
                key = ("act" if kind is RECV_F else "grad", a[0], a[2], rid)
                t = arrivals.get(key)
                if t is None:
                    r.i, r.waits_for = i, key
                    self.waiting[key] = r
                    return
                if t >= r.now:  # ``_wait`` for the bubble, inlined
                    bubble["bubble"] += t - r.now
                    r.now = r.made = t
            elif kind is SEND_F or kind is SEND_B:
                sent = p2p.get((rid, a[0], kind))  # ``_send_of``, inlined where it is known
                if sent is None:
                    self._send_of(r, a)
                    sent = p2p[(rid, a[0], kind)]
                what, to, dst, seconds, held = sent
                key = (what, to, a[2], dst)
                if not calls[dst] and self._first_to(r, dst):  # ``_grant``'s choice, inlined
                    t = r.now
                    begin = max(t, recv_free.get(dst, 0.0))
                    recv_free[dst] = begin + seconds
                    if self.granted is not None:
                        self.granted.append((dst, begin, begin + seconds))
                    end = t + (begin + held - t)  # the sender's timeout (``transfers.send``)
                    blocked = end - t  # ``Attribution.add("pp", ...)``, inlined
                    pp["pp"] += blocked
                    bubble["exposed_comm"] += blocked
                    r.now, r.made = end, t
                    arrivals[key] = t + (begin + seconds - t) if held != seconds else end
                    waiter = self.waiting.pop(key, None)
                    if waiter is not None:
                        waiter.waits_for = None
                        self.ready.append(waiter)
                    i += 1
                    continue
                r.i, r.call = i, (dst, held, key)
                calls[dst][rid] = (r.now, seconds, key, r.made, held)
                self.advancing = r
                self._grant(dst)
                self.advancing = None
                if r.call is not None:
                    return  # to wait for its turn
                i = r.i
                continue  # granted at once: on with the list (``_grant`` moved ``i`` on)
            elif (kind is F or kind is B or kind is I or kind is W) and not plain(
                    r, a[0], kind):
                if kind is F:
                    self._forward(r, a)
                else:
                    self._backward(r, a, WAYS[kind])
            i += 1
        r.i = i
        self._finish(r)
        r.finished = True

    def _plain(self, r: WalkRank, chunk: int, kind: Kind) -> bool:
        """Run a forward or whole backward of ``chunk`` as ``_forward`` and ``_backward`` do
        where it is one whole segment (no gated first forward, no last backward reducing
        segment by segment); False (nothing done) where it needs their general path."""
        known = r.plain.get(chunk)
        if known is None:
            known = r.plain[chunk] = self._plain_costs(r, chunk)
        forward, backward, run_forward, run_backward, activation, transient, held, last = known
        memory = r.memory
        if kind is F:
            if r.gathers:  # its first forward waits for the parameters: ``_forward`` counts it
                if not r.forwards[chunk]:
                    return False
                r.forwards[chunk] += 1
            memory.current += activation  # ``MemoryTracker.alloc``
            if memory.current > memory.peak:
                memory.peak = memory.current
            run_forward(r, forward)
            return True
        if kind is not B:
            return False  # split backwards: their general path
        backwards = r.backwards
        backwards[chunk] += 1
        if backwards[chunk] == last:
            backwards[chunk] -= 1  # the last, reducing as it goes: ``_backward`` counts it
            return False
        memory.current += transient  # ``MemoryTracker.alloc``
        if memory.current > memory.peak:
            memory.peak = memory.current
        run_backward(r, backward)
        memory.current -= held  # ``MemoryTracker.free``
        return True

    def _send_of(self, r: WalkRank, a) -> tuple[int, float, tuple]:
        """(the receiving rank, the transfer's seconds, the arrival key) of a send; its
        sender's wait (``held``: all of it for a blocking send) is remembered beside it."""
        chunk, kind, microbatch = a
        sent = self.p2p.get((r.rid, chunk, kind))
        if sent is None:
            what, to = ("act", chunk + 1) if kind is SEND_F else ("grad", chunk - 1)
            dst = self.peers[self.work[to].stage]
            sent = self.p2p[(r.rid, chunk, kind)] = (
                what, to, dst, *self._send_times(r.rid, chunk, dst))
        what, to, dst, seconds, _ = sent
        return dst, seconds, (what, to, microbatch, dst)

    # --- sends --------------------------------------------------------------------------------

    def _grant(self, dst: int) -> None:
        """Start the sends into ``dst`` whose turn is certain: the earliest called, of two
        called at one instant the one resumed by the earlier-made event (SimPy's order)."""
        calls, senders, by_id = self.calls[dst], self.senders[dst], self.by_id
        while calls:
            # the earliest (called at, made at); of equal ones the first in the dict
            src = next(iter(calls)) if len(calls) == 1 else self._earliest_of(calls)
            t, seconds, key, made, held = calls[src]
            for other in senders:
                if other == src:
                    continue
                call = calls.get(other)
                if call is not None:
                    if call[0] == t and call[3] == made:
                        raise Undecided  # resumed by events made at one instant: unknown order
                    continue
                o = by_id[other]
                if o.call is None and o.waits_for is None:  # ``_earliest_call``: its clock
                    if not o.finished and o.now <= t:
                        watchers = self.watch.get(other)
                        if watchers is None:
                            self.watch[other] = {dst}
                        else:
                            watchers.add(dst)
                        return
                    continue
                bound, chain = self._earliest_call(o)
                if bound <= t:  # it may still call first: ask again once it moves
                    for rid in chain:
                        self.watch.setdefault(rid, set()).add(dst)
                    return
            del calls[src]
            begin = max(t, self.recv_free.get(dst, 0.0))
            self.recv_free[dst] = begin + seconds
            if self.granted is not None:
                self.granted.append((dst, begin, begin + seconds))
            end = t + (begin + held - t)  # the sender's timeout (``transfers.send``)
            sender = by_id[src]
            blocked = end - t  # ``Attribution.add("pp", ...)``, inlined
            sender.clock.comm["pp"] += blocked
            sender.clock.seconds["exposed_comm"] += blocked
            sender.now, sender.made, sender.call = end, t, None
            sender.i += 1
            if sender is not self.advancing:
                self.ready.append(sender)
            self.arrivals[key] = t + (begin + seconds - t) if held != seconds else end
            waiter = self.waiting.pop(key, None)
            if waiter is not None:
                waiter.waits_for = None
                self.ready.append(waiter)

    def _first_to(self, r: WalkRank, dst: int) -> bool:
        """Whether ``r``'s send into ``dst``, called now with no other call into ``dst``
        waiting, is certain to go first: no other sender into ``dst`` may call before it
        (``_grant``'s check where ``r``'s is the only call; where it is not certain, ``_grant``
        decides it, and watches the ranks that may still call first)."""
        t, by_id = r.now, self.by_id
        for other in self.senders[dst]:
            if other == r.rid:
                continue
            o = by_id[other]
            if o.call is None and o.waits_for is None:  # ``_earliest_call``: its clock
                if not o.finished and o.now <= t:
                    return False
            elif self._earliest_call(o)[0] <= t:
                return False
        return True

    @staticmethod
    def _earliest_of(calls: dict[int, tuple]) -> int:
        """The sender of the call with the least (called at, made at), the first in ``calls``
        of equal ones (``min``'s choice; of two, compared without a key function)."""
        if len(calls) == 2:
            first, second = calls
            a, b = calls[first], calls[second]
            return second if (b[0], b[3]) < (a[0], a[3]) else first
        return min(calls, key=lambda k: calls[k][::3])

    def _earliest_call(self, r: WalkRank) -> tuple[float, list[int]]:
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

