"""The data-parallel collectives of one rank: gradient reduction and parameter gathers.

What each reduction and gather is (which collectives, over which groups, how many bytes) and
when it runs come from ``costs/dp_reduction.py``, the description the closed form reads too;
this module issues them as events. Gradients are reduced segment by segment (one DP bucket, or
one ZeRO-3 unit) on the DP stream beside the main thread; ZeRO-1/2 parameters are gathered
once a step, ZeRO-3 units before each use; and the end of the step (last reductions, DualPipe's
gradient swap, a tied embedding's gradient sum, optimizer, gathers). A mixin of ``Engine``: it
uses the engine's scenario (``s``), cost models (``costs``), communicator (``comm``), clock
(``env``), work (``work``) and ``_async``/``_wait``/``_busy``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from functools import cached_property
from typing import TYPE_CHECKING

import simpy

from ..costs import dp_reduction as dp
from ..costs.cost_model import copy_sum_bytes, finalize_grads_time, optimizer_time, twin_stage
from ..costs.work import ChunkWork, Segment

if TYPE_CHECKING:
    from .rank import Rank


class DataParallelTraffic:
    """Starting and awaiting a rank's data-parallel collectives (mixed into ``Engine``)."""

    @cached_property
    def dp_timing(self) -> dp.DpTiming:
        """When this scenario's reductions and gathers run (``dp_reduction.dp_timing``)."""
        return dp.dp_timing(self.s.parallel)

    def _step_start(self, r: Rank) -> None:
        """ZeRO-1/2 with ``overlap_param_gather``: gather the parameters the last step updated
        as the step starts; the first forward of each segment waits for its own."""
        if self.dp_timing.gather == dp.BEFORE_STEP:
            self._gather_all(r)

    def _forward_gate(self, r: Rank, w: ChunkWork,
                      first: bool) -> Callable[[int], simpy.Event | None] | None:
        """What the forward of chunk ``w``'s segment ``k`` waits for: ZeRO-3's gather of it
        (none where a backward left the chunk gathered), or, in a chunk's first forward of
        the step, its gather started with the step."""
        if self.dp_timing.gather == dp.PER_UNIT:
            if w.chunk in r.gathered:  # left whole by a backward; resharded after this forward
                r.gathered.discard(w.chunk)
                return None
            return self._zero3_gathers(r, w, forward=True)
        if first and r.gathers:
            return lambda k: r.gathers.get((w.chunk, k))
        return None

    def _backward_hooks(self, r: Rank, w: ChunkWork, way: str, last: bool):
        """(what each segment of a backward waits for, what starts after it, whether the
        backward ends with ZeRO-2's epilogue) for a backward of ``way`` ("backward", "input"
        or "weight") of chunk ``w``, its last of the step if ``last``. The weight gradients
        exist once a whole or weight-half backward has run, so reductions start there; the
        input half needs the weights (ZeRO-3 gathers them, but for a chunk a backward left
        gathered under PyTorch's pipelining: ``zero3.gathering_passes``). ZeRO-2 keeps only
        its gradient shard, so every micro-batch's gradients are reduce-scattered into it
        (DeepSpeed stage 2; not under a pipeline)."""
        t, grads = self.dp_timing, way != "input"
        before = after = None
        every = t.reduce == dp.PER_MICROBATCH and grads
        if t.gather == dp.PER_UNIT and way != "weight":
            if w.chunk not in r.gathered:
                before = self._zero3_gathers(r, w, forward=False)
            if self.s.parallel.deferred_zero3:
                r.gathered.add(w.chunk)  # PyTorch's pipelining: not resharded after a backward
        if t.reduce == dp.PER_UNIT:
            if grads:
                after = lambda k, seg: self._reduce(r, seg, f"RS {w.chunk}.{k}")  # noqa: E731
        elif (last or every) and t.reduce_overlapped:
            after = lambda k, seg: self._reduce(r, seg, f"grads {w.chunk}.{k}")  # noqa: E731
        return before, after, every

    def _reduce(self, r: Rank, seg: Segment, name: str) -> None:
        """Start reducing one segment's gradients on the DP stream (``dp_reduction.reduction``)."""
        ops = dp.reduction(self.s, seg.dense_params, seg.expert_params, self._group_size(r))
        r.pending.extend(self._dp_ops(r, ops, name))

    def _gather(self, r: Rank, seg: Segment, name: str) -> simpy.Event | None:
        """Start gathering one segment's parameters (``dp_reduction.gather``); the event of
        its completion, if any."""
        ops = self._dp_ops(r, dp.gather(self.s, seg.dense_params, seg.expert_params,
                                        self._group_size(r)), name)
        if len(ops) == 1 and self.fidelity == "full":  # its own end: no condition over one
            return ops[0]
        return simpy.AllOf(self.env, ops) if ops else None

    def _group_size(self, r: Rank) -> Callable[[str], int]:
        return lambda group: self.comm.group_size(r.rid, group)

    def _dp_ops(self, r: Rank, collectives: list[dp.DpCollective],
                name: str) -> list[simpy.Event]:
        """Each collective on the DP stream, in order: the events of their ends."""
        if self.fidelity == "full":
            return [self._queued(r, name, c) for c in collectives]
        return [self._async(r, "dp", name, self.comm.collective(r.rid, c.group, c.op, c.nbytes))
                for c in collectives]

    def _queued(self, r: Rank, name: str, c: dp.DpCollective) -> simpy.Event:
        """Full fidelity: ``c`` queued on ``r``'s DP stream, first come first served, as
        ``_async`` queues it on a SimPy resource, without a process, a request and a release
        of its own: each op starts when the one before it ends (``_next_dp``)."""
        done = self.env.event()
        r.dp_queue.append((name, c, done))
        if len(r.dp_queue) == 1:
            self._next_dp(r)
        return done

    def _next_dp(self, r: Rank) -> None:
        """Start the op at the head of ``r``'s DP stream: the NCCL count up and the rank into
        its group's collective (``FabricComm.join``); at its end the count down, its span,
        its event, and the next op."""
        name, c, done = r.dp_queue[0]
        begin = self.env.now
        self._nccl(r, +1)
        joined = self.comm.join(r.rid, c.group, c.op, c.nbytes)

        def end(_event: simpy.Event) -> None:
            self._nccl(r, -1)
            self.timeline.record(r.rid, "dp", name, begin, self.env.now)
            r.dp_queue.popleft()
            done.succeed()
            if r.dp_queue:
                self._next_dp(r)
        joined.callbacks.append(end)

    def _gather_all(self, r: Rank) -> None:
        for w in self._own_chunks(r):
            for k, seg in enumerate(w.segments):
                event = self._gather(r, seg, f"AG {w.chunk}.{k}")
                if event is not None:
                    r.gathers[(w.chunk, k)] = event

    def _zero3_gathers(self, r: Rank, w: ChunkWork, forward: bool) -> Callable:
        """ZeRO-3: each unit's weights gathered before its use (forward, and again for the
        backward and its recomputation), ``prefetch`` units ahead issued with it
        (``dp_reduction.gathers_due``, the rule ``zero3.run_pass`` follows). A backward runs
        the segments in reverse: position ``i`` of its pass is segment ``count - 1 - i``."""
        issued: dict[int, simpy.Event | None] = {}  # by position in the pass
        count, depth = len(w.segments), self.dp_timing.prefetch

        def segment(i: int) -> int:
            return i if forward else count - 1 - i

        def before(k: int) -> simpy.Event | None:
            for i in dp.gathers_due(segment(k), count, depth, issued):
                j = segment(i)
                issued[i] = self._gather(r, w.segments[j], f"AG {w.chunk}.{j}")
            return issued[segment(k)]
        return before

    def _zero2_epilogue(self, r: Rank, w: ChunkWork, started: bool) -> Generator:
        """The end of a ZeRO-2 backward: reduce-scatter the buckets not started during it and
        wait for all of them before the next pass (DeepSpeed's
        independent_gradient_partition_epilogue synchronises the device each micro-batch,
        deepspeed/runtime/zero/stage_1_and_2.py)."""
        if not started:
            for k, seg in enumerate(w.segments):
                self._reduce(r, seg, f"grads {w.chunk}.{k}")
        if r.pending:
            yield from self._wait(r, simpy.AllOf(self.env, r.pending), "dp")
            r.pending.clear()

    def _finish(self, r: Rank) -> Generator:
        """Gradients reduced, optimizer stepped, and (ZeRO-1/2 without overlap) parameters
        gathered back, before the next step may start."""
        t = self.dp_timing
        if t.reduce == dp.PER_STEP and not t.reduce_overlapped:
            for w in self._own_chunks(r):
                for k, seg in enumerate(w.segments):
                    self._reduce(r, seg, f"grads {w.chunk}.{k}")
        if r.pending:
            yield from self._wait(r, simpy.AllOf(self.env, r.pending), "dp")
        twin = twin_stage(self.s, r.stage)
        if twin is not None:
            yield from self._sum_copies(r, r.peers[twin])
        finalize = finalize_grads_time(self.costs.stage(r.stage), r.stage)
        if finalize > 0:  # tied embedding and TP-whole gradients, counted with the sync
            yield from self._busy(r, 0.0, {"dp": finalize}, "finalize grads", "optimizer")
        seconds = optimizer_time(self.costs.stage(r.stage), r.stage) * r.factor
        yield from self._busy(r, seconds, None, "optimizer", "optimizer")
        if t.gather == dp.AFTER_STEP:
            self._gather_all(r)
            if r.gathers:
                yield from self._wait(r, simpy.AllOf(self.env, list(r.gathers.values())),
                                      "dp")

    def _sum_copies(self, r: Rank, twin: int) -> Generator:
        """Swap the reduced gradients with the rank holding the other copy of this stage's
        parameters (DualPipe), so that both step on their sum: the main thread waits."""
        start = self.env.now
        yield from self.comm.p2p(r.rid, twin, copy_sum_bytes(self.s, r.stage))
        self.timeline.record(r.rid, "dp", "sum copies", start, self.env.now)
        r.clock.add("dp", self.env.now - start)

    def _own_chunks(self, r: Rank) -> list[ChunkWork]:
        return [w for w in self.work if w.stage == r.stage]
