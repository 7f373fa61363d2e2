"""A scenario's split as Megatron-LM command-line arguments.

Flag names are Megatron-LM's (NVIDIA/Megatron-LM ``megatron/training/arguments.py``, which
adds ``--num-virtual-stages-per-pipeline-rank``, ``--overlap-grad-reduce``,
``--overlap-param-gather``, ``--use-distributed-optimizer`` and
``--data-parallel-sharding-strategy`` itself, and the rest from the fields of
``megatron/core/model_parallel_config.py`` (``tensor_model_parallel_size``,
``sequence_parallel``, ``tp_comm_overlap``, ``microbatch_group_size_per_vp_stage``,
``bf16`` ...),
``megatron/core/transformer/transformer_config.py`` (``recompute_granularity``,
``recompute_method``, ``recompute_num_layers``) and
``megatron/training/config/training_config.py`` (``micro_batch_size``,
``global_batch_size``), kebab-cased). A setting Megatron-LM has no flag for is a ``#``
comment line saying so, never a made-up flag.
"""

from __future__ import annotations

from clustersim.simulator.costs.optimizer_states import whole_optimizer_state
from clustersim.simulator.inputs.placement import context_levels
from clustersim.simulator.inputs.scenario import Scenario
from clustersim.simulator.pipeline.interleaved import INTERLEAVED_ORDER, microbatch_group
from clustersim.simulator.pipeline.stages import stage_layers


def megatron_args(s: Scenario) -> list[str]:
    """One flag (with its value) per line; comments start with ``#``."""
    p, t = s.parallel, s.training
    args = [f"--tensor-model-parallel-size {p.tp}", f"--pipeline-model-parallel-size {p.pp}"]
    if p.virtual_stages > 1:
        args.append(f"--num-virtual-stages-per-pipeline-rank {p.virtual_stages}")
        interleaved = p.schedule in INTERLEAVED_ORDER
        if interleaved and not p.overlap_p2p_comm:
            args.append("--no-overlap-p2p-communication")  # on by default when interleaved
        if interleaved and s.microbatches % p.pp:  # the default group is pp
            group = microbatch_group(p.pp, s.microbatches)
            args.append(f"--microbatch-group-size-per-virtual-pipeline-stage {group}")
    if p.cp > 1:
        args.append(f"--context-parallel-size {p.cp}")
        if p.cp_comm != "p2p":
            args.append(f"--cp-comm-type {p.cp_comm}")
        if p.cp_comm == "a2a+p2p":
            inner, ring = context_levels(s)
            args.append(f"--hierarchical-context-parallel-sizes {inner} {ring}")
    if p.ep > 1:  # Megatron-Core's default dispatcher is allgather; the model costs these
        args.append(f"--expert-model-parallel-size {p.ep}")
        args.append("--moe-token-dispatcher-type " + (
            "alltoall" if p.moe_dispatcher == "alltoall"
            else "flex --moe-flex-dispatcher-backend deepep"))
    if p.schedule == "combined-1f1b":  # interleaved 1F1B, each steady F and B one pair
        args.append("--overlap-moe-expert-parallel-comm" if p.ep > 1 else
                    "# combined-1f1b: Megatron-Core overlaps all-to-alls only with ep > 1")
    if s.model.mtp_layers:  # DeepSeek-V3's multi-token prediction, in the last chunk
        args.append(f"--mtp-num-layers {s.model.mtp_layers}")
    if p.folded:  # MoE parallel folding: whole experts, EP over the TP ranks too
        args.append(f"--expert-tensor-parallel-size {p.etp}")
    if p.sequence_parallel:
        args.append("--sequence-parallel")
    if p.tp_comm_overlap:
        args.append("--tp-comm-overlap")
    args += [f"--micro-batch-size {t.micro_batch}", f"--global-batch-size {t.global_batch}"]
    if t.precision in ("bf16", "fp16"):
        args.append(f"--{t.precision}")
    if t.precision == "fp8":  # Transformer Engine: E4M3 forward, E5M2 gradients
        args += ["--bf16", "--fp8-format hybrid"]
        if t.fp8_param_gather:
            args.append("--fp8-param-gather")
    args += _recompute(s) + _data_parallel(s) + _optimizer_state(s)
    if p.schedule not in MEGATRON_SCHEDULES:
        args.append(f"# schedule {p.schedule}: {SCHEDULE_NOTES.get(p.schedule, REGISTERED)}")
    layers = p.stage_layers
    if layers and len(layers) == p.pp * p.virtual_stages:  # per chunk: the ends may be empty
        if layers[0] == 0:
            args.append("--account-for-embedding-in-pipeline-split")
        if layers[-1] == 0:
            args.append("--account-for-loss-in-pipeline-split")
    elif not layers and p.layer_split == "ends_as_layers" and p.pp > 1:
        args += ["--account-for-embedding-in-pipeline-split",
                 "--account-for-loss-in-pipeline-split"]
        if (s.model.layers + 2) % (p.pp * p.virtual_stages):
            args.append(f"# layers + 2 = {s.model.layers + 2} do not divide into "
                        f"{p.pp * p.virtual_stages} chunks, which Megatron-Core asks of these "
                        "flags; clustersim gives the first chunks one more")
    if p.stage_pools is not None:
        args.append(f"# stages on pools {p.stage_pools} with layers {stage_layers(s)}: launch "
                    "the ranks pp outermost, each stage's on its pool's nodes; Megatron-LM "
                    "takes uneven layers as --pipeline-model-parallel-layout (experimental)")
    return args


# What Megatron-LM's flags above run: 1F1B, interleaved with --num-virtual-stages-per-
# pipeline-rank.
MEGATRON_SCHEDULES = ("1f1b", "interleaved", "combined-1f1b")
# A schedule registered with clustersim (docs/extending.md) that no note below names.
REGISTERED = "registered with clustersim, not a Megatron-LM schedule: these flags run 1F1B"
# Schedules with no Megatron-LM flag, and where they do run.
SCHEDULE_NOTES = {
    "gpipe": "Megatron-LM runs 1F1B (interleaved with virtual stages); it has no GPipe flag",
    "zb-h1": "not in Megatron-LM's main line; PyTorch runs it as ScheduleInterleavedZeroBubble "
             "with one stage per rank, as does the sail-sg/zero-bubble-pipeline-parallelism fork",
    "zb-h2": "not in Megatron-LM's main line; the sail-sg/zero-bubble-pipeline-parallelism fork "
             "builds it with its scheduler at a 2p - 1 micro-batch memory limit",
    "zb-v": "not in Megatron-LM's main line; PyTorch runs it as ScheduleZBVZeroBubble, the "
            "sail-sg fork as its ZB-V schedule",
    "dualpipev": "not in Megatron-LM's main line; PyTorch runs it as ScheduleDualPipeV, "
                 "deepseek-ai/DualPipe as DualPipeV",
    "dualpipe": "not in Megatron-LM's main line; deepseek-ai/DualPipe runs it as DualPipe, "
                "each rank given two modules (its stage of each direction's copy)",
}


def _recompute(s: Scenario) -> list[str]:
    if s.parallel.recompute == "selective":
        modules = s.parallel.recompute_modules  # None: Megatron-Core's default, core_attn
        if modules and "op_sac" in modules:
            return ["# recompute op_sac: torchtitan's op-level selective checkpointing "
                    "(activation_checkpoint.mode selective, selective_ac_option op); "
                    "Megatron-LM has no such flag"]
        return ["--recompute-granularity selective"] + (
            [f"--recompute-modules {' '.join(modules)}"] if modules is not None else [])
    if s.parallel.recompute == "full":
        # Every layer recomputed: 'uniform' over chunks of one layer.
        return ["--recompute-granularity full", "--recompute-method uniform",
                "--recompute-num-layers 1"]
    return []


def _data_parallel(s: Scenario) -> list[str]:
    p = s.parallel
    args = []
    if p.zero == 1:
        args.append("--use-distributed-optimizer")  # shards optimizer state over DP: ZeRO-1
        if p.hybrid_sharded:  # copies of it, each over dp_shard ranks, their shards all-reduced
            args.append(f"--num-distributed-optimizer-instances {p.state_copies}")
    elif p.zero in (2, 3):
        strategy = "optim_grads" if p.zero == 2 else "optim_grads_params"
        args.append(f"# zero {p.zero}: not a Megatron-LM flag; its nearest is Megatron-FSDP "
                    f"(--data-parallel-sharding-strategy {strategy}), which differs in "
                    f"details; or run ZeRO-{p.zero} with DeepSpeed")
        if p.hybrid_sharded:
            args.append(f"# dp_shard {p.dp_shard}: Megatron-FSDP's hybrid sharding, "
                        f"--num-distributed-optimizer-instances {p.state_copies}")
    if p.overlap_grad_reduce and p.dp * p.cp > 1:
        args.append("--overlap-grad-reduce")
    if p.overlap_param_gather and p.zero == 1:
        args.append("--overlap-param-gather")  # Megatron-LM: only with the distributed optimizer
    return args


def _optimizer_state(s: Scenario) -> list[str]:
    """Moments kept in fewer bits, or the master as its remainder bits: Megatron-LM's
    precision-aware optimizer (Transformer Engine's FusedAdam), which needs the distributed
    optimizer and, over bf16 weights, keeps the master as remainders unless TE is older than
    2.1 (``store_param_remainders``, megatron/core/optimizer/optimizer_config.py)."""
    t = s.training
    if whole_optimizer_state(t.master_weights, t.optimizer_moments):
        return []
    if t.optimizer_moments == "fp32" and t.master_weights == "none":
        return ["# master_weights none: Megatron-LM always keeps a master (fp32, fp16 or "
                "remainder bits); apex's DistributedFusedAdam with dtype bf16 keeps none"]
    if t.optimizer != "adam":  # optimizer_config.py asserts it
        return [f"# optimizer state (master_weights {t.master_weights}, optimizer_moments "
                f"{t.optimizer_moments}): Megatron-LM's precision-aware optimizer is Adam's only"]
    args = ["--use-precision-aware-optimizer"]
    if t.optimizer_moments != "fp32":
        args += [f"--exp-avg-dtype {t.optimizer_moments}",
                 f"--exp-avg-sq-dtype {t.optimizer_moments}"]
    if s.parallel.zero != 1:
        args.append("# the precision-aware optimizer needs the distributed optimizer "
                    "(--use-distributed-optimizer, zero 1)")
    bf16_weights = t.precision == "bf16" or (t.precision == "fp8" and not t.fp8_param_gather)
    if t.master_weights in ("optimizer", "none") and bf16_weights:
        args.append(f"# master_weights {t.master_weights}: with these flags Megatron-LM keeps "
                    "the master as 16-bit remainders over bf16 weights (2 bytes a parameter)")
    return args


def megatron_command_line(s: Scenario) -> str:
    """The flags on one line (comments dropped), to paste after ``pretrain_gpt.py``."""
    return " ".join(a for a in megatron_args(s) if not a.startswith("#"))
