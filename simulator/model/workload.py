"""The transformer workload: FLOPs per step and the kernels of one layer (parameter counts:
``param_counts.py``).

FLOP accounting follows SCENARIO.md (Narayanan et al. 2021; Korthikanti et al. 2022): matmuls
only, forward + backward = 3x forward, attention scores over the full s x s square.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..inputs.specs import ModelSpec
from . import elementwise as ew
from . import latent, routing
from . import param_counts as pc
from .kernels import Gemm
from .recompute import rerun_flops_per_sequence

if TYPE_CHECKING:
    from ..inputs.scenario import Scenario

# Bytes per element of what a precision stores and sends. FP8 training (Transformer Engine)
# keeps weights, activations and messages in bf16; only its GEMM operands are 8-bit
# (``GEMM_OPERAND_BYTES``, the FP8 weight copies in ``memory.fp8_weight_cache_bytes`` and the
# FP8 copies of GEMM inputs kept for backward, ``activations.FP8_SAVED_BYTES``).
BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 2}
GEMM_OPERAND_BYTES = {**BYTES, "fp8": 1}
# The precision everything but FP8's GEMMs runs in: its peak rates attention and the head.
WIDE = {"fp8": "bf16"}


# --- FLOPs (SCENARIO.md, "FLOP accounting") ---------------------------------------------------

def layer_forward_flops(m: ModelSpec) -> float:
    """Forward FLOPs of one layer for one sequence.

    ``2sh(h + 2h_kv) + 4s^2h + 2sh^2 + 2ksh (f * top_k + f_shared)`` (QKV, scores and values,
    output, MLP: the routed experts a token visits and the shared ones); under MLA
    ``2s`` times its projection weights and ``2 s^2 a (d_qk + d_v)`` for scores and values.
    """
    s = m.seq_len
    projections = 2 * s * pc.attention_weights(m)
    mlp = 2 * m.ffn_matrices * s * m.hidden * (m.ffn_hidden * m.top_k + m.shared_width)
    return float(projections + mlp) + attention_core_forward_flops(m)


def attention_core_forward_flops(m: ModelSpec) -> float:
    """Scores and values over the full square, ``2 s^2 a (d_qk + d_v)``: ``4 s^2 h`` when both
    head widths are ``h / a``; what selective recomputation re-runs."""
    return 2.0 * m.seq_len * m.seq_len * m.heads * (m.qk_head_dim + m.value_head_dim)


def logits_forward_flops(m: ModelSpec) -> float:
    """Output layer for one sequence: ``2 s h V``."""
    return 2.0 * m.seq_len * m.hidden * m.vocab


def model_flops_per_step(s: Scenario) -> float:
    """Model FLOPs of one optimizer step: 3x forward, no recomputation."""
    layers = sum(n * layer_forward_flops(kind) for kind, n in pc.layer_kinds(s.model))
    per_sequence = layers + logits_forward_flops(s.model)
    return 3.0 * per_sequence * s.training.global_batch


def recompute_flops_per_step(s: Scenario) -> float:
    """What recomputation re-runs: each layer's forward (full), or under selective its attention
    core and its ``recompute_modules``' GEMMs (MLA's up-projections, ``recompute.py``).

    With flash attention the core is one fused kernel, and Megatron-Core checkpoints it all the
    same (megatron/core/transformer/attention.py, ``_checkpointed_attention_forward``): its
    forward re-runs in backward, for almost no memory (the kernel keeps no score matrix, and
    its output is the projection's saved input anyway).
    """
    total = 0.0
    core = "core_attn" in s.parallel.recomputed
    for kind, n in pc.layer_kinds(s.model):
        selective = ((attention_core_forward_flops(kind) if core else 0.0)
                     + rerun_flops_per_sequence(replace(s, model=kind)))
        per_layer = {
            "none": 0.0,
            "selective": selective,
            "full": layer_forward_flops(kind),
        }[s.parallel.recompute]
        total += per_layer * n
    return total * s.training.global_batch


def hardware_flops_per_step(s: Scenario) -> float:
    """Model FLOPs plus recomputation: what Megatron-LM reports as achieved FLOP/s."""
    return model_flops_per_step(s) + recompute_flops_per_step(s)


# --- kernels of one layer on one rank, per micro-batch ------------------------------------------

@dataclass(frozen=True, slots=True)
class LayerKernels:
    """Forward work of one layer for one micro-batch on one rank.

    ``gemm_runs`` are the weight GEMMs by shape, each with how many times it is launched (QKV,
    output projection, each MLP matrix once per local expert; ``m`` = tokens): the local experts
    share one shape, so costing a layer takes time independent of their number (a million
    experts, as in He 2024, "Mixture of A Million Experts", arXiv:2407.04202, is 3 runs, not
    3 million GEMMs); ``gemms`` lists every launch one by one; ``attention`` is the
    score/value products' FLOPs over the full ``s x s`` square (the model-FLOPs convention) and
    ``attention_gemms`` the same work as the two batched GEMMs an unfused implementation runs
    (``QK^T`` and ``PV`` per head); ``memory_bytes`` is the HBM traffic of the element-wise
    kernels (norms, activations, residuals, softmax) forward, ``backward_memory_bytes`` that
    of their backward kernels.
    ``tp_bytes`` is the size of one tensor-parallel collective (``tp_collective_bytes``).
    """

    gemm_runs: tuple[tuple[Gemm, int], ...]
    attention: float
    attention_gemms: tuple[Gemm, Gemm]
    memory_bytes: float
    tp_bytes: float
    tokens: int
    backward_memory_bytes: float = 0.0

    @property
    def gemms(self) -> tuple[Gemm, ...]:
        """Every weight GEMM launch in order (as many as the local experts' matrices: cost a
        layer by ``gemm_runs``)."""
        return tuple(g for g, launches in self.gemm_runs for _ in range(launches))

    @property
    def matmuls(self) -> tuple[float, ...]:
        """Each weight GEMM launch's FLOPs."""
        return tuple(g.flops for g in self.gemms)

    @property
    def matmul_flops(self) -> float:
        return sum(g.flops * launches for g, launches in self.gemm_runs) + self.attention


# FlashAttention skips the key blocks a causal mask hides entirely: about half the square
# (Dao 2023, FlashAttention-2, sec. 3.1.1 "Causal masking": blocks above the diagonal are
# skipped, "about 1.7-1.8x speedup" over non-causal). Every model here is a causal decoder.
CAUSAL_FRACTION = 0.5
# FlashAttention-2's backward runs 5 matmuls against the forward's 2 (it recomputes the scores):
# 2.5x the forward's FLOPs (Dao 2023, sec. 4.1, the benchmark's FLOP count).
FLASH_BACKWARD_RATIO = 2.5


def layer_kernels(s: Scenario) -> LayerKernels:
    """Per-rank forward kernels of one layer: tokens ``b*s/cp``, weights split ``tp`` ways.

    K and V split by tp down to one head each, below which they are replicated (Megatron-LM).
    An MoE layer runs one GEMM per local expert (``experts/ep`` of them), each on its share
    ``tokens * top_k * ep / experts`` of the routed tokens times ``expert_load`` (1 for balanced
    routing at capacity factor 1).
    """
    m, p = s.model, s.parallel
    tokens = s.training.micro_batch * m.seq_len // p.cp
    h, tp = m.hidden, p.tp
    act = BYTES[s.training.precision]
    local_experts = max(m.experts // p.ep, 1)
    # The step waits for the busiest rank: its experts run on expert_load times the mean.
    expert_tokens = routing.routed_rows(s, tokens) / local_experts
    etp = p.etp if m.experts > 1 else tp
    runs = (
        *[(g, 1) for g in _attention_projections(s, tokens)],
        (Gemm(expert_tokens, m.ffn_hidden / etp, h), (m.ffn_matrices - 1) * local_experts),
        (Gemm(expert_tokens, h, m.ffn_hidden / etp), local_experts),  # down projection
        *_shared_expert_runs(s, tokens),
    )
    # Queries of this rank against all keys: 2 (d_qk + d_v) per head, 4 h over all heads.
    attention = 2.0 * tokens * m.seq_len * m.heads / tp * (m.qk_head_dim + m.value_head_dim)
    return LayerKernels(runs, attention, _attention_gemms(s, tokens),
                        _elementwise_bytes(s, tokens, act), tp_collective_bytes(s), tokens,
                        _elementwise_bytes(s, tokens, act, backward=True))


def gemm_roles(s: Scenario) -> tuple[str, ...]:
    """The tensor-parallel role of each of ``layer_kernels(s).gemm_runs``, in the same order:
    ``column`` (QKV, FC1: input gathered or replicated, output split), ``row`` (output
    projection, FC2: output reduced), ``expert`` (routed experts, whose TP traffic the token
    dispatcher carries) or ``duplicated`` (MLA's down-projections, ``latent.roles``)."""
    m = s.model
    mlp = ("column", "row")  # FC1 (with a gated MLP's gate: one run) and FC2
    attention = latent.roles(m) if m.mla else ("column", "row")
    routed = mlp if m.experts == 1 else ("expert", "expert")
    return attention + routed + (mlp if m.shared_experts else ())


def shared_input_runs(s: Scenario) -> frozenset[int]:
    """Indices in ``layer_kernels(s).gemm_runs`` of a gated MLP's gate-and-up run, whose
    ``ffn_matrices - 1`` launches per expert read one input (the routed experts' and the
    shared experts'); empty for a plain MLP."""
    if s.model.ffn_matrices < 3:
        return frozenset()
    first = len(gemm_roles(s)) - (4 if s.model.shared_experts else 2)
    return frozenset((first, first + 2) if s.model.shared_experts else (first,))


def _attention_projections(s: Scenario, tokens: int) -> tuple[Gemm, ...]:
    """QKV (column-parallel) and output projection (row-parallel), or MLA's projections
    (``latent.gemms``)."""
    m, tp, h = s.model, s.parallel.tp, s.model.hidden
    if m.mla:
        return latent.gemms(m, tokens, tp, s.parallel.sequence_parallel)
    q = m.query_width / tp
    return Gemm(tokens, q + 2 * m.kv_width_per_rank(tp), h), Gemm(tokens, h, q)


def _shared_expert_runs(s: Scenario, tokens: int) -> tuple[tuple[Gemm, int], ...]:
    """The shared experts, one MLP of ``shared_width`` split by tp like a dense MLP, on every
    token of the rank (Megatron-Core's SharedExpertMLP, megatron/core/transformer/moe/
    shared_experts.py)."""
    m, tp = s.model, s.parallel.tp
    if not m.shared_experts:
        return ()
    width = m.shared_width / tp
    return (Gemm(tokens, width, m.hidden), m.ffn_matrices - 1), (Gemm(tokens, m.hidden, width), 1)


def _attention_gemms(s: Scenario, tokens: int) -> tuple[Gemm, Gemm]:
    """Unfused attention per head: scores ``Q K^T`` (``s_q x d_qk`` by ``d_qk x s``) and
    context ``P V`` (``s_q x s`` by ``s x d_v``), batched over the micro-batch and the rank's
    heads."""
    m, p = s.model, s.parallel
    queries = m.seq_len // p.cp
    batch = s.training.micro_batch * m.heads / p.tp
    return (Gemm(queries, m.seq_len, m.qk_head_dim, batch),
            Gemm(queries, m.value_head_dim, m.seq_len, batch))


def _elementwise_bytes(s: Scenario, tokens: int, act: int, backward: bool = False) -> float:
    """HBM bytes read and written by one layer's element-wise kernels in forward (or, with
    ``backward``, by their backward kernels), as Megatron-LM fuses them (bias-dropout-add,
    bias-GeLU/SwiGLU, layer norm, scale-mask-softmax).

    Without flash attention, the fused scale-mask-softmax reads the ``heads/tp x s x s`` scores
    and writes the probabilities (2), and their dropout reads them, writes them and a one-byte
    mask (2.5): 4.5 x ``act`` bytes per score (megatron/core/fusions/fused_softmax.py); in
    backward the softmax reads its output and the gradient and writes the input's (3), the
    dropout reads the gradient and the mask and writes (2.5): 5.5. At ``model.dropout`` 0 no
    dropout kernel runs (torch's ``dropout`` returns its input when p is 0). The MoE
    permutations run transposed in backward, the same bytes (``routing.permutation_bytes``).
    """
    m, p = s.model, s.parallel
    hidden_split = p.tp if p.sequence_parallel else 1
    scores = ew.attention_score_bytes(s, tokens, act, backward)
    routed = m.ffn_hidden * m.top_k * (expert_load(s) if m.experts > 1 else 1)
    ffn_width = (routed + m.shared_width) / p.tp
    # MLA's latent norms read and write each latent, on the rank's sequence shard; their
    # backward reads the latent and its gradient and writes the input's.
    latents = ((3 if backward else 2) * latent.latent_width(m) * tokens / hidden_split * act
               if m.mla else 0.0)
    norms = (ew.norm_activation_backward_bytes if backward else ew.norm_activation_bytes)(
        tokens, m.hidden / hidden_split, ffn_width, act, m.ffn_kind, fused=True,
        dropout=m.dropout > 0)
    rope = ew.rope_bytes(tokens, rotated_width(s), act) if m.position_embedding == "rope" else 0
    return norms + scores + latents + rope + routing.permutation_bytes(s, act)


def rotated_width(s: Scenario) -> float:
    """Elements per token RoPE rotates on one TP rank: every query and key column, or, under
    MLA, each of the rank's heads' ``qk_rope`` query part and the one shared RoPE key."""
    m = s.model
    if m.mla:
        return (m.heads / s.parallel.tp + 1) * m.qk_rope_head_dim
    return m.heads * m.qk_head_dim / s.parallel.tp + s.model.kv_width_per_rank(s.parallel.tp)


def logits_kernels(s: Scenario) -> tuple[float, float]:
    """Forward FLOPs of the output layer and HBM bytes of the loss, per micro-batch per rank."""
    m = s.model
    tokens = s.training.micro_batch * m.seq_len // s.parallel.cp
    flops = 2.0 * tokens * m.hidden * m.vocab / s.parallel.tp
    return flops, ew.loss_bytes(tokens, m.vocab / s.parallel.tp)


def logits_gemm(s: Scenario) -> Gemm:
    """The output layer's GEMM per micro-batch per rank: tokens by ``h`` by ``V/tp``."""
    tokens = s.training.micro_batch * s.model.seq_len // s.parallel.cp
    return Gemm(tokens, s.model.vocab / s.parallel.tp, s.model.hidden)


def mtp_projection_gemm(s: Scenario) -> Gemm:
    """A multi-token prediction module's projection of its two normed inputs, the hidden state
    and the next token's embedding, ``2h`` down to ``h`` (DeepSeek-V3 report sec. 2.2, ``M_k``;
    Megatron-Core's ``eh_proj``, a column-parallel linear): tokens by ``2h`` by ``h/tp``."""
    tokens = s.training.micro_batch * s.model.seq_len // s.parallel.cp
    return Gemm(tokens, s.model.hidden / s.parallel.tp, 2 * s.model.hidden)


# --- message sizes of the collectives inside a layer (per rank, per micro-batch) ---------------

def pipeline_message_bytes(s: Scenario) -> float:
    """One activation (or its gradient) sent between pipeline stages per micro-batch by each
    TP rank: ``b s/cp x h``, split over the TP ranks under sequence parallelism (each rank
    holds ``1/tp`` of the sequence) or scatter-gather (``pp_scatter_gather``: each rank sends
    ``1/tp`` of the tensor, megatron/p2p_communication.py's ``split_tensor_into_1d_equal_chunks``
    before Megatron-Core; DeepSpeed's ``PartitionedTensor``, deepspeed/runtime/pipe/engine.py).
    Otherwise every TP rank sends the whole ``(s, b, h)`` tensor (Megatron-Core's
    megatron/core/pipeline_parallel/p2p_communication.py)."""
    tokens = s.training.micro_batch * s.model.seq_len // s.parallel.cp
    p = s.parallel
    split = p.tp if p.sequence_parallel or p.pp_scatter_gather else 1
    return tokens * s.model.hidden * BYTES[s.training.precision] / split


def pipeline_gather_bytes(s: Scenario) -> float:
    """What the receiving TP group all-gathers after each scatter-gather message: the whole
    ``b s/cp x h`` activation (``gather_split_1d_tensor``); 0 when the message arrives whole or
    sequence parallelism keeps it split."""
    p = s.parallel
    if p.pp == 1 or p.tp == 1 or p.sequence_parallel or not p.pp_scatter_gather:
        return 0.0
    return pipeline_message_bytes(s) * p.tp


def tp_collective_bytes(s: Scenario) -> float:
    """One tensor-parallel collective around a dense sublayer: the full ``b s/cp x h``
    activation (the all-reduce buffer, the all-gather output, the reduce-scatter input)."""
    tokens = s.training.micro_batch * s.model.seq_len // s.parallel.cp
    return tokens * s.model.hidden * BYTES[s.training.precision]


def latent_gather_bytes(s: Scenario) -> tuple[float, float, float]:
    """MLA's all-gathers under sequence parallelism, ``b s/cp`` tokens of each of
    ``latent.gathered_widths`` in the training precision (``layer_comm.latent_collectives``
    carries the up-projections' inputs as FP8 copies under fp8)."""
    tokens = s.training.micro_batch * s.model.seq_len // s.parallel.cp
    act = BYTES[s.training.precision]
    return tuple(tokens * w * act for w in latent.gathered_widths(s.model))


def expert_load(s: Scenario) -> float:
    """Routed tokens of the busiest expert-parallel rank over the balanced mean.

    With ``capacity_factor`` set every expert's buffer holds exactly ``capacity_factor *
    tokens * top_k / experts`` slots (Megatron-Core's get_capacity in
    megatron/core/transformer/moe/moe_utils.py, with --moe-pad-expert-input-to-capacity;
    GShard and DeepSpeed's top-k gating): tokens over capacity are dropped, free slots padded,
    so every rank carries ``capacity_factor`` times the mean whatever the routing. Dropless
    (``capacity_factor: null``, Megatron-Core's default) follows the routing: the busiest rank
    receives ``expert_imbalance`` times the mean, at most all ``ep`` ranks' tokens.
    """
    return routing.routing_load(s.model, s.parallel.ep)


def dispatched_copies(s: Scenario) -> float:
    """Routed token copies the busiest rank dispatches: each TP rank routes its ``b s/(cp tp)``
    tokens (sequence parallelism, which Megatron-Core requires for MoE with tp > 1) to
    ``top_k`` experts, times ``expert_load`` (megatron/core/transformer/moe/token_dispatcher.py,
    MoEAlltoAllTokenDispatcher)."""
    m, p = s.model, s.parallel
    return s.training.micro_batch * m.seq_len / (p.cp * p.tp) * m.top_k * expert_load(s)


def expert_dispatch_bytes(s: Scenario) -> float:
    """One token dispatch (or combine) all-to-all of the busiest rank: ``h`` values a copy."""
    return dispatched_copies(s) * s.model.hidden * BYTES[s.training.precision]


def expert_probs_bytes(s: Scenario) -> float:
    """The routing probabilities that travel with one dispatch, fp32, one a copy (Megatron-Core's
    alltoall dispatcher sends ``permuted_probs`` in an all-to-all of their own)."""
    return dispatched_copies(s) * 4


def expert_tp_bytes(s: Scenario) -> float:
    """The expert-TP all-gather (and reduce-scatter) of the dispatched tokens around the
    experts when ``etp`` > 1: the ``etp`` ranks' received tokens, ``etp *
    expert_dispatch_bytes``; none when the experts are whole (``expert_tp`` 1)."""
    etp = s.parallel.etp
    return etp * expert_dispatch_bytes(s) if etp > 1 else 0.0
