"""Reserved flows: a flow that expects its links to itself, as one timer (issue 26, item 3).

A tensor-parallel ring inside a node runs as one flow through both directions of each member's
NVLink port (``fabric.Fabric.tensor_ring``); where the group owns its ports (data-parallel and
pipeline peers in other nodes, as under tp 8 on 8-GPU nodes), nothing else ever crosses them,
and a flow alone on its links ends at its closed form: its alphas, then its bytes at its
slowest link's rate. A reservation is that: one timer, instead of a start, an end-of-flow alarm
and a settling of the network. It is exact, not assumed: a flow that comes onto a reserved link
before the reservation ends takes it back (``_release``) as the flow ``transfer`` would have
started, alone on its links until then, and the network re-rates both from that instant, so
every end is the flow network's (``tests/simulator/test_flow_reserve.py`` checks this against
hand-worked max-min figures, a plain fluid simulation, and the engine without reservations).
A mixin of ``flows.FlowNetwork``: it uses the network's clock, links, ``transfer``, ``_start``
and ``_adopt``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import simpy


class _Reservation:
    """A flow of ``nbytes`` promised ``links`` from ``start`` to ``end`` at ``rate`` (its
    slowest link's), one of ``group``; ``live`` until it ends or another flow comes."""

    __slots__ = ("end", "group", "links", "live", "nbytes", "rate", "start")

    def __init__(self, links: tuple[Hashable, ...], nbytes: float, group: list, start: float,
                 rate: float) -> None:
        self.links, self.nbytes, self.group = links, nbytes, group
        self.start, self.rate, self.live = start, rate, True
        self.end = start + nbytes / rate  # as ``_start`` times a flow alone on its links


class Reservations:
    """Reserving flows on a ``FlowNetwork`` (mixed into it): ``_reserved`` maps each reserved
    link to its reservation."""

    _reserved: dict[Hashable, _Reservation]
    _moved: dict[simpy.Event, simpy.Event]  # a taken-back ``at_once`` timer -> the flow's end

    def reserve(self, path: Sequence[Hashable], nbytes: float, after: float = 0.0,
                at_once: bool = False) -> simpy.Event:
        """``transfer``, for a flow that expects its links to itself (a tensor-parallel ring
        through its member's NVLink port): if no flow crosses them now, it is one timer at the
        end a flow alone there takes (``after``, then ``nbytes`` at its slowest link's rate)
        instead of a start, an alarm and a settling. A flow that comes onto one of its links
        before that end turns it back into the flow ``transfer`` would have started
        (``_release``), so its end, and every other flow's, is the flow network's. With
        ``at_once`` the event is the timer itself, one event fewer: ``_release`` moves its
        callbacks and waiters onto the flow's own end, so a wait begun later must wait on
        ``current(event)``, not on the timer, which still goes off at the reserved end."""
        links = tuple(dict.fromkeys(path))
        on, reserved = self._on, self._reserved
        if nbytes <= 0 or not links:
            return self.transfer(path, nbytes, after)
        for link in links:
            if on[link] or link in reserved:
                return self.transfer(path, nbytes, after)
        now, capacity = self.env.now, self.capacity
        rate = capacity[links[0]]
        for link in links:
            rate = min(rate, capacity[link])
        held = _Reservation(links, float(nbytes), [1, None], now + after, rate)
        for link in links:
            reserved[link] = held
            self.carried[link] += nbytes
        timer = self.env.timeout(held.end - now)
        timer.callbacks.append(lambda _: self._reserved_end(held))
        held.group[1] = timer if at_once else self.env.event()
        return held.group[1]

    def current(self, event: simpy.Event) -> simpy.Event:
        """The event that now stands for ``event``: the flow's own end for the timer of an
        ``at_once`` reservation taken back, else ``event`` itself."""
        return self._moved.get(event, event)

    def _reserved_end(self, held: _Reservation) -> None:
        """A reservation's timer: unless another flow took it back, its transfer is done
        (its waiters resume on this timer, or on the event it succeeds)."""
        if not held.live:
            return
        held.live = False
        for link in held.links:
            del self._reserved[link]
        if not held.group[1].triggered:
            held.group[1].succeed()

    def _release(self, held: _Reservation) -> None:
        """Another flow comes onto ``held``'s links: from here it is the flow ``transfer``
        would have started at ``held.start``, alone there until now (so at its slowest link's
        rate, ending at ``held.end`` unless re-rated), or, before that start, that start."""
        held.live = False
        for link in held.links:
            del self._reserved[link]
        timer = held.group[1]
        if timer.triggered:  # ``at_once``: its waiters move onto the flow's own end
            held.group[1] = self._moved[timer] = self.env.event()
            held.group[1].callbacks, timer.callbacks = timer.callbacks, []
        now = self.env.now
        if now < held.start:
            self.env.timeout(held.start - now).callbacks.append(
                lambda _: self._start(held.links, held.nbytes, held.group, counted=True))
            return
        self._adopt(held)
