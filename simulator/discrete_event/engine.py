"""The discrete-event engine: ranks walk their schedule's actions on SimPy streams.

Each simulated rank has five streams, like CUDA streams: compute, TP comm, DP comm, PP send and
PP recv. Its main thread walks its action list in order and runs compute and blocking sends
itself, one op after another, so those streams need no queue; ops that run beside it (TP under
overlap, DP) queue on SimPy resources of capacity one, and the PP streams live in
``transfers.py``. A receive waits for the activation (or gradient) to arrive; a forward or
backward runs its compute and then its tensor-parallel collectives, as Megatron-LM does by
default, or, with ``tp_comm_overlap``, the collectives beside the GEMMs they overlap, so that
only what outlasts them is exposed; a send blocks until the message is through (Megatron-LM's
1F1B), one transfer at a time into a rank, or, asynchronous (``overlap_p2p_comm``), holds its
sender only for what its compute loses beside the transfer (``overlap.send_hold``).
Data-parallel collectives run on the DP stream beside the main thread: gradient buckets are
reduced as the last backward of a chunk produces them (``overlap_grad_reduce``), ZeRO-1/2
parameters gathered at the start of the step, ZeRO-3 units gathered before each use
(``zero3_prefetch`` ahead, ``zero3.py``) and their gradients reduce-scattered after it. While
any collective runs on a rank's DP or TP stream, its compute goes at
``1 - comm_compute_slowdown`` of its speed (NCCL kernels take SMs), re-rated whenever one
starts or ends (``shared_compute.py``).
Activations are allocated by a forward and freed by its backward, so each stage's peak memory
comes from the same timeline as the step time. Spans are recorded only when asked for
(``record``: a trace or a timeline plot); ``simulate`` extends a step of many micro-batches
from a few short ones when that is exact (``steady.py``).

The engine knows nothing of which schedule made the action lists (``schedules.py``) nor of how
a collective is costed (``comm.py``): the two fidelities differ only in their ranks and
communicator.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import replace

import simpy

from clustersim.topologies import network as net
from clustersim.topologies.profile import Profile

from ..costs import memory as mem
from ..costs.result import StepResult, step_result
from ..costs.stage_breakdown import from_totals
from ..costs.stage_costs import StageCosts
from ..inputs import variability
from ..inputs.pool_rules import check_fidelity
from ..inputs.scenario import Scenario
from ..model import workload as wl
from ..network.symmetry import mirrored, tp_width
from ..pipeline.overlap import send_hold
from ..pipeline.schedules import Action, Kind, schedule_named
from ..pipeline.stages import scenario_layout
from . import periodic, progress, steady, walk
from .comm import ClosedFormComm, FabricComm
from .dp_traffic import DataParallelTraffic
from .lowered import lowered_lists
from .rank import Rank, Streams
from .segments import SegmentRunner
from .shared_compute import SharedCompute
from .timeline import Timeline
from .transfers import PipelineTransfers

FIDELITIES = ("representative", "full")
# Allocations between two collections of CPython's youngest generation while a full-fidelity
# step runs (CPython's default: 700). Such a step makes and drops millions of short-lived SimPy
# events, flows and generators; at the default, the collector (its young collections, and
# the whole-heap ones they lead to) took a third of the ECMP example's CPU (128 sequences:
# 13.2 s, 8.8 s with collection off, 8.3 s at 20,000; measured 2026-11-26, issue 26). Cycles
# still go, a few MB of young objects later.
YOUNG_COLLECTION = 50_000
BACKWARDS = {Kind.BACKWARD: "backward", Kind.BACKWARD_INPUT: "input",
             Kind.BACKWARD_WEIGHT: "weight"}


@contextmanager
def _collected_less(less: bool) -> Iterator[None]:
    """With ``less``, young objects collected every ``YOUNG_COLLECTION`` allocations rather
    than CPython's default, for the time inside; the collector's thresholds as they were after.
    Collection never changes an answer, only when garbage goes."""
    before = gc.get_threshold()
    if less and before[0] < YOUNG_COLLECTION:
        gc.set_threshold(YOUNG_COLLECTION, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


class Engine(DataParallelTraffic, SegmentRunner, SharedCompute):
    """One training step of a scenario, simulated event by event."""

    def __init__(self, s: Scenario, fidelity: str = "representative",
                 profile: Profile | None = None, *, record: bool = False,
                 microbatches: int | None = None, symmetry: bool = True) -> None:
        if fidelity not in FIDELITIES:
            raise ValueError(f"fidelity must be one of {FIDELITIES} (got {fidelity!r})")
        p = s.parallel
        self.s, self.fidelity, self.record = s, fidelity, record
        self.m = s.microbatches if microbatches is None else microbatches
        self.env = simpy.Environment()
        self.costs = StageCosts(s, profile)  # each stage's pool's cost model (stage_costs.py)
        self.cm = self.costs.stage(0)
        self.work = self.costs.chunks
        self.chunks = len(self.work)
        layout = scenario_layout(s)
        lowered, passes, self.kinds = lowered_lists(
            schedule_named(p.schedule).build, p.pp, self.m, p.virtual_stages, self.chunks,
            layout.stages, layout.copies)
        self.schedule = dict(lowered)  # tuples, shared by the engines of one shape
        self.passes = Counter(passes)
        self.dispatch_bytes = wl.expert_dispatch_bytes(s)  # one token all-to-all, per rank
        self.timeline = Timeline(enabled=record)
        self.placement = self.cm.placement
        self.width = 1  # GPUs each simulated rank stands for (full fidelity, symmetry.py)
        if fidelity == "full":
            check_fidelity(s, fidelity)
            self.width = tp_width(s) if symmetry else 1
            self.comm = FabricComm(self.env, self.cm, self.placement, self.width,
                                   self.width > 1 and mirrored(s))
            coords = [c for c in self.placement.coordinates() if c["tp"] % self.width == 0]
        else:
            self.comm = ClosedFormComm(self.env, self.costs, self.placement.strides["pp"])
            coords = [{"tp": 0, "cp": 0, "dp": 0, "pp": stage} for stage in range(p.pp)]
        self._pipelines: dict[int, tuple[int, ...]] = {}  # each pipeline's ranks, stage by stage
        self.ranks = [self._rank(c) for c in coords]
        self._apply_variability(fidelity)
        self._by_id = {r.rid: r for r in self.ranks}
        self.transfers = PipelineTransfers(self.env, self.comm, self.timeline, self._p2p_estimate)
        # what a send holds its sender of its transfer, per stage (``overlap.send_hold``)
        self.send_holds = tuple(send_hold(p.overlap_p2p_comm,
                                          self.costs.stage(i).profile.comm_compute_slowdown)
                                for i in range(p.pp))

    def _rank(self, coords: dict[str, int]) -> Rank:
        rid = self.placement.rank(**coords)
        label = f"rank {rid} (stage {coords['pp']}, dp {coords['dp']}, tp {coords['tp']})"
        self.timeline.rank_labels[rid] = label
        stride = self.placement.strides["pp"]  # the rank of each stage's peer: ids are linear
        first = rid - coords["pp"] * stride  # its pipeline's first stage: one list per pipeline
        if first not in self._pipelines:
            self._pipelines[first] = tuple(first + stage * stride
                                           for stage in range(self.s.parallel.pp))
        peers = self._pipelines[first]
        slowdown = self.costs.stage(coords["pp"]).profile.comm_compute_slowdown
        return Rank(rid, coords["pp"], Streams(self.env), peers=peers, slowdown=slowdown)

    def _apply_variability(self, fidelity: str) -> None:
        """Full fidelity: each GPU its own drawn factor (a rank standing for a TP group, the
        group's slowest); representative, one rank per stage standing for all: the expected
        slowest of the GPUs of its cluster, or of its pool (``variability.py``)."""
        v = self.s.cluster.variability if fidelity == "full" else None  # full refuses pools
        drawn = variability.rank_factors(v, self.s.cluster.gpus) if v is not None else None
        for r in self.ranks:
            pool = self.costs.stage(r.stage).s.cluster  # the cluster, or the stage's pool
            r.factor = (max(drawn[r.rid:r.rid + self.width]) if drawn
                        else variability.expected_max(pool.variability, pool.gpus))

    # --- running ------------------------------------------------------------------------------

    def run(self) -> StepResult:
        """Simulate the step; the StepResult of its slowest rank."""
        return self.result(self.totals())

    def totals(self) -> list[steady.Totals]:
        """Simulate the step; per rank, what its StepResult is made of."""
        self.listener, self.ran = progress.current(), 0  # actions run, for a progress bar
        self.actions = sum(len(self.schedule[r.stage]) for r in self.ranks)
        mains = [self.env.process(self._main(rank)) for rank in self.ranks]
        with _collected_less(self.fidelity == "full"):
            self.env.run()
        stuck = [r.rid for r, main in zip(self.ranks, mains, strict=True) if main.is_alive]
        if stuck:  # nothing left to happen, yet a rank waits: a step never to be reported
            raise RuntimeError(f"the simulated step stalled: rank(s) {stuck[:8]} wait for an "
                               "event nothing will trigger (an engine bug: please report it)")
        return [steady.Totals(r.finish, *r.clock.seconds.values(), r.memory.peak,
                              *r.clock.comm.values()) for r in self.ranks]

    def result(self, totals: list[steady.Totals]) -> StepResult:
        """The StepResult of the slowest rank, from the ranks' totals (simulated here or
        extrapolated by ``steady``)."""
        slowest = max(totals, key=lambda t: t.finish)
        stages = from_totals([r.stage for r in self.ranks], totals, slowest.finish)
        return step_result(self.s, slowest.finish, slowest.breakdown(), self._memory(totals),
                           self.fidelity, stages)

    def _main(self, r: Rank) -> Generator:
        self._step_start(r)  # ZeRO-1/2: the parameters the last step updated (dp_traffic.py)
        for a in self.schedule[r.stage]:
            kind = a.kind
            if kind is Kind.RECV_F or kind is Kind.RECV_B:
                what = "act" if kind is Kind.RECV_F else "grad"
                arrival = self.transfers.arrival(what, a.chunk, a.microbatch, r.rid)
                if not arrival.processed:  # the pipeline bubble: waiting for another stage
                    yield from self._wait(r, arrival, "bubble")
            elif kind is Kind.FORWARD:
                yield from self._forward(r, a)
            elif kind in BACKWARDS:
                yield from self._backward(r, a, BACKWARDS[kind])
            elif kind is Kind.SEND_F:
                yield from self._send(r, "act", a, a.chunk + 1)
            elif kind is Kind.SEND_B:
                yield from self._send(r, "grad", a, a.chunk - 1)
            elif kind is Kind.OVERLAP_F_B:
                r.pair = [0.0, 0.0, 0.0, 0.0]
            self.ran += 1
            if self.listener is not None and self.ran % 1024 == 0:
                self.listener(self.ran, self.actions)
        yield from self._finish(r)
        r.finish = self.env.now

    def _forward(self, r: Rank, a: Action) -> Generator:
        w = self.work[a.chunk]
        r.memory.alloc(self.env.now, w.activation_bytes)
        first = r.forwards[a.chunk] == 0
        r.forwards[a.chunk] += 1
        before = self._forward_gate(r, w, first)
        name = f"F{a.microbatch}.{a.chunk}" if self.record else "F"
        if before is None:
            yield from self._segment(r, w.whole, name, "forward")
        else:
            yield from self._pass(r, w, name, "forward", before, None)

    def _backward(self, r: Rank, a: Action, way: str) -> Generator:
        """A backward whole (``way`` "backward"), or its input- or weight-gradient half
        (zero-bubble schedules). The weight gradients exist once the whole or the weight half
        has run, so data-parallel reduction starts there; the input half needs the weights
        (ZeRO-3 gathers them) and the weight half the stored activations, freed after it."""
        w = self.work[a.chunk]
        grads = way != "input"
        if way != "weight":
            r.memory.alloc(self.env.now, w.transient_bytes)
        if grads:
            r.backwards[a.chunk] += 1
        last = grads and r.backwards[a.chunk] == self.passes[a.chunk]
        before, after, every = self._backward_hooks(r, w, way, last)
        name = f"{a.kind}{a.microbatch}.{a.chunk}" if self.record else "B"
        if before is None and after is None:
            yield from self._segment(r, w.whole, name, way)
        else:
            yield from self._pass(r, w, name, way, before, after)
        if r.pair is not None:
            yield from self._end_pair(r, name)
        if every:
            yield from self._zero2_epilogue(r, w, started=self.dp_timing.reduce_overlapped)
        held = w.transient_bytes + w.activation_bytes
        if way == "input":  # the weight half's operands stay, the rest is freed
            r.memory.alloc(self.env.now, w.weight_half_bytes - held)
        elif way == "weight":
            r.memory.free(self.env.now, w.weight_half_bytes)
        else:
            r.memory.free(self.env.now, held)

    # --- pipeline traffic ---------------------------------------------------------------------

    def _send(self, r: Rank, kind: str, a: Action, to_chunk: int) -> Generator:
        """Send an activation (or its gradient) to the rank of ``to_chunk`` (``transfers.py``)."""
        dst = r.peers[self.work[to_chunk].stage]
        arrival = self.transfers.arrival(kind, to_chunk, a.microbatch, dst)
        name = f"{kind} {a.microbatch}.{a.chunk}->{to_chunk}" if self.record else None
        start = self.env.now
        work = self.work[a.chunk]
        yield from self.transfers.send(r.rid, dst, work.message_bytes, arrival, name,
                                       work.message_gather_s, self.send_holds[r.stage])
        r.clock.add("pp", self.env.now - start)

    def _p2p_estimate(self, src: int, dst: int, nbytes: float) -> float:
        """A transfer's closed form between the two ranks' stages: what an asynchronous send's
        wait is taken from where only the fabric knows the transfer (full fidelity)."""
        a, b = self._by_id[src].stage, self._by_id[dst].stage
        return net.p2p_time(self.costs.send_links(a, b), nbytes)

    # --- primitives ---------------------------------------------------------------------------

    def _busy(self, r: Rank, seconds: float, comm: dict[str, float] | None, name: str,
              cause: str) -> Generator:
        """``seconds`` of compute on the compute stream, then ``comm`` (seconds of exposed
        collectives by kind, in order) each on its stream, one after the other (the TP stream
        is idle: collectives overlapped earlier were waited for). At a constant compute rate
        all are known up front, so one timeout covers them."""
        parts = [(kind, t) for kind, t in (comm or {}).items() if t > 0]
        exposed = sum(t for _, t in parts)
        if r.slowdown == 0 and seconds > 0 and exposed > 0:
            start = self.env.now
            yield self.env.timeout(seconds + exposed)
            self._spent(r, "compute", name, cause, start, start + seconds)
            self._collectives(r, parts, name, start + seconds)
            return
        yield from self._compute(r, seconds, name, cause)
        if exposed > 0:
            start = self.env.now
            yield self.env.timeout(exposed)
            self._collectives(r, parts, name, start)

    def _collectives(self, r: Rank, parts: list[tuple[str, float]], name: str,
                     start: float) -> None:
        """Exposed collectives run back to back from ``start``: each kind (tp, cp, ep) on its
        stream of the timeline and charged to its kind."""
        for kind, seconds in parts:
            self._spent(r, kind, name, kind, start, start + seconds)
            start += seconds

    def _spent(self, r: Rank, stream: str, name: str, cause: str, start: float,
               end: float) -> None:
        """The main thread ran ``name`` on ``stream`` from ``start`` to ``end``, for ``cause``."""
        self.timeline.record(r.rid, stream, name, start, end)
        r.clock.add(cause, end - start)

    def _hold(self, seconds: float) -> Generator:
        yield self.env.timeout(seconds)

    def _wait(self, r: Rank, event: simpy.Event, cause: str) -> Generator:
        """The main thread waits for ``event``; the wait is charged to ``cause``."""
        start = self.env.now
        yield event
        r.clock.add(cause, self.env.now - start)

    def _async(self, r: Rank, stream: str, name: str, body: Generator,
               label: str | None = None) -> simpy.Process:
        """Run ``body`` on ``stream`` beside the main thread, in the stream's order; its span
        goes on the timeline's ``label`` stream (default ``stream``)."""
        def op() -> Generator:
            with r.streams[stream].request() as request:
                yield request
                begin = self.env.now
                self._nccl(r, +1)
                yield from body
                self._nccl(r, -1)
            self.timeline.record(r.rid, label or stream, name, begin, self.env.now)
        return self.env.process(op())

    def _started(self, r: Rank, stream: str, name: str, op) -> simpy.Event:
        """``_async`` for an op that starts as one event (``comm.PortRing``): on an idle
        stream it needs no process and no request, only the NCCL count around it, raised
        when it starts and lowered when it ends before anyone waiting for it resumes (as
        ``_async``'s process does, at the same instants). The main thread waits for every TP
        op before issuing the next, so the TP stream is idle here; if not, ``_async``. The
        event may be a reservation's timer, which the main thread waits on only through
        ``op.current`` (``FlowNetwork.current``: the flow's end if the ring's port was shared).
        """
        queue = r.streams[stream]
        if queue.users or queue.queue:
            return self._async(r, stream, name, op)
        begin = self.env.now
        self._nccl(r, +1)
        done = op.start(at_once=True)  # waited for through ``op.current`` (``_segment``)

        def end(_event: simpy.Event) -> None:
            self._nccl(r, -1)
            self.timeline.record(r.rid, stream, name, begin, self.env.now)
        if done.callbacks is None:  # done already (nothing to send)
            end(done)
        else:
            done.callbacks.append(end)
        return done

    def _memory(self, totals: list[steady.Totals]) -> list[mem.StageMemory]:
        """Closed-form model states and buffers; activations at the timeline's peak."""
        peaks = [0.0] * self.s.parallel.pp
        for r, t in zip(self.ranks, totals, strict=True):
            peaks[r.stage] = max(peaks[r.stage], t.peak_activations)
        return [replace(mem.stage_memory(self.s, i), activations=peaks[i])
                for i in range(self.s.parallel.pp)]


def simulate(s: Scenario, fidelity: str = "representative", profile: Profile | None = None,
             trace: str | None = None) -> StepResult:
    """Simulate one step of ``s``; with ``trace``, also write its Chrome trace there.

    Without a trace, a step of many micro-batches is simulated for a few micro-batch counts
    and extended along its steady state (``steady.py``) when that is exact, or walked once at
    a shorter count whose last units repeat (``periodic.py``) where that costs less than half
    the three counts (or they cost more than half the step); each simulation is walked
    without SimPy where that gives the engine's answer (``walk.py``)."""
    if trace:
        engine = Engine(s, fidelity, profile, record=True)
        result = engine.run()
        engine.timeline.write_chrome_trace(trace)
        return result
    engines: list[Engine] = []

    def totals(m: int | None) -> list[steady.Totals]:
        engines.append(Engine(s, fidelity, profile, microbatches=m))
        return walk.walked_totals(engines[-1]) or engines[-1].totals()

    def engine_at(m: int) -> Engine:
        engines.append(Engine(s, fidelity, profile, microbatches=m))
        return engines[-1]

    counts, extended = steady.sample_counts(s), None
    if walk.may_walk(s, fidelity):  # one walk, where it costs less than half the three
        extended = periodic.extended(s, engine_at, None if counts is None else sum(counts) / 2)
    if extended is None and counts is not None:
        extended = steady.extrapolated(s, totals)
    if extended is None:
        extended = totals(None)
    return engines[-1].result(extended)
