"""The discrete-event engine: ranks walk their schedule's actions on SimPy streams.

Each simulated rank has five streams (compute, TP comm, DP comm, PP send, PP recv), each a
SimPy resource of capacity one, like a CUDA stream. The rank's main thread walks its action list
in order: a receive waits for the activation (or gradient) to arrive; a forward or backward runs
its compute on the compute stream and its tensor-parallel collectives on the TP stream, one
after the other as Megatron-LM does by default, or, with ``tp_comm_overlap``, the collectives
beside the GEMMs they overlap, so that only what outlasts them is exposed; a send holds the PP
streams of both ends until the message is through (a blocking send, Megatron-LM's default).
Data-parallel collectives run on the DP stream beside the main thread: gradient buckets are
reduced as the last backward of a chunk produces them (``overlap_grad_reduce``), ZeRO-1/2
parameters gathered at the start of the step, ZeRO-3 units gathered before each use
(``zero3_prefetch`` ahead, ``zero3.py``) and their gradients reduce-scattered after it. While
any collective runs on a rank's DP or TP stream, its compute goes at
``1 - comm_compute_slowdown`` of its speed (NCCL kernels take SMs), re-rated whenever one
starts or ends (a fluid model, as ``links.py`` for flows).
Activations are allocated by a forward and freed by its backward, so each stage's peak memory
comes from the same timeline as the step time.

The engine knows nothing of which schedule made the action lists (``schedules.py``) nor of how
a collective is costed (``comm.py``): the two fidelities differ only in their ranks and
communicator.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass, field, replace

import simpy

from clustersim.topologies.profile import Profile

from . import memory as mem
from . import workload as wl
from . import zero3
from .analytic import CostModel, optimizer_time, step_result
from .comm import ClosedFormComm, FabricComm
from .result import StepResult
from .scenario import Scenario
from .schedules import Action, Kind, build_schedule, with_communication
from .timeline import STREAMS, Attribution, MemoryTracker, Timeline
from .work import ChunkWork, Segment, chunk_work

FIDELITIES = ("representative", "full")


@dataclass(eq=False)
class Rank:
    """One simulated GPU: its streams, its clock by cause and its memory."""

    rid: int
    stage: int
    streams: dict[str, simpy.Resource]
    clock: Attribution = field(default_factory=Attribution)
    memory: MemoryTracker = field(default_factory=MemoryTracker)
    pending: list[simpy.Event] = field(default_factory=list)  # DP ops to finish before the step
    gathers: dict[tuple[int, int], simpy.Event] = field(default_factory=dict)
    forwards: Counter = field(default_factory=Counter)  # per chunk
    backwards: Counter = field(default_factory=Counter)
    peers: list[int] = field(default_factory=list)  # the rank of each stage in its pipeline
    finish: float = 0.0
    nccl_active: int = 0  # collectives running on the DP or TP stream right now
    nccl_change: simpy.Event | None = None  # fires when nccl_active changes


class Engine:
    """One training step of a scenario, simulated event by event."""

    def __init__(self, s: Scenario, fidelity: str = "representative",
                 profile: Profile | None = None) -> None:
        if fidelity not in FIDELITIES:
            raise ValueError(f"fidelity must be one of {FIDELITIES} (got {fidelity!r})")
        p = s.parallel
        self.s, self.fidelity = s, fidelity
        self.env = simpy.Environment()
        self.cm = CostModel(s, profile)
        self.slowdown = self.cm.profile.comm_compute_slowdown
        self.work = chunk_work(self.cm)
        self.chunks = len(self.work)
        self.schedule = with_communication(
            build_schedule(p.schedule, p.pp, s.microbatches, p.virtual_stages), self.chunks)
        self.weight_bytes = wl.BYTES[s.training.precision]  # per parameter, as gathered
        self.grad_bytes = wl.BYTES[s.training.grad_dtype]  # per parameter, as reduced
        self.timeline = Timeline()
        self.placement = self.cm.placement
        if fidelity == "full":
            self.comm = FabricComm(self.env, self.cm, self.placement)
            coords = self.placement.coordinates()
        else:
            self.comm = ClosedFormComm(self.env, self.cm)
            coords = [{"tp": 0, "cp": 0, "dp": 0, "pp": stage} for stage in range(p.pp)]
        self.ranks = [self._rank(c) for c in coords]
        self._by_id = {r.rid: r for r in self.ranks}
        self._arrivals: dict[tuple, simpy.Event] = {}

    def _rank(self, coords: dict[str, int]) -> Rank:
        rid = self.placement.rank(**coords)
        label = f"rank {rid} (stage {coords['pp']}, dp {coords['dp']}, tp {coords['tp']})"
        self.timeline.rank_labels[rid] = label
        streams = {name: simpy.Resource(self.env, capacity=1) for name in STREAMS}
        peers = [self.placement.rank(**{**coords, "pp": stage})
                 for stage in range(self.s.parallel.pp)]
        return Rank(rid, coords["pp"], streams, peers=peers)

    # --- running ------------------------------------------------------------------------------

    def run(self) -> StepResult:
        """Simulate the step; the StepResult of its slowest rank."""
        for rank in self.ranks:
            self.env.process(self._main(rank))
        self.env.run()
        slowest = max(self.ranks, key=lambda r: r.finish)
        breakdown = slowest.clock.breakdown()
        return step_result(self.s, slowest.finish, breakdown, self._memory(), self.fidelity)

    def _main(self, r: Rank) -> Generator:
        p = self.s.parallel
        if p.zero in (1, 2) and p.overlap_param_gather:
            self._gather_all(r)  # the updated parameters of the last step, needed by forwards
        for a in self.schedule[r.stage]:
            if a.kind is Kind.FORWARD:
                yield from self._forward(r, a)
            elif a.kind is Kind.BACKWARD:
                yield from self._backward(r, a)
            elif a.kind is Kind.RECV_F:
                yield from self._wait(r, self._arrival("act", a.chunk, a.microbatch, r.rid),
                                      "bubble")
            elif a.kind is Kind.RECV_B:
                yield from self._wait(r, self._arrival("grad", a.chunk, a.microbatch, r.rid),
                                      "bubble")
            elif a.kind is Kind.SEND_F:
                yield from self._send(r, "act", a, a.chunk + 1)
            elif a.kind is Kind.SEND_B:
                yield from self._send(r, "grad", a, a.chunk - 1)
        yield from self._finish(r)
        r.finish = self.env.now

    def _forward(self, r: Rank, a: Action) -> Generator:
        w = self.work[a.chunk]
        r.memory.alloc(self.env.now, w.activation_bytes)
        first = r.forwards[a.chunk] == 0
        r.forwards[a.chunk] += 1
        before = None
        if self.s.parallel.zero == 3:
            before = self._zero3_gathers(r, w, forward=True)
        elif first and r.gathers:
            before = lambda k: r.gathers.get((w.chunk, k))  # noqa: E731
        yield from self._pass(r, w, f"F{a.microbatch}.{a.chunk}", True, before, None)

    def _backward(self, r: Rank, a: Action) -> Generator:
        p, w = self.s.parallel, self.work[a.chunk]
        r.memory.alloc(self.env.now, w.transient_bytes)
        r.backwards[a.chunk] += 1
        last = r.backwards[a.chunk] == self.s.microbatches
        # ZeRO-2 keeps only its gradient shard, so every micro-batch's gradients are
        # reduce-scattered into it, not once per step (DeepSpeed stage 2).
        every = p.zero == 2
        before = after = None
        if p.zero == 3:
            before = self._zero3_gathers(r, w, forward=False)
            after = lambda k, seg: self._reduce(r, seg, f"RS {w.chunk}.{k}")  # noqa: E731
        elif (last or every) and p.overlap_grad_reduce:
            after = lambda k, seg: self._reduce(r, seg, f"grads {w.chunk}.{k}")  # noqa: E731
        yield from self._pass(r, w, f"B{a.microbatch}.{a.chunk}", False, before, after)
        if every:
            yield from self._zero2_epilogue(r, w, started=p.overlap_grad_reduce)
        r.memory.free(self.env.now, w.transient_bytes + w.activation_bytes)

    def _zero2_epilogue(self, r: Rank, w: ChunkWork, started: bool) -> Generator:
        """The end of a ZeRO-2 backward: reduce-scatter the buckets not started during it and
        wait for all of them before the next pass (DeepSpeed's
        independent_gradient_partition_epilogue synchronises the device each micro-batch,
        deepspeed/runtime/zero/stage_1_and_2.py)."""
        if not started:
            for k, seg in enumerate(w.segments):
                self._reduce(r, seg, f"grads {w.chunk}.{k}")
        if r.pending:
            yield from self._wait(r, simpy.AllOf(self.env, r.pending), "exposed_comm")
            r.pending.clear()

    def _pass(self, r: Rank, w: ChunkWork, name: str, forward: bool,
              before: Callable[[int], simpy.Event | None] | None,
              after: Callable[[int, Segment], None] | None) -> Generator:
        """A chunk's forward or backward: whole, or segment by segment when a DP op must
        happen in between (``before`` gives an event to wait for, ``after`` starts an op)."""
        if before is None and after is None:
            yield from self._segment(r, w.whole, name, forward)
            return
        order = range(len(w.segments)) if forward else reversed(range(len(w.segments)))
        for k in order:
            seg = w.segments[k]
            gate = before(k) if before else None
            if gate is not None:
                yield from self._wait(r, gate, "exposed_comm")
            yield from self._segment(r, seg, name, forward)
            if after:
                after(k, seg)

    def _segment(self, r: Rank, seg: Segment, name: str, forward: bool) -> Generator:
        """One way of a segment: compute, and its TP collectives after it, or beside the GEMMs
        they overlap (``tp_comm_overlap``: only what outlasts them is exposed); then the
        exposed CP/EP collectives."""
        compute, tp, hide, other = seg.pass_times(forward)
        if tp > 0 and hide > 0:
            collectives = self._async(r, "tp", name, self._hold(tp))
            yield from self._compute(r, hide, name, "compute")
            yield from self._wait(r, collectives, "exposed_comm")
            yield from self._busy(r, compute - hide, other, name, "compute")
        else:
            yield from self._busy(r, compute, tp + other, name, "compute")

    def _finish(self, r: Rank) -> Generator:
        """Gradients reduced, optimizer stepped, and (ZeRO-1/2 without overlap) parameters
        gathered back, before the next step may start."""
        p = self.s.parallel
        if p.zero < 2 and not p.overlap_grad_reduce:
            for w in self._own_chunks(r):
                for k, seg in enumerate(w.segments):
                    self._reduce(r, seg, f"grads {w.chunk}.{k}")
        if r.pending:
            yield from self._wait(r, simpy.AllOf(self.env, r.pending), "exposed_comm")
        seconds = optimizer_time(self.cm, r.stage)
        yield from self._busy(r, seconds, 0.0, "optimizer", "optimizer")
        if p.zero in (1, 2) and not p.overlap_param_gather:
            self._gather_all(r)
            if r.gathers:
                yield from self._wait(r, simpy.AllOf(self.env, list(r.gathers.values())),
                                      "exposed_comm")

    # --- data-parallel traffic ----------------------------------------------------------------

    def _reduce(self, r: Rank, seg: Segment, name: str) -> None:
        """Start reducing one segment's gradients on the DP stream (all-reduce under ZeRO-0,
        reduce-scatter otherwise), dense and expert parameters each over their own group."""
        op = "allreduce" if self.s.parallel.zero == 0 else "reduce_scatter"
        r.pending.extend(self._dp_ops(r, seg, op, name, self.grad_bytes))

    def _gather(self, r: Rank, seg: Segment, name: str) -> simpy.Event | None:
        """Start gathering one segment's parameters; the event of its completion, if any."""
        ops = self._dp_ops(r, seg, "allgather", name, self.weight_bytes)
        return simpy.AllOf(self.env, ops) if ops else None

    def _dp_ops(self, r: Rank, seg: Segment, op: str, name: str,
                width: int) -> list[simpy.Event]:
        ops = []
        for group, params in (("dp", seg.dense_params), ("edp", seg.expert_params)):
            if params > 0 and self.comm.group_size(r.rid, group) > 1:
                body = self.comm.collective(r.rid, group, op, params * width)
                ops.append(self._async(r, "dp", name, body))
        return ops

    def _gather_all(self, r: Rank) -> None:
        for w in self._own_chunks(r):
            for k, seg in enumerate(w.segments):
                event = self._gather(r, seg, f"AG {w.chunk}.{k}")
                if event is not None:
                    r.gathers[(w.chunk, k)] = event

    def _zero3_gathers(self, r: Rank, w: ChunkWork, forward: bool) -> Callable:
        """ZeRO-3: each unit's weights gathered before its use (forward, and again for the
        backward and its recomputation), ``zero3.prefetch_depth`` units ahead issued with it."""
        issued: dict[int, simpy.Event | None] = {}
        step = 1 if forward else -1
        depth = zero3.prefetch_depth(self.s.parallel)

        def before(k: int) -> simpy.Event | None:
            for j in range(k, k + step * (depth + 1), step):
                if 0 <= j < len(w.segments) and j not in issued:
                    issued[j] = self._gather(r, w.segments[j], f"AG {w.chunk}.{j}")
            return issued[k]
        return before

    # --- pipeline traffic ---------------------------------------------------------------------

    def _send(self, r: Rank, kind: str, a: Action, to_chunk: int) -> Generator:
        """Send an activation (or its gradient) to the rank of ``to_chunk``; blocking, and one
        transfer at a time into a rank (an activation from upstream and a gradient from
        downstream arriving together queue on the receiver's recv stream)."""
        dst = r.peers[to_chunk % self.s.parallel.pp]
        arrival = self._arrival(kind, to_chunk, a.microbatch, dst)
        nbytes = self.work[a.chunk].message_bytes
        name = f"{kind} {a.microbatch}.{a.chunk}->{to_chunk}"

        start = self.env.now
        receiver = self._by_id[dst].streams["pp_recv"]
        with r.streams["pp_send"].request() as send, receiver.request() as recv:
            yield send & recv  # a transfer needs the sender's send and the receiver's recv stream
            begin = self.env.now
            yield from self.comm.p2p(r.rid, dst, nbytes)
        self.timeline.record(r.rid, "pp_send", name, begin, self.env.now)
        self.timeline.record(dst, "pp_recv", name, begin, self.env.now)
        arrival.succeed()
        r.clock.add("exposed_comm", self.env.now - start)

    def _arrival(self, kind: str, chunk: int, microbatch: int, rank: int) -> simpy.Event:
        key = (kind, chunk, microbatch, rank)
        event = self._arrivals.get(key)
        if event is None:
            event = self._arrivals[key] = self.env.event()
        return event

    # --- primitives ---------------------------------------------------------------------------

    def _busy(self, r: Rank, seconds: float, comm: float, name: str, cause: str) -> Generator:
        """``seconds`` of compute on the compute stream, then ``comm`` of its exposed
        collectives on the TP stream, one after the other."""
        yield from self._compute(r, seconds, name, cause)
        if comm > 0:
            start = self.env.now
            with r.streams["tp"].request() as request:
                yield request
                yield self.env.timeout(comm)
            self.timeline.record(r.rid, "tp", name, start, self.env.now)
            r.clock.add("exposed_comm", self.env.now - start)

    def _compute(self, r: Rank, seconds: float, name: str, cause: str) -> Generator:
        """``seconds`` of compute (at full speed) on the compute stream. While collectives run
        on the rank's DP or TP stream it goes at ``1 - x`` of its speed (the profile's
        ``comm_compute_slowdown``: SMs taken by NCCL), re-rated whenever one starts or ends."""
        if seconds <= 0:
            return
        start = self.env.now
        with r.streams["compute"].request() as request:
            yield request
            if self.slowdown == 0:
                yield self.env.timeout(seconds)
            else:
                yield from self._fluid(r, seconds)
        self.timeline.record(r.rid, "compute", name, start, self.env.now)
        r.clock.add(cause, self.env.now - start)

    def _fluid(self, r: Rank, seconds: float) -> Generator:
        """Compute at the current rate until done or until the NCCL activity changes."""
        remaining = seconds
        while True:
            rate = 1.0 - self.slowdown if r.nccl_active else 1.0
            begin = self.env.now
            done = self.env.timeout(remaining / rate)
            yield done | self._nccl_change(r)
            if done.processed:
                return
            remaining -= (self.env.now - begin) * rate

    def _nccl_change(self, r: Rank) -> simpy.Event:
        if r.nccl_change is None:
            r.nccl_change = self.env.event()
        return r.nccl_change

    def _nccl(self, r: Rank, delta: int) -> None:
        """A collective starts (+1) or ends (-1) on the rank: compute in flight is re-rated."""
        r.nccl_active += delta
        if r.nccl_change is not None:
            changed, r.nccl_change = r.nccl_change, None
            changed.succeed()

    def _hold(self, seconds: float) -> Generator:
        yield self.env.timeout(seconds)

    def _wait(self, r: Rank, event: simpy.Event, cause: str) -> Generator:
        """The main thread waits for ``event``; the wait is charged to ``cause``."""
        start = self.env.now
        yield event
        r.clock.add(cause, self.env.now - start)

    def _async(self, r: Rank, stream: str, name: str, body: Generator) -> simpy.Process:
        """Run ``body`` on ``stream`` beside the main thread, in the stream's order."""
        def op() -> Generator:
            with r.streams[stream].request() as request:
                yield request
                begin = self.env.now
                self._nccl(r, +1)
                yield from body
                self._nccl(r, -1)
            self.timeline.record(r.rid, stream, name, begin, self.env.now)
        return self.env.process(op())

    def _own_chunks(self, r: Rank) -> list[ChunkWork]:
        return self.work[r.stage::self.s.parallel.pp]

    def _memory(self) -> list[mem.StageMemory]:
        """Closed-form model states and buffers; activations at the timeline's peak."""
        peaks = [0.0] * self.s.parallel.pp
        for r in self.ranks:
            peaks[r.stage] = max(peaks[r.stage], r.memory.peak)
        return [replace(mem.stage_memory(self.s, i), activations=peaks[i])
                for i in range(self.s.parallel.pp)]


def simulate(s: Scenario, fidelity: str = "representative", profile: Profile | None = None,
             trace: str | None = None) -> StepResult:
    """Simulate one step of ``s``; with ``trace``, also write its Chrome trace there."""
    engine = Engine(s, fidelity, profile)
    result = engine.run()
    if trace:
        engine.timeline.write_chrome_trace(trace)
    return result
