"""Flows across several links at once, at max-min fair rates (a fluid network model).

Each flow follows a path of directed links (a GPU's egress port, a switch uplink, the
receiver's ingress port ...). Rates are max-min fair: progressive filling raises every flow's
rate together until a link saturates, freezes the flows through it at that rate, and goes on
with the capacity left (Bertsekas & Gallager, "Data Networks", sec. 6.5.2). Rates change only
when a flow starts or ends, so a transfer costs a few events whatever its size, never one per
packet (NOTES.md B8). Changes at one instant are handled together: a ring phase that starts
a thousand flows recomputes the rates once.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import simpy

_EPS_BYTES = 1e-6  # flows this close to done count as done (floating-point residue)
_EPS_SECONDS = 1e-12  # ... and so do flows this close in time


class _Flow:
    __slots__ = ("done", "left", "path", "rate")

    def __init__(self, path: tuple[Hashable, ...], nbytes: float, done: simpy.Event) -> None:
        self.path, self.left, self.done, self.rate = path, nbytes, done, 0.0


def max_min_rates(paths: Sequence[Sequence[Hashable]],
                  capacity: dict[Hashable, float]) -> list[float]:
    """Max-min fair rates of flows with the given paths over links of the given capacities
    (progressive filling): no flow can go faster without slowing one that is not faster."""
    rates = [0.0] * len(paths)
    left = {link: capacity[link] for path in paths for link in path}
    users: dict[Hashable, list[int]] = {}
    for i, path in enumerate(paths):
        for link in set(path):
            users.setdefault(link, []).append(i)
    count = {link: len(flows) for link, flows in users.items()}
    active = set(range(len(paths)))
    while active:
        share = min(left[link] / n for link, n in count.items() if n > 0)
        tight = [link for link, n in count.items()
                 if n > 0 and left[link] / n <= share * (1 + 1e-12)]
        for link in tight:
            for i in users[link]:
                if i in active:
                    active.discard(i)
                    rates[i] = share
                    for other in set(paths[i]):
                        left[other] -= share
                        count[other] -= 1
    return rates


class FlowNetwork:
    """Directed links and the flows crossing them, each at its max-min fair rate."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.capacity: dict[Hashable, float] = {}  # bytes/s
        self.carried: dict[Hashable, float] = {}  # bytes that crossed each link
        self._flows: list[_Flow] = []
        self._last = env.now
        self._wake = env.event()
        env.process(self._run())

    def add_link(self, link: Hashable, bandwidth: float) -> None:
        if bandwidth <= 0:
            raise ValueError(f"link {link!r}: bandwidth must be positive (got {bandwidth})")
        self.capacity[link] = bandwidth
        self.carried.setdefault(link, 0.0)

    @property
    def active_flows(self) -> int:
        return len(self._flows)

    def transfer(self, path: Sequence[Hashable], nbytes: float) -> simpy.Event:
        """An event that succeeds when ``nbytes`` have crossed every link of ``path``."""
        done = self.env.event()
        if nbytes <= 0 or not path:
            done.succeed()
            return done
        self._charge()
        flow = _Flow(tuple(path), float(nbytes), done)
        self._flows.append(flow)
        for link in flow.path:
            self.carried[link] += nbytes
        if not self._wake.triggered:
            self._wake.succeed()
        return done

    def _charge(self) -> None:
        """Debit every flow with what it moved at its rate since the last change."""
        elapsed = self.env.now - self._last
        self._last = self.env.now
        if elapsed > 0:
            for flow in self._flows:
                flow.left -= flow.rate * elapsed

    def _rerate(self) -> None:
        rates = max_min_rates([f.path for f in self._flows], self.capacity)
        for flow, rate in zip(self._flows, rates, strict=True):
            flow.rate = rate

    def _run(self):
        while True:
            if not self._flows:
                yield self._wake
                self._wake = self.env.event()
                continue
            yield self.env.timeout(0)  # let every change of this instant arrive first
            self._charge()
            self._rerate()
            first = min(f.left / f.rate for f in self._flows)
            # NOTE: stale timeouts cannot be cancelled in SimPy; they fire harmlessly.
            yield self.env.timeout(max(first, 0.0)) | self._wake
            if self._wake.triggered:
                self._wake = self.env.event()
            self._charge()
            running, finished = [], []
            for f in self._flows:
                done = f.left <= max(_EPS_BYTES, _EPS_SECONDS * f.rate)
                (finished if done else running).append(f)
            self._flows = running
            for flow in finished:
                flow.done.succeed()
