"""Activations and their gradients between pipeline stages: the engine's PP send and recv streams.

A send is blocking (Megatron-LM's ``p2p_communication`` outside its interleaved schedule): the
sender's main thread waits until the transfer is through, so its send stream never queues. An
asynchronous send (``parallel.overlap_p2p_comm``) holds its sender, once its transfer has begun,
for what the compute beside it loses (``overlap.send_hold`` of the transfer: of its closed form
where only the fabric knows it), and the message arrives when the transfer ends. A rank receives one
transfer at a time: an activation from upstream and a gradient from downstream arriving
together queue on its recv stream, first come first served. When the communicator knows a
transfer's duration up front (closed-form costs, nothing contends), that queue needs no SimPy
resource: each transfer into a rank starts when the one granted before it ends, which is what
a FIFO resource of capacity one would grant, at the cost of one timeout. Otherwise (full
fidelity, where a transfer's flow shares links with whatever runs then) the recv stream is a
first-come-first-served queue of transfers, each started as the one before it ends.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from typing import Protocol

import simpy

from .timeline import Timeline


class PointToPoint(Protocol):
    """What the transfers need of a communicator (``comm.py``)."""

    def p2p(self, src: int, dst: int, nbytes: float) -> Generator: ...

    def p2p_seconds(self, src: int, dst: int, nbytes: float) -> float | None: ...


class PipelineTransfers:
    """Every rank's PP streams, and the arrival of each message a rank waits for."""

    def __init__(self, env: simpy.Environment, comm: PointToPoint, timeline: Timeline,
                 estimate: Callable[[int, int, float], float] | None = None) -> None:
        self.env, self.comm, self.timeline = env, comm, timeline
        # (src, dst, bytes) -> a transfer's closed form, what an asynchronous send's wait is
        # taken from where only the fabric knows the transfer (full fidelity)
        self.estimate = estimate
        self._arrivals: dict[tuple, simpy.Event] = {}
        self._recv_free: dict[int, float] = {}  # rank -> when its recv stream is next free
        # rank -> its recv stream's transfers: the one under way first, then each waiting
        # one's turn (full fidelity, ``_queued``)
        self._recv_queues: dict[int, deque] = {}

    def arrival(self, kind: str, chunk: int, microbatch: int, rank: int) -> simpy.Event:
        """The event of ``rank`` having received ``kind`` ("act" or "grad") of ``microbatch``
        for model chunk ``chunk``; the same event for the sender and the receiver."""
        key = (kind, chunk, microbatch, rank)
        event = self._arrivals.get(key)
        if event is None:
            event = self._arrivals[key] = self.env.event()
        return event

    def send(self, src: int, dst: int, nbytes: float, arrival: simpy.Event,
             name: str | None, gather: float = 0.0, hold: float = 1.0) -> Generator:
        """Send ``nbytes`` from ``src`` to ``dst``; ``arrival`` fires when they have arrived.
        ``gather`` seconds of reassembly on arrival (scatter-gather's TP all-gather) count as
        part of the transfer. A blocking send (``hold`` 1) returns once the receiver has it
        whole; an asynchronous one once its transfer has begun and ``hold`` of it has passed
        (``overlap.send_hold``), the transfer going on alone. ``name`` labels the spans when
        the timeline records them."""
        seconds = self.comm.p2p_seconds(src, dst, nbytes)
        if seconds is None:
            if hold < 1:
                self.env.process(self._flow(src, dst, nbytes, arrival, name, gather))
                yield self.env.timeout(hold * (self.estimate(src, dst, nbytes) + gather))
            else:
                yield from self._flow(src, dst, nbytes, arrival, name, gather)
            return
        seconds += gather
        begin = max(self.env.now, self._recv_free.get(dst, 0.0))
        self._recv_free[dst] = begin + seconds
        if hold < 1:
            done = self.env.timeout(begin + seconds - self.env.now)
            done.callbacks.append(lambda _: self._delivered(src, dst, arrival, name, begin))
            yield self.env.timeout(begin + hold * seconds - self.env.now)
            return
        yield self.env.timeout(begin + seconds - self.env.now)
        self._delivered(src, dst, arrival, name, begin)

    def _flow(self, src: int, dst: int, nbytes: float, arrival: simpy.Event, name: str | None,
              gather: float) -> Generator:
        """A transfer as flows on the fabric, queued on ``dst``'s recv stream, then its
        reassembly; ``arrival`` fires at its end."""
        begin = yield from self._queued(src, dst, nbytes)
        if gather:
            yield self.env.timeout(gather)
        self._delivered(src, dst, arrival, name, begin)

    def _delivered(self, src: int, dst: int, arrival: simpy.Event, name: str | None,
                   begin: float) -> None:
        """A transfer begun at ``begin`` has arrived: recorded where named, ``arrival`` fired."""
        if name is not None:
            self.timeline.record(src, "pp_send", name, begin, self.env.now)
            self.timeline.record(dst, "pp_recv", name, begin, self.env.now)
        arrival.succeed()

    def _queued(self, src: int, dst: int, nbytes: float) -> Generator:
        """A transfer whose duration only the fabric knows, in ``dst``'s recv queue, first
        come first served, as a SimPy resource of capacity one grants it, without a request
        and a release event of its own: a transfer into an idle stream starts at once, one
        into a busy stream when the transfers queued before it have ended; returns when it
        started."""
        waiting = self._recv_queues.get(dst)
        if waiting is None:
            waiting = self._recv_queues[dst] = deque()
        if waiting:  # busy: wait for a turn, which the transfer ahead hands on as it ends
            turn = self.env.event()
            waiting.append(turn)
            yield turn
        else:
            waiting.append(None)  # the transfer under way
        begin = self.env.now
        yield from self.comm.p2p(src, dst, nbytes)
        waiting.popleft()
        if waiting:
            waiting[0].succeed()
        return begin
