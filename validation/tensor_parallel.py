"""Megatron-style tensor parallelism for the harness's GPT, written by hand so that the bytes
moved are exactly those the simulator models (Shoeybi et al. 2019, Megatron-LM
``tensor_parallel/mappings.py``): ``f`` (identity forward, all-reduce backward) enters a
parallel region and ``g`` (all-reduce forward, identity backward) leaves it; with sequence
parallelism they become all-gather / reduce-scatter along the sequence. Weights are split by
taking this rank's chunk of the whole matrix, drawn alike on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class TensorParallel:
    """This rank's place in its TP group (size 1: no tensor parallelism)."""

    group: dist.ProcessGroup | None = None
    size: int = 1
    rank: int = 0
    sequence_parallel: bool = False


# --- Megatron's f and g ---------------------------------------------------------------------

class CopyToRegion(torch.autograd.Function):
    """f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromRegion(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class GatherSequence(torch.autograd.Function):
    """Sequence-parallel f: all-gather along the sequence, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x, group, size):
        ctx.group, ctx.size = group, size
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_sequence(grad, ctx.group, ctx.size), None, None


class ScatterSequence(torch.autograd.Function):
    """Sequence-parallel g: reduce-scatter along the sequence, all-gather backward."""

    @staticmethod
    def forward(ctx, x, group, size):
        ctx.group, ctx.size = group, size
        return _reduce_scatter_sequence(x, group, size)

    @staticmethod
    def backward(ctx, grad):
        parts = [torch.empty_like(grad) for _ in range(ctx.size)]
        dist.all_gather(parts, grad.contiguous(), group=ctx.group)
        return torch.cat(parts, dim=1), None, None


class GatherReplicated(torch.autograd.Function):
    """All-gather along ``dim`` into a computation every TP rank repeats identically (the
    output layer's input sequence, or its vocabulary-split logits): backward keeps this rank's
    part of the gradient, without summing."""

    @staticmethod
    def forward(ctx, x, group, size, rank, dim):
        ctx.size, ctx.rank, ctx.dim = size, rank, dim
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(ctx.size, dim=ctx.dim)[ctx.rank].contiguous(), None, None, None, None


def reduce_scatter(parts: list[torch.Tensor], group) -> torch.Tensor:
    """The sum over the group of every rank's ``parts[rank]``, this rank's: a reduce-scatter,
    run as an all-to-all and a local sum. Gloo has no reduce-scatter of its own (PyTorch
    emulates it, 3-7x slower than an all-gather of the same bytes on this project's machines:
    benchmarks/gloo_collectives.py); the all-to-all moves what a ring reduce-scatter moves,
    ``(n-1)/n`` of the buffer each way, which is what the model prices."""
    sent = torch.stack(parts)
    received = torch.empty_like(sent)
    dist.all_to_all_single(received, sent, group=group)
    return received.sum(0)


def _reduce_scatter_sequence(x: torch.Tensor, group, size: int) -> torch.Tensor:
    return reduce_scatter(list(x.chunk(size, dim=1)), group)


def enter_region(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """Megatron's ``f``: into a column-parallel layer (gathering the sequence under SP)."""
    if tp.size == 1:
        return x
    if tp.sequence_parallel:
        return GatherSequence.apply(x, tp.group, tp.size)
    return CopyToRegion.apply(x, tp.group)


def leave_region(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """Megatron's ``g``: out of a row-parallel layer (scattering the sequence under SP)."""
    if tp.size == 1:
        return x
    if tp.sequence_parallel:
        return ScatterSequence.apply(x, tp.group, tp.size)
    return ReduceFromRegion.apply(x, tp.group)


def shard(weight: torch.Tensor, tp: TensorParallel, dim: int) -> nn.Parameter:
    """This rank's chunk of ``weight`` along ``dim``, a parameter of its own."""
    return nn.Parameter(weight.chunk(tp.size, dim=dim)[tp.rank].clone())


def mark_sequence_partial(params, tp: TensorParallel) -> None:
    """With sequence parallelism these replicated weights see only this rank's part of the
    sequence: their gradients must be summed over the TP group (Megatron-LM does the same)."""
    for param in params:
        param.sequence_partial = tp.sequence_parallel and tp.size > 1


def sync_sequence_parallel_grads(modules, tp: TensorParallel) -> None:
    """All-reduce the partial gradients of replicated weights: those
    ``_mark_sequence_partial`` flagged, and replicated K/V heads."""
    for module in modules:
        for param in module.parameters():
            partial = getattr(param, "sequence_partial", False) or getattr(
                param, "replicated_kv", False)
            if partial and param.grad is not None:
                dist.all_reduce(param.grad, group=tp.group)
