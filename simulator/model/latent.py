"""Multi-head latent attention (MLA): its parameters, projection GEMMs and saved activations.

DeepSeek-V2 report (arXiv 2405.04434) sec. 2.1.2-2.1.3 and the transformers layout of
``DeepseekV3Attention`` (deepseek-ai/DeepSeek-V3 ``modeling_deepseek.py``): the query goes
through a down-projection ``W^DQ`` (``h x d_c'``, ``q_lora_rank``), an RMSNorm and an
up-projection ``W^UQ`` to ``a`` heads of ``d_h + d_h^R`` (``qk_nope + qk_rope``), or, without
``q_lora_rank`` (DeepSeek-V2-Lite), one ``h x a (d_h + d_h^R)`` projection; keys and values share
a down-projection ``W^DKV`` to the latent ``d_c`` (``kv_lora_rank``) plus the one RoPE key
``d_h^R`` every head shares, an RMSNorm over the latent and an up-projection ``W^UKV`` to ``a``
heads of ``d_h`` key and ``d_v`` value columns; the output projection maps ``a d_v`` back to
``h``. Attention itself is ordinary per-head attention with ``d_h + d_h^R``-wide queries and
keys and ``d_v``-wide values, so its FLOPs are ``2 s^2 a (d_qk + d_v)`` per sequence over the
full square (SCENARIO.md's convention, ``4 s^2 h`` when both widths are ``h / a``).

Under tensor parallelism Megatron-Core splits the per-head up-projections by columns and the
output projection by rows, like QKV and the output projection of dense attention, and keeps the
down-projections whole on every TP rank (``parallel_mode="duplicated"``, megatron/core/
transformer/multi_latent_attention.py): with sequence parallelism each rank runs them on its
``1/tp`` of the tokens, and the up-projections all-gather the latents, not the hidden state
(``layer_comm.tp_collectives``). Their weight gradients differ by rank and are summed over the TP
group once a step (``finalize_model_grads``, ``cost_model.finalize_grads_time``). Without
sequence parallelism every rank runs them on all the tokens, alike, and the up-projections'
backward all-reduces the latents' gradients. DeepSeek-V2 and V3 trained without TP
(V3 report arXiv 2412.19437 sec. 3.2: 16-way PP, 64-way EP, ZeRO-1 DP); NVIDIA's DeepSeek-V3
recipes for H100 run TP 2 (NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .kernels import Gemm

if TYPE_CHECKING:
    from ..inputs.specs import ModelSpec


def query_weights(m: ModelSpec) -> int:
    """``h d_c' + d_c' a d_qk`` (down and up), or ``h a d_qk`` without a query latent."""
    heads_width = m.heads * m.qk_head_dim
    if m.q_lora_rank is None:
        return m.hidden * heads_width
    return m.hidden * m.q_lora_rank + m.q_lora_rank * heads_width


def key_value_weights(m: ModelSpec) -> int:
    """``h (d_c + d_h^R)`` down (latent and shared RoPE key) and ``d_c a (d_h + d_v)`` up."""
    down = m.hidden * (m.kv_lora_rank + m.qk_rope_head_dim)
    up = m.kv_lora_rank * m.heads * (m.qk_nope_head_dim + m.v_head_dim)
    return down + up


def projection_weights(m: ModelSpec) -> int:
    """Weights of every MLA projection, output ``a d_v x h`` included: what its GEMMs
    multiply, each token once."""
    return query_weights(m) + key_value_weights(m) + m.heads * m.v_head_dim * m.hidden


def latent_norm_params(m: ModelSpec) -> int:
    """The RMSNorms over the query latent (when there is one) and the key-value latent, a
    weight each (and a bias under LayerNorm)."""
    per_width = 2 if m.norm == "layernorm" else 1
    return per_width * ((m.q_lora_rank or 0) + m.kv_lora_rank)


def attention_params(m: ModelSpec) -> int:
    """All of MLA's parameters: projections and latent norms (no biases: the spec refuses
    ``bias: true`` with MLA). DeepSeek-V3: 187,107,328 per layer."""
    return projection_weights(m) + latent_norm_params(m)


def duplicated_params(m: ModelSpec) -> int:
    """What every TP rank holds whole: the down-projections (``h d_c'`` and ``h (d_c + d_h^R)``)
    and the latent norms."""
    query_down = m.hidden * m.q_lora_rank if m.q_lora_rank is not None else 0
    return query_down + m.hidden * (m.kv_lora_rank + m.qk_rope_head_dim) + latent_norm_params(m)


def gemms(m: ModelSpec, tokens: float, tp: int = 1,
          sequence_parallel: bool = False) -> tuple[Gemm, ...]:
    """MLA's projection GEMMs on one TP rank, ``Gemm(m=tokens, n=out, k=in)``, in the order they
    run: query down and up (or the one query projection), key-value down and up, output. The
    up-projections and the query projection carry ``heads/tp`` heads, the output projection
    reads them; the down-projections are whole, on the rank's ``tokens/tp`` under sequence
    parallelism (``roles``)."""
    heads = m.heads / tp
    q_width = heads * m.qk_head_dim
    down_rows = tokens / tp if sequence_parallel else tokens
    query = ((Gemm(tokens, q_width, m.hidden),) if m.q_lora_rank is None else
             (Gemm(down_rows, m.q_lora_rank, m.hidden), Gemm(tokens, q_width, m.q_lora_rank)))
    return (*query,
            Gemm(down_rows, m.kv_lora_rank + m.qk_rope_head_dim, m.hidden),
            Gemm(tokens, heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
            Gemm(tokens, m.hidden, heads * m.v_head_dim))


def roles(m: ModelSpec) -> tuple[str, ...]:
    """The TP role of each of ``gemms``: ``duplicated`` (a down-projection, whole on every
    rank), ``column`` (the up-projections, the query projection) or ``row`` (output)."""
    query = ("column",) if m.q_lora_rank is None else ("duplicated", "column")
    return (*query, "duplicated", "column", "row")


def gathered_widths(m: ModelSpec) -> tuple[int, int, int]:
    """Columns per token of each all-gather MLA runs under sequence parallelism, one a tensor
    as Megatron-Core's ``MLASelfAttention`` does: the query latent ``d_c'`` (or, without one,
    the hidden state the query projection reads) and the key-value latent ``d_c``, each
    gathered by its column-parallel up-projection, and the shared RoPE key ``d_h^R``
    (``k_pos_emb``, ``gather_from_sequence_parallel_region`` of its own)."""
    query = m.hidden if m.q_lora_rank is None else m.q_lora_rank
    return query, m.kv_lora_rank, m.qk_rope_head_dim


def latent_width(m: ModelSpec) -> int:
    """Columns per token of the latents: ``d_c' + d_c`` (``d_c`` alone without a query
    latent). Each latent is kept twice for backward, as its norm's input and as the
    up-projection's (the norm's output); its norm reads and writes it once each forward."""
    return (m.q_lora_rank or 0) + m.kv_lora_rank
