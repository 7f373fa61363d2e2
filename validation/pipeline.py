"""Run one rank's pipeline action list for real: the engine's own schedules, no other copy.

The actions come from ``simulator.pipeline.schedules`` (``with_communication`` of any registered
schedule), so the real run and the simulation follow one source of truth. A split backward
runs as PyTorch's zero-bubble schedules run it (``torch.distributed.pipelining._backward``):
the input-gradient half differentiates the chunk's input only and keeps the graph's
intermediate gradients, from which the weight-gradient half later finishes the parameters'
gradients without re-running the data-gradient chain; the first chunk, whose input needs no
gradient, runs its whole backward as its weight half (as ``PipelineStage`` does). Receives
block; sends are posted asynchronously (so two neighbours sending to each other cannot
deadlock) and each message carries a tag naming its kind, chunk and micro-batch, since
activations and gradients between two ranks share one channel when chunks interleave.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from clustersim.simulator.pipeline.schedules import Action, Kind

from .measure import ActivationMeter, PhaseClock


@dataclass
class PipelineRank:
    """This rank's chunks and where its neighbours are."""

    chunks: dict[int, nn.Module]  # chunk index -> module (embedding in chunk 0, head in last)
    total_chunks: int
    rank_of_stage: Callable[[int], int]  # pipeline stage -> global rank
    pp: int
    activation_shape: tuple[int, ...]
    losses: list[torch.Tensor] = field(default_factory=list)
    meter: ActivationMeter | None = None  # counts what forwards keep for their backwards
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    phases: PhaseClock = field(default_factory=PhaseClock)
    chunk_stages: tuple[int, ...] | None = None  # chunk -> stage; None: c % pp (loop)

    def stage_of(self, chunk: int) -> int:
        return self.chunk_stages[chunk] if self.chunk_stages else chunk % self.pp


def run_actions(p: PipelineRank, actions: list[Action], inputs: list[torch.Tensor],
                targets: list[torch.Tensor], loss_fn: Callable, scale: float) -> None:
    """Forward and backward every micro-batch as ``actions`` order them; losses (already
    scaled by ``scale``) of the last chunk are kept in ``p.losses``."""
    received: dict[tuple[int, int], torch.Tensor] = {}
    outputs: dict[tuple[int, int], torch.Tensor] = {}
    grads: dict[tuple[int, int], torch.Tensor] = {}
    weight_halves: dict[tuple[int, int], list] = {}  # saved by an input half for its W
    sends = []
    last = p.total_chunks - 1
    for a in actions:
        key = (a.chunk, a.microbatch)
        if a.kind is Kind.RECV_F:
            buf = torch.empty(p.activation_shape, device=p.device)
            with p.phases.phase("pp_wait"):
                dist.recv(buf, src=_peer(p, a.chunk - 1), tag=_tag(p, "F", a.chunk - 1, a))
            received[key] = buf.requires_grad_()
        elif a.kind is Kind.FORWARD:
            x = inputs[a.microbatch] if a.chunk == 0 else received[key]
            with p.phases.phase("forward"), \
                    p.meter.forward_of(key) if p.meter else nullcontext():
                out = p.chunks[a.chunk](x)
                if a.chunk == last:
                    out = loss_fn(out, targets[a.microbatch]) * scale
            if a.chunk == last:
                p.losses.append(out.detach())
            outputs[key] = out
            if a.chunk < last and a.chunk + 1 in p.chunks:  # the next chunk is ours (a V's turn)
                received[(a.chunk + 1, a.microbatch)] = out.detach().requires_grad_()
        elif a.kind is Kind.SEND_F:
            sends.append(dist.isend(outputs[key].detach().contiguous(),
                                    dst=_peer(p, a.chunk + 1), tag=_tag(p, "F", a.chunk, a)))
        elif a.kind is Kind.RECV_B:
            buf = torch.empty(p.activation_shape, device=p.device)
            with p.phases.phase("pp_wait"):
                dist.recv(buf, src=_peer(p, a.chunk + 1), tag=_tag(p, "B", a.chunk + 1, a))
            grads[key] = buf
        elif a.kind is Kind.BACKWARD:
            out = outputs.pop(key)
            with p.phases.phase("backward"):
                out.backward(None if a.chunk == last else grads.pop(key))
            if p.meter:
                p.meter.release(key)
        elif a.kind is Kind.BACKWARD_INPUT and a.chunk > 0:
            out, x = outputs.pop(key), received[key]
            with p.phases.phase("backward"):
                _, weight_halves[key] = stage_backward_input(
                    [out], None if a.chunk == last else [grads.pop(key)], [x],
                    p.chunks[a.chunk].parameters())
        elif a.kind is Kind.BACKWARD_WEIGHT:
            with p.phases.phase("backward"):
                if a.chunk > 0:
                    stage_backward_weight(p.chunks[a.chunk].parameters(),
                                          weight_halves.pop(key))
                else:  # the first chunk's input needs no gradient: its whole backward here
                    outputs.pop(key).backward(None if a.chunk == last else grads.pop(key))
            if p.meter:
                p.meter.release(key)
        if a.kind in (Kind.BACKWARD, Kind.BACKWARD_INPUT) and a.chunk > 0 \
                and a.chunk - 1 in p.chunks:  # hand the input's gradient to our own chunk
            grads[(a.chunk - 1, a.microbatch)] = received.pop(key).grad
        elif a.kind is Kind.SEND_B:
            grad = received.pop(key).grad.contiguous()
            sends.append(dist.isend(grad, dst=_peer(p, a.chunk - 1),
                                    tag=_tag(p, "B", a.chunk, a)))
    with p.phases.phase("pp_wait"):
        for work in sends:
            work.wait()


def _peer(p: PipelineRank, chunk: int) -> int:
    return p.rank_of_stage(p.stage_of(chunk))


def _tag(p: PipelineRank, kind: str, sender_chunk: int, a: Action) -> int:
    """One tag per message: direction, the sending chunk and the micro-batch."""
    return (a.microbatch * p.total_chunks + sender_chunk) * 2 + (kind == "B")
