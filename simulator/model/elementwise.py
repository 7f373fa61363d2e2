"""HBM bytes of a layer's element-wise kernels, as Megatron-LM fuses them: norms, residual adds
and dropouts, the activation function, unfused attention's softmax, RoPE, and the loss.

Each function counts what its kernels read and write, in units of ``act`` bytes (the activation
width) per element unless it says otherwise; ``workload.layer_kernels`` sums them for a layer,
and the cost model moves them at the profile's HBM rate. At ``model.dropout`` 0 no dropout kernel
runs: torch's ``dropout`` returns its input when p is 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..inputs.scenario import Scenario


def attention_score_bytes(s: Scenario, tokens: int, act: int, backward: bool = False) -> float:
    """Forward (or backward) HBM bytes of unfused attention's scale-mask-softmax and its
    dropout over the ``heads/tp x s x s`` scores: 2 + 2.5, backward 3 + 2.5, bytes of ``act``
    per score, the dropout's share only at a dropout above 0; 0 with flash attention, whose
    kernel keeps the scores on chip."""
    if s.training.flash_attention:
        return 0.0
    per_score = (3 if backward else 2) + (2.5 if s.model.dropout > 0 else 0)
    return per_score * act * (s.model.heads / s.parallel.tp) * tokens * s.model.seq_len


def norm_activation_bytes(tokens: int, hidden: float, ffn_width: float, act: int,
                          ffn_kind: str, fused: bool = False, dropout: bool = True) -> float:
    """Forward bytes of one layer's norms, residual adds and dropouts (``tokens x hidden``
    tensors; hidden split by tp only with sequence parallelism) and of its activation function
    (``tokens x ffn_width``), in units of ``act`` bytes per element:

    - each of the two norms reads its input and writes its output: 2 (fused layer norm);
    - each of the two residual branches, unfused, adds (read 2, write 1: 3) and drops out (read,
      write, one-byte mask: 2.5); fused (Megatron-LM's ``bias_dropout_add_fused_train``,
      megatron/core/fusions/fused_bias_dropout.py, on by default) it reads the branch and the
      residual and writes the sum and the mask: 3.5; without ``dropout`` (probability 0, where
      torch's ``dropout`` returns its input) the add alone: 3;
    - the activation reads its input and writes its output: 2 for bias-GeLU, 3 for SwiGLU (two
      halves in, megatron/core/fusions/fused_bias_gelu.py, fused_bias_swiglu.py).

    ``fused=False`` is what the real-run harness (plain PyTorch) moves."""
    residual_dropout = 3 + (0.5 if fused else 2.5) * dropout
    norms_residuals_dropouts = (2 * 2 + 2 * residual_dropout) * tokens * hidden * act
    activation = (3 if ffn_kind == "swiglu" else 2) * tokens * ffn_width * act
    return norms_residuals_dropouts + activation


def norm_activation_backward_bytes(tokens: int, hidden: float, ffn_width: float, act: int,
                                   ffn_kind: str, fused: bool = False,
                                   dropout: bool = True) -> float:
    """Backward bytes of the kernels ``norm_activation_bytes`` counts, in units of ``act``:

    - each norm's backward reads its input and the output's gradient and writes the input's:
      3 (Apex's and Transformer Engine's fused layer-norm backward; the weight gradients are
      reductions of ``hidden`` elements);
    - each residual branch's dropout backward reads the gradient and the one-byte mask and
      writes the branch's gradient: 2.5, none without ``dropout``; the residual add's gradient
      passes through unchanged, fused or not (``bias_dropout_add``'s autograd graph);
    - bias-GeLU's backward reads the input and the gradient and writes the input's: 3;
      SwiGLU's reads both halves and the gradient and writes both halves' gradients: 5
      (megatron/core/fusions/fused_bias_gelu.py, fused_bias_swiglu.py, ``bwd`` functions)."""
    del fused  # the backward kernels move the same bytes either way
    norms_residuals_dropouts = (2 * 3 + 2 * 2.5 * dropout) * tokens * hidden * act
    activation = (5 if ffn_kind == "swiglu" else 3) * tokens * ffn_width * act
    return norms_residuals_dropouts + activation


def loss_bytes(tokens: int, vocab: float) -> float:
    """Forward bytes of the loss over fp32 logits: write them, softmax reads and writes."""
    return 3 * 4.0 * tokens * vocab


def rope_bytes(tokens: int, width: float, act: int) -> float:
    """Bytes of rotating ``width`` query and key elements per token (``workload.rotated_width``),
    forward or backward alike: Megatron-LM applies RoPE with Transformer Engine's fused kernel
    unless told ``--no-rope-fusion`` (megatron/training/arguments.py;
    megatron/core/models/common/embeddings/rope_utils.py, ``fused_apply_rotary_pos_emb``),
    which reads each element and writes it rotated, and its backward the same for the
    gradient (the cos and sin tables are per position, negligible beside ``tokens x width``)."""
    return 2 * act * tokens * width
