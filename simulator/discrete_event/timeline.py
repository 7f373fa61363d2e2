"""What the engine saw: spans per rank and stream, each rank's time by cause, its peak memory.

A rank's *main thread* (the process walking its action list) is never idle without a reason:
it computes, waits for a collective or a send it needs, waits for data from another stage (the
pipeline bubble) or steps the optimizer. Summing those intervals on the slowest rank gives a
breakdown that adds up to the step time exactly (SCENARIO.md, ``breakdown_s``). Exposed
communication is also kept by kind (``COMM_KINDS``: the group it runs over), so that each
stage's breakdown can say which traffic it waits for (``stage_breakdown.py``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from ..costs.result import Breakdown
from ..costs.stage_breakdown import COMM_KINDS  # the groups exposed communication runs over

# The trace's threads, in this order (tids); cp and ep come last so earlier tids keep their meaning.
# Context- and expert-parallel traffic is drawn on threads of its own, though ring attention
# queues on the TP stream's resource in the engine: a trace must not call an all-to-all "tp".
STREAMS = ("compute", "tp", "dp", "pp_send", "pp_recv", "cp", "ep")
CAUSES = ("compute", "exposed_comm", "bubble", "optimizer")


class Span(NamedTuple):
    """One op on one stream of one rank, in seconds from the start of the step."""

    rank: int
    stream: str
    name: str
    start: float
    end: float


@dataclass(slots=True)
class Attribution:
    """Seconds of a rank's main thread by cause (``CAUSES``), and its exposed communication by
    kind (``COMM_KINDS``), which sums to its ``exposed_comm``."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    comm: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COMM_KINDS, 0.0))

    def add(self, cause: str, seconds: float) -> None:
        """Charge ``seconds`` to ``cause``: one of ``CAUSES`` but ``exposed_comm``, or a comm
        kind (exposed communication over that group): every exposed wait names its group."""
        if cause in self.comm:
            self.comm[cause] += seconds
            cause = "exposed_comm"
        elif cause == "exposed_comm":
            raise ValueError("exposed communication is charged to its kind, one of "
                             f"{COMM_KINDS}")
        self.seconds[cause] += seconds

    def breakdown(self) -> Breakdown:
        return Breakdown(**self.seconds)


@dataclass(slots=True)
class MemoryTracker:
    """Transient bytes (activations, recomputed tensors) a rank holds: ops allocate and free,
    the peak is remembered."""

    current: float = 0.0
    peak: float = 0.0

    def alloc(self, now: float, nbytes: float) -> None:
        self.current += nbytes
        if self.current > self.peak:
            self.peak = self.current

    def free(self, now: float, nbytes: float) -> None:
        self.current -= nbytes


@dataclass(slots=True)
class Timeline:
    """Every span of one simulated step, and the labels of the ranks that ran them; a timeline
    not ``enabled`` records nothing (spans cost time and memory nobody asked for)."""

    spans: list[Span] = field(default_factory=list)
    rank_labels: dict[int, str] = field(default_factory=dict)
    enabled: bool = True

    def record(self, rank: int, stream: str, name: str, start: float, end: float) -> None:
        if self.enabled and end > start:
            self.spans.append(Span(rank, stream, name, start, end))

    def chrome_trace(self) -> dict:
        """Chrome trace-event JSON: one process per rank, one thread per stream (Perfetto)."""
        events: list[dict] = []
        for rank, label in sorted(self.rank_labels.items()):
            events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                           "args": {"name": label}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                           "args": {"sort_index": rank}})
            for tid, stream in enumerate(STREAMS):
                events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                               "args": {"name": stream}})
        tids = {stream: tid for tid, stream in enumerate(STREAMS)}
        for span in self.spans:
            events.append({"ph": "X", "name": span.name, "cat": span.stream, "pid": span.rank,
                           "tid": tids[span.stream], "ts": span.start * 1e6,
                           "dur": (span.end - span.start) * 1e6})
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def write_chrome_trace(self, path: str | Path) -> None:
        """Write the trace atomically: a reader never sees a half-written file."""
        write_json_atomically(Path(path), self.chrome_trace())


def write_json_atomically(path: Path, data: object) -> None:
    """``json.dump`` to a temporary file beside ``path``, then rename it into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
