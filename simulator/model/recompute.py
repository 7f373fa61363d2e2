"""What Megatron-Core's selective recomputation modules re-run in backward, and its cost.

``parallel.recompute_modules`` (Megatron-Core's ``recompute_modules``, transformer_config.py)
drops tensors in forward (``activations.layer_tensors``) and rebuilds them before the backward
that needs them, so each module costs a second forward of what it covers:

- ``core_attn``: the attention core: unfused, its two batched GEMMs and the scale-mask-softmax
  and dropout between them ("QK^T, softmax, softmax dropout, and attention over V",
  Korthikanti et al. 2022 sec. 5); fused (flash attention), the kernel's forward, which
  Megatron-Core checkpoints too (``workload.recompute_flops_per_step``) though it saves almost
  no memory there;
- ``layernorm``: the norms whose output feeds several GEMMs (MLA's input norm, an MoE layer's
  pre-MLP norm; dense layers fuse theirs into a LayerNormLinear and are unaffected), an
  element-wise kernel reading its input and writing its output;
- ``mla_up_proj``: MLA's query and key-value up-projections (and RoPE), GEMMs
  (multi_latent_attention.py, ``qkv_up_checkpoint``);
- ``mlp``: a dense layer's whole MLP, FC1, the activation and FC2 with their TP collectives
  (transformer_layer.py, ``recompute_mlp``: MoE layers are left alone), keeping only its input;
- ``moe_act``: the experts' activation function (experts.py, ``activation_checkpoint``),
  reading fc1's output and writing fc2's input.

``op_sac`` is torchtitan's op-level selective activation checkpointing, a whole policy rather
than a module (torchtitan/distributed/activation_checkpoint.py, ``_apply_op_sac``): it saves
the outputs of the matmuls (``aten.mm``) and of the fused attention kernel and re-runs every
other op in backward, and of the matmuls it re-runs every second one in forward order (``mm``
counts 2, 4, 6: "Saves output of all compute ops, except every second mm"). In a Llama block
(torchtitan/models/llama3/model.py: ``wq, wk, wv``, ``wo``, then ``w2(silu(w1(x)) * w3(x))``)
that is ``wk``, ``wo`` and ``w3``; in a GELU MLP ``wk``, ``wo`` and ``fc2``. Its element-wise
re-run is every norm, residual add and activation of the forward (``compute.rerun_bytes``).

This module gives the GEMMs re-run, whose FLOPs the workload counts
(``workload.recompute_flops_per_step``); ``compute.py`` prices them with the other kernels
(``kernel_times``, ``rerun_gemm_time``) and the element-wise bytes re-run (``rerun_bytes``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .kernels import Gemm

if TYPE_CHECKING:
    from ..inputs.scenario import Scenario


def rerun_gemms(s: Scenario) -> tuple[Gemm, ...]:
    """Weight GEMMs one layer re-runs per micro-batch in backward: ``op_sac``'s every second
    matmul; MLA's up-projections (query ``d_c' -> a d_qk`` when it has a query latent,
    key-value ``d_c -> a (d_h + d_v)``, the rank's ``a/tp`` heads) under ``mla_up_proj``; a
    dense layer's FC1 (gate and up under SwiGLU) and FC2 under ``mlp``."""
    m, p = s.model, s.parallel
    if "op_sac" in p.recomputed:
        return op_sac_gemms(s)
    tokens = s.training.micro_batch * m.seq_len // p.cp
    gemms: list[Gemm] = []
    if "mla_up_proj" in p.recomputed and m.mla:
        heads = m.heads / p.tp
        if m.q_lora_rank is not None:
            gemms.append(Gemm(tokens, heads * m.qk_head_dim, m.q_lora_rank))
        gemms.append(Gemm(tokens, heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank))
    if "mlp" in p.recomputed and m.experts == 1:
        width = m.ffn_hidden / p.tp
        gemms += [Gemm(tokens, width, m.hidden)] * (m.ffn_matrices - 1)
        gemms.append(Gemm(tokens, m.hidden, width))
    return tuple(gemms)


def op_sac_gemms(s: Scenario) -> tuple[Gemm, ...]:
    """The matmuls ``op_sac`` re-runs per layer and micro-batch (the even ones in forward
    order): the key projection (``T x h -> kv_heads d / tp``, one head at least), the output
    projection (``a d / tp -> h``) and the MLP's second matmul (SwiGLU's up projection
    ``h -> f / tp``, or a GELU MLP's down projection ``f / tp -> h``)."""
    m, p = s.model, s.parallel
    tokens = s.training.micro_batch * m.seq_len // p.cp
    kv_width = m.kv_width_per_rank(p.tp)
    second_mlp = (Gemm(tokens, m.ffn_hidden / p.tp, m.hidden) if m.ffn_matrices == 3
                  else Gemm(tokens, m.hidden, m.ffn_hidden / p.tp))
    return (Gemm(tokens, kv_width, m.hidden), Gemm(tokens, m.hidden, m.query_width / p.tp),
            second_mlp)


def rerun_flops_per_sequence(s: Scenario) -> float:
    """FLOPs of ``rerun_gemms`` for one whole sequence (hardware FLOPs, not model FLOPs)."""
    per_microbatch = sum(g.flops for g in rerun_gemms(s))
    return per_microbatch * s.parallel.cp / s.training.micro_batch
