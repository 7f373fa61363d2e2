"""One way of a segment of layers: its compute and the communication inside its layers.

A forward (or backward) of consecutive layers runs its compute and, around it, the layers'
tensor-, context- and expert-parallel communication. In ``representative`` all of it is closed
forms inside the segment's timeouts; in ``full`` three of them run as flows on the fabric,
where they meet the data-parallel rings and pipeline sends: the context-parallel ring beside the
attention it hides behind (its sends go while earlier blocks are computed), the tensor-parallel
rings after the compute or beside the GEMMs they overlap (``tp_comm_overlap``), and the expert
all-to-alls after the compute. A mixin of ``Engine``: it uses the engine's clock, communicator
and stream primitives (``_compute``, ``_busy``, ``_wait``, ``_async``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING

import simpy

from ..costs.work import ChunkWork, Segment
from ..pipeline.overlap import exposed_beside

if TYPE_CHECKING:
    from .rank import Rank


class SegmentRunner:
    """Runs a chunk's segments on a rank (mixed into ``Engine``)."""

    def _pass(self, r: Rank, w: ChunkWork, name: str, way: str,
              before: Callable[[int], simpy.Event | None] | None,
              after: Callable[[int, Segment], None] | None) -> Generator:
        """A chunk's forward or backward segment by segment, when a DP op must happen in
        between (``before`` gives an event to wait for, ``after`` starts an op)."""
        count = len(w.segments)
        order = range(count) if way == "forward" else reversed(range(count))
        for k in order:
            seg = w.segments[k]
            gate = before(k) if before else None
            if gate is not None:
                yield from self._wait(r, gate, "dp")
            yield from self._segment(r, seg, name, way)
            if after:
                after(k, seg)

    def _segment(self, r: Rank, seg: Segment, name: str, way: str) -> Generator:
        """One way of a segment: compute, and its TP collectives after it, or beside the GEMMs
        they overlap (``tp_comm_overlap``: only what outlasts them is exposed); then the
        exposed CP/EP collectives. In full fidelity the CP ring first runs as a flow beside the
        attention it hides behind, and the TP rings and the EP all-to-alls run as flows
        (``_flows``), all of the segment's layers' back to back. Each exposed wait is charged
        to its kind (tp, cp, ep) and drawn on that kind's stream of the timeline."""
        compute, tp, hide, _ = seg.pass_times(way)
        compute, hide = compute * r.factor, hide * r.factor
        ring, tokens, context, other = self._flows(r, seg, way, tp)
        if context is not None:
            attention = min(seg.cp_traffic(way)[3] * r.factor, compute - hide)
            sends = self._async(r, "tp", f"context-parallel {name}", context, label="cp")
            yield from self._compute(r, attention, name, "compute")
            yield from self._wait(r, sends, "cp")
            compute -= attention
        if r.pair is not None:  # half of an overlapped pair: its all-to-alls behind the other
            other = self._into_pair(r, way, compute, other)
        if tp > 0 and hide > 0:
            tail, *tail_traffic = seg.tp_tail(way)
            collectives = (self._started(r, "tp", name, ring) if hasattr(ring, "start")
                           else self._async(r, "tp", name, ring or self._hold(tp - tail)))
            yield from self._compute(r, hide, name, "compute")
            if hasattr(ring, "current"):  # a reservation's timer, or the flow's end since
                collectives = ring.current(collectives)
            yield from self._wait(r, collectives, "tp")
            if tail > 0 and ring is not None:  # the pipelined splits sent after the GEMMs
                tail_ring = self.comm.tensor_parallel(r.rid, *tail_traffic)
                yield from self._exposed(r, tail_ring, f"tensor-parallel {name}", "tp")
            elif tail > 0:
                other = {**other, "tp": tail}
            yield from self._busy(r, compute - hide, other, name, "compute")
        elif ring is not None:
            yield from self._compute(r, compute, name, "compute")
            yield from self._exposed(r, ring, f"tensor-parallel {name}", "tp")
            yield from self._busy(r, 0.0, other, name, "compute")
        else:
            yield from self._busy(r, compute, {"tp": tp, **other}, name, "compute")
        if tokens is not None:
            yield from self._exposed(r, tokens, f"all-to-all {name}", "ep")

    def _flows(self, r: Rank, seg: Segment, way: str, tp: float):
        """(TP rings, EP all-to-alls, CP ring, the rest of the exposed comm by kind, cp and ep)
        of one way of a segment: the three as flows when the communicator runs them (full
        fidelity; else None and the closed forms stay in ``tp`` and the rest). Not for the
        halves of overlapped pairs (DualPipe, DualPipeV), which run their closed forms: each
        hides the other's all-to-alls (``_into_pair``)."""
        other = {"cp": seg.cp_traffic(way)[0], "ep": seg.alltoalls(way)[0]}
        if r.pair is not None:
            return None, None, None, other
        traffic = seg.tp_traffic(way)
        tail = seg.tp_tail(way)[1:]  # run apart, after the GEMMs
        ring = (self.comm.tensor_parallel(r.rid, *(a - b for a, b in zip(traffic, tail,
                                                                           strict=True)))
                if tp > 0 and traffic[0] else None)
        rounds = seg.alltoalls(way)[1]
        tokens = self.comm.expert_alltoall(r.rid, self.dispatch_bytes, rounds) if rounds else None
        if tokens is not None:  # the tokens' as flows; the probabilities' stay closed form
            other["ep"] = seg.alltoalls(way)[2]
        _, sent, sends, _ = seg.cp_traffic(way)
        context = self.comm.context_parallel(r.rid, sent, sends) if sent > 0 else None
        if context is not None:
            other["cp"] = 0.0
        return ring, tokens, context, other

    def _exposed(self, r: Rank, flows: Generator, name: str, kind: str) -> Generator:
        """The main thread waits for ``flows``, exposed communication of ``kind`` (tp, ep),
        drawn on that kind's stream; a ring that starts as one event (``comm.PortRing``) is
        waited for as that event, without a process around it."""
        start = self.env.now
        done = flows.start(at_once=True) if hasattr(flows, "start") else self.env.process(flows)
        yield from self._wait(r, done, kind)
        self.timeline.record(r.rid, kind, name, start, self.env.now)

    def _into_pair(self, r: Rank, way: str, compute: float,
                   other: dict[str, float]) -> dict[str, float]:
        """Count one half of an overlapped forward-backward pair: its compute hides the other
        half's expert all-to-alls, its own all-to-alls wait for the other half's compute
        (``_end_pair``). The rest of its communication is exposed as outside a pair: DualPipe
        overlaps "both all-to-all and PP communication" (DeepSeek-V3 report, sec. 3.2.1), and
        Megatron-Core's combined 1F1B hides the "EP A2A in forward step ... by the
        attention/mlp computation in the backward step, and vice versa"
        (megatron/core/pipeline_parallel/combined_1f1b.py), refusing the overlap without expert
        parallelism (transformer_config.py). Tensor- and context-parallel collectives sit
        between a chunk's own GEMMs, where the other half's compute cannot cover them."""
        half = 0 if way == "forward" else 2
        r.pair[half] += compute
        r.pair[half + 1] += other["ep"]
        _add_kinds(r.pair_kinds[half // 2], {"ep": other["ep"]})
        return {**other, "ep": 0.0}

    def _end_pair(self, r: Rank, name: str) -> Generator:
        """The end of an overlapped forward-backward pair: each half's all-to-alls ran
        behind the other half's compute, and only what outlasts it is exposed (DualPipe's
        F&B = max(C_F, E_B) + max(C_B, E_F)), the compute slowed meanwhile
        (``overlap.exposed_beside``). What each half exposes is shared among its kinds in
        proportion to their part of that half's communication (the closed form does not say
        which collective outlasts the compute)."""
        c_f, e_f, c_b, e_b = r.pair
        kinds = r.pair_kinds
        r.pair, r.pair_kinds = None, ({}, {})
        exposed: dict[str, float] = {}
        _add_kinds(exposed, _shared(kinds[0], exposed_beside(e_f, c_b, r.slowdown)))
        _add_kinds(exposed, _shared(kinds[1], exposed_beside(e_b, c_f, r.slowdown)))
        yield from self._busy(r, 0.0, exposed, name, "compute")


def _add_kinds(into: dict[str, float], seconds: dict[str, float]) -> None:
    """Add seconds by kind into ``into``."""
    for kind, t in seconds.items():
        into[kind] = into.get(kind, 0.0) + t


def _shared(kinds: dict[str, float], exposed: float) -> dict[str, float]:
    """``exposed`` seconds shared among ``kinds`` in proportion to their seconds."""
    total = sum(kinds.values())
    if exposed <= 0 or total <= 0:
        return {}
    return {kind: exposed * t / total for kind, t in kinds.items()}
