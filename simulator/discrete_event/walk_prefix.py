"""A step's fixed part (``walk_rows.py``), for the walk to go on from where durations start to
depend on when actions run: each rank's limit, its state there, the messages sent before it and
received after, and the check that the walk's later sends do not overlap the fixed part's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..pipeline.schedules import Kind
from .walk_rank import WalkRank
from .walk_row_lists import MADE, _Row

F, B, RECV_F = Kind.FORWARD, Kind.BACKWARD, Kind.RECV_F


@dataclass(frozen=True, slots=True)
class Prefix:
    """A step's fixed part, for the walk to go on from: every rank (``WalkRank``) at the first
    action whose time depends on when it runs, the arrivals of the messages sent before and
    received after it, and each destination's sends so far (rank -> sorted begins, ends)."""

    ranks: list[WalkRank]
    arrivals: dict[tuple, float]
    sent: dict[int, tuple[np.ndarray, np.ndarray]]


def clashes(prefix: Prefix, granted: list[tuple[int, float, float]]) -> bool:
    """Whether a message the walk sent after the fixed part overlaps one sent in it into the
    same rank (the walk would have queued one behind the other): the sends into a rank are
    disjoint and sorted, so only the last to start before a span ends may overlap it."""
    spans: dict[int, list] = {}
    for dst, begin, end in granted:
        spans.setdefault(dst, []).append((begin, end))
    for dst, found in spans.items():
        if dst in prefix.sent:
            begins, ends = prefix.sent[dst]
            begin, end = np.array(found).T
            last = np.searchsorted(begins, end, side="left") - 1
            if np.any((last >= 0) & (ends[np.maximum(last, 0)] > begin)):
                return True
    return False


class FixedPart:
    """Where each row's fixed durations end, and the walk's start from there (mixed into
    ``walk_rows._Rows``)."""

    def _limits(self, rows: list[_Row]) -> list[int]:
        """Where each row's fixed durations end: its first action without one, or the first
        receive whose message is sent past its sender's limit (the walk takes it from there)."""
        limits = []
        for row in rows:
            unfixed = np.flatnonzero(np.isnan(row.durations))
            limits.append(int(unfixed[0]) if len(unfixed) else len(row.durations))
        if all(limit == len(row.durations) for row, limit in zip(rows, limits, strict=True)):
            return limits
        offsets = np.array([row.offset for row in rows])
        senders = [np.searchsorted(offsets, row.recv_from, side="right") - 1 for row in rows]
        changed = True
        while changed:
            changed = False
            cut = np.array(limits)
            for i, row in enumerate(rows):
                late = (row.recv_at < limits[i]) & (
                    row.recv_from - offsets[senders[i]] >= cut[senders[i]])
                if late.any():
                    limits[i], changed = int(row.recv_at[late][0]), True
        return limits

    @staticmethod
    def _cut(row: _Row, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Keep a row's first ``limit`` actions; return its later receives (index, flat index
        of their sends)."""
        tail = row.recv_at[:0], row.recv_from[:0]
        if limit < len(row.cumulative):
            keep = row.recv_at < limit
            tail = (row.recv_at[~keep], row.recv_from[~keep])
            row.recv_at, row.recv_from = row.recv_at[keep], row.recv_from[keep]
            sends = row.send_at < limit
            row.send_at, row.send_to = row.send_at[sends], row.send_to[sends]
            row.durations, row.cumulative = row.durations[:limit], row.cumulative[:limit]
        row.started = row.cumulative[row.recv_at] - row.durations[row.recv_at]
        return tail

    def _prefix(self, rows: list[_Row], tables: list[np.ndarray], ends: np.ndarray,
                arrive: np.ndarray, limits: list[int], tails: list, seen: list[list],
                marks: dict[int, list[int]]) -> Prefix:
        """The step's fixed part, for the walk to go on from (``walk.py``): each rank at its
        limit (clock, made, each chunk's forwards and backwards so far, its noted states and
        the marks still to come), the messages its later receives wait for that were sent in
        the fixed part, and the sends into each rank so far (``arrive``: when each send's
        message is through)."""
        offsets = np.array([row.offset for row in rows])
        arrivals, sent = {}, {}
        for row, table, limit, (recv_at, recv_from), states in zip(
                rows, tables, limits, tails, seen, strict=True):
            r = row.rank
            r.i, r.made = limit, self._made(row, table, ends, arrive, limit)
            counts = np.bincount(row.types[0][:limit] % len(table), minlength=len(table))
            for t, (chunk, kind, _) in enumerate(row.types[1]):
                if kind is F:
                    r.forwards[chunk] += int(counts[t])
                elif kind is B:
                    r.backwards[chunk] += int(counts[t])
            r.marks, r.seen = list(marks.get(r.rid, [])), list(states)  # the walk notes more
            r.mark = r.marks[len(states)] if len(states) < len(r.marks) else -1
            sender = np.searchsorted(offsets, recv_from, side="right") - 1
            known = recv_from - offsets[sender] < np.array(limits)[sender]
            for k, flat in zip(recv_at[known].tolist(), recv_from[known].tolist(), strict=True):
                chunk, kind, microbatch = r.actions[k]
                what = "act" if kind is RECV_F else "grad"
                arrivals[(what, chunk, microbatch, r.rid)] = float(arrive[flat])
            at = row.offset + row.send_at
            begin = ends[at] - row.durations[row.send_at]
            end = arrive[at]  # the transfer's end, past its sender's wait if asynchronous
            for dst in np.unique(row.send_to).tolist():
                mine = row.send_to == dst
                sent.setdefault(self.ranks[dst].rid, []).append((begin[mine], end[mine]))
        spans = {}
        for dst, parts in sent.items():
            begin = np.concatenate([p[0] for p in parts])
            order = np.argsort(begin)
            spans[dst] = (begin[order], np.concatenate([p[1] for p in parts])[order])
        return Prefix([row.rank for row in rows], arrivals, spans)

    @staticmethod
    def _made(row: _Row, table: np.ndarray, ends: np.ndarray, arrive: np.ndarray,
              limit: int) -> float:
        """When the event that resumed the rank last before action ``limit`` was made: a
        receive that waited, at the arrival; one that did not, as before it; a compute or a
        send, from its start (``MADE``)."""
        types, own = row.types[0], ends[row.offset:row.offset + limit]
        for k in range(limit - 1, -1, -1):
            before = float(own[k - 1]) if k > 0 else 0.0
            if types[k] >= 0:
                return before + float(table[types[k], MADE])
            arrival = float(arrive[row.recv_from[np.searchsorted(row.recv_at, k)]])
            if arrival >= before:
                return arrival
        return 0.0
