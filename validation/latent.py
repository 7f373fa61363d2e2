"""The harness's multi-head latent attention (DeepSeek-V2 report, arXiv 2405.04434, sec.
2.1.2-2.1.3), laid out as Megatron-Core's ``MLASelfAttention`` runs it
(megatron/core/transformer/multi_latent_attention.py) and the simulator counts it
(``simulator/model/latent.py``):

- the query through a down-projection to ``q_lora_rank``, a norm and an up-projection to
  ``heads`` of ``qk_nope + qk_rope`` (or one projection without a query latent);
- keys and values through one down-projection to the latent ``kv_lora_rank`` beside the RoPE
  key every head shares (``qk_rope``), a norm over the latent and an up-projection to
  ``heads`` of ``qk_nope`` key and ``v_head_dim`` value columns; each head's key is its own
  part joined to the shared one;
- ordinary causal attention over those widths, and the output projection from
  ``heads x v_head_dim``.

Under tensor parallelism the down-projections and the norms are whole on every rank (TE's
``duplicated`` linears) and run on the rank's tokens, its part of the sequence under sequence
parallelism; the up-projections split the heads by columns and enter the parallel region
each with its own input (the query latent, the key-value latent, the shared RoPE key: three
all-gathers under sequence parallelism, none of the hidden state), and the output projection
splits by rows, as a dense layer's. Without sequence parallelism the harness also sums the
RoPE key's gradient over the group (one all-reduce more than the model counts: Megatron-Core
runs a collective for that key only under sequence parallelism, its gather), which the exact
gradient of its duplicated down-projection needs. The harness's positions are learned
(shrink.py), so no rotary embedding turns the RoPE parts: they are plain columns of the same
widths.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .tensor_parallel import TensorParallel, enter_region, mark_sequence_partial, shard


class LatentAttention(nn.Module):
    """MLA with its two latents, each normed before its up-projection."""

    def __init__(self, shape, gen: torch.Generator, tp: TensorParallel) -> None:
        super().__init__()
        h, a, std = shape.hidden, shape.heads, 0.02
        self.tp, self.heads = tp, a // tp.size
        self.nope, self.rope = shape.qk_nope_head_dim, shape.qk_rope_head_dim
        self.v_dim, self.latent = shape.v_head_dim, shape.kv_lora_rank
        qk = self.nope + self.rope

        def weight(rows: int, cols: int, split: int | None = None,
                   scale: float = std) -> nn.Parameter:
            whole = torch.randn(rows, cols, generator=gen) * scale
            return nn.Parameter(whole) if split is None else shard(whole, tp, split)
        if shape.q_lora_rank is None:
            self.q_down, self.q_norm, self.q_up = None, None, weight(a * qk, h, 0)
        else:
            self.q_down = weight(shape.q_lora_rank, h)
            self.q_norm = nn.LayerNorm(shape.q_lora_rank)
            self.q_up = weight(a * qk, shape.q_lora_rank, 0)
        self.kv_down = weight(self.latent + self.rope, h)
        self.kv_norm = nn.LayerNorm(self.latent)
        self.kv_up = weight(a * (self.nope + self.v_dim), self.latent, 0)
        self.o = weight(h, a * self.v_dim, 1, std / math.sqrt(2 * shape.layers))
        whole = [self.kv_down, *self.kv_norm.parameters()]
        if self.q_down is not None:
            whole += [self.q_down, *self.q_norm.parameters()]
        mark_sequence_partial(whole, tp)  # they see the rank's part of the sequence only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: the rank's tokens; the output, the row-split projection's partial sum (the
        caller leaves the region)."""
        query = x if self.q_down is None else self.q_norm(F.linear(x, self.q_down))
        q = F.linear(enter_region(query, self.tp), self.q_up)
        latent, k_rope = F.linear(x, self.kv_down).split([self.latent, self.rope], dim=-1)
        kv = F.linear(enter_region(self.kv_norm(latent), self.tp), self.kv_up)
        k_rope = enter_region(k_rope.contiguous(), self.tp)
        b, s, _ = q.shape
        q = q.view(b, s, self.heads, -1)
        k_nope, v = kv.view(b, s, self.heads, -1).split([self.nope, self.v_dim], dim=-1)
        k = torch.cat([k_nope, k_rope.unsqueeze(2).expand(b, s, self.heads, self.rope)], -1)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.contiguous().transpose(1, 2), is_causal=True)
        return F.linear(y.transpose(1, 2).reshape(b, s, -1), self.o)
