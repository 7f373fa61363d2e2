"""Per-rank memory: model states under TP/PP/DP and ZeRO, activations, communication buffers.

Model states follow Rajbhandari et al. 2020 (ZeRO, sec. 3.1 and Figure 1): mixed-precision
Adam keeps 2 + 2 + 12 = 16 bytes per parameter, of which ZeRO-1 shards the 12 of optimizer
state, ZeRO-2 also the 2 of gradients and ZeRO-3 all 16 over the data-parallel ranks.
Activations follow Korthikanti et al. 2022 (sec. 4), generalised to GQA and SwiGLU so that
with ``kv_heads == heads``, ``ffn_hidden == 4h`` and GELU it is exactly ``sbh(34 + 5as/h)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import workload as wl
from .specs import ModelSpec
from .stages import chunk_layers, stage_layers

if TYPE_CHECKING:
    from .scenario import Scenario

BUCKET_PARAMS = 40_000_000  # Megatron-LM's default DDP bucket size, in parameters


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Peak bytes on the busiest rank of one pipeline stage, by component."""

    stage: int
    params: float
    grads: float
    optimizer: float
    activations: float
    buffers: float

    @property
    def peak_bytes(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers


# --- model states ----------------------------------------------------------------------------

def state_bytes_per_param(precision: str, optimizer: str) -> tuple[int, int, int]:
    """Bytes per parameter of (weights, gradients, optimizer state) before sharding.

    Mixed precision keeps an fp32 master copy in the optimizer state: Adam 4 + 4 + 4 = 12
    (ZeRO paper's K = 12), SGD with momentum 4 + 4 = 8; in fp32 the weights are the master.
    """
    weight = wl.BYTES[precision]
    master = 4 if precision != "fp32" else 0
    moments = 8 if optimizer == "adam" else 4
    return weight, weight, master + moments


def model_state_bytes(params: float, shards: int, zero: int, precision: str = "bf16",
                      optimizer: str = "adam") -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes of ``params`` parameters on one of ``shards`` ranks.

    ZeRO stage ``zero`` shards the optimizer state (>= 1), gradients (>= 2) and weights (3).
    """
    weight, grad, opt = state_bytes_per_param(precision, optimizer)
    return (params * weight / (shards if zero >= 3 else 1),
            params * grad / (shards if zero >= 2 else 1),
            params * opt / (shards if zero >= 1 else 1))


def layer_params_per_rank(m: ModelSpec, tp: int, ep: int) -> tuple[float, float]:
    """(dense, expert) parameters of one layer on one tensor/expert-parallel rank.

    Norms and the router are replicated; K and V are split by tp down to one head, below which
    they are replicated (Megatron-LM).
    """
    kv_per_rank = max(m.kv_heads / tp, 1) * m.head_dim
    attention = (m.hidden * m.hidden * 2 / tp + 2 * m.hidden * kv_per_rank
                 + ((m.hidden / tp + 2 * kv_per_rank + m.hidden) if m.bias else 0))
    router = m.hidden * m.experts if m.experts > 1 else 0
    dense = attention + router + 2 * wl.norm_params(m)
    experts = (m.experts / ep) * wl.expert_params(m) / tp
    if m.experts == 1:
        return dense + experts, 0.0
    return dense, experts


def stage_params_per_rank(s: Scenario, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters on one rank of ``stage``: its layers, embedding and head."""
    m, p = s.model, s.parallel
    dense, expert = layer_params_per_rank(m, p.tp, p.ep)
    layers = stage_layers(s)[stage]
    dense, expert = dense * layers, expert * layers
    if stage == 0:
        dense += wl.embedding_params(m) / p.tp
    if stage == p.pp - 1:
        # A tied output layer still needs its own copy on the last stage when pp > 1.
        tied_copy = m.tie_embeddings and p.pp > 1
        dense += wl.norm_params(m) + (m.vocab * m.hidden / p.tp if tied_copy or not
                                      m.tie_embeddings else 0)
    return dense, expert


def stage_model_states(s: Scenario, stage: int) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes on one rank of ``stage`` after ZeRO sharding.

    Dense parameters shard over the dp*cp ranks that replicate them, expert parameters over
    the dp*cp/ep ranks that replicate each expert (Megatron-LM's distributed optimizer).
    """
    p, t = s.parallel, s.training
    dense, expert = stage_params_per_rank(s, stage)
    replicas = p.dp * p.cp
    a = model_state_bytes(dense, replicas, p.zero, t.precision, t.optimizer)
    b = model_state_bytes(expert, max(replicas // p.ep, 1), p.zero, t.precision, t.optimizer)
    return a[0] + b[0], a[1] + b[1], a[2] + b[2]


# --- activations -----------------------------------------------------------------------------

def layer_activation_bytes(m: ModelSpec, micro_batch: int, tp: int = 1, cp: int = 1,
                           sequence_parallel: bool = False, recompute: str = "none",
                           flash_attention: bool = False) -> float:
    """Activation bytes one layer keeps for backward, per micro-batch, on one rank.

    Korthikanti et al. 2022, eq. (1)-(5): ``sbh(34 + 5as/h)`` with no parallelism,
    ``sbh(10 + 24/t + 5as/(ht))`` with tensor parallelism, ``sbh/t (34 + 5as/h)`` with sequence
    parallelism too, ``34 sbh/t`` with selective recomputation and ``2sbh/t`` with full.
    Terms: 2-byte tensors, 1-byte dropout masks; s is the sequence this cp rank holds.
    """
    s, b, h = m.seq_len // cp, micro_batch, m.hidden
    outer = tp if sequence_parallel else 1  # sequence parallelism splits the non-TP regions
    if recompute == "full":
        return 2 * s * b * h / outer  # only the layer's input
    kv = max(m.kv_heads / tp, 1) * m.head_dim  # K/V width on this rank
    f = m.ffn_hidden * m.top_k / tp
    inside = s * b * (2 * h / tp + 4 * kv + 2 * h / tp + (6 if m.ffn_kind == "swiglu" else 4) * f)
    # QKV input, attention-output dropout mask, MLP input, MLP dropout mask, two norm inputs.
    outside = s * b * h * (2 + 1 + 2 + 1 + 4) / outer
    scores = 5 * (m.heads / tp) * s * (s * cp) * b  # softmax out, mask, dropout out
    if flash_attention:
        scores = 4 * (m.heads / tp) * s * b  # only the fp32 log-sum-exp per row
    elif recompute == "selective":
        scores = 0.0
    return inside + outside + scores


def inflight_microbatches(s: Scenario, stage: int) -> list[int]:
    """Micro-batches whose activations each chunk of ``stage`` holds at the stage's peak.

    GPipe holds all m; 1F1B holds ``p - stage`` (Narayanan et al. 2021, sec. 2.2.1);
    interleaved holds ``2(p - stage - 1) + (v - 1)p + 1`` chunk-micro-batches, Megatron-LM's
    warm-up count plus one, spread over the chunks in schedule order.
    """
    p, v, m = s.parallel.pp, s.parallel.virtual_stages, s.microbatches
    if s.parallel.schedule == "gpipe":
        return [m] * v
    if s.parallel.schedule == "1f1b" or v == 1:
        return [min(p - stage, m)] * v
    held = min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)
    # Forward step k runs chunk (k // p) % v: groups of p micro-batches per chunk in turn.
    counts = [0] * v
    for k in range(held):
        counts[(k // p) % v] += 1
    return counts


def stage_activation_bytes(s: Scenario, stage: int) -> float:
    """Activations held at the peak of ``stage``: layers x in-flight micro-batches, plus the
    embedding dropout mask on the first stage and the fp32 logits on the last (Korthikanti
    sec. 4.3: ``4sbv/t`` for the output layer and loss of one micro-batch)."""
    m, p, t = s.model, s.parallel, s.training
    per_layer = layer_activation_bytes(m, t.micro_batch, p.tp, p.cp, p.sequence_parallel,
                                       p.recompute, t.flash_attention)
    chunks = chunk_layers(s)[stage::p.pp]
    inflight = inflight_microbatches(s, stage)
    total = sum(n * k for n, k in zip(chunks, inflight)) * per_layer
    tokens = t.micro_batch * m.seq_len // p.cp
    outer = p.tp if p.sequence_parallel else 1
    if p.recompute == "full":
        # Backward re-materialises one layer's full activations at a time.
        total += layer_activation_bytes(m, t.micro_batch, p.tp, p.cp, p.sequence_parallel,
                                        "none", t.flash_attention)
    if stage == 0:
        total += tokens * m.hidden / outer * max(inflight)
    if stage == p.pp - 1:
        total += 4 * tokens * m.vocab / p.tp + 4 * tokens * m.hidden / outer
    return total


# --- buffers and the total ---------------------------------------------------------------------

def stage_buffer_bytes(s: Scenario, stage: int) -> float:
    """Communication buffers: pipeline send/recv, ZeRO-2 gradient buckets, ZeRO-3 gathered layers.

    Pipeline: one activation and one gradient tensor each way (``b s h`` / tp with Megatron's
    scatter-gather). ZeRO-2: two gradient buckets of 40M parameters in flight. ZeRO-3: the
    full weights of two layers (the one running and the prefetched next) and one layer's
    unsharded gradients awaiting reduce-scatter.
    """
    m, p, t = s.model, s.parallel, s.training
    act = wl.BYTES[t.precision]
    total = 0.0
    if p.pp > 1:
        total += 4 * t.micro_batch * (m.seq_len // p.cp) * m.hidden * act / p.tp
    dense, expert = layer_params_per_rank(m, p.tp, p.ep)
    if p.zero == 2:
        total += 2 * min(BUCKET_PARAMS, sum(stage_params_per_rank(s, stage))) * act
    if p.zero == 3:
        total += 3 * (dense + expert) * act
    return total


def stage_memory(s: Scenario, stage: int) -> StageMemory:
    """Every component of one stage's peak, on its busiest rank."""
    params, grads, optimizer = stage_model_states(s, stage)
    return StageMemory(stage, params, grads, optimizer, stage_activation_bytes(s, stage),
                       stage_buffer_bytes(s, stage))


def memory_per_stage(s: Scenario) -> list[StageMemory]:
    """``stage_memory`` for every pipeline stage, first to last."""
    return [stage_memory(s, stage) for stage in range(s.parallel.pp)]
