"""Flows across several links at once, at max-min fair rates (a fluid network model).

Each flow follows a path of directed links (a GPU's egress port, a switch uplink, the
receiver's ingress port ...). Rates are max-min fair: progressive filling raises every flow's
rate together until a link saturates, freezes the flows through it at that rate, and goes on
with the capacity left (Bertsekas & Gallager, "Data Networks", sec. 6.5.2). Rates change only
when a flow starts or ends, so a transfer costs a few events whatever its size, never one per
packet (NOTES.md B8). Changes at one instant are handled together, once everything else at
that instant has run (a ring phase that starts a thousand flows re-rates once), and only the
flows that share links with a changed one, transitively, are re-rated, component by component:
a pipeline send between two idle ports leaves a data-parallel ring elsewhere alone. A flow onto
links no flow crosses (a tensor-parallel ring's NVLink port, mostly) takes its rate, its
slowest link's, when it starts, without waiting for the instant's settling, which re-rates it
only if another flow joins it then. The network is driven by event callbacks, not a SimPy
process, so a flow costs its own end and nothing per re-rate; a collective's flows are one
bundle, one event when its last flow ends. A flow expected to have its links to itself (a
tensor-parallel ring's port) can be reserved instead (``reserve``): while no other flow comes
onto those links it is one timer at its closed-form end; one that does turns it back into the
flow it stands for, so the answer is the same.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Sequence

import simpy

from .reserve import Reservations, _Reservation

_EPS_BYTES = 1e-6  # flows this close to done count as done (floating-point residue)
_EPS_SECONDS = 1e-12  # ... and so do flows this close in time
# SimPy processes an instant's events by priority, URGENT (0) then NORMAL (1): the network's
# own events come last, once every flow that starts or ends at that instant has.
_LATE = 2
# Components at least this many flows are filled by numpy over arrays of links and flows;
# smaller ones (most: a few ring flows, one pipeline send) by the heap in pure Python, whose
# per-call cost is lower: on rings over ports of one speed the two cost the same near 256
# flows (2 cores, numpy 1.26), numpy 2x faster at 1,024.
VECTOR_FLOWS = 256
# Links whose fair shares differ by less than this, relatively, saturate together.
_TIE = 1e-12


def max_min_rates(paths: Sequence[Sequence[Hashable]],
                  capacity: dict[Hashable, float]) -> list[float]:
    """Max-min fair rates of flows with the given paths over links of the given capacities
    (progressive filling): no flow can go faster without slowing one that is not faster."""
    if len(paths) >= VECTOR_FLOWS:
        return vector_rates(paths, capacity)
    return heap_rates(paths, capacity)


def heap_rates(paths: Sequence[Sequence[Hashable]],
               capacity: dict[Hashable, float]) -> list[float]:
    """Progressive filling with the links in a heap by fair share (capacity left / flows not
    yet frozen): the smallest saturates next and freezes its flows; stale entries are skipped."""
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


def vector_rates(paths: Sequence[Sequence[Hashable]],
                 capacity: dict[Hashable, float]) -> list[float]:
    """Progressive filling over numpy arrays: each round, every link's fair share (capacity
    left / unfrozen flows on it) at once; the links at the smallest saturate together, their
    unfrozen flows freeze at it, and their rates come off every link they cross. As many
    rounds as distinct bottleneck levels, each linear in the (flow, link) pairs."""
    import numpy as np  # here, not at the top: representative steps start without numpy

    index: dict[Hashable, int] = {}
    flow_of: list[int] = []
    link_of: list[int] = []
    for i, path in enumerate(paths):
        for link in dict.fromkeys(path):
            flow_of.append(i)
            link_of.append(index.setdefault(link, len(index)))
    pair_flow, pair_link = np.array(flow_of), np.array(link_of)
    n_links = len(index)
    left = np.array([capacity[link] for link in index], dtype=float)
    rates = np.full(len(paths), np.nan)
    live = np.ones(len(pair_flow), dtype=bool)  # pairs whose flow is not frozen yet
    while live.any():
        count = np.bincount(pair_link[live], minlength=n_links)
        busy = count > 0
        share = np.full(n_links, np.inf)
        share[busy] = np.maximum(left[busy], 0.0) / count[busy]
        level = share.min()
        saturated = share <= level * (1 + _TIE)
        frozen = np.zeros(len(paths), dtype=bool)
        frozen[pair_flow[live & saturated[pair_link]]] = True
        rates[frozen] = level
        newly = live & frozen[pair_flow]
        left -= np.bincount(pair_link[newly], minlength=n_links) * level
        live &= ~newly
    return np.nan_to_num(rates, nan=0.0).tolist()


class _Late(simpy.Event):
    """An event, triggered at creation like a ``Timeout``, that runs ``callback`` ``delay``
    from now after every URGENT and NORMAL event of that instant."""

    def __init__(self, env: simpy.Environment, callback, delay: float = 0.0) -> None:
        super().__init__(env)
        self.callbacks.append(callback)
        self._ok, self._value = True, None
        env.schedule(self, _LATE, delay)  # type: ignore[arg-type]


class _Flow:
    """A flow's bytes ``left`` at time ``since``, moving at ``rate`` until re-rated; ``links``
    its distinct links; ``group`` the [flows not done, event] of the transfer it belongs to."""

    __slots__ = ("group", "left", "links", "rate", "since", "version")

    def __init__(self, links: tuple[Hashable, ...], nbytes: float, group: list,
                 now: float) -> None:
        self.links, self.left, self.group = links, nbytes, group
        self.rate, self.since, self.version = 0.0, now, 0

    def left_at(self, now: float) -> float:
        return self.left - self.rate * (now - self.since)


class FlowNetwork(Reservations):
    """Directed links and the flows crossing them, each at its max-min fair rate; flows that
    expect their links to themselves can be reserved (``reserve.Reservations``)."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.capacity: dict[Hashable, float] = {}  # bytes/s
        self.carried: dict[Hashable, float] = {}  # bytes that crossed each link
        self._on: dict[Hashable, set[_Flow]] = {}  # link -> flows crossing it
        self._changed: set[Hashable] = set()  # links whose flows changed this instant
        self._ends: list[tuple[float, int, int, _Flow]] = []  # (end, version, tie, flow)
        self._count = 0
        self._settling = False  # a settling of this instant's changes is scheduled
        self._alarm = math.inf  # when the earliest pending end-of-flow alarm goes off
        self._reserved: dict[Hashable, _Reservation] = {}  # link -> the reservation on it
        self._moved: dict[simpy.Event, simpy.Event] = {}  # ``Reservations.current``

    def add_link(self, link: Hashable, bandwidth: float) -> None:
        if bandwidth <= 0:
            raise ValueError(f"link {link!r}: bandwidth must be positive (got {bandwidth})")
        self.capacity[link] = bandwidth
        self.carried.setdefault(link, 0.0)
        self._on.setdefault(link, set())

    @property
    def active_flows(self) -> int:
        flows = {f for flows in self._on.values() for f in flows}
        return len(flows) + len({id(r) for r in self._reserved.values()})

    def transfer(self, path: Sequence[Hashable], nbytes: float,
                 after: float = 0.0) -> simpy.Event:
        """An event that succeeds when ``nbytes`` have crossed every link of ``path``, the
        flow starting ``after`` from now (a collective's alphas: a timeout whose callback
        starts it, so the process waiting on it resumes once, not twice)."""
        done = self.env.event()
        if nbytes <= 0 or not path:
            if after > 0:
                self.env.timeout(after).callbacks.append(lambda _: done.succeed())
            else:
                done.succeed()
            return done
        group = [1, done]
        if after > 0:
            self.env.timeout(after).callbacks.append(
                lambda _: self._start(path, float(nbytes), group))
        else:
            self._start(path, float(nbytes), group)
        return done

    def _adopt(self, held: _Reservation) -> None:
        """``held`` as the flow that started alone at ``held.start``: on its links, at its
        slowest link's rate, its end queued as ``_start`` queues it (``Reservations._release``)."""
        flow = _Flow(held.links, held.nbytes, held.group, held.start)
        flow.rate, flow.version = held.rate, 1
        for link in held.links:
            self._on[link].add(flow)
        self._count += 1
        heapq.heappush(self._ends, (held.end, 1, self._count, flow))
        self._arm()

    def transfer_all(self, paths: Sequence[Sequence[Hashable]], nbytes: float) -> simpy.Event:
        """One flow of ``nbytes`` along each of ``paths``, all at once; an event that succeeds
        when the last of them is through (a bundle of mirror flows waits for its slowest)."""
        return self.bundle([(path, nbytes) for path in paths])

    def bundle(self, flows: Sequence[tuple[Sequence[Hashable], float]],
               after: float = 0.0) -> simpy.Event:
        """One flow per (path, bytes), all at once, ``after`` from now; an event that succeeds
        when the last of them is through: a collective's flows, which ends with its slowest,
        as one event rather than one each and a condition over them."""
        done = self.env.event()
        flows = [(path, float(nbytes)) for path, nbytes in flows if path and nbytes > 0]
        if not flows:
            if after > 0:
                self.env.timeout(after).callbacks.append(lambda _: done.succeed())
            else:
                done.succeed()
            return done
        group = [len(flows), done]
        if after > 0:
            self.env.timeout(after).callbacks.append(lambda _: self._start_all(flows, group))
        else:
            self._start_all(flows, group)
        return done

    def _start_all(self, flows: Sequence[tuple[Sequence[Hashable], float]],
                   group: list) -> None:
        for path, nbytes in flows:
            self._start(path, nbytes, group)

    def _start(self, path: Sequence[Hashable], nbytes: float, group: list,
               counted: bool = False) -> None:
        """A flow of ``nbytes`` along ``path`` from now, one of ``group``; this instant's
        settling re-rates it with whatever shares its links. Onto links no flow crosses (a
        tensor-parallel ring's port, mostly) it gets its rate, its slowest link's, at once,
        as the settling would give it: only a flow that joins it this instant re-rates it.
        A reservation on its links becomes a flow first (``_release``); ``counted``: its bytes
        are in ``carried`` already (a reservation's)."""
        links = tuple(dict.fromkeys(path))  # distinct, in path order
        now, on, carried, reserved = self.env.now, self._on, self.carried, self._reserved
        if reserved:
            for link in links:
                held = reserved.get(link)
                if held is not None:
                    self._release(held)
        flow = _Flow(links, nbytes, group, now)
        alone = not any(on[link] for link in links)
        for link in links:
            on[link].add(flow)
            if not counted:
                carried[link] += nbytes
        if alone:
            flow.rate, flow.version = min(self.capacity[link] for link in links), 1
            self._count += 1
            heapq.heappush(self._ends, (now + nbytes / flow.rate, 1, self._count, flow))
            self._arm()
            return
        self._changed.update(links)
        if not self._settling:
            self._settling = True
            _Late(self.env, self._settle)

    # --- the instant's bookkeeping -------------------------------------------------------------

    def _settle(self, _event: simpy.Event | None = None) -> None:
        """End the flows due now, re-rate what their ends and this instant's starts touched,
        and set the alarm for the next end."""
        self._settling = False
        self._finish_due()
        if self._changed:
            self._rerate()
        self._arm()

    def _on_alarm(self, _event: simpy.Event) -> None:
        if self.env.now >= self._alarm:
            self._alarm = math.inf
        self._settle()

    def _arm(self) -> None:
        """An alarm at the earliest end, unless one goes off by then (a later one that is
        left pending goes off harmlessly: SimPy cannot cancel an event)."""
        ends = self._ends
        while ends and ends[0][1] != ends[0][3].version:  # stale: re-rated or done since
            heapq.heappop(ends)
        if ends and ends[0][0] < self._alarm:
            delay = max(ends[0][0] - self.env.now, 0.0)
            # The instant SimPy fires it at (now + delay), which may lie an ulp from the end
            # itself: ``_on_alarm`` must recognise its own alarm, or no later one is set.
            self._alarm = self.env.now + delay
            _Late(self.env, self._on_alarm, delay)

    def _components(self, seeds: set[Hashable]) -> list[list[_Flow]]:
        """The flows linked to the seed links through shared links, one list per connected
        component: max-min rates are set within a component alone, and a flow alone in its
        component is alone on every link it crosses."""
        on, seen, taken = self._on, set(), set()
        parts: list[list[_Flow]] = []
        for seed in seeds:
            if seed in seen:
                continue
            flows: list[_Flow] = []
            todo = [seed]
            while todo:
                link = todo.pop()
                if link in seen:
                    continue
                seen.add(link)
                for flow in on[link]:
                    if flow not in taken:
                        taken.add(flow)
                        flows.append(flow)
                        todo.extend(flow.links)
            if flows:
                parts.append(flows)
        return parts

    def _rerate(self) -> None:
        """Max-min rates for the flows sharing links with this instant's changes, component by
        component: a flow alone on every link it crosses (a tensor-parallel ring's port) runs
        at its slowest link, the others are filled together; a flow whose rate stays keeps its
        place in the queue of ends."""
        now, capacity, ends = self.env.now, self.capacity, self._ends
        parts = self._components(self._changed)
        self._changed.clear()
        for flows in parts:
            if len(flows) == 1:
                rates = [min(capacity[link] for link in flows[0].links)]
            else:
                rates = max_min_rates([flow.links for flow in flows], capacity)
            for flow, rate in zip(flows, rates, strict=True):
                if rate == flow.rate and rate > 0:
                    continue
                flow.left, flow.since = flow.left_at(now), now
                flow.rate, flow.version = rate, flow.version + 1
                if rate > 0:
                    self._count += 1
                    heapq.heappush(ends, (now + flow.left / rate, flow.version, self._count,
                                          flow))

    def _finish_due(self) -> None:
        """End the flows due now; their links change, their transfers may be done."""
        now, ends, on, changed = self.env.now, self._ends, self._on, self._changed
        while ends:
            end, version, _, flow = ends[0]
            if version != flow.version:  # re-rated since: a stale entry
                heapq.heappop(ends)
                continue
            slack = max(_EPS_BYTES, _EPS_SECONDS * flow.rate)
            if end > now and flow.left_at(now) > slack:
                break
            heapq.heappop(ends)
            flow.version += 1
            for link in flow.links:
                on[link].discard(flow)
            changed.update(flow.links)
            group = flow.group
            group[0] -= 1
            if group[0] == 0:
                group[1].succeed()
