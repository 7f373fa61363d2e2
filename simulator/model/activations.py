"""Activation bytes one transformer layer keeps for backward, tensor by tensor.

The tensors are those Megatron-Core with Transformer Engine (TE) saves, read from their code
(NVIDIA/Megatron-LM and NVIDIA/TransformerEngine; docs/memory.md lists each term and its
source). With a GPT layer (``kv_heads == heads``, ``ffn_hidden == 4h``, GELU, dropout) in
bf16 the sum is Korthikanti et al. 2022's ``sbh(34 + 5as/h)`` (eq. 1) and its tensor-,
sequence-parallel and selective forms (eq. 2-5).

Notation, per micro-batch on one rank: ``T = b s / cp`` tokens of the tensor-parallel group,
``o = tp`` with sequence parallelism (1 without) for the tensors outside the TP region, ``e``
bytes per activation element (2 in bf16, fp16 and fp8, 4 in fp32) and ``g`` bytes per saved
GEMM input: ``e``, but 1 under fp8, where TE's Linear and LayerNormLinear save the FP8 copy of
their input that the weight-gradient GEMM reads (``transformer_engine/pytorch/module/
linear.py``: ``saved_inputmat`` is the quantized ``inputmat``, columnwise only;
``layernorm_linear.py`` saves ``ln_out`` quantized and the norm's input ``inputmat`` in bf16).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from ..inputs.specs import ModelSpec
from . import latent
from . import workload as wl
from .routing import routing_load

if TYPE_CHECKING:
    from ..inputs.scenario import Scenario

FP8_SAVED_BYTES = 1  # one byte per element of an FP8 (E4M3) copy TE keeps for backward
FP32_BYTES = 4  # fp32: flash attention's log-sum-exp, the router's scores, the expert probs
INDEX_BYTES = 8  # int64: torch.topk's indices, which its backward scatters through
MASK_BYTES = 1  # a dropout mask: one byte (bool) per element (Korthikanti et al. 2022, sec. 4)


def layer_tensors(m: ModelSpec, micro_batch: int, tp: int = 1, cp: int = 1,
                  sequence_parallel: bool = False, recompute: str = "none",
                  flash_attention: bool = False, precision: str = "bf16", ep: int = 1,
                  modules: frozenset[str] | None = None, autocast: bool = False,
                  gathered_inputs: bool = False, expert_tp: int | None = None
                  ) -> dict[str, float]:
    """Bytes one layer keeps for backward per micro-batch on one rank, by tensor.

    ``modules`` are the selectively recomputed modules (Megatron-Core's recompute_modules);
    None means its default, ``core_attn``, under ``recompute == "selective"``. Full
    recomputation keeps only the layer's input (Korthikanti sec. 4.1); the checkpointed
    forward's tensors come back one layer at a time in backward (``memory.py``). Under
    ``autocast`` the residual stream stays fp32 (``residual_bytes``). ``gathered_inputs``:
    the attention's and the dense MLP's column-parallel input is kept whole, as gathered
    (``ParallelSpec.gathered_inputs_kept``), not as its sequence shard. ``expert_tp``: the
    routed experts' tensor parallelism (``ParallelSpec.etp``; None: ``tp``).
    """
    e = wl.BYTES[precision]
    r = residual_bytes(precision, autocast)
    tokens = micro_batch * m.seq_len // cp
    outer = tp if sequence_parallel else 1  # sequence parallelism splits the non-TP regions
    if recompute == "full":
        return {"layer_input": r * tokens * m.hidden / outer}
    if modules is None:
        modules = frozenset({"core_attn"}) if recompute == "selective" else frozenset()
    if "op_sac" in modules:
        return _op_sac_tensors(m, tokens, tp, outer, e, r)
    fp8 = precision == "fp8"
    g = FP8_SAVED_BYTES if fp8 else e
    hidden = tokens * m.hidden / outer  # elements of one [T/o, h] tensor
    # what QKV and FC1 keep: whole where gathered inputs are kept (dense layers, as
    # ``layer_comm.tp_collectives`` drops their re-gathers; MoE layers keep Megatron's)
    kept_whole = gathered_inputs and m.experts == 1
    column_input = tokens * m.hidden if kept_whole else hidden
    # MLA's down-projections read the rank's shard, ungathered; its latents gathered or not
    latent_rows = (tokens / outer, tokens if kept_whole else tokens / outer)
    terms = {
        # RMSNorm/LayerNorm backward needs its input: the attention's and the MLP's norm.
        "norm_inputs": 2 * r * hidden,
        "attention_input": _attention_input_bytes(m, fp8, g, modules) * (
            hidden if m.mla else column_input),
        **_attention_tensors(m, tokens, tp, e, fp8, g, modules, latent_rows),
        "scores": _score_bytes(m, micro_batch, tokens, tp, e, flash_attention, modules),
        # The two residual branches' dropout masks (bias-dropout-add), none without dropout.
        "dropout_masks": 2 * MASK_BYTES * hidden if m.dropout > 0 else 0.0,
    }
    if m.experts == 1:  # recomputed whole (``mlp``), the MLP keeps only its input
        kept = "mlp" not in modules
        terms["mlp_input"] = g * column_input if kept else 0.0  # LayerNormLinear's ln_out
        terms["mlp"] = _mlp_bytes(m, tokens, m.ffn_hidden / tp, e, g) if kept else 0.0
    else:
        terms.update(_moe_tensors(m, tokens, outer, (tp, expert_tp or tp), ep, e, fp8, g,
                                  modules))
    return terms


def _op_sac_tensors(m: ModelSpec, tokens: int, tp: int, outer: int, e: int,
                    r: int) -> dict[str, float]:
    """What torchtitan's op-level selective checkpointing keeps of a dense layer (model/
    recompute.py): the block's input (the checkpoint's argument) and the outputs of the ops on
    its save list (torchtitan/distributed/activation_checkpoint.py, ``_apply_op_sac``): the
    odd matmuls in forward order (``wq``'s query, ``wv``'s value, the MLP's first matmul and,
    in a SwiGLU block, ``w2``'s output: a row-parallel matmul's whole ``T x h`` partial sum),
    the fused attention kernel's output and fp32 log-sum-exp, and, with tensor parallelism,
    the two reduce-scatters' outputs (``_c10d_functional.reduce_scatter_tensor``)."""
    kv = m.kv_width_per_rank(tp)
    swiglu = m.ffn_matrices == 3
    return {
        "layer_input": r * tokens * m.hidden / outer,
        "qkv": e * tokens * (m.query_width / tp + kv),
        "attention_output": e * tokens * m.query_width / tp,
        "scores": FP32_BYTES * m.heads / tp * tokens,
        "mlp": e * tokens * (m.ffn_hidden / tp + (m.hidden if swiglu else 0)),
        "reduce_scatters": 2 * e * tokens * m.hidden / tp if tp > 1 and outer > 1 else 0.0,
    }


def _attention_input_bytes(m: ModelSpec, fp8: bool, g: int, modules: frozenset[str]) -> float:
    """Bytes per element of the attention norm's output as the projections keep it.

    Dense attention fuses the norm into the QKV LayerNormLinear, which keeps ``ln_out`` (``g``).
    MLA has a separate norm feeding two down-projections (Megatron-Core's MLA layer spec:
    ``input_layernorm=TENorm``, ``linear_q_down_proj`` and ``linear_kv_down_proj`` TE Linears):
    in bf16 both keep the one norm output (``e``), under fp8 an FP8 copy each (2 x 1); with
    ``layernorm`` recomputed the output is dropped and rebuilt (TE told to keep the original
    input, ``set_for_recompute_input_layernorm``, transformer_layer.py).
    """
    if not m.mla:
        return g
    if "layernorm" in modules:
        return 0.0
    return 2 * FP8_SAVED_BYTES if fp8 else g


def _attention_tensors(m: ModelSpec, tokens: int, tp: int, e: int, fp8: bool, g: int,
                       modules: frozenset[str],
                       latent_rows: tuple[float, float]) -> dict[str, float]:
    """Q, K and V as the attention kernel keeps them (``e`` each, K and V split by tp down to one
    head), its output (kept by the kernel in ``e``, and under fp8 also as the output
    projection's FP8 copy) and, under MLA, each latent as its norm's input (``e``) and its
    up-projection's input (``g``), on ``latent_rows`` tokens each (the rank's sequence shard
    under sequence parallelism; the up-projection's as the column-parallel inputs are kept);
    ``mla_up_proj`` drops and rebuilds the per-head Q, K, V (multi_latent_attention.py,
    ``qkv_up_checkpoint``)."""
    if m.mla:
        heads = m.heads / tp
        qkv_width = heads * (2 * m.qk_head_dim + m.value_head_dim)
        out_width = heads * m.value_head_dim
        if "mla_up_proj" in modules:
            qkv_width = 0.0
        norm_rows, up_rows = latent_rows
        extra = {"latents": latent.latent_width(m) * (norm_rows * e + up_rows * g)}
    else:
        kv = m.kv_width_per_rank(tp)
        qkv_width, out_width, extra = m.query_width / tp + 2 * kv, m.query_width / tp, {}
    output = e + (FP8_SAVED_BYTES if fp8 else 0)
    return {"qkv": e * tokens * qkv_width, **extra,
            "attention_output": output * tokens * out_width}


def _score_bytes(m: ModelSpec, micro_batch: int, tokens: int, tp: int, e: int,
                 flash_attention: bool, modules: frozenset[str]) -> float:
    """The ``heads/tp x s x s`` scores: softmax output (``e``) and, with dropout, its mask (1)
    and output (``e``), Korthikanti's ``5 as^2 b`` in bf16; recomputed (``core_attn``) none;
    flash attention keeps only an fp32 log-sum-exp per row and head."""
    heads = m.heads / tp
    if flash_attention:
        return FP32_BYTES * heads * tokens
    if "core_attn" in modules:
        return 0.0
    per_score = e + ((MASK_BYTES + e) if m.dropout > 0 else 0)
    return per_score * heads * tokens * m.seq_len


def _mlp_bytes(m: ModelSpec, rows: float, width: float, e: int, g: int) -> float:
    """A dense MLP (or the shared experts) on ``rows`` tokens, ``width`` columns per rank: the
    activation's input (GELU: f, SwiGLU: gate and up, 2f; ``e``, fused bias-activation saves
    its input) and fc2's input, the activation's output (``g``)."""
    return rows * width * ((m.ffn_matrices - 1) * e + g)


def _moe_tensors(m: ModelSpec, tokens: int, outer: int, tps: tuple[int, int], ep: int, e: int,
                 fp8: bool, g: int, modules: frozenset[str]) -> dict[str, float]:
    """An MoE layer's MLP part as Megatron-Core's alltoall dispatcher and TEGroupedMLP run it
    (megatron/core/transformer/moe/: router.py, token_dispatcher.py, experts.py):

    - the pre-MLP norm's output (a separate TENorm), kept by the router's GEMM (bf16: the
      router does not run in FP8) and, under fp8, as the shared experts' fc1 FP8 copy;
      ``layernorm`` recomputation drops it;
    - the router's fp32 scores (softmax/sigmoid keep their output) and int64 top-k indices;
    - the dispatched tokens, ``R = T top_k load`` rows of ``h`` (``expert_load``: dropless
      balance or padded capacity; gathered over the expert-TP group, ``tps`` = (tp, etp): of
      ``T etp/tp`` tokens, ``routing.routed_rows``), kept by the experts' fc1 (``g``); the
      permutation itself keeps only indices (index_select / TE moe_permute);
    - their routing probabilities, fp32, kept by the weighted SwiGLU, which applies them
      (``weighted_bias_swiglu_impl`` since Megatron-Core's "Memory efficient token permutation",
      commit 2659630721, 2025-04; before it unpermute multiplied the expert outputs by the
      probabilities and kept the ``R x h`` outputs too);
    - fc1's output, the activation's input, ``e``; fc2's input ``g`` (none with ``moe_act``
      recomputed: Megatron-Core's CheckpointWithoutOutput, experts.py);
    - the shared experts as a dense MLP of ``shared_width`` on all ``T`` tokens.
    """
    hidden = tokens * m.hidden / outer
    shared_fp8_copy = FP8_SAVED_BYTES if fp8 and m.shared_experts else 0
    tp, etp = tps
    routed = tokens * etp / tp * m.top_k * routing_load(m, ep)
    width = m.ffn_hidden / etp
    return {
        "mlp_input": 0.0 if "layernorm" in modules else (e + shared_fp8_copy) * hidden,
        "router": tokens / outer * (FP32_BYTES * m.experts + INDEX_BYTES * m.top_k),
        "expert_inputs": g * routed * m.hidden,
        "expert_probs": FP32_BYTES * routed,
        "expert_activation_input": e * routed * width * (m.ffn_matrices - 1),
        "expert_fc2_input": 0.0 if "moe_act" in modules else g * routed * width,
        "shared_experts": (_mlp_bytes(m, tokens, m.shared_width / tp, e, g)
                           if m.shared_experts else 0.0),
    }


def embedding_bytes(m: ModelSpec, tokens: int, outer: int) -> float:
    """The embedding's dropout mask, ``sbh/t`` bytes (Korthikanti sec. 4.3); none without
    dropout (the embedding's output is the first norm's input, counted there)."""
    return MASK_BYTES * tokens * m.hidden / outer if m.dropout > 0 else 0.0


def head_bytes(m: ModelSpec, tokens: int, tp: int, outer: int, precision: str,
               autocast: bool = False, loss_kernel: str | None = None,
               gathered_inputs: bool = False) -> float:
    """Output layer and loss: the final norm's input and the output layer's input (``e`` each,
    sequence-parallel shards) and the logits the loss keeps: fp32 under Megatron-LM's
    vocab-parallel cross-entropy (``vocab_parallel_logits.float()``, exp in place, saved:
    megatron/core/tensor_parallel/cross_entropy.py; ``4sbh/t + 4sbv/t`` in bf16, Korthikanti
    sec. 4.3) and PyTorch's (``log_softmax`` saves its fp32 output), the logits as they are
    under a fused kernel (flash-attn's ``CrossEntropyLoss`` saves its input,
    flash_attn/losses/cross_entropy.py). Under ``autocast`` the final norm's input is fp32
    and the loss keeps the output layer's ``e``-byte logits beside their fp32 copy
    (cross-entropy runs in fp32 and saves its input's cast; measured:
    validation/autocast_memory.py). With ``gathered_inputs`` the output layer keeps its input
    whole, as gathered. Each multi-token prediction module (``mtp_layers``) keeps as much
    again for its own output layer and loss, and its projection's input, the two normed inputs
    side by side (``2 e T h``, as gathered: a column-parallel linear)."""
    e = wl.BYTES[precision]
    kept = e if loss_kernel == "fused" else FP32_BYTES
    logits = (kept + (e if autocast else 0)) * tokens * m.vocab / tp
    output_input = e * tokens * m.hidden / (1 if gathered_inputs else outer)
    head = residual_bytes(precision, autocast) * tokens * m.hidden / outer + output_input + logits
    return head + m.mtp_layers * (head + 2 * e * tokens * m.hidden)


def loss_backward_bytes(m: ModelSpec, tokens: int, tp: int, precision: str,
                        loss_kernel: str | None = None) -> float:
    """What the loss's backward allocates beside what it kept, at the start of a micro-batch's
    backward, when the stage holds the most: PyTorch's ``F.cross_entropy`` on fp32 logits
    (torchtitan's ``loss_fn``) holds ``nll_loss``'s fp32 gradient and ``log_softmax``'s fp32
    input gradient beside the saved log-probabilities, 8 bytes per logit, and 12 over
    vocabulary shards (``tp > 1``: torchtitan's loss parallelism, whose fused backward
    ``(grad_input + torch.exp(x)) * grad_output`` holds three fp32 temporaries at once:
    torch/distributed/tensor/parallel/loss.py, ``_nll_loss_and_log_softmax_backward``);
    Megatron-LM's computes the gradient in place in the saved softmax and a fused kernel
    writes one gradient of the logits' type, so each adds one ``e``-byte tensor (the cast back
    to the logits' type that autograd makes, none when the logits are fp32 already, or the
    fused kernel's output)."""
    e = wl.BYTES[precision]
    if loss_kernel == "pytorch":
        return (3 if tp > 1 else 2) * FP32_BYTES * tokens * m.vocab / tp
    if loss_kernel != "fused" and e == FP32_BYTES:
        return 0.0  # in place throughout: ``.float()`` of fp32 logits is the tensor itself
    return e * tokens * m.vocab / tp


def residual_bytes(precision: str, autocast: bool) -> int:
    """Bytes per element of the residual stream, the norms' saved inputs: the training
    precision's, but fp32 under PyTorch autocast over fp32 parameters, which casts only the
    GEMMs' operands and adds their outputs back into the fp32 stream (measured on an H200 and
    counted tensor by tensor on CPUs: a GPT layer keeps 32 ``T h`` bytes beside its input where
    the same layer in bf16 keeps 30; docs/memory.md)."""
    return FP32_BYTES if autocast else wl.BYTES[precision]


@functools.lru_cache(maxsize=4096)  # a pure function of its (hashable) arguments: the planner
# asks it for the same layer under thousands of splits that differ elsewhere
def layer_activation_bytes(m: ModelSpec, micro_batch: int, tp: int = 1, cp: int = 1,
                           sequence_parallel: bool = False, recompute: str = "none",
                           flash_attention: bool = False, precision: str = "bf16",
                           ep: int = 1, modules: frozenset[str] | None = None,
                           autocast: bool = False, gathered_inputs: bool = False,
                           expert_tp: int | None = None) -> float:
    """Activation bytes one layer keeps for backward, per micro-batch, on one rank: the sum of
    ``layer_tensors`` (each tensor Megatron-Core and Transformer Engine save).

    For a GPT layer in bf16 with dropout it is Korthikanti et al. 2022, eq. (1)-(5):
    ``sbh(34 + 5as/h)`` with no parallelism, ``sbh(10 + 24/t + 5as/(ht))`` with tensor
    parallelism, ``sbh/t (34 + 5as/h)`` with sequence parallelism too, ``34 sbh/t`` with
    selective recomputation and ``2sbh/t`` with full; s is the sequence this cp rank holds.
    """
    return sum(layer_tensors(m, micro_batch, tp, cp, sequence_parallel, recompute,
                             flash_attention, precision, ep, modules, autocast,
                             gathered_inputs, expert_tp).values())


def scenario_layer_bytes(s: Scenario, recompute: str) -> float:
    """``layer_activation_bytes`` with the scenario's settings and the given recomputation."""
    m, p, t = s.model, s.parallel, s.training
    modules = p.recomputed if recompute == p.recompute else None
    return layer_activation_bytes(m, t.micro_batch, p.tp, p.cp, p.sequence_parallel, recompute,
                                  t.flash_attention, t.precision, p.ep, modules, t.autocast,
                                  p.gathered_inputs_kept, p.etp)
