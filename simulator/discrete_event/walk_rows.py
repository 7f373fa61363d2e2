"""The walk in arrays: each rank's action list as one row, every row's times at once.

Where nothing a rank does depends on when it does it (every forward and backward takes the same
time wherever it falls: no gradient reduction or parameter gather runs on the DP stream beside
it, so nothing slows the compute at some times and not others), the step is a max-plus system
of fixed durations: an action ends at ``max(the end of the one before it, the time it waits
for) + its duration``, where a receive waits for its message and a send for the rank it sends
into to be free of the send called before it (the walk's ``recv_free``); an asynchronous send's
message is through its lag (the transfer less its sender's wait) after the send ends, which
the waits' starts carry. Along one row that
recurrence is a running maximum (``e_k = D_k + max(0, max_{j<=k}(r_j - D_{j-1}))`` with ``D``
the cumulative durations and ``r`` the times waited for), which numpy computes for a whole row
at once; the rows are coupled only by their messages, so sweeping the rows forward and
backward, each with what the others have so far, reaches the step's times once a sweep changes
nothing (the least fixed point of a monotone system; Baccelli et al., *Synchronization and
Linearity*, 1992, ch. 3); the order of the sends into a rank is read off the sweep and swept
again until it holds.

Each kind of action's duration, its time by cause and its memory are worked out once by the
walk's own arithmetic (``walk_rank.RankArithmetic``) on a blank rank, and the step's end (DP
reduction, optimizer, tied embeddings) is the walk's ``_finish``. Where durations are fixed only
up to some action (a chunk's last backward reducing its gradients beside it), the arrays run
each rank up to there and the walk goes on from it (``walk_prefix.py``). Times are the walk's
up to the rounding of sums taken in another order (relative 2e-12 at most on the 10^5 actions
of Korthikanti et al.'s 530B step; ``tests/simulator/test_walk_rows.py`` holds them within
1e-11). Parameters gathered as the step starts, split backwards, two sends into one rank called
at one instant, or a sweep that does not settle answer ``None``, and the caller walks the list.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from ..costs import dp_reduction as dp
from ..pipeline.schedules import Action, Kind
from .steady import Totals
from .walk_prefix import FixedPart, Prefix
from .walk_rank import RankArithmetic, Undecided, WalkRank
from .walk_row_lists import (
    BUBBLE,
    CHANGE,
    COLUMNS,
    EXPOSED,
    PEAK,
    PP,
    STATE,
    RowLists,
    _Row,
)

F, B = Kind.FORWARD, Kind.BACKWARD
SEND_F, SEND_B = Kind.SEND_F, Kind.SEND_B
SWEEPS_PER_STAGE = 4  # more sweeps than this per rank: not settling, walk it instead
_EMPTY = np.zeros(0, dtype=np.int64)


def row_totals(engine, marks: dict[int, list[int]] | None = None
               ) -> tuple[list[Totals], list[list]] | Prefix | None:
    """Every rank's totals of ``engine``'s step (as ``walk.walked_totals``) and its states
    before the action indices ``marks`` gives it (``WalkRank.marked``); or, where its durations
    are fixed only up to some action on some rank, its fixed part (``Prefix``) for the walk to
    go on from; or None where the arrays cannot say (the caller walks all of it)."""
    try:
        return _Rows(engine).run(marks or {})
    except Undecided:
        return None


class _Rows(RowLists, FixedPart, RankArithmetic):
    """The engine's rules (``walk_rank.py``) on a blank rank per kind of action, then the
    rows' times by sweeps."""

    def __init__(self, e) -> None:
        self.e, self.s, self.work = e, e.s, e.work
        self.ranks = [WalkRank(r, e.schedule[r.stage]) for r in e.ranks]
        self.index = {r.rid: i for i, r in enumerate(self.ranks)}
        self.peers = e.ranks[0].peers
        self.last = self.e.passes if self.e.dp_timing.reduce_overlapped else {}
        self.entries: dict[tuple, tuple | None] = {}  # ``_compute_entry``'s, by kind of work
        self.alike = _alike(self.work)
        # whether a last backward reduces over data-parallel groups (its rank's own)
        self.reduces = e.s.parallel.dp * e.s.parallel.cp > 1

    def run(self, marks: dict[int, list[int]]
            ) -> tuple[list[Totals], list[list]] | Prefix | None:
        rows = self._rows()
        if rows is None or any(self._gathers_first(row.rank) for row in rows):
            return None
        tables = [self._costs(row) for row in rows]
        # what each send's message takes to arrive after its sender goes on (asynchronous
        # sends), by flat action; None where every send blocks until its message is through
        self.lags = np.concatenate([row.lags for row in rows]) if any(
            hold != 1 for hold in self.e.send_holds) else None
        limits = self._limits(rows)
        whole = all(limit == len(row.types[0]) for row, limit in zip(rows, limits, strict=True))
        tails = [self._cut(row, limit) for row, limit in zip(rows, limits, strict=True)]
        ends = self._settled(rows, rows[-1].offset + len(rows[-1].types[0]))
        if ends is None:
            return None
        arrive = ends if self.lags is None else ends + self.lags
        seen = [self._states(row, table, ends, arrive, marks.get(row.rank.rid, []), limit)
                for row, table, limit in zip(rows, tables, limits, strict=True)]
        if whole:
            return [self._finished(row.rank) for row in rows], seen
        return self._prefix(rows, tables, ends, arrive, limits, tails, seen, marks)

    def _costs(self, row: _Row) -> np.ndarray:
        """A row's table: per action type (and a last row of zeros, which a receive, type -1,
        reads), its seconds, its seconds by cause and by comm kind, its memory change, the peak
        above its start and when the event that resumes the rank after it was made
        (``COLUMNS``), by the walk's own arithmetic on a blank rank. An action that queues DP
        work (its time then depends on when it runs) has no fixed duration: NaN in
        ``row.durations``, zeros in the table. A send's seconds are its sender's wait, and
        ``row.lags`` what its message takes to arrive after that (asynchronous sends)."""
        types, keys = row.types
        rank = self.e.ranks[self.index[row.rank.rid]]
        table = np.zeros((len(keys) + 1, len(COLUMNS)))
        unfixed = np.zeros(len(keys) + 1, dtype=bool)
        lags = np.zeros(len(keys) + 1)
        for t, (chunk, kind, third) in enumerate(keys):
            if kind is SEND_F or kind is SEND_B:
                seconds, held = self._send_times(row.rank.rid, chunk, self.ranks[third].rid)
                table[t, 0] = table[t, EXPOSED] = table[t, PP] = held  # made at the call
                lags[t] = seconds - held
                continue
            entry = self._compute_entry(rank, chunk, kind, bool(third))
            if entry is None:
                unfixed[t] = True
            else:
                table[t] = entry
        row.durations = table[:, 0][types]
        row.lags = lags[types]
        if unfixed.any():
            row.durations[unfixed[types]] = np.nan
        row.cumulative = np.cumsum(row.durations)
        return table

    def _compute_entry(self, rank, chunk: int, kind: Kind, last: bool) -> tuple | None:
        """A forward's or backward's table entry (``_costs``), run once per kind of work: the
        middle stages of a pipeline run alike chunks (a chunk's work without its index and
        stage; a last backward that reduces over DP, which asks its own rank's groups, per
        rank)."""
        key = (self.alike[chunk], kind, last, last and self.reduces and (rank.rid,),
               rank.factor, rank.slowdown)
        if key in self.entries:
            return self.entries[key]
        scratch = WalkRank(rank, [])
        if kind is F:
            self._forward(scratch, Action(chunk, kind, 0))
        else:
            scratch.backwards[chunk] = self.e.passes[chunk] - 1 if last else 0
            self._backward(scratch, Action(chunk, kind, 0), "backward")
        entry = None
        if not scratch.busy and scratch.pending == -np.inf:  # no DP work queued
            entry = (scratch.now, *scratch.clock.seconds.values(), *scratch.clock.comm.values(),
                     scratch.memory.current, scratch.memory.peak, scratch.made)
        self.entries[key] = entry
        return entry

    def _gathers_first(self, r: WalkRank) -> bool:
        """Whether ``r``'s parameters are gathered on its DP stream as the step starts (the
        walk's ``run``): its first forwards then wait for them and its compute slows beside
        them."""
        if dp.dp_timing(self.s.parallel).gather != dp.BEFORE_STEP:
            return False
        scratch = WalkRank(self.e.ranks[self.index[r.rid]], [])
        self._gather_all(scratch)
        return bool(scratch.busy)

    # --- the rows' times ----------------------------------------------------------------------

    def _sweep(self, rows: list[_Row], size: int,
               start: np.ndarray | None = None) -> np.ndarray | None:
        """Every action's end, sweeping the rows forward and back until nothing changes (a
        row waits on its neighbours, which change on nearly every sweep until the last), from
        zero or from ``start``, ends known to lie at or below the answer."""
        ends = np.zeros(size) if start is None else start.copy()
        rules = [_Waits(row, ends, self.lags) for row in rows]
        order = list(range(len(rows)))
        for sweep in range(SWEEPS_PER_STAGE * len(rows) + 4):
            changed = False
            for i in order if sweep % 2 == 0 else reversed(order):
                changed |= rules[i].swept(ends)
            if not changed:
                return ends
        return None

    def _settled(self, rows: list[_Row], size: int) -> np.ndarray | None:
        """Every action's end, with each send queued behind the one called before it into the
        same rank (the walk's ``recv_free``): swept without queues first, then, while some
        send waits, again with each send behind the one its rank's calls put before it, until
        that order no longer changes; None where two sends into one rank are called at one
        instant (SimPy's order) or the order does not settle."""
        for row in rows:
            row.queue_at, row.queue_on = _EMPTY, _EMPTY
        start = None
        for turn in range(SWEEPS_PER_STAGE):
            ends = self._sweep(rows, size, start)
            if ends is None:
                return None
            queued = self._queues(rows, ends)
            if queued is None:
                return None
            if queued is False:
                return ends
            # The first order only adds waits, so the unqueued ends lie below the queued ones
            # (the system is monotone): the sweeps may start from them. A later order may drop
            # waits as well: from zero again.
            start = ends if turn == 0 else None
        return None

    def _queues(self, rows: list[_Row], ends: np.ndarray) -> bool | None:
        """Order the sends into each rank by when they are called; False where that is the
        order the rows were swept with (or none waits on its predecessor), True where rows now
        queue anew (sweep again), None where two are called at one instant."""
        flats, calls, dsts = [], [], []
        for row in rows:
            at = row.offset + row.send_at
            flats.append(at)
            calls.append(np.where(row.send_at > 0, ends[at - 1], 0.0))
            dsts.append(row.send_to)
        flat, call, dst = np.concatenate(flats), np.concatenate(calls), np.concatenate(dsts)
        # by destination, then call (lexsort's order; the destination's sort is a radix sort)
        order = np.argsort(call)
        order = order[np.argsort(dst[order].astype(np.int16 if len(rows) < 2 ** 15 else np.int64),
                                 kind="stable")]
        flat, call, dst = flat[order], call[order], dst[order]
        same = dst[1:] == dst[:-1]
        if np.any(same & (call[1:] == call[:-1])):
            return None
        before = np.where(same, flat[:-1], -1)  # the send each one is queued behind
        queued_now = any(len(row.queue_at) for row in rows)
        ahead = ends[flat[:-1]] if self.lags is None else ends[flat[:-1]] + self.lags[flat[:-1]]
        if not queued_now and not np.any(same & (ahead > call[1:])):
            return False  # no send waits for its channel
        behind = np.full(len(ends), -1, dtype=np.int64)
        behind[flat[1:]] = before
        changed = False
        for row in rows:
            on = behind[row.offset + row.send_at]
            keep = on >= 0
            queue_at, queue_on = row.send_at[keep], on[keep]
            if not (np.array_equal(queue_at, row.queue_at)
                    and np.array_equal(queue_on, row.queue_on)):
                row.queue_at, row.queue_on, changed = queue_at, queue_on, True
                row.queue_started = row.cumulative[queue_at] - row.durations[queue_at]
        return changed

    # --- totals -------------------------------------------------------------------------------

    def _states(self, row: _Row, table: np.ndarray, ends: np.ndarray, arrive: np.ndarray,
                marks: list[int], limit: int) -> Sequence[tuple]:
        """Set the row's rank to its state before action ``limit`` (clock, time by cause and
        kind, memory), and return its states before each index of ``marks`` (``marked``);
        ``arrive``: when each send's message (or channel) is through."""
        r, types = row.rank, row.types[0][:limit]
        own = ends[row.offset:row.offset + limit]
        inner = marks[:bisect.bisect_left(marks, limit)]  # (limit is at most the row's length)
        points = np.array([*inner, limit])
        # per span [point before, point): how many actions of each type (the table's rows),
        # waits; an action's span is the number of points at or before it
        spans, width = len(points), len(table)
        span = np.cumsum(np.bincount(np.array(inner, dtype=np.int64), minlength=limit))
        so_far = np.empty((spans, width + 2))
        so_far[:, :-2] = np.bincount(span * width + types % width,  # a receive's -1: zeros
                                     minlength=spans * width).reshape(spans, width)
        so_far[:, -2] = _waited(own, arrive, row.recv_at, row.recv_from, span, spans)
        # a send's wait for its channel: exposed pp, not bubble
        so_far[:, -1] = _waited(own, arrive, row.queue_at, row.queue_on, span, spans)
        np.cumsum(so_far, axis=0, out=so_far)
        change = table[:, CHANGE][types]
        held = np.cumsum(change)
        peak = held - change
        peak += table[:, PEAK][types]
        np.maximum.accumulate(peak, out=peak)
        sums = so_far[:, :-2] @ table
        sums[:, BUBBLE] += so_far[:, -2]
        sums[:, EXPOSED] += so_far[:, -1]
        sums[:, PP] += so_far[:, -1]
        before = points - 1  # a state before action i reads action i - 1's
        at = np.maximum(before, 0)
        table_states = np.zeros((spans, STATE))
        if limit:
            table_states[:, 0], table_states[:, EXPOSED + 3] = own[at], np.maximum(peak[at], 0)
            table_states[:, 1:EXPOSED + 3] = sums[:, 1:EXPOSED + 3]
            table_states[:, EXPOSED + 4:-1] = sums[:, EXPOSED + 3:CHANGE]
            table_states[:, -1] = held[at]
            table_states[before < 0] = 0.0  # before the first action: nothing yet
        end = tuple(table_states[-1].tolist())
        r.now = r.made = end[0]
        r.clock.seconds.update(zip(r.clock.seconds, end[1:5], strict=True))
        r.clock.comm.update(zip(r.clock.comm, end[6:-1], strict=True))
        r.memory.current, r.memory.peak = end[-1], end[5]
        return _Noted(table_states[:-1])

    def _finished(self, r: WalkRank) -> Totals:
        self._finish(r)
        return Totals(r.now, *r.clock.seconds.values(), r.memory.peak, *r.clock.comm.values())


def _alike(work: list) -> list[int]:
    """Each chunk's class of work: chunks whose work is the same but for their index and
    stage share one, so a kind of work is keyed by a small number (comparing two chunks'
    segments field by field, on every lookup, cost more than the arithmetic it saved). The
    chunks of one layer mix share their segments' objects (``work.chunk_work``), so those are
    told apart by identity: equal segments built apart only make two classes of one work."""
    classes: dict[tuple, int] = {}
    return [classes.setdefault((id(w.segments), id(w.whole), w.activation_bytes,
                                w.transient_bytes, w.weight_half_bytes), len(classes))
            for w in work]


class _Noted(Sequence):
    """A rank's states before its marks, as the walk notes them (``WalkRank.marked``: tuples
    of floats), read from the rows of an array when asked: the periodic check reads a few."""

    def __init__(self, table: np.ndarray) -> None:
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [tuple(state) for state in self.table[i].tolist()]
        return tuple(self.table[i].tolist())


class _Waits:
    """A row's ends from the others' (``e_k = max(e_{k-1}, r_k) + d_k``): its cumulative
    durations plus, from each wait on (a receive for its message, a send queued for its
    channel), the running maximum of ``r_j - start_j`` over the waits so far, never below
    zero. The waits' places are fixed for a sweep; their times come from ``ends``, into which
    the row writes its own."""

    __slots__ = ("sources", "starts", "counts", "cumulative", "view", "buffers")

    def __init__(self, row: _Row, ends: np.ndarray, lags: np.ndarray | None) -> None:
        n = len(row.cumulative)
        at, self.sources, self.starts = row.recv_at, row.recv_from, row.started
        if len(row.queue_at):
            at = np.concatenate((at, row.queue_at))
            order = np.argsort(at, kind="stable")
            at = at[order]
            self.sources = np.concatenate((self.sources, row.queue_on))[order]
            self.starts = np.concatenate((self.starts, row.queue_started))[order]
        if lags is not None:  # a message (or channel) is through its send's lag after its end
            self.starts = self.starts - lags[self.sources]
        lead = int(at[0]) if len(at) else n  # actions before the first wait: never pushed
        view = ends[row.offset:row.offset + n]
        view[:lead] = row.cumulative[:lead]
        self.cumulative, self.view = row.cumulative[lead:], view[lead:]
        self.counts = np.empty_like(at)  # actions from each wait to the next
        self.counts[:-1], self.counts[-1:] = at[1:] - at[:-1], n - at[-1:]
        # the push-backs behind a zero (the running maximum then never falls below it), as
        # this sweep finds them and as the last one wrote them; None: not written yet
        self.buffers: list = [np.zeros(len(at) + 1), None]

    def swept(self, ends: np.ndarray) -> bool:
        """Write the row's ends into ``ends``; whether they changed."""
        found, written = self.buffers
        np.subtract(ends[self.sources], self.starts, out=found[1:])
        np.maximum.accumulate(found, out=found)
        if written is not None and (found == written).all():
            return False  # nothing it waits for moved: its ends stand
        np.add(self.cumulative, np.repeat(found[1:], self.counts), out=self.view)
        self.buffers = [written if written is not None else np.zeros(len(found)), found]
        return True


def _waited(own: np.ndarray, ends: np.ndarray, at: np.ndarray, on: np.ndarray,
            span: np.ndarray, spans: int) -> np.ndarray:
    """Per span, the time a row's actions at ``at`` waited for the ends at ``on`` (their
    message, or their channel) beyond the row's own previous end."""
    if not len(at):
        return np.zeros(spans)
    before = at - 1
    ready = np.where(before >= 0, own[np.maximum(before, 0)], 0.0)
    return np.bincount(span[at], weights=np.maximum(ends[on] - ready, 0.0), minlength=spans)

