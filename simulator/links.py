"""Links whose bandwidth is shared fairly among the flows crossing them (a fluid model).

``n`` flows on a link of bandwidth ``B`` each progress at ``B/n``; rates change only when a
flow starts or ends, so a transfer costs a handful of events whatever its size, never one per
packet (NOTES.md B8, processor sharing). A flow first waits the link's latency, then joins.
"""

from __future__ import annotations

import simpy

_EPS_BYTES = 1e-6  # flows this close to done count as done (floating-point residue)
_EPS_SECONDS = 1e-12  # ... and so do flows this close in time: a later ``now`` may not differ


class FluidLink:
    """One direction of one link, shared equally by the flows on it."""

    def __init__(self, env: simpy.Environment, bandwidth: float, latency: float = 0.0,
                 name: str = "") -> None:
        if bandwidth <= 0:
            raise ValueError(f"link {name!r}: bandwidth must be positive (got {bandwidth})")
        self.env = env
        self.bandwidth = bandwidth  # bytes/s
        self.latency = latency  # s
        self.name = name
        self.bytes_carried = 0.0
        self._flows: dict[simpy.Event, float] = {}  # done event -> bytes left
        self._last = env.now
        self._wake = env.event()
        env.process(self._run())

    @property
    def active_flows(self) -> int:
        return len(self._flows)

    def transfer(self, nbytes: float) -> simpy.Event:
        """An event that succeeds when ``nbytes`` have crossed the link."""
        done = self.env.event()
        if self.latency:
            self.env.process(self._after_latency(nbytes, done))
        else:
            self._join(nbytes, done)
        return done

    def _after_latency(self, nbytes: float, done: simpy.Event):
        yield self.env.timeout(self.latency)
        self._join(nbytes, done)

    def _join(self, nbytes: float, done: simpy.Event) -> None:
        if nbytes <= 0:
            done.succeed()
            return
        self._charge()
        self._flows[done] = float(nbytes)
        self.bytes_carried += nbytes
        if not self._wake.triggered:
            self._wake.succeed()

    def _charge(self) -> None:
        """Debit every flow with its share of the bytes moved since the last change."""
        elapsed = self.env.now - self._last
        self._last = self.env.now
        if self._flows and elapsed > 0:
            share = elapsed * self.bandwidth / len(self._flows)
            for done in self._flows:
                self._flows[done] -= share

    def _run(self):
        while True:
            if not self._flows:
                yield self._wake
                self._wake = self.env.event()
                continue
            rate = self.bandwidth / len(self._flows)
            # NOTE: stale timeouts cannot be cancelled in SimPy; they fire harmlessly.
            yield self.env.timeout(min(self._flows.values()) / rate) | self._wake
            if self._wake.triggered:
                self._wake = self.env.event()
            self._charge()
            slack = max(_EPS_BYTES, _EPS_SECONDS * self.bandwidth / len(self._flows))
            for done in [d for d, left in self._flows.items() if left <= slack]:
                del self._flows[done]
                done.succeed()
