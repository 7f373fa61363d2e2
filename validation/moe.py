"""The harness's mixture of experts: top-k routing to padded expert buffers, spread over the
expert-parallel ranks by all-to-all, as Megatron-Core's alltoall dispatcher runs it with a
capacity factor (megatron/core/transformer/moe/: router.py, moe_utils.py, token_dispatcher.py).

- The router (replicated) scores every token against every expert (softmax, fp32) and keeps
  each token's ``top_k``. Each expert takes ``C = ceil(T top_k / E x capacity_factor)`` of the
  rank's ``T`` tokens, its highest-scored (``drop_policy: probs``), padded to exactly ``C``
  with tokens of probability 0 (``moe_pad_expert_input_to_capacity``): every buffer has the
  same size, which is what the simulator charges (``routing.routed_rows``).
- The buffers, expert by expert, go to the ranks holding their experts (``E/ep`` each,
  consecutive) in one all-to-all with equal splits, and come back the same way.
- Each local expert's MLP runs in turn over its ``ep C`` rows (Megatron-Core's
  ``SequentialMLP``: one GEMM per expert and matrix, as the simulator costs them). The routing
  probabilities travel with the tokens and weight the activation (Megatron-Core's
  ``weighted_bias_swiglu_impl``), which keeps the MLP's inputs and the probabilities, not the
  experts' outputs: what ``activations._moe_tensors`` counts.

There is no auxiliary load-balancing loss: a few steps from a random start do not need one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

from .tensor_parallel import GatherSequence, ScatterSequence, TensorParallel


@dataclass(frozen=True)
class ExpertParallel:
    """This rank's place in its expert-parallel group (size 1: every expert local) and the
    group over which its experts' gradients reduce (None: no other rank holds them)."""

    group: dist.ProcessGroup | None = None
    size: int = 1
    rank: int = 0
    data_group: dist.ProcessGroup | None = None
    folded: bool = False  # whole experts under TP, the EP group drawn from TP x DP ranks


@dataclass(frozen=True)
class ExpertShape:
    """What one MoE layer needs of the model's shape."""

    hidden: int
    ffn_hidden: int  # one routed expert's width
    experts: int
    top_k: int
    capacity_factor: float
    swiglu: bool
    layers: int  # for the output matrices' initial scale, as the dense MLP's


def expert_capacity(tokens: int, shape: ExpertShape) -> int:
    """Slots per expert in one rank's buffer: ``ceil(T top_k / E x capacity_factor)``
    (Megatron-Core's ``get_capacity``, called with ``T top_k`` tokens), at most ``T``."""
    return min(tokens, math.ceil(tokens * shape.top_k / shape.experts * shape.capacity_factor))


class _WeightedActivation(torch.autograd.Function):
    """The experts' activation times each row's routing probability, keeping only its inputs
    and the probabilities and recomputing the product in backward (a fused kernel's memory)."""

    @staticmethod
    def forward(ctx, probs, up, gate=None):
        ctx.save_for_backward(probs, up, gate)
        return _activation(up, gate) * probs.unsqueeze(-1)

    @staticmethod
    def backward(ctx, grad):
        saved = [t for t in ctx.saved_tensors if t is not None]
        with torch.enable_grad():
            inputs = [t.detach().requires_grad_() for t in saved]
            probs, up, *gate = inputs
            out = _activation(up, gate[0] if gate else None) * probs.unsqueeze(-1)
            grads = torch.autograd.grad(out, inputs, grad)
        return (*grads, None) if not gate else grads


def _activation(up: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    """SwiGLU with a gate, GELU without."""
    return F.gelu(up) if gate is None else F.silu(gate) * up


def _experts_weights(stacked: torch.Tensor, local: slice, tp: TensorParallel,
                     dim: int) -> nn.ParameterList:
    """This rank's experts of one matrix, each a parameter of its own (its TP shard along
    ``dim``), marked as experts'."""
    weights = nn.ParameterList(nn.Parameter(w.chunk(tp.size, dim=dim)[tp.rank].clone())
                               for w in stacked[local])
    for w in weights:
        w.expert = True
    return weights


class MoE(nn.Module):
    """An MoE MLP: the router, this rank's ``E/ep`` experts and the all-to-alls between.

    Under tensor parallelism (with sequence parallelism, as Megatron-Core requires) each rank
    routes its own part of the sequence, and the experts split like the dense MLP
    (``expert_tp`` = tp): what the all-to-all brought is all-gathered over the TP group, each
    rank runs its columns of the experts' first matrices and rows of their second, and the
    outputs are reduce-scattered back before the all-to-all home (Megatron-Core's alltoall
    dispatcher: ``gather_from_sequence_parallel_region`` and
    ``reduce_scatter_to_sequence_parallel_region`` over the TP group). Folded (``expert_tp``
    1, MoE parallel folding) the experts stay whole and the EP group is drawn from the
    stage's TP x DP ranks: each rank's own tokens go to the all-to-all, nothing is gathered."""

    def __init__(self, shape: ExpertShape, ep: ExpertParallel, gen: torch.Generator,
                 tp: TensorParallel | None = None) -> None:
        super().__init__()
        tp = tp or TensorParallel()
        if shape.experts % ep.size:
            raise ValueError(f"experts ({shape.experts}) must be divisible by ep ({ep.size})")
        if tp.size > 1 and not tp.sequence_parallel:
            raise ValueError("experts under tensor parallelism need sequence parallelism")
        if ep.folded:  # whole experts: each rank's own tokens go straight to the all-to-all
            tp = TensorParallel()
        h, f, e, std = shape.hidden, shape.ffn_hidden, shape.experts, 0.02
        self.shape, self.ep, self.tp = shape, ep, tp
        local = slice(ep.rank * e // ep.size, (ep.rank + 1) * e // ep.size)
        self.router = nn.Parameter(torch.randn(e, h, generator=gen) * std)
        # One tensor per expert and matrix, as SequentialMLP's modules hold them: indexing one
        # stacked tensor would give each expert's gradient the whole stack's size.
        self.up = _experts_weights(torch.randn(e, f, h, generator=gen) * std, local, tp, 0)
        self.gate = _experts_weights(torch.randn(e, f, h, generator=gen) * std, local, tp, 0) \
            if shape.swiglu else None
        down = torch.randn(e, h, f, generator=gen) * std / math.sqrt(2 * shape.layers)
        self.down = _experts_weights(down, local, tp, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        tokens = x.reshape(b * s, h)
        slots, probs = self._route(tokens)
        rows = self._gather(self._exchange(tokens.index_select(0, slots)))
        probs = self._gather(self._exchange(probs.unsqueeze(-1))).squeeze(-1)
        out = self._scatter(self._experts(rows, probs))
        # scatter_add, whose backward keeps only the index (index_add's keeps its source)
        combined = torch.zeros_like(tokens).scatter_add(
            0, slots.unsqueeze(-1).expand(-1, h), self._exchange(out))
        return combined.view(b, s, h)

    def _route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the token of each expert slot, expert-major, and its routing probability)."""
        scores = F.linear(tokens, self.router).float().softmax(dim=-1)
        top, chosen = scores.topk(self.shape.top_k, dim=-1)
        routed = torch.zeros_like(scores).scatter(-1, chosen, top)
        capacity = expert_capacity(tokens.shape[0], self.shape)
        kept = routed.detach().topk(capacity, dim=0).indices  # (C, E): each expert's best
        probs = routed.gather(0, kept)  # 0 for the padding: tokens not routed here
        return kept.t().reshape(-1), probs.t().reshape(-1).to(tokens.dtype)

    def _exchange(self, rows: torch.Tensor) -> torch.Tensor:
        """Expert-major rows to the ranks holding those experts, or the experts' outputs home
        again: with equal splits the all-to-all is its own inverse."""
        if self.ep.size == 1:
            return rows
        return wait_tensor(all_to_all_single_autograd(rows.contiguous(), None, None,
                                                      self.ep.group))

    def _gather(self, rows: torch.Tensor) -> torch.Tensor:
        """The TP group's received rows, one rank's after another (its reduce-scatter
        backward sums the partial gradients the column-split matrices give)."""
        if self.tp.size == 1:
            return rows
        return GatherSequence.apply(rows.unsqueeze(0), self.tp.group, self.tp.size).squeeze(0)

    def _scatter(self, rows: torch.Tensor) -> torch.Tensor:
        """The row-split matrices' partial outputs summed over the TP group, each rank keeping
        its own rows."""
        if self.tp.size == 1:
            return rows
        return ScatterSequence.apply(rows.unsqueeze(0), self.tp.group, self.tp.size).squeeze(0)

    def _experts(self, rows: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """The local experts' MLPs one after another, each on its rows from every source rank
        (Megatron-Core's ``SequentialMLP``, its default without ``--moe-grouped-gemm``)."""
        local, ep = len(self.up), self.ep.size * self.tp.size  # rows from every source
        per_source = rows.shape[0] // (ep * local)
        grouped = rows.view(ep, local, per_source, -1).transpose(0, 1).reshape(
            local, ep * per_source, -1)
        weights = probs.view(ep, local, per_source).transpose(0, 1).reshape(local, -1)
        outs = []
        for i, (x, w) in enumerate(zip(grouped.unbind(0), weights.unbind(0), strict=True)):
            gate = None if self.gate is None else F.linear(x, self.gate[i])
            act = _WeightedActivation.apply(w, F.linear(x, self.up[i]), gate)
            outs.append(F.linear(act, self.down[i]))
        out = torch.stack(outs)
        return out.view(local, ep, per_source, -1).transpose(0, 1).reshape(rows.shape)
