"""The walk in arrays: each rank's action list as one row, every row's times at once.

Where nothing a rank does depends on when it does it (every forward and backward takes the same
time wherever it falls: no gradient reduction or parameter gather runs on the DP stream during
the pipeline, so nothing slows the compute at some times and not others) and no two messages
into one rank overlap (each receive is answered as its send is called), the step is a max-plus
system of fixed durations: an action ends at ``max(the end of the one before it, the arrival of
the message it waits for) + its duration``. Along one row that recurrence is a running maximum
(``e_k = D_k + max(0, max_{j<=k}(r_j - D_{j-1}))`` with ``D`` the cumulative durations and
``r`` the arrivals), which numpy computes for a whole row at once; the rows are coupled only by
their messages, so sweeping the rows forward and backward, each with the arrivals the others
have so far, reaches the step's times once a sweep changes nothing (the least fixed point of a
monotone system; Baccelli et al., *Synchronization and Linearity*, 1992, ch. 3).

Each kind of action's duration, its time by cause and its memory are worked out once by the
walk's own arithmetic (``walk_rank.RankArithmetic``) on a blank rank, and the step's end (DP
reduction, optimizer, tied embeddings) is the walk's ``_finish``. Times are the walk's up to the
rounding of sums taken in another order (relative 2e-12 at most on the 10^5 actions of
Korthikanti et al.'s 530B step; ``tests/simulator/test_walk_rows.py`` holds them within 1e-11).
Anything else (a DP op during the pipeline, split backwards, two messages into one rank that
overlap, a sweep that does not settle) answers ``None``, and the caller walks the list.
"""

from __future__ import annotations

from itertools import repeat
from operator import itemgetter

import numpy as np

from ..costs import dp_reduction as dp
from ..pipeline.schedules import Action, Kind
from .steady import Totals
from .timeline import CAUSES, COMM_KINDS
from .walk_rank import RankArithmetic, Undecided, WalkRank

F, B = Kind.FORWARD, Kind.BACKWARD
SEND_F, SEND_B, RECV_F, RECV_B = Kind.SEND_F, Kind.SEND_B, Kind.RECV_F, Kind.RECV_B
# The kinds a row runs (no split backward, no overlapped pair), coded so that ``% 2`` is
# 1 for what carries a gradient.
KINDS = (F, B, SEND_F, SEND_B, RECV_F, RECV_B)
CODES = {kind: code for code, kind in enumerate(KINDS)}
CHUNK, KIND, MICROBATCH = itemgetter(0), itemgetter(1), itemgetter(2)
# A row's table: seconds, seconds by cause (``timeline.CAUSES``), by comm kind
# (``timeline.COMM_KINDS``), memory change, peak above the action's start.
COLUMNS = ("seconds", *CAUSES, *COMM_KINDS, "change", "peak")
EXPOSED, BUBBLE = COLUMNS.index("exposed_comm"), COLUMNS.index("bubble")
PP, CHANGE, PEAK = COLUMNS.index("pp"), COLUMNS.index("change"), COLUMNS.index("peak")
SWEEPS_PER_STAGE = 4  # more sweeps than this per rank: not settling, walk it instead
# Each shape's rows (``_Rows._shape``): a plan or a benchmark walks one shape again and again,
# and reading the lists is most of the work. At most ``STRUCTURES_KEPT`` shapes, as
# ``engine._lowered`` keeps lists.
STRUCTURES_KEPT = 64
_STRUCTURES: dict[tuple, list] = {}


class _Row:
    """One rank's list as arrays: what each action is, and (set per step) how long it takes."""

    __slots__ = ("rank", "types", "recv_at", "recv_from", "send_at", "send_to", "offset",
                 "durations", "cumulative", "started")

    def __init__(self, rank: WalkRank, offset: int) -> None:
        self.rank, self.offset = rank, offset


def row_totals(engine, marks: dict[int, list[int]] | None = None
               ) -> tuple[list[Totals], list[list]] | None:
    """Every rank's totals of ``engine``'s step (as ``walk.walked_totals``) and its states
    before the action indices ``marks`` gives it (``WalkRank.marked``), or None where the
    step is not a fixed-duration max-plus system (the caller walks it)."""
    try:
        return _Rows(engine).run(marks or {})
    except Undecided:
        return None


class _Rows(RankArithmetic):
    """The engine's rules (``walk_rank.py``) on a blank rank per kind of action, then the
    rows' times by sweeps."""

    def __init__(self, e) -> None:
        self.e, self.s, self.work = e, e.s, e.work
        self.ranks = [WalkRank(r, e.schedule[r.stage]) for r in e.ranks]
        self.index = {r.rid: i for i, r in enumerate(self.ranks)}
        self.peers = e.ranks[0].peers
        self.last = self.e.passes if self.e.dp_timing.reduce_overlapped else {}
        self.entries: dict[tuple, tuple | None] = {}  # ``_compute_entry``'s, by kind of work

    def run(self, marks: dict[int, list[int]]) -> tuple[list[Totals], list[list]] | None:
        rows = self._rows()
        if rows is None or any(self._gathers_first(row.rank) for row in rows):
            return None
        tables = [self._costs(row) for row in rows]
        if any(table is None for table in tables):
            return None
        ends = self._sweep(rows, rows[-1].offset + len(rows[-1].types[0]))
        if ends is None or self._overlapping(rows, ends):
            return None
        seen = [self._states(row, table, ends, marks.get(row.rank.rid, []))
                for row, table in zip(rows, tables, strict=True)]
        return [self._finished(row.rank) for row in rows], seen

    def _rows(self) -> list[_Row] | None:
        """Each rank's row, read from its list or remembered from the last list of the same
        shape; None where a list holds an action a row cannot run (split backwards)."""
        rows, offset = [], 0
        for r in self.ranks:
            rows.append(_Row(r, offset))
            offset += len(r.actions)
        key = self._shape()
        if key not in _STRUCTURES:
            if len(_STRUCTURES) >= STRUCTURES_KEPT:
                _STRUCTURES.clear()
            _STRUCTURES[key] = self._structure(rows) and [
                (row.types, row.recv_at, row.recv_from, row.send_at, row.send_to)
                for row in rows]
        known = _STRUCTURES[key]
        if not known:
            return None
        for row, parts in zip(rows, known, strict=True):
            row.types, row.recv_at, row.recv_from, row.send_at, row.send_to = parts
        return rows

    def _shape(self) -> tuple:
        """What the rows' structure is built from: the lists (``engine._lowered``'s key: the
        schedule, its depth, count and chunks per rank, each chunk's stage, each chunk's
        backward passes), which backward reduces as it goes, and the ranks."""
        p, e = self.s.parallel, self.e
        return (p.schedule, p.pp, e.m, p.virtual_stages, tuple(w.stage for w in self.work),
                tuple(sorted(e.passes.items())), tuple(sorted(self.last.items())),
                tuple(self.peers), tuple(r.rid for r in e.ranks))

    # --- what each action is ------------------------------------------------------------------

    def _structure(self, rows: list[_Row]) -> bool:
        """Each action's type (a compute's chunk, kind and whether it is its chunk's last
        backward; a send's chunk, kind and destination; -1 for a receive), and which send each
        receive waits for; False where a list holds another kind of action. (NOTE: read with
        numpy, a few passes per list at C speed: a list is 10^4 actions on 64 stages.)"""
        chunks = len(self.work)
        stage_rank = np.array([self.index[self.peers[w.stage]] for w in self.work] + [0])
        most = 1 + max(max(map(MICROBATCH, row.rank.actions), default=0) for row in rows)
        sent_by = np.full(2 * (chunks + 1) * most, -1, dtype=np.int64)  # message -> its send
        waits_on = []
        for row in rows:
            acts = row.rank.actions
            n = len(acts)
            kind = np.fromiter(map(CODES.get, map(KIND, acts), repeat(len(CODES))), np.int64, n)
            if n and kind.max() == len(CODES):
                return False
            chunk = np.fromiter(map(CHUNK, acts), np.int64, n)
            microbatch = np.fromiter(map(MICROBATCH, acts), np.int64, n)
            # a message: (the chunk it goes to, activation or gradient, micro-batch)
            send = (kind == 2) | (kind == 3)
            recv = (kind == 4) | (kind == 5)
            to = np.where(kind == 2, chunk + 1, np.where(kind == 3, chunk - 1, chunk))
            message = (to * 2 + (kind % 2)) * most + microbatch
            row.send_at, row.recv_at = np.flatnonzero(send), np.flatnonzero(recv)
            sent_by[message[send]] = row.offset + row.send_at
            waits_on.append(message[recv])
            row.send_to = stage_rank[to[send]]
            # a type: (kind, chunk, last backward or destination)
            third = np.zeros(n, dtype=np.int64)
            third[send] = row.send_to
            self._mark_last(third, kind, chunk)
            code = (kind * (chunks + 1) + chunk) * (len(rows) + 1) + third
            code[recv] = -1
            found, types = np.unique(code, return_inverse=True)
            if len(found) and found[0] == -1:  # receives: type -1, the table's row of zeros
                found, types = found[1:], types - 1
            keys = [(int(c // (len(rows) + 1) % (chunks + 1)), KINDS[c // (len(rows) + 1)
                     // (chunks + 1)], int(c % (len(rows) + 1))) for c in found]
            row.types = (types.astype(np.int64), keys)
        for row, messages in zip(rows, waits_on, strict=True):
            row.recv_from = sent_by[messages]
            if np.any(row.recv_from < 0):
                return False  # a receive no list sends
        return True

    def _mark_last(self, third: np.ndarray, kind: np.ndarray, chunk: np.ndarray) -> None:
        """Mark (1 in ``third``) each chunk's backward that reduces its gradients as it goes:
        its ``passes``-th, where the reduction overlaps the backward (``walk._plain``)."""
        if not self.last:
            return
        backward = np.flatnonzero(kind == 1)
        for c in np.unique(chunk[backward]).tolist():
            mine = backward[chunk[backward] == c]
            count = self.last.get(c, -1)
            if 0 < count <= len(mine):
                third[mine[count - 1]] = 1

    def _costs(self, row: _Row) -> np.ndarray | None:
        """A row's table: per action type (and a last row of zeros, which a receive, type -1,
        reads), its seconds, its seconds by cause and by comm kind (``COLUMNS``), its memory
        change and the peak above its start, by the walk's own arithmetic on a blank rank;
        None where an action queues DP work (its time then depends on when it runs)."""
        types, keys = row.types
        rank = self.e.ranks[self.index[row.rank.rid]]
        table = np.zeros((len(keys) + 1, len(COLUMNS)))
        for t, (chunk, kind, third) in enumerate(keys):
            if kind is SEND_F or kind is SEND_B:
                w = self.work[chunk]
                dst = self.ranks[third].rid
                seconds = (self.e.comm.p2p_seconds(row.rank.rid, dst, w.message_bytes)
                           + w.message_gather_s)
                table[t, [0, EXPOSED, PP]] = seconds
                continue
            entry = self._compute_entry(rank, chunk, kind, bool(third))
            if entry is None:
                return None
            table[t] = entry
        row.durations = table[types, 0]
        row.cumulative = np.cumsum(row.durations)
        # each receive's start had it nothing to wait for: the durations before it
        row.started = (row.cumulative - row.durations)[row.recv_at]
        return table

    def _compute_entry(self, rank, chunk: int, kind: Kind, last: bool) -> tuple | None:
        """A forward's or backward's table entry (``_costs``), run once per kind of work: the
        middle stages of a pipeline run alike chunks (a chunk's work without its index and
        stage; a reducing last backward, which asks its own rank's groups, per rank)."""
        w = self.work[chunk]
        key = (w.segments, w.whole, w.activation_bytes, w.transient_bytes,
               w.weight_half_bytes, kind, last, last and (rank.rid,), rank.factor, rank.slowdown)
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
                     scratch.memory.current, scratch.memory.peak)
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

    def _sweep(self, rows: list[_Row], size: int) -> np.ndarray | None:
        """Every action's end, sweeping the rows forward and back until nothing changes."""
        ends = np.zeros(size)
        order = list(range(len(rows)))
        for sweep in range(SWEEPS_PER_STAGE * len(rows) + 4):
            changed = False
            for i in order if sweep % 2 == 0 else reversed(order):
                row = rows[i]
                new = self._row_ends(row, ends)
                view = ends[row.offset:row.offset + len(new)]
                if not np.array_equal(view, new):
                    view[:] = new
                    changed = True
            if not changed:
                return ends
        return None

    @staticmethod
    def _row_ends(row: _Row, ends: np.ndarray) -> np.ndarray:
        """A row's ends given the arrivals in ``ends``: ``e_k = max(e_{k-1}, r_k) + d_k``."""
        slack = np.full(len(row.cumulative), -np.inf)
        slack[row.recv_at] = ends[row.recv_from] - row.started
        np.maximum.accumulate(slack, out=slack)
        np.maximum(slack, 0.0, out=slack)
        return row.cumulative + slack

    def _overlapping(self, rows: list[_Row], ends: np.ndarray) -> bool:
        """Whether two messages into one rank overlap, or are called at one instant (the walk
        would queue the later one, or ask SimPy's order)."""
        calls: list[list] = [[] for _ in rows]
        for row in rows:
            if not len(row.send_at):
                continue
            at = row.offset + row.send_at
            end = ends[at]
            start = end - row.durations[row.send_at]
            for dst in np.unique(row.send_to):
                mine = row.send_to == dst
                calls[dst].append((start[mine], end[mine]))
        for parts in calls:
            if not parts:
                continue
            start = np.concatenate([p[0] for p in parts])
            end = np.concatenate([p[1] for p in parts])
            order = np.argsort(start, kind="stable")
            start, end = start[order], end[order]
            if np.any(start[1:] <= start[:-1]) or np.any(start[1:] < end[:-1]):
                return True
        return False

    # --- totals -------------------------------------------------------------------------------

    def _states(self, row: _Row, table: np.ndarray, ends: np.ndarray,
                marks: list[int]) -> list:
        """Set the row's rank to its state at the end of its list (clock, time by cause and
        kind, memory), and return its states before each index of ``marks`` (``marked``)."""
        r, types = row.rank, row.types[0]
        own = ends[row.offset:row.offset + len(types)]
        waits = np.zeros(len(own))
        if len(row.recv_at):
            before = row.recv_at - 1
            ready = np.where(before >= 0, own[np.maximum(before, 0)], 0.0)
            waits[row.recv_at] = np.maximum(ends[row.recv_from] - ready, 0.0)
        held = np.cumsum(table[types, CHANGE])
        peak = np.maximum.accumulate(held - table[types, CHANGE] + table[types, PEAK])
        slots = types % len(table)  # a receive's -1: the table's row of zeros

        def state(i: int) -> tuple:
            """(clock, seconds by cause, peak, comm by kind, held) before action ``i``."""
            if i == 0:  # (the state's fields are the table's, less seconds, plus peak and held)
                return (0.0,) * len(COLUMNS)
            sums = np.bincount(slots[:i], minlength=len(table)) @ table
            sums[BUBBLE] += waits[:i].sum()
            return (float(own[i - 1]), *sums[1:EXPOSED + 3].tolist(),
                    max(0.0, float(peak[i - 1])), *sums[EXPOSED + 3:CHANGE].tolist(),
                    float(held[i - 1]))

        end = state(len(own))
        r.now = r.made = end[0]
        r.clock.seconds.update(zip(r.clock.seconds, end[1:5], strict=True))
        r.clock.comm.update(zip(r.clock.comm, end[6:-1], strict=True))
        r.memory.current, r.memory.peak = end[-1], end[5]
        # the walk notes a state before an action, none after the last
        return [state(i) for i in marks if i < len(own)]

    def _finished(self, r: WalkRank) -> Totals:
        self._finish(r)
        return Totals(r.now, *r.clock.seconds.values(), r.memory.peak, *r.clock.comm.values())

