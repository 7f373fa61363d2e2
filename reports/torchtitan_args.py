"""A scenario's split as torchtitan options (``training.framework: fsdp``).

Option names are the fields of torchtitan's ``ParallelismConfig`` and ``TrainingConfig``
(pytorch/torchtitan ``torchtitan/config/configs.py`` @ b5bcd76c), given as the
``--section.field value`` flags its launcher still takes over a configuration; what is chosen
in the configuration tree instead (the activation-checkpointing policy, Float8 training) is
a ``#`` comment naming the class, never a made-up flag.
"""

from __future__ import annotations

from clustersim.simulator.costs.optimizer_states import whole_optimizer_state
from clustersim.simulator.inputs import stack_choices
from clustersim.simulator.inputs.scenario import Scenario
from clustersim.simulator.pipeline.interleaved import microbatch_group
from clustersim.simulator.pipeline.stages import chunk_layers

# clustersim's schedules as ``get_schedule_class`` names them
# (torch/distributed/pipelining/schedules.py); ``stack_choices.py`` keeps fsdp to these.
SCHEDULE_CLASSES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B",
                    "zb-v": "ZBVZeroBubble", "dualpipev": "DualPipeV"}
# torchtitan's stages per rank when ``pipeline_parallel_layers_per_stage`` is not given: one
# for single-stage schedules, two for the others (``get_pipeline_metadata``,
# torchtitan/distributed/pipeline_parallel.py)
DEFAULT_STAGES_PER_RANK = 2


def _context_rotation(cp_comm: str) -> list[str]:
    """torchtitan's ``context_parallel_rotate_method``: ``allgather`` (its default) gathers
    every K/V shard at once; ``alltoall`` passes each shard round the ring (PyTorch's
    ``_AllToAllRotater``), as ``p2p`` does. Ulysses' head all-to-alls are not among them."""
    if cp_comm == "p2p":
        return ["--parallelism.context_parallel_rotate_method alltoall"]
    if cp_comm in ("a2a", "a2a+p2p"):
        return [f"# cp_comm {cp_comm}: torchtitan's context parallelism rotates K/V shards; "
                "it has no head all-to-all (Ulysses)"]
    return []


def torchtitan_args(s: Scenario) -> list[str]:
    """One option (with its value) per line; comments start with ``#``."""
    p, t = s.parallel, s.training
    args = _data_parallel(s)
    if p.tp > 1:
        args.append(f"--parallelism.tensor_parallel_degree {p.tp}")
        if not p.sequence_parallel:
            args.append("--parallelism.enable_sequence_parallel False")
    if p.cp > 1:
        args.append(f"--parallelism.context_parallel_degree {p.cp}")
        args += _context_rotation(p.cp_comm)
    if p.ep > 1:
        args.append(f"--parallelism.expert_parallel_degree {p.ep}")
        if p.tp > 1:  # torchtitan's experts take the TP degree only when told (default 1)
            args.append(f"--parallelism.expert_tensor_parallel_degree {p.etp}")
    args += _pipeline(s)
    tokens = s.model.seq_len
    args += [f"--training.max_context_length {tokens}",
             f"--training.num_tokens_per_microbatch_per_dp_rank {t.micro_batch * tokens}",
             f"--training.num_tokens_per_train_step {t.global_batch * tokens}"]
    if t.precision == "fp32":
        args.append("--training.mixed_precision_param float32")
    elif t.precision == "fp8":
        args.append("# fp8: Float8LinearConverter in the model's converters "
                    "(torchtitan/components/quantization/float8.py)")
    args.append(_checkpointing(s))
    if p.tp_comm_overlap:
        args.append("# tp_comm_overlap: Transformer Engine's userbuffers, not torchtitan's; "
                    "its Async TP (compile.enable_async_tensor_parallel) is another overlap")
    if not whole_optimizer_state(t.master_weights, t.optimizer_moments):
        args.append(f"# optimizer state (master_weights {t.master_weights}, optimizer_moments "
                    f"{t.optimizer_moments}): torch.optim's AdamW keeps its moments in the "
                    "parameters' fp32, the parameters being the master")
    return args


def _data_parallel(s: Scenario) -> list[str]:
    """FSDP2 shards over ``data_parallel_shard_degree``; ZeRO-2 keeps the gathered
    parameters from forward to backward (``reshard_after_forward`` never), ZeRO-3 frees
    them (always); torchtitan's ``default`` is never under a pipeline, always without
    (``get_fsdp_reshard_after_forward_policy``, torchtitan/distributed/fsdp.py). ZeRO-0 is
    DDP over ``data_parallel_replicate_degree``; hybrid sharding (``dp_shard``) is FSDP over
    the shard degree and its copies over the replicate one (HSDP)."""
    p = s.parallel
    if p.zero == 0:
        return [f"--parallelism.data_parallel_replicate_degree {p.dp}",
                "--parallelism.data_parallel_shard_degree 1"]
    # Hybrid sharding (HSDP): FSDP over the shard degree, its copies over the replicate one.
    degrees = [f"--parallelism.data_parallel_shard_degree {p.state_shards // p.cp}"]
    if p.hybrid_sharded:
        degrees.insert(0, f"--parallelism.data_parallel_replicate_degree {p.state_copies}")
    if p.zero == 1:
        return [*degrees,
                "# zero 1: FSDP2 has no optimizer-only sharding; this shards as ZeRO-2/3 do"]
    reshard = p.zero == 3
    policy = "default" if reshard == (p.pp == 1) else ("always" if reshard else "never")
    return [*degrees, f"--parallelism.fsdp_reshard_after_forward {policy}"]


def _pipeline(s: Scenario) -> list[str]:
    p = s.parallel
    if p.pp == 1:
        return []
    args = [f"--parallelism.pipeline_parallel_degree {p.pp}",
            f"--parallelism.pipeline_parallel_schedule "
            f"{SCHEDULE_CLASSES.get(p.schedule, p.schedule)}",
            f"--parallelism.num_pp_microbatches {s.microbatches}"]
    if p.schedule not in SCHEDULE_CLASSES:
        args.append(f"# schedule {p.schedule}: not a torch.distributed.pipelining schedule")
    if p.schedule == "interleaved" and s.microbatches % p.pp:
        args.append(_rounds_note(p.pp, s.microbatches))
    # torchtitan counts the embedding and the output layer as one layer each (weights 1, its
    # default: layer_split ends_as_layers) unless told 0 (layer_split even)
    weight = 1 if p.layer_split == "ends_as_layers" else 0
    if not weight:
        args += ["--parallelism.pipeline_parallel_first_stage_less_layers 0",
                 "--parallelism.pipeline_parallel_last_stage_less_layers 0"]
    if p.stage_layers:
        return args + [f"# chunks of {list(p.stage_layers)} layers: set "
                       "parallelism.module_fqns_per_model_part"]
    chunks, spread = p.pp * p.virtual_stages, s.model.layers + 2 * weight
    if p.virtual_stages > 1 and p.virtual_stages != DEFAULT_STAGES_PER_RANK:
        per_stage = -(-spread // chunks)
        if -(-spread // per_stage) == chunks:  # torchtitan's stage count from it
            args.append(f"--parallelism.pipeline_parallel_layers_per_stage {per_stage}")
        else:
            args.append(f"# chunks of {chunk_layers(s)} layers: set "
                        "parallelism.module_fqns_per_model_part")
    return args


def _rounds_note(pp: int, m: int) -> str:
    """Off the pp grid, torch's rounds (``stack_choices.torch_interleaved_rounds``) beside the
    Megatron-LM groups clustersim simulated."""
    rounds, group = stack_choices.torch_interleaved_rounds(pp, m), microbatch_group(pp, m)
    if rounds is None:
        return (f"# {m} micro-batches: torch's ScheduleInterleaved1F1B refuses a count that is "
                f"no multiple of its {max(1, m // pp)} rounds; simulated as Megatron-LM's "
                f"groups of {group}")
    return (f"# {m} micro-batches: torch's ScheduleInterleaved1F1B runs {rounds} rounds of "
            f"{m // rounds}; simulated as Megatron-LM's groups of {group}")


def _checkpointing(s: Scenario) -> str:
    """The ``activation_checkpoint`` policy: a class in the configuration tree, or its tyro
    subcommand (torchtitan/distributed/activation_checkpoint.py)."""
    p = s.parallel
    if p.recompute == "full":
        return "# activation_checkpoint: FullAC.Config() (subcommand full)"
    if p.recompute == "selective":
        if "op_sac" in p.recomputed:
            return "# activation_checkpoint: SelectiveAC.Config() (subcommand selective)"
        return ("# recompute selective of " + ", ".join(sorted(p.recomputed)) + ": torchtitan's "
                "SelectiveAC saves per op; subclass it (get_save_ops) to save these")
    return "# activation_checkpoint: None (subcommand none)"
