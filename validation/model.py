"""A small GPT whose shape comes from a scenario's model spec, split Megatron-style.

Under tensor parallelism (tensor_parallel.py) the QKV and first MLP matrices are split by
columns, the attention output and second MLP matrices by rows, and each block's parallel
regions are entered by ``f`` and left by ``g``. Every rank builds the full model from the same
seed and keeps its shard, so a split run and a single-process run start equal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from clustersim.simulator.inputs.specs import ModelSpec

from .context import ContextParallel, context_attention, local_positions
from .latent import LatentAttention
from .moe import ExpertParallel, ExpertShape, MoE
from .tensor_parallel import (
    CopyToRegion,
    GatherReplicated,
    GatherSequence,
    TensorParallel,
    enter_region,
    leave_region,
    mark_sequence_partial,
    shard,
)


@dataclass(frozen=True)
class GPTShape:
    """The model spec fields the real model needs."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    ffn_kind: str
    vocab: int
    seq_len: int
    head_dim: int | None = None  # per-head width; None: hidden / heads
    experts: int = 1  # > 1: every block's MLP is a mixture of experts (moe.py)
    top_k: int = 1
    capacity_factor: float = 1.0
    # Multi-head latent attention where kv_lora_rank is set (latent.py)
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None

    @classmethod
    def from_spec(cls, m: ModelSpec) -> GPTShape:
        return cls(m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.ffn_kind, m.vocab,
                   m.seq_len, m.head_dim, m.experts, m.top_k, m.capacity_factor or 1.0,
                   m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim,
                   m.v_head_dim)

    def experts_shape(self) -> ExpertShape:
        return ExpertShape(self.hidden, self.ffn_hidden, self.experts, self.top_k,
                           self.capacity_factor, self.ffn_kind == "swiglu", self.layers)


# --- the model --------------------------------------------------------------------------------

class Attention(nn.Module):
    """Causal self-attention; heads split over the TP group (K/V heads too, or replicated
    when there are fewer K/V heads than TP ranks, as Megatron-LM does). Replicated K/V weights
    are kept whole on every rank, each rank using the head its Q heads share; the gradient
    each rank computes is then a part of the whole, and summing over the group gives every
    copy the same, exact gradient. Under context parallelism the rank's part of the sequence
    attends to the whole through the CP group (context.py)."""

    def __init__(self, shape: GPTShape, tp: TensorParallel, gen: torch.Generator,
                 cp: ContextParallel) -> None:
        super().__init__()
        h, d = shape.hidden, shape.head_dim or shape.hidden // shape.heads
        self.tp, self.cp, self.head_dim = tp, cp, d
        self.heads = shape.heads // tp.size
        self.kv_heads = max(shape.kv_heads // tp.size, 1)
        std = 0.02
        q = torch.randn(shape.heads * d, h, generator=gen) * std
        k = torch.randn(shape.kv_heads * d, h, generator=gen) * std
        v = torch.randn(shape.kv_heads * d, h, generator=gen) * std
        o = torch.randn(h, shape.heads * d, generator=gen) * std / math.sqrt(2 * shape.layers)
        self.q = shard(q, tp, 0)
        replicated = shape.kv_heads < tp.size
        kv_tp = TensorParallel() if replicated else tp
        self.k, self.v = shard(k, kv_tp, 0), shard(v, kv_tp, 0)
        self.kv_head = tp.rank * shape.kv_heads // tp.size if replicated else None
        for weight in (self.k, self.v):
            weight.replicated_kv = replicated
        self.o = shard(o, tp, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = F.linear(x, self.q).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        wk, wv = self.k, self.v
        if self.kv_head is not None:  # this rank's Q heads share one replicated K/V head
            wk, wv = (w.view(-1, self.head_dim, w.shape[1])[self.kv_head] for w in (wk, wv))
        k = F.linear(x, wk).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = F.linear(x, wv).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.cp.size > 1:
            y = context_attention(q, k, v, self.cp)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               enable_gqa=self.kv_heads != self.heads)
        return F.linear(y.transpose(1, 2).reshape(b, s, -1), self.o)


class MLP(nn.Module):
    """GELU (2 matrices) or SwiGLU (3); the f-wide matrices split by columns."""

    def __init__(self, shape: GPTShape, tp: TensorParallel, gen: torch.Generator) -> None:
        super().__init__()
        h, f, std = shape.hidden, shape.ffn_hidden, 0.02
        self.swiglu = shape.ffn_kind == "swiglu"
        self.up = shard(torch.randn(f, h, generator=gen) * std, tp, 0)
        if self.swiglu:
            self.gate = shard(torch.randn(f, h, generator=gen) * std, tp, 0)
        down = torch.randn(h, f, generator=gen) * std / math.sqrt(2 * shape.layers)
        self.down = shard(down, tp, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = F.linear(x, self.up)
        act = F.silu(F.linear(x, self.gate)) * up if self.swiglu else F.gelu(up)
        return F.linear(act, self.down)


class Block(nn.Module):
    """Pre-norm transformer block: x + g(attn(f(norm x))), then the same for the MLP; the
    experts are not a region (under TP each rank routes its own part of the sequence and the
    experts gather and scatter what they need, moe.py)."""

    def __init__(self, shape: GPTShape, tp: TensorParallel, gen: torch.Generator,
                 ep: ExpertParallel, cp: ContextParallel) -> None:
        super().__init__()
        self.tp = tp
        self.norm1, self.norm2 = nn.LayerNorm(shape.hidden), nn.LayerNorm(shape.hidden)
        self.latent = shape.kv_lora_rank is not None
        self.attn = LatentAttention(shape, gen, tp) if self.latent else \
            Attention(shape, tp, gen, cp)
        self.experts = shape.experts > 1
        self.mlp = MoE(shape.experts_shape(), ep, gen, tp) if self.experts else \
            MLP(shape, tp, gen)
        for norm in (self.norm1, self.norm2):
            mark_sequence_partial(norm.parameters(), tp)
        if self.experts:  # the router sees this rank's part of the sequence only
            mark_sequence_partial([self.mlp.router], tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.latent:  # MLA enters the region with its latents, not the hidden state
            x = x + leave_region(self.attn(self.norm1(x)), self.tp)
        else:
            x = x + leave_region(self.attn(enter_region(self.norm1(x), self.tp)), self.tp)
        if self.experts:  # routed on this rank's part of the sequence (moe.py)
            return x + self.mlp(self.norm2(x))
        return x + leave_region(self.mlp(enter_region(self.norm2(x), self.tp)), self.tp)


class Embedding(nn.Module):
    """Token embedding split by vocabulary over TP (Megatron's VocabParallelEmbedding: each rank
    looks up the ids in its range, ``g`` sums the parts) and learned positions, replicated;
    under context parallelism, those of the rank's part of the sequence."""

    def __init__(self, shape: GPTShape, tp: TensorParallel, gen: torch.Generator,
                 cp: ContextParallel) -> None:
        super().__init__()
        if shape.vocab % tp.size:
            raise ValueError(f"vocab ({shape.vocab}) must be divisible by tp ({tp.size})")
        self.tp, self.cp = tp, cp
        words = torch.randn(shape.vocab, shape.hidden, generator=gen) * 0.02
        self.tokens = shard(words, tp, 0)
        self.first = tp.rank * self.tokens.shape[0]
        self.positions = nn.Parameter(torch.randn(shape.seq_len, shape.hidden,
                                                  generator=gen) * 0.02)
        mark_sequence_partial([self.positions], tp)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.first
        outside = (local < 0) | (local >= self.tokens.shape[0])
        x = F.embedding(local.masked_fill(outside, 0), self.tokens)
        x = leave_region(x.masked_fill(outside.unsqueeze(-1), 0.0), self.tp)
        positions = self.positions[local_positions(ids.shape[1] * self.cp.size, self.cp)]
        if self.tp.sequence_parallel and self.tp.size > 1:  # leave_region kept this rank's part
            positions = positions.chunk(self.tp.size)[self.tp.rank]
        return x + positions


class Head(nn.Module):
    """Final norm and the output layer split by vocabulary over TP; the logits are gathered so
    that every rank computes the same loss (Megatron fuses a vocab-parallel cross-entropy
    instead, which moves fewer bytes; the matmul and the weights per rank are the same)."""

    def __init__(self, shape: GPTShape, tp: TensorParallel, gen: torch.Generator) -> None:
        super().__init__()
        self.tp = tp
        self.norm = nn.LayerNorm(shape.hidden)
        self.out = shard(torch.randn(shape.vocab, shape.hidden, generator=gen) * 0.02, tp, 0)
        mark_sequence_partial(self.norm.parameters(), tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tp = self.tp
        if tp.size == 1:
            return F.linear(self.norm(x), self.out)
        if tp.sequence_parallel:  # each rank's logits part needs the whole sequence
            x = GatherSequence.apply(self.norm(x), tp.group, tp.size)
        else:
            x = CopyToRegion.apply(self.norm(x), tp.group)
        return GatherReplicated.apply(F.linear(x, self.out), tp.group, tp.size, tp.rank, -1)


def build_layers(shape: GPTShape, tp: TensorParallel, seed: int,
                 ep: ExpertParallel | None = None,
                 cp: ContextParallel | None = None) -> list[nn.Module]:
    """Embedding, the blocks, head — the full model in order, this rank's TP shard of each
    (and its experts). Every module is drawn from one generator in this order on every rank,
    so any subset a pipeline stage keeps has the same weights as in the single-process
    model."""
    cp = cp or ContextParallel()
    if (shape.experts > 1 or shape.kv_lora_rank is not None) and cp.size > 1:
        raise ValueError("the harness's experts and latent attention run without context "
                         "parallelism (cp 1)")
    gen = torch.Generator().manual_seed(seed)
    modules: list[nn.Module] = [Embedding(shape, tp, gen, cp)]
    modules += [Block(shape, tp, gen, ep or ExpertParallel(), cp) for _ in range(shape.layers)]
    modules.append(Head(shape, tp, gen))
    return modules


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
