"""A scenario's split as Megatron-DeepSpeed arguments and a DeepSpeed configuration
(``training.framework: deepspeed``).

Flags are Megatron-DeepSpeed's (deepspeedai/Megatron-DeepSpeed ``megatron/arguments.py`` @
4efb479d), in the form its ``examples_deepspeed/pretrain_llama2_distributed.sh`` passes them;
configuration keys are DeepSpeed's (``train_batch_size``, ``train_micro_batch_size_per_gpu``,
``zero_optimization``, ``bf16``/``fp16``, ``data_types``: deepspeed/runtime/config.py,
deepspeed/runtime/zero/config.py). What neither has is a ``#`` comment, never a made-up flag.
"""

from __future__ import annotations

from typing import Any

from clustersim.simulator.costs.optimizer_states import whole_optimizer_state
from clustersim.simulator.inputs import frameworks
from clustersim.simulator.inputs.scenario import Scenario

CONFIG_FILE = "ds_config.json"


def deepspeed_args(s: Scenario) -> list[str]:
    """One flag (with its value) per line; comments start with ``#``."""
    p, t = s.parallel, s.training
    args = [f"--tensor-model-parallel-size {p.tp}", f"--pipeline-model-parallel-size {p.pp}"]
    if p.pp == 1:
        # the non-pipeline engine: the one that runs ZeRO-2 and -3
        args.append("--no-pipeline-parallel")
    if p.sequence_parallel:
        args.append("--sequence-parallel")
    if p.schedule == "zb-h1":
        args.append("--enable-zbh1-pipeline")
    elif p.schedule != "1f1b" and p.pp > 1:
        args.append(f"# schedule {p.schedule}: DeepSpeed's pipeline engine runs 1F1B "
                    "(TrainSchedule) or, with --enable-zbh1-pipeline, ZB-H1")
    if p.cp > 1 and p.cp_comm == "a2a":
        args.append(f"--ds-sequence-parallel-size {p.cp}")  # Ulysses
    elif p.cp > 1:
        args.append(f"# cp_comm {p.cp_comm}: DeepSpeed's context parallelism is Ulysses' "
                    "all-to-alls (--ds-sequence-parallel-size), cp_comm a2a")
    if p.ep > 1 or p.folded:
        args.append("# expert parallelism: see DeepSpeed-MoE")
    args += [f"--micro-batch-size {t.micro_batch}", f"--global-batch-size {t.global_batch}"]
    if t.precision in ("bf16", "fp16"):
        args.append(f"--{t.precision}")
    elif t.precision == "fp8":
        args += ["--bf16", "# fp8: Megatron-DeepSpeed has no FP8 training"]
    if p.recompute == "full":
        args += ["--deepspeed-activation-checkpointing", "--recompute-granularity full",
                 "--recompute-method uniform"]
    elif p.recompute == "selective":
        args.append("--recompute-granularity selective")
    if p.tp_comm_overlap:
        args.append("# tp_comm_overlap: Transformer Engine's userbuffers, not in DeepSpeed")
    if p.tp > 1 and p.tp_backward_overlap and not p.sequence_parallel:
        args.append("# tp_backward_overlap: Megatron-DeepSpeed turns the asynchronous backward "
                    "all-reduce off whenever DeepSpeed runs (megatron/arguments.py)")
    if not whole_optimizer_state(t.master_weights, t.optimizer_moments):
        args.append(f"# optimizer state (master_weights {t.master_weights}, optimizer_moments "
                    f"{t.optimizer_moments}): DeepSpeed's ZeRO and BF16 optimizers keep an fp32 "
                    "master and fp32 moments")
    if p.hybrid_sharded and p.zero < 3:
        args.append(f"# dp_shard {p.dp_shard}: DeepSpeed shards ZeRO-{p.zero} over every "
                    "data-parallel rank; its hybrid sharding (MiCS, mics_shard_size) is ZeRO-3's")
    return args + ["--deepspeed", f"--deepspeed_config {CONFIG_FILE}", f"--zero-stage {p.zero}"]


def deepspeed_config(s: Scenario) -> dict[str, Any]:
    """The DeepSpeed configuration file of the split: batch, ZeRO stage and its overlap, and
    the precision; the gradient dtype only where it is not DeepSpeed's own default."""
    p, t = s.parallel, s.training
    zero: dict[str, Any] = {"stage": p.zero}
    default = frameworks.default_value("deepspeed", "parallel.overlap_grad_reduce", p.zero,
                                       p.pp > 1)
    if p.overlap_grad_reduce != default:
        zero["overlap_comm"] = p.overlap_grad_reduce
    if p.hybrid_sharded and p.zero == 3:  # MiCS: ZeRO-3 within groups, replicated across
        zero["mics_shard_size"] = p.dp_shard
    config: dict[str, Any] = {"train_batch_size": t.global_batch,
                              "train_micro_batch_size_per_gpu": t.micro_batch,
                              "zero_optimization": zero}
    if t.precision in ("bf16", "fp8"):
        config["bf16"] = {"enabled": True}
    elif t.precision == "fp16":
        config["fp16"] = {"enabled": True}
    if t.precision in frameworks.LOW_PRECISION and t.grad_dtype != frameworks.default_value(
            "deepspeed", "training.grad_dtype", p.zero, p.pp > 1):
        config["data_types"] = {"grad_accum_dtype": t.grad_dtype}
    return config
