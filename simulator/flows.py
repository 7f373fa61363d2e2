"""Flows across several links at once, at max-min fair rates (a fluid network model).

Each flow follows a path of directed links (a GPU's egress port, a switch uplink, the
receiver's ingress port ...). Rates are max-min fair: progressive filling raises every flow's
rate together until a link saturates, freezes the flows through it at that rate, and goes on
with the capacity left (Bertsekas & Gallager, "Data Networks", sec. 6.5.2). Rates change only
when a flow starts or ends, so a transfer costs a few events whatever its size, never one per
packet (NOTES.md B8). Changes at one instant are handled together (a ring phase that starts a
thousand flows re-rates once), and only the flows that share links with a changed one,
transitively, are re-rated: a pipeline send between two idle ports leaves a data-parallel ring
elsewhere alone.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Sequence

import simpy

_EPS_BYTES = 1e-6  # flows this close to done count as done (floating-point residue)
_EPS_SECONDS = 1e-12  # ... and so do flows this close in time


def max_min_rates(paths: Sequence[Sequence[Hashable]],
                  capacity: dict[Hashable, float]) -> list[float]:
    """Max-min fair rates of flows with the given paths over links of the given capacities
    (progressive filling): no flow can go faster without slowing one that is not faster.

    The links wait in a heap by fair share (capacity left / flows not yet frozen); the
    smallest saturates next and freezes its flows; stale entries are skipped."""
    rates: list[float | None] = [None] * len(paths)
    links = [set(path) for path in paths]
    users: dict[Hashable, list[int]] = {}
    for i, path in enumerate(links):
        for link in path:
            users.setdefault(link, []).append(i)
    left = {link: capacity[link] for link in users}
    count = {link: len(flows) for link, flows in users.items()}
    heap = [(left[link] / n, n, id(link), link) for link, n in count.items()]
    heapq.heapify(heap)
    while heap:
        share, n, _, link = heapq.heappop(heap)
        if count[link] != n or n == 0:  # stale: the link changed since it was pushed
            continue
        for i in users[link]:
            if rates[i] is None:
                rates[i] = share
                for other in links[i]:
                    left[other] -= share
                    count[other] -= 1
                    if other != link and count[other] > 0:
                        heapq.heappush(heap, (max(left[other], 0.0) / count[other],
                                              count[other], id(other), other))
        count[link] = 0
    return [r if r is not None else 0.0 for r in rates]


class _Flow:
    """A flow's bytes ``left`` at time ``since``, moving at ``rate`` until re-rated."""

    __slots__ = ("done", "left", "path", "rate", "since", "version")

    def __init__(self, path: tuple[Hashable, ...], nbytes: float, done: simpy.Event,
                 now: float) -> None:
        self.path, self.left, self.done = path, nbytes, done
        self.rate, self.since, self.version = 0.0, now, 0

    def left_at(self, now: float) -> float:
        return self.left - self.rate * (now - self.since)


class FlowNetwork:
    """Directed links and the flows crossing them, each at its max-min fair rate."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.capacity: dict[Hashable, float] = {}  # bytes/s
        self.carried: dict[Hashable, float] = {}  # bytes that crossed each link
        self._on: dict[Hashable, set[_Flow]] = {}  # link -> flows crossing it
        self._changed: set[Hashable] = set()  # links whose flows changed this instant
        self._ends: list[tuple[float, int, int, _Flow]] = []  # (end, version, tie, flow)
        self._count = 0
        self._wake = env.event()
        env.process(self._run())

    def add_link(self, link: Hashable, bandwidth: float) -> None:
        if bandwidth <= 0:
            raise ValueError(f"link {link!r}: bandwidth must be positive (got {bandwidth})")
        self.capacity[link] = bandwidth
        self.carried.setdefault(link, 0.0)
        self._on.setdefault(link, set())

    @property
    def active_flows(self) -> int:
        return len({f for flows in self._on.values() for f in flows})

    def transfer(self, path: Sequence[Hashable], nbytes: float) -> simpy.Event:
        """An event that succeeds when ``nbytes`` have crossed every link of ``path``."""
        done = self.env.event()
        if nbytes <= 0 or not path:
            done.succeed()
            return done
        flow = _Flow(tuple(path), float(nbytes), done, self.env.now)
        for link in set(flow.path):
            self._on[link].add(flow)
            self.carried[link] += nbytes
        self._changed.update(flow.path)
        if not self._wake.triggered:
            self._wake.succeed()
        return done

    def _component(self, seeds: Iterable[Hashable]) -> set[_Flow]:
        """Every flow linked to the seed links through shared links."""
        flows: set[_Flow] = set()
        todo, seen = list(seeds), set()
        while todo:
            link = todo.pop()
            if link in seen:
                continue
            seen.add(link)
            for flow in self._on[link] - flows:
                flows.add(flow)
                todo.extend(flow.path)
        return flows

    def _rerate(self) -> None:
        """Max-min rates for the flows sharing links with this instant's changes."""
        now = self.env.now
        flows = list(self._component(self._changed))
        self._changed.clear()
        rates = max_min_rates([f.path for f in flows], self.capacity)
        for flow, rate in zip(flows, rates, strict=True):
            flow.left, flow.since = flow.left_at(now), now
            flow.rate, flow.version = rate, flow.version + 1
            if rate > 0:
                self._count += 1
                heapq.heappush(self._ends, (now + flow.left / rate, flow.version,
                                            self._count, flow))

    def _finish_due(self) -> None:
        """End the flows due now; their links change."""
        now = self.env.now
        while self._ends:
            end, version, _, flow = self._ends[0]
            if version != flow.version:  # re-rated since: a stale entry
                heapq.heappop(self._ends)
                continue
            slack = max(_EPS_BYTES, _EPS_SECONDS * flow.rate)
            if end > now and flow.left_at(now) > slack:
                break
            heapq.heappop(self._ends)
            flow.version += 1
            for link in set(flow.path):
                self._on[link].discard(flow)
            self._changed.update(flow.path)
            flow.done.succeed()

    def _run(self):
        while True:
            if not self._changed and not self._ends:
                yield self._wake
                self._wake = self.env.event()
                continue
            yield self.env.timeout(0)  # let every change of this instant arrive first
            if self._wake.triggered:
                self._wake = self.env.event()
            self._finish_due()
            if self._changed:
                self._rerate()
            while self._ends and self._ends[0][1] != self._ends[0][3].version:
                heapq.heappop(self._ends)
            if not self._ends:
                continue
            # NOTE: stale timeouts cannot be cancelled in SimPy; they fire harmlessly.
            yield self.env.timeout(max(self._ends[0][0] - self.env.now, 0.0)) | self._wake
            if self._wake.triggered:
                self._wake = self.env.event()
