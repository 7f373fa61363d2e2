"""Parameter counts of a model: per layer, per kind of layer, whole and activated.

One place for what ``memory.py`` shards, what ``workload.py`` turns into FLOPs and what the
tables print as a model's size.
"""

from __future__ import annotations

from ..inputs.specs import ModelSpec
from . import latent


def attention_weights(m: ModelSpec) -> int:
    """Weights of the attention's projections, what its GEMMs multiply each token by:
    ``h(q + 2h_kv) + q h`` (Q, K, V, output; ``q = a d``, ``h`` unless ``head_dim`` says
    otherwise), or MLA's (``latent.projection_weights``)."""
    if m.mla:
        return latent.projection_weights(m)
    return m.hidden * (m.query_width + 2 * m.kv_hidden) + m.query_width * m.hidden


def attention_params(m: ModelSpec) -> int:
    """The attention's parameters: projections plus biases, or MLA's with its latent norms."""
    if m.mla:
        return latent.attention_params(m)
    biases = (m.query_width + 2 * m.kv_hidden) + m.hidden if m.bias else 0
    return attention_weights(m) + biases


def expert_params(m: ModelSpec, width: int | None = None) -> int:
    """One MLP (one expert) of ``width`` (default ``ffn_hidden``): ``k * h * f`` weights for
    k = 2 (gelu) or 3 (swiglu) (+ biases)."""
    f = m.ffn_hidden if width is None else width
    weights = m.ffn_matrices * m.hidden * f
    biases = (m.ffn_matrices - 1) * f + m.hidden if m.bias else 0
    return weights + biases


def mlp_params(m: ModelSpec) -> int:
    """All experts of one layer, the shared experts (one MLP of ``shared_width``) and the router
    (``h * experts``) when ``experts > 1``."""
    router = m.hidden * m.experts if m.experts > 1 else 0
    shared = expert_params(m, m.shared_width) if m.shared_experts else 0
    return m.experts * expert_params(m) + shared + router


def norm_params(m: ModelSpec) -> int:
    """One normalisation: weight and bias (LayerNorm) or weight only (RMSNorm)."""
    return 2 * m.hidden if m.norm == "layernorm" else m.hidden


def layer_params(m: ModelSpec) -> int:
    """One transformer layer: attention, MLP and its two norms."""
    return attention_params(m) + mlp_params(m) + 2 * norm_params(m)


def embedding_params(m: ModelSpec) -> int:
    """Token embedding, plus learned position embeddings where the model has them."""
    positions = m.seq_len * m.hidden if m.position_embedding == "learned" else 0
    return m.vocab * m.hidden + positions


def head_params(m: ModelSpec) -> int:
    """Final norm and the output layer (zero extra weights when tied to the embedding)."""
    output = 0 if m.tie_embeddings else m.vocab * m.hidden
    return norm_params(m) + output


def layer_kinds(m: ModelSpec) -> tuple[tuple[ModelSpec, int], ...]:
    """Each kind of layer the model has with its count, in model order: the ``dense_layers``
    first ones (``ModelSpec.dense_layer_spec``) and the rest, or one kind for all."""
    if m.dense_layers == 0:
        return ((m, m.layers),)
    return ((m.dense_layer_spec(), m.dense_layers), (m, m.layers - m.dense_layers))


def total_params(m: ModelSpec) -> int:
    """Parameters of the whole model, every expert counted (the published "size")."""
    layers = sum(n * layer_params(kind) for kind, n in layer_kinds(m))
    return layers + embedding_params(m) + head_params(m)


def activated_params(m: ModelSpec) -> int:
    """Parameters a token's forward multiplies by: all but the routed experts it skips
    (``experts - top_k`` per MoE layer) and the embedding tables, which it only looks a row up
    in (a tied output layer still counts). DeepSeek's "activated" count (DeepSeek-V3 report,
    arXiv 2412.19437 sec. 1: 37B of 671B) and ``N`` of the ``6 N`` FLOPs per token."""
    skipped = sum(n * (kind.experts - kind.top_k) * expert_params(kind)
                  for kind, n in layer_kinds(m))
    lookup = embedding_params(m) - (m.vocab * m.hidden if m.tie_embeddings else 0)
    return total_params(m) - skipped - lookup


def layer_params_per_rank(m: ModelSpec, tp: int, ep: int,
                          etp: int | None = None) -> tuple[float, float]:
    """(dense, expert) parameters of one layer on one tensor/expert-parallel rank; the routed
    experts split ``etp`` ways (``ParallelSpec.etp``; None: ``tp``).

    Column-parallel weights and biases (Q, K, V, MLP up/gate) and row-parallel weights (attention
    output, MLP down) split by tp; row-parallel biases, norms and the router are replicated.
    K and V split by tp down to one head, below which they are replicated (Megatron-LM).
    Shared experts are dense parameters (replicated over ep, reduced over every data-parallel
    rank, as Megatron-Core's SharedExpertMLP). MLA's down-projections and latent norms are
    whole on every rank, the rest split by tp (``latent.duplicated_params``).
    """
    kv_per_rank = m.kv_width_per_rank(tp)
    duplicated = latent.duplicated_params(m) if m.mla else 0
    attention = (duplicated + (latent.attention_params(m) - duplicated) / tp if m.mla else
                 m.hidden * m.query_width * 2 / tp + 2 * m.hidden * kv_per_rank
                 + ((m.query_width / tp + 2 * kv_per_rank + m.hidden) if m.bias else 0))
    router = m.hidden * m.experts if m.experts > 1 else 0
    shared = _expert_params_per_rank(m, tp, m.shared_width) if m.shared_experts else 0
    dense = attention + router + shared + 2 * norm_params(m)
    experts = (m.experts / ep) * _expert_params_per_rank(m, etp or tp if m.experts > 1 else tp)
    if m.experts == 1:
        return dense + experts, 0.0
    return dense, experts


def _expert_params_per_rank(m: ModelSpec, tp: int, width: int | None = None) -> float:
    """One MLP of ``width`` (default ``ffn_hidden``) on one tp rank: ``(k h f + (k-1) f) / t
    + h`` with biases.

    The down projection's bias (h) is replicated like every row-parallel bias; dividing all of
    ``expert_params`` by tp (as this module once did) undercounted it by ``h (1 - 1/t)``.
    """
    k, h, f = m.ffn_matrices, m.hidden, m.ffn_hidden if width is None else width
    return (k * h * f + ((k - 1) * f if m.bias else 0)) / tp + (h if m.bias else 0)


def tp_summed_params(m: ModelSpec) -> int:
    """Parameters of one layer that every TP rank holds whole and, under sequence parallelism,
    trains on its own shard of the tokens, so their gradients are summed over the TP group once
    a step: the norms, the router, row-parallel biases and MLA's down-projections and latent
    norms (the ``sequence_parallel`` attribute Megatron-Core sets on them: megatron/core/
    extensions/transformer_engine.py for duplicated TE linears, moe/router.py,
    tensor_parallel/layers.py; summed in ``_allreduce_non_tensor_model_parallel_grads``,
    megatron/core/distributed/finalize_model_grads.py)."""
    router = m.hidden * m.experts if m.experts > 1 else 0
    row_biases = m.hidden * (1 + int(m.experts == 1) + int(m.shared_experts > 0)) if m.bias else 0
    duplicated = latent.duplicated_params(m) if m.mla else 0
    return 2 * norm_params(m) + router + row_biases + duplicated
