"""What every scenario section shares: the value sets of its fields and a frozen base that
refuses unknown keys."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict

from clustersim.fields import no_bool

FfnKind = Literal["gelu", "swiglu"]
Norm = Literal["layernorm", "rmsnorm"]
PositionEmbedding = Literal["learned", "rope", "none"]
Precision = Literal["bf16", "fp16", "fp32", "fp8"]
GradPrecision = Literal["bf16", "fp16", "fp32"]
Optimizer = Literal["adam", "sgd"]
OptimizerImpl = Literal["fused", "foreach"]
Framework = Literal["megatron", "deepspeed", "fsdp"]
MasterWeights = Literal["optimizer", "params", "remainders", "none"]
# What Adam's two moments (SGD's momentum) are stored in: Megatron-LM's --exp-avg-dtype and
# --exp-avg-sq-dtype choices (megatron/training/arguments.py, precision-aware optimizer).
MomentsDtype = Literal["fp32", "bf16", "fp16", "fp8"]
Recompute = Literal["none", "selective", "full"]
# Megatron-Core's selective-recomputation modules that clustersim costs (transformer_config.py,
# ``recompute_modules``; its default is ["core_attn"]), and torchtitan's op-level policy
# (``op_sac``, torchtitan/distributed/activation_checkpoint.py; model/recompute.py).
RecomputeModule = Literal["core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "op_sac"]
ZeroStage = Annotated[Literal[0, 1, 2, 3], BeforeValidator(no_bool)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
