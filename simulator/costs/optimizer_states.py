"""What an optimizer keeps and moves per parameter: the model states of Rajbhandari et al.
2020 (ZeRO, sec. 3.1 and Figure 1: ``2 + 2 + K`` bytes, ``K = 12`` for mixed-precision Adam),
the stacks' variants of them (a master kept whole, as remainders or not at all; 16-bit moments;
FSDP's fp32 parameters as the master) and the fp32 copy of narrower gradients its step makes.
Per parameter, before any rank's share is taken (``memory.py`` applies them to a stage).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..model import workload as wl

if TYPE_CHECKING:
    from ..inputs.scenario import Scenario

MASTER_BYTES = 4  # the fp32 master copy of a weight, under mixed precision
SUB_GROUP = 1e9  # DeepSpeed ZeRO-3's sub_group_size default (deepspeed/runtime/zero/config.py)
# What the optimizer keeps of the master, by ``training.master_weights``: all of it (4; the
# fp32 parameters themselves under ``params``), the 16 bits the bf16 weight lacks
# (``remainders``: apex's DistributedFusedAdam with ``store_param_remainders``, which NeMo set
# for bf16 models from 2022-10, nemo/collections/nlp/models/language_modeling/
# megatron_base_model.py ``setup_optimization``; Megatron-LM's precision-aware optimizer, an
# int16 shard, megatron/core/optimizer/distrib_optimizer.py) or none (the weights are updated
# in place: DistributedFusedAdam whose dtype is the model's, ``store_params`` false).
MASTER_KEPT = {"optimizer": MASTER_BYTES, "params": MASTER_BYTES, "remainders": 2, "none": 0}
MOMENTS_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}  # one moment, per parameter


def state_bytes_per_param(precision: str, optimizer: str, grad_dtype: str | None = None,
                          master_weights: str = "optimizer",
                          moments: str = "fp32") -> tuple[int, int, int]:
    """Bytes per parameter of (weights, gradients, optimizer state) before sharding.

    Mixed precision keeps an fp32 master copy in the optimizer state: Adam 4 + 4 + 4 = 12
    (ZeRO paper's K = 12), SGD with momentum 4 + 4 = 8; in fp32 the weights are the master.
    Less where the optimizer keeps less of the master (``MASTER_KEPT``) or its moments in 16
    bits (``moments``: DeepSeek-V3's bf16 moments beside an fp32 master, K = 4 + 2 + 2 = 8).
    Gradients take ``grad_dtype`` (default: the weights' precision, as in the ZeRO paper).
    """
    weight = wl.BYTES[precision]
    master = MASTER_KEPT[master_weights] if precision != "fp32" else 0
    return weight, wl.BYTES[grad_dtype or precision], master + moments_bytes(optimizer, moments)


def whole_optimizer_state(master_weights: str, moments: str) -> bool:
    """Whether the optimizer keeps a whole fp32 master (or the fp32 parameters) and fp32
    moments, as every stack's default optimizer does."""
    return moments == "fp32" and MASTER_KEPT[master_weights] == MASTER_BYTES


def moments_bytes(optimizer: str, moments: str = "fp32") -> int:
    """Bytes per parameter of the optimizer's moments: Adam's two, SGD's momentum."""
    return (2 if optimizer == "adam" else 1) * MOMENTS_BYTES[moments]


def model_state_bytes(params: float, shards: int, zero: int, precision: str = "bf16",
                      optimizer: str = "adam", grad_dtype: str | None = None,
                      master_weights: str = "optimizer",
                      moments: str = "fp32") -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes of ``params`` parameters on one of ``shards`` ranks.

    ZeRO stage ``zero`` shards the optimizer state (>= 1), gradients (>= 2) and weights (3).
    ``master_weights`` "params" (FSDP's MixedPrecisionPolicy) keeps the parameters themselves
    in fp32 as the master and casts them per use, so sharded gradients are the fp32 parameters'
    own (``foreach_reduce`` casts the reduced shard back, torch/distributed/fsdp/_fully_shard/
    _fsdp_collectives.py) and, under ZeRO-3, the shard is 4 + 4 + 8 bytes with Adam: no
    training-precision copy persists (the gathered units are ``stage_buffer_bytes``). Below
    ZeRO-3 the training-precision weights are whole through the step, the same bytes as a
    master in the optimizer state.
    """
    weight, grad, opt = state_bytes_per_param(precision, optimizer, grad_dtype,
                                              master_weights, moments)
    if master_weights == "params" and precision != "fp32":
        grad = MASTER_BYTES if zero >= 2 else grad
        if zero >= 3:
            weight, opt = MASTER_BYTES, opt - MASTER_BYTES
    return (params * weight / (shards if zero >= 3 else 1),
            params * grad / (shards if zero >= 2 else 1),
            params * opt / (shards if zero >= 1 else 1))


def fp32_gradient_copy_bytes(s: Scenario) -> int:
    """Bytes per parameter of the optimizer's shard that the step copies its gradients into:
    4 where a whole fp32 master steps on narrower gradients, else 0. Megatron-LM casts them
    as it hands them over (``shard_main_param.grad = shard_model_grad.float()``, megatron/core/
    optimizer/distrib_optimizer.py; ``main_param.grad = model_param.main_grad.float()``,
    optimizer.py), freed by the next ``zero_grad``; DeepSpeed's ZeRO-1/2 flattens them into an
    fp32 partition (``single_grad_partition``, deepspeed/runtime/zero/stage_1_and_2.py
    ``step``), its ZeRO-3 one ``sub_group_size`` at a time (``_release_sub_group`` drops each,
    zero/stage3.py; ``SUB_GROUP``). The precision-aware optimizer reads the narrow gradients in
    place (``decoupled_grad``): no copy with a master kept as remainders or not at all."""
    t = s.training
    narrow = wl.BYTES[t.grad_dtype] < MASTER_BYTES
    return MASTER_BYTES if (narrow and t.precision != "fp32"
                            and t.master_weights == "optimizer") else 0
