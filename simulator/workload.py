"""The transformer workload: parameter counts, FLOPs per step, and the kernels of one layer.

FLOP accounting follows SCENARIO.md (Narayanan et al. 2021; Korthikanti et al. 2022): matmuls
only, forward + backward = 3x forward, attention scores over the full s x s square.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .specs import ModelSpec

if TYPE_CHECKING:
    from .scenario import Scenario

BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


# --- parameters ------------------------------------------------------------------------------

def attention_params(m: ModelSpec) -> int:
    """Q, K, V and output projections (+ biases): ``h(h + 2h_kv) + h^2``."""
    weights = m.hidden * (m.hidden + 2 * m.kv_hidden) + m.hidden * m.hidden
    biases = (m.hidden + 2 * m.kv_hidden) + m.hidden if m.bias else 0
    return weights + biases


def expert_params(m: ModelSpec) -> int:
    """One MLP (one expert): ``k * h * f`` weights for k = 2 (gelu) or 3 (swiglu) (+ biases)."""
    weights = m.ffn_matrices * m.hidden * m.ffn_hidden
    biases = (m.ffn_matrices - 1) * m.ffn_hidden + m.hidden if m.bias else 0
    return weights + biases


def mlp_params(m: ModelSpec) -> int:
    """All experts of one layer plus the router (``h * experts``) when ``experts > 1``."""
    router = m.hidden * m.experts if m.experts > 1 else 0
    return m.experts * expert_params(m) + router


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


def total_params(m: ModelSpec) -> int:
    """Parameters of the whole model, every expert counted (the published "size")."""
    return m.layers * layer_params(m) + embedding_params(m) + head_params(m)


# --- FLOPs (SCENARIO.md, "FLOP accounting") ---------------------------------------------------

def layer_forward_flops(m: ModelSpec) -> float:
    """Forward FLOPs of one layer for one sequence.

    ``2sh(h + 2h_kv) + 4s^2h + 2sh^2 + 2ksh f * top_k`` (QKV, scores and values, output, MLP).
    """
    s, h = m.seq_len, m.hidden
    qkv = 2 * s * h * (h + 2 * m.kv_hidden)
    attention = 4 * s * s * h
    output = 2 * s * h * h
    mlp = 2 * m.ffn_matrices * s * h * m.ffn_hidden * m.top_k
    return float(qkv + attention + output + mlp)


def attention_core_forward_flops(m: ModelSpec) -> float:
    """The ``4 s^2 h`` of scores and values: what selective recomputation re-runs."""
    return 4.0 * m.seq_len * m.seq_len * m.hidden


def logits_forward_flops(m: ModelSpec) -> float:
    """Output layer for one sequence: ``2 s h V``."""
    return 2.0 * m.seq_len * m.hidden * m.vocab


def model_flops_per_step(s: Scenario) -> float:
    """Model FLOPs of one optimizer step: 3x forward, no recomputation."""
    per_sequence = s.model.layers * layer_forward_flops(s.model) + logits_forward_flops(s.model)
    return 3.0 * per_sequence * s.training.global_batch


def recompute_flops_per_step(s: Scenario) -> float:
    """What recomputation re-runs: each layer's forward (full) or its attention core (selective).

    With flash attention the attention core is fused and its score matrix never stored, so
    selective recomputation has nothing to re-run (the backward kernel recomputes the scores
    either way, counted in the 3x of model FLOPs): it costs 0, as the step time and memory say.
    """
    selective = 0.0 if s.training.flash_attention else attention_core_forward_flops(s.model)
    per_layer = {
        "none": 0.0,
        "selective": selective,
        "full": layer_forward_flops(s.model),
    }[s.parallel.recompute]
    return per_layer * s.model.layers * s.training.global_batch


def hardware_flops_per_step(s: Scenario) -> float:
    """Model FLOPs plus recomputation: what Megatron-LM reports as achieved FLOP/s."""
    return model_flops_per_step(s) + recompute_flops_per_step(s)


# --- kernels of one layer on one rank, per micro-batch ------------------------------------------

@dataclass(frozen=True, slots=True)
class LayerKernels:
    """Forward work of one layer for one micro-batch on one rank.

    ``matmuls`` are the GEMMs' FLOPs (``attention`` holds the score/value products separately,
    since flash attention fuses them and recomputation treats them apart); ``memory_bytes`` is
    the HBM traffic of the element-wise kernels (norms, activations, residuals, softmax).
    ``tp_bytes`` is the size of one tensor-parallel all-reduce (two per layer each way).
    """

    matmuls: tuple[float, ...]
    attention: float
    memory_bytes: float
    tp_bytes: float
    tokens: int

    @property
    def matmul_flops(self) -> float:
        return sum(self.matmuls) + self.attention


def layer_kernels(s: Scenario) -> LayerKernels:
    """Per-rank forward kernels of one layer: tokens ``b*s/cp``, weights split ``tp`` ways.

    K and V split by tp down to one head each, below which they are replicated (Megatron-LM).
    An MoE layer runs one GEMM per local expert (``experts/ep`` of them), each on its share
    ``tokens * top_k * ep / experts`` of the routed tokens (balanced routing).
    """
    m, p = s.model, s.parallel
    tokens = s.training.micro_batch * m.seq_len // p.cp
    h, tp = m.hidden, p.tp
    act = BYTES[s.training.precision]
    kv_width = max(m.kv_heads / tp, 1) * m.head_dim  # K (or V) columns on this rank
    local_experts = max(m.experts // p.ep, 1)
    expert_tokens = tokens * m.top_k / local_experts
    matmuls = (
        2.0 * tokens * h * (h / tp + 2 * kv_width),  # QKV (column-parallel)
        2.0 * tokens * h * h / tp,  # output projection (row-parallel)
        *[2.0 * expert_tokens * h * m.ffn_hidden / tp] * (m.ffn_matrices * local_experts),
    )
    attention = 4.0 * tokens * m.seq_len * h / tp  # queries of this rank against all keys
    return LayerKernels(matmuls, attention, _elementwise_bytes(s, tokens, act), tokens * h * act,
                        tokens)


def _elementwise_bytes(s: Scenario, tokens: int, act: int) -> float:
    """HBM bytes read and written by one layer's element-wise kernels in forward.

    Without flash attention, softmax, its mask and dropout also read and write the
    ``heads/tp x s x s`` scores.
    """
    m, p = s.model, s.parallel
    hidden_split = p.tp if p.sequence_parallel else 1
    scores = 0.0
    if not s.training.flash_attention:
        scores = 4.5 * act * (m.heads / p.tp) * tokens * m.seq_len
    return norm_activation_bytes(tokens, m.hidden / hidden_split, m.ffn_hidden * m.top_k / p.tp,
                                 act, m.ffn_kind) + scores


def norm_activation_bytes(tokens: int, hidden: float, ffn_width: float, act: int,
                          ffn_kind: str) -> float:
    """Forward bytes of one layer's norms, residual adds and dropouts (``tokens x hidden``
    tensors; hidden split by tp only with sequence parallelism) and of its activation function
    (``tokens x ffn_width``)."""
    norms_residuals_dropouts = (2 * 2 + 2 * 3 + 2 * 2.5) * tokens * hidden * act
    activation = (3 if ffn_kind == "swiglu" else 2) * tokens * ffn_width * act
    return norms_residuals_dropouts + activation


def loss_bytes(tokens: int, vocab: float) -> float:
    """Forward bytes of the loss over fp32 logits: write them, softmax reads and writes."""
    return 3 * 4.0 * tokens * vocab


def logits_kernels(s: Scenario) -> tuple[float, float]:
    """Forward FLOPs of the output layer and HBM bytes of the loss, per micro-batch per rank."""
    m = s.model
    tokens = s.training.micro_batch * m.seq_len // s.parallel.cp
    flops = 2.0 * tokens * m.hidden * m.vocab / s.parallel.tp
    return flops, loss_bytes(tokens, m.vocab / s.parallel.tp)
