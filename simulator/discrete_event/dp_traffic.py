"""The data-parallel collectives of one rank: gradient reduction and parameter gathers.

Gradients are reduced segment by segment (one DP bucket, or one ZeRO-3 unit) on the DP stream
beside the main thread, all-reduced under ZeRO-0 and reduce-scattered otherwise, dense and
expert parameters each over their own group; ZeRO-1/2 parameters are all-gathered once a step,
ZeRO-3 units before each use; and the end of the step (last reductions, optimizer, gathers).
A mixin of ``Engine``: it uses the engine's scenario (``s``), cost models (``costs``),
communicator (``comm``), clock (``env``), work (``work``), byte widths and
``_async``/``_wait``/``_busy``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING

import simpy

from ..costs import zero3
from ..costs.cost_model import copy_sum_bytes, optimizer_time, twin_stage
from ..costs.work import ChunkWork, Segment

if TYPE_CHECKING:
    from .rank import Rank


class DataParallelTraffic:
    """Starting and awaiting a rank's data-parallel collectives (mixed into ``Engine``)."""

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
        p = self.s.parallel
        if not p.sharded_gradients and not p.overlap_grad_reduce:
            for w in self._own_chunks(r):
                for k, seg in enumerate(w.segments):
                    self._reduce(r, seg, f"grads {w.chunk}.{k}")
        if r.pending:
            yield from self._wait(r, simpy.AllOf(self.env, r.pending), "dp")
        twin = twin_stage(self.s, r.stage)
        if twin is not None:
            yield from self._sum_copies(r, r.peers[twin])
        seconds = optimizer_time(self.costs.stage(r.stage), r.stage) * r.factor
        yield from self._busy(r, seconds, None, "optimizer", "optimizer")
        if p.zero in (1, 2) and not p.overlap_param_gather:
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
