"""What one model chunk costs: the engine's menu of per-micro-batch work, from the cost model.

A segment's forward (or backward) is compute on the compute stream and tensor-parallel
collectives on the TP stream: one after the other, or, under ``tp_comm_overlap``, the collectives
beside the GEMMs they overlap (``*_hide`` seconds of the compute), then the rest of the compute.

A chunk's layers are grouped into *segments*, each one data-parallel gradient bucket (about
40M parameters, whole layers, as Megatron-LM's DDP fills them) or, under ZeRO-3, one layer (the
unit FSDP gathers). The engine runs a chunk's forward or backward either whole or segment by
segment, when a bucket's reduction or a unit's gather has to start or finish in between.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from ..model import activations as act
from ..model import workload as wl
from ..pipeline.stages import chunk_mix, head_apart, scenario_layout
from . import compute, split_backward
from . import memory as mem
from .compute import kernel_times, tp_overlaps
from .layer_comm import (
    backward_hide,
    context_comm,
    context_traffic,
    other_comm,
    pipeline_gather_time,
    pipelined_tail,
    pipelined_tail_traffic,
    tensor_comm_total,
    tensor_traffic,
)
from .token_dispatch import expert_alltoalls, expert_comm, forwarded_dispatch, probs_comm

if TYPE_CHECKING:
    from .cost_model import CostModel


@dataclass(frozen=True, slots=True)
class Segment:
    """Consecutive layers of one chunk: their times for one micro-batch and their parameters."""

    forward: float  # compute
    backward: float  # compute, recomputation included
    forward_comm: float  # exposed CP/EP collectives
    backward_comm: float
    dense_params: float  # on one rank (after tp / ep sharding)
    expert_params: float
    forward_tp: float = 0.0  # tensor-parallel collectives, hidden or not
    backward_tp: float = 0.0
    forward_hide: float = 0.0  # compute the TP collectives overlap (tp_comm_overlap: the GEMMs)
    backward_hide: float = 0.0
    weight_grad: float = 0.0  # the weight-gradient GEMMs among the backward's compute
    weight_hide: float = 0.0  # ... the cover of the TP collectives a split input half lacks
    forward_ep: float = 0.0  # the expert all-to-alls' closed form, among forward_comm
    backward_ep: float = 0.0
    forward_alltoalls: float = 0.0  # how many all-to-alls of expert_dispatch_bytes
    backward_alltoalls: float = 0.0
    # The routing probabilities' all-to-alls, among forward_ep: closed form at every fidelity
    # (mostly latency; token_dispatch.probs_comm).
    forward_probs: float = 0.0
    backward_probs: float = 0.0
    forward_tp_bytes: float = 0.0  # what the TP collectives send through a member's NVLink
    backward_tp_bytes: float = 0.0
    forward_tp_steps: float = 0.0  # ... in how many ring steps (alphas)
    backward_tp_steps: float = 0.0
    forward_tp_inter: float = 0.0  # ... of which across nodes (a group wider than a node)
    backward_tp_inter: float = 0.0
    forward_cp: float = 0.0  # ring attention's exposed closed form, among forward_comm
    backward_cp: float = 0.0
    forward_cp_bytes: float = 0.0  # what ring attention sends to the next CP rank
    backward_cp_bytes: float = 0.0
    forward_cp_steps: float = 0.0  # ... in how many sends (alphas)
    backward_cp_steps: float = 0.0
    forward_cp_hide: float = 0.0  # the attention those sends hide behind
    backward_cp_hide: float = 0.0
    # Of forward_tp, what no GEMM hides under tp_comm_overlap (layer_comm.pipelined_tail),
    # and what it sends through a member's NVLink port in how many ring steps.
    forward_tail: float = 0.0
    forward_tail_bytes: float = 0.0
    forward_tail_steps: float = 0.0
    forward_tail_inter: float = 0.0

    def pass_times(self, way: str) -> tuple[float, float, float, float]:
        """(compute, TP collectives, compute they overlap, other exposed comm) of one way:
        ``forward``, ``backward``, or a split backward's ``input`` and ``weight`` halves. The
        backward's collectives all go with its input half: Megatron-LM launches them beside the
        data-gradient GEMMs (the re-gather sequence parallelism needs for the weight gradient
        included); the weight half is its GEMMs alone, and the collectives lose them as cover
        (``split_backward.py``)."""
        if way == "forward":
            return self.forward, self.forward_tp, self.forward_hide, self.forward_comm
        if way == "weight":
            return self.weight_grad, 0.0, 0.0, 0.0
        if way == "input":
            compute = self.backward - self.weight_grad
            hide = min(max(0.0, self.backward_hide - self.weight_hide), compute)
            return compute, self.backward_tp, hide, self.backward_comm
        return self.backward, self.backward_tp, self.backward_hide, self.backward_comm

    def tp_tail(self, way: str) -> tuple[float, float, float, float]:
        """(seconds, bytes, ring steps, those across nodes) of one way's TP collectives that
        run after the GEMMs they overlap under ``tp_comm_overlap``: the forward's pipelined
        tails only."""
        if way == "forward":
            return (self.forward_tail, self.forward_tail_bytes, self.forward_tail_steps,
                    self.forward_tail_inter)
        return 0.0, 0.0, 0.0, 0.0

    def tp_traffic(self, way: str) -> tuple[float, float, float]:
        """(bytes, ring steps, those across nodes) one way's TP collectives send through a
        member's ports (``layer_comm.tensor_traffic``); a backward's go with its input half."""
        if way == "forward":
            return self.forward_tp_bytes, self.forward_tp_steps, self.forward_tp_inter
        if way == "weight":
            return 0.0, 0.0, 0.0
        return self.backward_tp_bytes, self.backward_tp_steps, self.backward_tp_inter

    def alltoalls(self, way: str) -> tuple[float, float, float]:
        """(closed-form seconds, count of token all-to-alls, the probabilities' seconds) of one
        way's expert all-to-alls, which ``pass_times``' other comm includes; like the TP
        collectives, a backward's go with its input half."""
        if way == "forward":
            return self.forward_ep, self.forward_alltoalls, self.forward_probs
        if way == "weight":
            return 0.0, 0.0, 0.0
        return self.backward_ep, self.backward_alltoalls, self.backward_probs

    def cp_traffic(self, way: str) -> tuple[float, float, float, float]:
        """(closed-form exposed seconds, bytes, sends, attention hiding them) of one way's
        ring attention (``layer_comm.context_traffic``); a backward's go with its input half,
        whose attention they hide behind."""
        if way == "forward":
            return (self.forward_cp, self.forward_cp_bytes, self.forward_cp_steps,
                    self.forward_cp_hide)
        if way == "weight":
            return 0.0, 0.0, 0.0, 0.0
        return (self.backward_cp, self.backward_cp_bytes, self.backward_cp_steps,
                self.backward_cp_hide)


@dataclass(frozen=True, slots=True)
class ChunkWork:
    """One model chunk on its pipeline rank."""

    chunk: int
    stage: int
    segments: tuple[Segment, ...]
    activation_bytes: float  # kept per micro-batch from its forward to its backward
    transient_bytes: float  # re-materialised during a backward (recomputation)
    message_bytes: float  # the activation (or its gradient) sent to the neighbouring chunk

    whole: Segment  # all segments together, for a pass run in one piece
    weight_half_bytes: float = 0.0  # kept from a split backward's input half to its weight half
    message_gather_s: float = 0.0  # the TP all-gather that reassembles a scatter-gather message

    @property
    def forward(self) -> float:
        return self.whole.forward

    @property
    def backward(self) -> float:
        return self.whole.backward


def chunk_work(cm: CostModel) -> list[ChunkWork]:
    """Work of every chunk, in chunk order, each on its stage (``stages.chunk_layout``); the
    first chunk of each copy of the model holds an embedding, the last a head."""
    s = cm.s
    p = s.parallel
    mix = chunk_mix(s)
    layout = scenario_layout(s)
    owner = layout.stages
    # (dense first layers, other layers): their segment, layers per segment and bytes.
    kinds = (_LayerKind.of(cm.dense_layer_costs) if s.model.dense_layers else None,
             _LayerKind.of(cm))
    tokens = s.training.micro_batch * s.model.seq_len // p.cp
    message, gather = wl.pipeline_message_bytes(s), pipeline_gather_time(cm)
    halves = [half for _, half in split_backward.chunk_bytes(s)]
    out = []
    layers = functools.cache(lambda counts: _layers(kinds, counts))  # middle chunks repeat
    for c, counts in enumerate(mix):
        segments, acts, transient, whole = layers(tuple(counts))
        if layout.is_first(c) or layout.is_last(c):
            segments = list(segments)
        if layout.is_first(c):
            segments[0] = _with_embedding(cm, segments[0])
            acts += _embedding_activation(s, tokens)
        if layout.is_last(c):
            segments[-1] = _with_head(cm, segments[-1], head_apart(s, c))
            acts += _head_activation(s, tokens)
            transient = max(transient, act.loss_backward_bytes(
                s.model, tokens, p.tp, s.training.precision, s.training.loss_kernel))
        if layout.is_first(c) or layout.is_last(c):
            segments, whole = tuple(segments), _summed(segments)
        out.append(ChunkWork(c, owner[c], segments, acts, transient, message, whole,
                             halves[c], gather))
    return out


def _layers(kinds: tuple, counts: tuple[int, ...]
            ) -> tuple[tuple[Segment, ...], float, float, Segment]:
    """A chunk's layers of each kind (``counts``), as segments, with the activation bytes they
    keep, those recomputation re-materialises and all segments summed."""
    segments: list[Segment] = []
    acts = transient = 0.0
    for kind, n in zip(kinds, counts, strict=True):
        if n:  # the dense first layers come first, in model order
            # A chunk's segments are a few sizes repeated (ZeRO-3: one layer each): each
            # size is built once.
            sized = {k: _scaled(kind.segment, k) for k in set(_split(n, kind.width))}
            segments += [sized[k] for k in _split(n, kind.width)]
            acts += n * kind.keep
            transient = max(transient, kind.transient)
    if not segments:  # an end chunk holding only the embedding or the head
        segments = [_scaled(kinds[-1].segment, 0)]
    return tuple(segments), acts, transient, _summed(segments)


@dataclass(frozen=True, slots=True)
class _LayerKind:
    """One kind of layer of a chunk: one layer's segment, layers per segment, activation bytes
    kept per layer and micro-batch, and those re-materialised by recomputation."""

    segment: Segment
    width: int
    keep: float
    transient: float

    @classmethod
    def of(cls, cm: CostModel) -> _LayerKind:
        """The kind of layer ``cm`` costs (its scenario's model, one layer)."""
        s = cm.s
        segment = _layer_segment(cm)
        keep = act.scenario_layer_bytes(s, s.parallel.recompute)
        return cls(segment, _layers_per_segment(s, segment.dense_params + segment.expert_params),
                   keep, act.scenario_layer_bytes(s, "none") - keep)


def _layer_segment(cm: CostModel) -> Segment:
    forward, backward, _ = cm.per_layer
    gemms, attention = kernel_times(cm)
    fwd_comm, bwd_comm = other_comm(cm, attention)
    fwd_tp, bwd_tp = tensor_comm_total(cm)
    hide = (gemms[0] if tp_overlaps(cm) else 0.0, backward_hide(cm, gemms[1]))
    # What a split backward's input half lacks of that cover (split_backward.py).
    input_gemms = max(0.0, gemms[1] - cm.weight_gradients[0])
    weight_hide = max(0.0, hide[1] - backward_hide(cm, input_gemms, split=True))
    dense, expert = mem.layer_params_per_rank(cm.s.model, cm.s.parallel.tp, cm.s.parallel.ep,
                                           cm.s.parallel.etp)
    ep, alltoalls, probs = expert_comm(cm), expert_alltoalls(cm), probs_comm(cm)
    if forwarded_dispatch(cm):  # full fidelity runs pairwise flows only: the closed form
        alltoalls = (0, 0)
    (fwd_bytes, fwd_steps, fwd_inter), (bwd_bytes, bwd_steps, bwd_inter) = tensor_traffic(cm)
    tail, (tail_bytes, tail_steps, tail_inter) = (
        (pipelined_tail(cm), pipelined_tail_traffic(cm)) if tp_overlaps(cm)
        else (0.0, (0.0, 0.0, 0.0)))
    cp = context_comm(cm, attention)
    (fwd_cp, fwd_sends, fwd_attn), (bwd_cp, bwd_sends, bwd_attn) = context_traffic(cm, attention)
    return Segment(forward, backward, fwd_comm, bwd_comm, dense, expert, fwd_tp, bwd_tp, *hide,
                   weight_grad=cm.weight_gradients[0], weight_hide=weight_hide,
                   forward_ep=ep[0], backward_ep=ep[1],
                   forward_alltoalls=alltoalls[0], backward_alltoalls=alltoalls[1],
                   forward_probs=probs[0], backward_probs=probs[1],
                   forward_tp_bytes=fwd_bytes, backward_tp_bytes=bwd_bytes,
                   forward_tp_steps=fwd_steps, backward_tp_steps=bwd_steps,
                   forward_tp_inter=fwd_inter, backward_tp_inter=bwd_inter,
                   forward_cp=cp[0], backward_cp=cp[1], forward_cp_bytes=fwd_cp,
                   backward_cp_bytes=bwd_cp, forward_cp_steps=fwd_sends,
                   backward_cp_steps=bwd_sends, forward_cp_hide=fwd_attn,
                   backward_cp_hide=bwd_attn, forward_tail=tail,
                   forward_tail_bytes=tail_bytes, forward_tail_steps=tail_steps,
                   forward_tail_inter=tail_inter)


def _layers_per_segment(s, layer_params: float) -> int:
    """One layer per ZeRO-3 unit; otherwise as many whole layers as fill a 40M bucket."""
    if s.parallel.zero == 3:
        return 1
    return max(1, int(mem.BUCKET_PARAMS // max(layer_params, 1.0)))


def _split(layers: int, width: int) -> list[int]:
    full, rest = divmod(layers, width)
    return [width] * full + ([rest] if rest else [])


_SEGMENT_FIELDS = tuple(f.name for f in fields(Segment))


def _summed(segments: list[Segment]) -> Segment:
    return Segment(*(sum(getattr(seg, name) for seg in segments) for name in _SEGMENT_FIELDS))


def _scaled(seg: Segment, k: int) -> Segment:
    return Segment(*(k * getattr(seg, name) for name in _SEGMENT_FIELDS))


def _with_embedding(cm: CostModel, seg: Segment) -> Segment:
    """The first chunk also owns the embedding table (a lookup: no FLOPs worth costing)."""
    extra = mem.embedding_params_per_rank(cm.s.model, cm.s.parallel.tp)
    return replace(seg, dense_params=seg.dense_params + extra)


def _with_head(cm: CostModel, seg: Segment, apart: bool) -> Segment:
    """The last chunk also runs the output layer and loss, and owns their weights (its own
    copy of a tied table when ``apart`` from the embedding's stage)."""
    s = cm.s
    fwd, bwd = compute.logits_times(cm)
    extra = mem.head_params_per_rank(s.model, s.parallel.tp, apart=apart)
    return replace(seg, forward=seg.forward + fwd, backward=seg.backward + bwd,
                   dense_params=seg.dense_params + extra,
                   weight_grad=seg.weight_grad + cm.weight_gradients[1])


def _embedding_activation(s, tokens: int) -> float:
    """The embedding's dropout mask (``activations.embedding_bytes``)."""
    outer = s.parallel.tp if s.parallel.sequence_parallel else 1
    return act.embedding_bytes(s.model, tokens, outer)


def _head_activation(s, tokens: int) -> float:
    """Output layer and loss (``activations.head_bytes``: ``4sbh/t + 4sbv/t`` in bf16)."""
    outer = s.parallel.tp if s.parallel.sequence_parallel else 1
    return act.head_bytes(s.model, tokens, s.parallel.tp, outer, s.training.precision,
                          s.training.autocast, s.training.loss_kernel,
                          s.parallel.gathered_inputs_kept)
