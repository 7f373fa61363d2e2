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
- ``moe_act``: the experts' activation function (experts.py, ``activation_checkpoint``),
  reading fc1's output and writing fc2's input.

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
    """Weight GEMMs one layer re-runs per micro-batch in backward: MLA's up-projections
    (query ``d_c' -> a d_qk`` when it has a query latent, key-value ``d_c -> a (d_h + d_v)``;
    MLA runs with tp 1) under ``mla_up_proj``."""
    m, p = s.model, s.parallel
    if "mla_up_proj" not in p.recomputed or not m.mla:
        return ()
    tokens = s.training.micro_batch * m.seq_len // p.cp
    kv_up = Gemm(tokens, m.heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank)
    if m.q_lora_rank is None:
        return (kv_up,)
    return Gemm(tokens, m.heads * m.qk_head_dim, m.q_lora_rank), kv_up


def rerun_flops_per_sequence(s: Scenario) -> float:
    """FLOPs of ``rerun_gemms`` for one whole sequence (hardware FLOPs, not model FLOPs)."""
    per_microbatch = sum(g.flops for g in rerun_gemms(s))
    return per_microbatch * s.parallel.cp / s.training.micro_batch
