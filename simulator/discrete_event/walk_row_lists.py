"""Reading each rank's action list into a row of arrays (``walk_rows.py``): each action's type,
the send each receive waits for and where each send goes, remembered per shape of lists.
"""

from __future__ import annotations

from itertools import repeat
from operator import itemgetter

import numpy as np

from ..pipeline.schedules import Kind
from .timeline import CAUSES, COMM_KINDS
from .walk_rank import WalkRank

F, B = Kind.FORWARD, Kind.BACKWARD
SEND_F, SEND_B, RECV_F, RECV_B = Kind.SEND_F, Kind.SEND_B, Kind.RECV_F, Kind.RECV_B
# The kinds a row runs (no split backward, no overlapped pair), coded so that ``% 2`` is
# 1 for what carries a gradient.
KINDS = (F, B, SEND_F, SEND_B, RECV_F, RECV_B)
CODES = {kind: code for code, kind in enumerate(KINDS)}
CHUNK, KIND, MICROBATCH = itemgetter(0), itemgetter(1), itemgetter(2)
# A row's table, a line per action type: seconds, seconds by cause (``timeline.CAUSES``) and by
# comm kind (``timeline.COMM_KINDS``), memory change, peak above the action's start, and when
# the event that resumes the rank after it was made, from its start.
COLUMNS = ("seconds", *CAUSES, *COMM_KINDS, "change", "peak", "made")
EXPOSED, BUBBLE = COLUMNS.index("exposed_comm"), COLUMNS.index("bubble")
PP, CHANGE, PEAK = COLUMNS.index("pp"), COLUMNS.index("change"), COLUMNS.index("peak")
MADE = COLUMNS.index("made")
STATE = 1 + len(CAUSES) + 1 + len(COMM_KINDS) + 1  # clock, causes, peak, comm kinds, held
# Each shape's rows (``RowLists._shape``): a plan or a benchmark walks one shape again and again,
# and reading the lists is most of the work. At most ``STRUCTURES_KEPT`` shapes, as
# ``lowered.lowered_lists`` keeps lists.
STRUCTURES_KEPT = 64
_STRUCTURES: dict[tuple, list] = {}



class _Row:
    """One rank's list as arrays: what each action is, and (set per step) how long it takes."""

    __slots__ = ("rank", "types", "recv_at", "recv_from", "send_at", "send_to", "offset",
                 "durations", "lags", "cumulative", "started", "queue_at", "queue_on",
                 "queue_started")

    def __init__(self, rank: WalkRank, offset: int) -> None:
        self.rank, self.offset = rank, offset



class RowLists:
    """The rows of an engine's lists (mixed into ``walk_rows._Rows``: it uses ``e``, ``s``,
    ``work``, ``ranks``, ``index``, ``peers`` and ``last``)."""

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
        """What the rows' structure is built from: the lists (``lowered.lowered_lists``'s key: the
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
