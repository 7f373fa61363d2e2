"""The training stack as a scenario field: the defaults Megatron-LM, DeepSpeed and FSDP use.

``training.framework`` names the stack. ``resolve`` fills every field a scenario left out with
that stack's default, read from the stack's own code (``DEFAULTS``, one row per field, each with
the file and function it comes from), so the rest of the simulator reads resolved fields only.
A field given explicitly always wins. Two rules are the stack's semantics rather than defaults:
DeepSpeed under bf16 has no unsharded optimizer (its stage 0 is the BF16_Optimizer, which shards
like ZeRO-1), and DeepSpeed's pipeline engine refuses ZeRO-2 and -3. docs/frameworks.md prints
``DEFAULTS`` as a table (``markdown_table``); a test keeps the two equal.

Versions read: Megatron-LM d98e8a64, DeepSpeed 38327e07 (2025-02), PyTorch 010ae4a8 (FSDP2),
torchtitan b5bcd76c.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clustersim.errors import ScenarioError

from ..pipeline.interleaved import INTERLEAVED_ORDER
from .specs import ParallelSpec, TrainingSpec
from .stack_defaults import (
    CONDITIONAL,
    ByPipeline,
    BySchedule,
    BySequenceParallel,
    ByZero,
    Split,
    show,
)

FRAMEWORKS = ("megatron", "deepspeed", "fsdp")
LOW_PRECISION = ("bf16", "fp8")  # mixed precision whose gradients a stack may keep wider


@dataclass(frozen=True, slots=True)
class Default:
    """One field's default under each stack, and where each was read."""

    field: str  # "section.name"
    values: dict[str, Any]  # per framework: a value or one of stack_defaults.CONDITIONAL
    source: str  # Markdown: the files and functions the values come from
    when: str = ""  # the condition under which the row applies, if any
    null: str = "`null`"  # what a null value means, as the docs' table prints it

    def value(self, framework: str, split: Split) -> Any:
        v = self.values[framework]
        return v.pick(split) if isinstance(v, CONDITIONAL) else v


# In resolution order: the ZeRO stage first, since later rows depend on it.
DEFAULTS: tuple[Default, ...] = (
    Default("parallel.zero", {"megatron": 0, "deepspeed": 0, "fsdp": ByPipeline(3, 2)}, (
        "Megatron-LM: `--use-distributed-optimizer` is off by default "
        "(megatron/training/arguments.py). DeepSpeed: `DeepSpeedZeroConfig.stage = 0` "
        "(deepspeed/runtime/zero/config.py). FSDP: `fully_shard(reshard_after_forward=True)`; "
        "torchtitan's `get_fsdp_reshard_after_forward_policy` (torchtitan/distributed/fsdp.py) "
        "keeps parameters unsharded after forward when pp is enabled, i.e. ZeRO-2")),
    Default("training.grad_dtype", {
        "megatron": "fp32", "deepspeed": ByZero(("fp32", "bf16", "bf16", "bf16")),
        "fsdp": "fp32"}, (
        "Megatron-LM: bf16 forces `accumulate_allreduce_grads_in_fp32` "
        "(megatron/training/arguments.py; docs/user-guide/features/dist_optimizer.md: bf16 "
        "parameters, fp32 gradients, 18 bytes or 6 + 12/d). DeepSpeed: "
        "`DeepSpeedEngine.get_data_types` accumulates in the model dtype under ZeRO and in fp32 "
        "without (deepspeed/runtime/engine.py), and `communication_data_type` is bf16; stage 0 "
        "is the `BF16_Optimizer`, which keeps fp32 gradients (`fp32_groups_gradients_flat`, "
        "deepspeed/runtime/bf16_optimizer.py) and all-reduces them cast to bf16 "
        "(`allreduce_bucket`): 2(n-1)/n x 2 bytes, the traffic of an fp32 reduce-scatter. "
        "FSDP: torchtitan's `mixed_precision_reduce = \"float32\"` "
        "(torchtitan/config/configs.py) as `MixedPrecisionPolicy(reduce_dtype=...)`; "
        "`foreach_reduce` reduce-scatters in it "
        "(torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py)"),
        when="under bf16 and fp8; under fp16 and fp32 every stack keeps the precision"),
    Default("training.master_weights", {
        "megatron": "optimizer", "deepspeed": "optimizer", "fsdp": "params"}, (
        "Megatron-LM: bf16 parameters and fp32 main parameters in the (distributed) optimizer "
        "(megatron/core/optimizer/distrib_optimizer.py). DeepSpeed: bit16 partitions and "
        "`single_partition_of_fp32_groups` (deepspeed/runtime/zero/stage_1_and_2.py), "
        "`fp32_groups_flat_partition` (bf16_optimizer.py). FSDP: the sharded parameters keep "
        "their fp32 dtype and `MixedPrecisionPolicy.param_dtype` casts only what is "
        "all-gathered; `foreach_reduce` casts the reduced shard back to it "
        "(`_to_dtype_if_needed(reduce_output, orig_dtype)`, _fsdp_collectives.py)")),
    Default("training.optimizer_impl", {
        "megatron": "fused", "deepspeed": "fused", "fsdp": "fused"}, (
        "Megatron-LM: Transformer Engine's `FusedAdam` (Apex's where TE is missing), "
        "megatron/core/optimizer/__init__.py. DeepSpeed: `FusedAdam` "
        "(deepspeed/ops/adam/fused_adam.py) unless `torch_adam: true` "
        "(`DeepSpeedEngine._configure_basic_optimizer`, engine.py). FSDP: torchtitan's "
        "`implementation = \"fused\"` (torchtitan/config/job_config.py, `Optimizer`), "
        "torch's `fused=True`. Each updates in place. torch.optim without `fused` runs "
        "`foreach` on GPUs (`_default_to_fused_or_foreach`, torch/optim/optimizer.py), as "
        "plain PyTorch loops and clustersim's own harness do")),
    Default("training.grad_accumulation_fusion", {
        "megatron": True, "deepspeed": False, "fsdp": False}, (
        "Megatron-LM: on unless `--no-gradient-accumulation-fusion` "
        "(megatron/training/arguments.py); Transformer Engine's `fuse_wgrad_accumulation` has "
        "the weight-gradient GEMM accumulate into `main_grad`. DeepSpeed and FSDP: the "
        "parameters' gradients are summed over micro-batches by autograd's `AccumulateGrad` "
        "(torch/csrc/autograd/functions/accumulate_grad.h), a kernel of its own per tensor; "
        "FSDP adds into the reduced shard (`foreach_reduce`, _fsdp_collectives.py)")),
    Default("parallel.overlap_grad_reduce", {
        "megatron": True, "deepspeed": ByZero((False, False, False, True)),
        "fsdp": ByPipeline(True, False)}, (
        "Megatron-LM: `--overlap-grad-reduce` is off in arguments.py but set in NVIDIA's "
        "recipes (examples/llama/train_llama3_8b_h100_fp8.sh), clustersim's default. DeepSpeed: "
        "`overlap_comm` defaults to `stage == 3` (`overlap_comm_valid`, zero/config.py): stages "
        "0-1 reduce at the accumulation boundary after the backward (engine.py "
        "`allreduce_gradients`, stage_1_and_2.py `reduce_gradients`), stage 2 reduces each "
        "bucket on the compute stream (`average_tensor`), and the pipeline engine runs "
        "`ReduceGrads` after the last micro-batch (deepspeed/runtime/pipe/schedule.py "
        "`TrainSchedule`). FSDP: reduce-scatters in each unit's post-backward; "
        "torch.distributed.pipelining schedules `REDUCE_GRAD` after all micro-batches "
        "(torch/distributed/pipelining/stage.py `perform_reduce_grad`)")),
    Default("parallel.overlap_param_gather", {
        "megatron": True, "deepspeed": ByZero((False, False, False, True)), "fsdp": True}, (
        "Megatron-LM: `--overlap-param-gather`, as `--overlap-grad-reduce`. DeepSpeed: ZeRO-1/2 "
        "and the BF16_Optimizer all-gather the updated weights inside `step()` "
        "(`all_gather_dp_groups`, stage_1_and_2.py, bf16_optimizer.py `update_lp_params`); "
        "ZeRO-3 prefetches. FSDP: each unit is all-gathered on its own stream before use, the "
        "next one ahead (`FSDPParamGroup._backward_prefetch`, _fsdp_param_group.py)")),
    Default("training.attention_kernel", {
        "megatron": None, "deepspeed": "flash2", "fsdp": "flash2"}, (
        "Megatron-Core: Transformer Engine's `DotProductAttention` picks by GPU: cuDNN's fused "
        "attention on Hopper and later (\"Disabling FlashAttention to give FusedAttention "
        "preference on Hopper+\", `get_attention_backend`, transformer_engine/pytorch/"
        "attention/dot_product_attention/utils.py), FlashAttention-3 class; flash-attn 2 "
        "before (A100). Null runs each GPU's own family, its profile's default (flash3 where "
        "the profile has it, else flash2), so the pools of a mixed cluster run theirs. "
        "DeepSpeed (Megatron-DeepSpeed): the flash-attn 2 package (`--use-flash-attn-v2`). "
        "FSDP (torchtitan, llm-foundry): "
        "`F.scaled_dot_product_attention`, whose flash backend is FlashAttention-2, or "
        "llm-foundry's `attn_impl: flash` (flash-attn 2); its 2023 benchmarks ran "
        "`attn_impl: triton`, which a case sets as `triton`"),
        null="the GPU's: `flash3` on Hopper and later, `flash2` before"),
    Default("training.loss_kernel", {
        "megatron": "vocab_parallel", "deepspeed": "vocab_parallel", "fsdp": "pytorch"}, (
        "Megatron-LM: `compute_language_model_loss` calls `vocab_parallel_cross_entropy` "
        "(megatron/core/models/common/language_module/language_module.py), which works on an "
        "fp32 copy of the logits in place and computes the gradient in the saved softmax "
        "(megatron/core/tensor_parallel/cross_entropy.py). DeepSpeed (Megatron-DeepSpeed): "
        "`post_language_model_processing` calls the same on `output.float()` "
        "(megatron/model/gpt_model.py). FSDP: torchtitan's `loss_fn` is "
        "`F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))` (train.py, "
        "later torchtitan/components/loss.py); llm-foundry's `loss_fn` defaults to "
        "`fused_crossentropy`, flash-attn's kernel (llmfoundry/models/mpt/modeling_mpt.py): "
        "set `fused` for it")),
    Default("parallel.pp_scatter_gather", {
        "megatron": True, "deepspeed": True, "fsdp": False}, (
        "Megatron-LM: `--scatter-gather-tensors-in-pipeline`, on by default, splits each "
        "pipeline send over the TP ranks and all-gathers it on arrival "
        "(megatron/p2p_communication.py, `split_tensor_into_1d_equal_chunks`, "
        "`gather_split_1d_tensor`; Narayanan et al. 2021 sec. 4.1), as the published Megatron-LM "
        "runs of 2021-23 ran; Megatron-Core's megatron/core/pipeline_parallel/"
        "p2p_communication.py sends whole tensors, so set `false` for Megatron-Core without "
        "sequence parallelism (with it the message is 1/tp either way). DeepSpeed: "
        "`is_pipe_partitioned = is_model_parallel`, activations sent as `PartitionedTensor` "
        "(deepspeed/runtime/pipe/engine.py). FSDP: torch.distributed.pipelining sends each "
        "stage's whole output (torch/distributed/pipelining/stage.py)"),
        when="with tp > 1 and pp > 1, without sequence parallelism"),
    Default("parallel.overlap_p2p_comm", {
        "megatron": BySchedule(False, True), "deepspeed": False, "fsdp": True}, (
        "Megatron-LM: `--no-overlap-p2p-communication` turns it off, so it is on by default "
        "(megatron/training/arguments.py, since 2023-10), and only for the interleaved "
        "schedule: without virtual stages arguments.py sets `overlap_p2p_comm = False`; "
        "`forward_backward_pipelining_with_interleaving` then sends with `isend` and waits "
        "for the handles only before the next use (megatron/core/pipeline_parallel/"
        "schedules.py). NeMo's interleaved recipes set it too (`overlap_p2p_comm: True`, "
        "NeMo-Framework-Launcher conf/training/gpt3/175b.yaml, NVIDIA's MLPerf GPT-3 configs "
        "of v3.0 and v3.1). DeepSpeed: `PipelineEngine` sends with blocking `p2p.send` "
        "(deepspeed/runtime/pipe/p2p.py). FSDP: torch.distributed.pipelining's "
        "`_PipelineScheduleRuntime` posts each send with `_batch_p2p` (`batch_isend_irecv`) "
        "and waits for its work at the step's end (torch/distributed/pipelining/"
        "schedules.py)"),
        when="with pp > 1"),
    Default("parallel.cp_comm", {
        "megatron": "p2p", "deepspeed": "a2a", "fsdp": "allgather"}, (
        "Megatron-LM: `--cp-comm-type` defaults to `p2p` (megatron/training/arguments.py), "
        "Transformer Engine's ring, `AttnFuncWithCPAndKVP2P` (transformer_engine/pytorch/"
        "attention/dot_product_attention/context_parallel.py). DeepSpeed: its sequence "
        "parallelism is Ulysses, `DistributedAttention`'s all-to-alls around the local "
        "attention (deepspeed/sequence/layer.py; Megatron-DeepSpeed's "
        "`--ds-sequence-parallel-size`). FSDP: torchtitan's `context_parallel_rotate_method` "
        "defaults to `allgather` (torchtitan/config/job_config.py), PyTorch's "
        "`_AllGatherRotater`, which all-gathers every K/V shard once "
        "(torch/distributed/tensor/experimental/_attention.py)"),
        when="with cp > 1"),
    Default("parallel.tp_backward_overlap", {
        "megatron": True, "deepspeed": BySequenceParallel(False, True), "fsdp": True}, (
        "Megatron-LM: `LinearWithGradAccumulationAndAsyncCommunication.backward` all-reduces "
        "the input gradient with `async_op=True` beside the weight-gradient GEMM "
        "(`--no-async-tensor-model-parallel-allreduce` turns it off; megatron/core/"
        "tensor_parallel/layers.py). DeepSpeed (Megatron-DeepSpeed): megatron/arguments.py "
        "sets `async_tensor_model_parallel_allreduce = False` whenever DeepSpeed runs (\"DeepSpeed "
        "seems to be incompatible\"), so `ColumnParallelLinear` all-reduces the input gradient "
        "in `_CopyToModelParallelRegion.backward` after the layer's backward GEMMs, the only "
        "path its mpu/layers.py had from the Megatron 2.4 fork of 2021-07 to the rebase of "
        "2023-07 (MT-NLG's code; BigScience's fork for BLOOM, bigscience-workshop/"
        "Megatron-DeepSpeed megatron/mpu/layers.py @ 119a0d2d, likewise); its "
        "sequence-parallel path (2024-09) reduce-scatters asynchronously beside the "
        "weight-gradient GEMM as Megatron-LM does. "
        "FSDP: torchtitan's plan is `parallel.tp_keeps_gathered_inputs` (below)"),
        when="with tp > 1"),
    Default("parallel.tp_keeps_gathered_inputs", {
        "megatron": False, "deepspeed": False, "fsdp": True}, (
        "Megatron-LM: `LinearWithGradAccumulationAndAsyncCommunication` saves the sequence "
        "shard of a column-parallel layer's input and all-gathers it again in backward "
        "(megatron/core/tensor_parallel/layers.py); Megatron-DeepSpeed likewise. FSDP "
        "(torchtitan): `PrepareModuleInput(desired_input_layouts=Replicate())` all-gathers the "
        "attention's and the MLP's input and `ColwiseParallel` the output layer's before the "
        "matmul, which saves the gathered tensor; the gather's backward is the gradient's "
        "reduce-scatter, nothing is gathered again (torchtitan/models/llama3/infra/"
        "parallelize.py, `apply_tp`); under op-level checkpointing the gathers are re-run "
        "instead (they are not on its save list)"),
        when="with tp > 1 and sequence parallelism"),
    Default("parallel.recompute_modules", {
        "megatron": None, "deepspeed": None, "fsdp": ["op_sac"]}, (
        "Megatron-LM: `--recompute-modules` defaults to `core_attn` "
        "(megatron/core/transformer/transformer_config.py), as Megatron-DeepSpeed's "
        "`--recompute-granularity selective` checkpoints the attention core. FSDP: torchtitan's "
        "selective mode is op-level by default (`selective_ac_option = \"op\"` in its Llama "
        "configs): `_apply_op_sac` saves the matmuls' and the attention kernel's outputs "
        "except every second matmul and re-runs the rest (torchtitan/distributed/"
        "activation_checkpoint.py; simulator/model/recompute.py)"),
        when="with recompute: selective", null="`[core_attn]`"),  # Megatron-Core's default
    Default("parallel.layer_split", {
        "megatron": "even", "deepspeed": "even", "fsdp": "ends_as_layers"}, (
        "Megatron-LM: `--account-for-embedding-in-pipeline-split` and "
        "`--account-for-loss-in-pipeline-split` are off by default (megatron/training/"
        "arguments.py); Megatron-DeepSpeed's `PipelineModule(partition_method="
        "'type:transformer')` balances the transformer layers alone (megatron/model/"
        "gpt_model.py). FSDP: torchtitan's `pipeline_parallel_first_stage_less_layers` and "
        "`_last_stage_less_layers` default to 1 (torchtitan/config/configs.py): "
        "`_generate_llm_fqn_per_model_part` spreads the layers plus one for the embedding and "
        "one for the output layer (torchtitan/distributed/pipeline_parallel.py)"),
        when="with pp > 1 and stage_layers null"),
    Default("parallel.zero3_prefetch", {"megatron": 1, "deepspeed": 1, "fsdp": 1}, (
        "FSDP: one unit ahead (`_backward_prefetch` unshards the previous unit of the forward "
        "order). DeepSpeed: `stage3_prefetch_bucket_size` = 5e7 elements ahead at parameter "
        "granularity (zero/config.py), less than one layer of a model over 50M parameters per "
        "layer: one unit is the nearest layer-granular depth. Megatron-LM: clustersim's "
        "default")),
    Default("parallel.zero3_pipeline_reduce", {
        "megatron": "microbatch", "deepspeed": "microbatch", "fsdp": "step"}, (
        "Megatron-LM: Megatron-FSDP's `no_sync` keeps reducing in its gradient-sharding modes "
        "(megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py). DeepSpeed: its "
        "pipeline engine refuses ZeRO-3. FSDP: PyTorch's pipelining syncs and reshards nothing "
        "in a backward (`backward_maybe_with_nosync`) and reduces after the last "
        "(`perform_reduce_grad`, torch/distributed/pipelining/stage.py)"),
        when="with zero 3 and pp > 1"),
)

# The stacks' semantics, printed under the defaults in docs/frameworks.md.
RULES: tuple[tuple[str, dict[str, str], str], ...] = (
    ("`zero: 0` under bf16/fp8", {
        "megatron": "as given", "deepspeed": "runs as ZeRO-1, fp32 gradients",
        "fsdp": "as given"},
        "DeepSpeed's bf16 path without ZeRO is the `BF16_Optimizer` "
        "(`_do_optimizer_sanity_check`, engine.py), which shards the fp32 master and moments "
        "over the data-parallel ranks (`fp32_groups_flat_partition`) and keeps whole fp32 "
        "gradients"),
    ("gradient buckets held through the backward (memory)", {
        "megatron": "ZeRO-2: 2 x 40M parameters", "deepspeed": "ZeRO-1/2, pp 1: 5e8 elements "
        "(x2 with `overlap_grad_reduce`); ZeRO-3: 5e8 elements beside its gathered units",
        "fsdp": "ZeRO-2: 2 x 40M parameters"},
        "DeepSpeed: `DeepSpeedZeroOptimizer.setup_buckets` allocates `reduce_bucket_size` "
        "(default 5e8, zero/config.py) elements of the model's dtype at the first gradient hook, "
        "a second under `overlap_comm`, and frees them at the step (zero/stage_1_and_2.py); the "
        "pipeline engine reduces after the last backward, and the BF16_Optimizer (bf16 with fp32 "
        "gradients at stage 0-1) has none; ZeRO-3 allocates one with the optimizer "
        "(zero/stage3.py) (`memory.deepspeed_reduce_buffers`)"),
    ("`zero: 2` or `3` with pp > 1", {
        "megatron": "2 as ZeRO-1; 3 as given", "deepspeed": "error",
        "fsdp": "2 as ZeRO-1; 3 reduced once, units gathered when sharded"},
        "DeepSpeed: `PipelineEngine.__init__` asserts \"ZeRO-2 and ZeRO-3 are incompatible "
        "with pipeline parallelism\" (deepspeed/runtime/pipe/engine.py). ZeRO-2 under a "
        "pipeline reduces once a step, ZeRO-3 as `zero3_pipeline_reduce` says "
        "(`ParallelSpec.sharded_gradients`, `deferred_zero3`)"),
)


def default_value(stack: str, field: str, zero: int, pipelined: bool,
                  interleaved: bool = False, sequence_parallel: bool = False) -> Any:
    """The value ``stack`` gives ``field`` ("section.name") when a scenario leaves it out, on
    a split of ZeRO stage ``zero``, with or without a pipeline, interleaved or not, with or
    without sequence parallelism (``DEFAULTS``)."""
    return next(r for r in DEFAULTS if r.field == field).value(
        stack, Split(zero, pipelined, interleaved, sequence_parallel))


def resolve(training: TrainingSpec, parallel: ParallelSpec) -> tuple[TrainingSpec, ParallelSpec]:
    """``training`` and ``parallel`` with every field left out set to the framework's default,
    then the framework's rules applied; raises ScenarioError where the stack cannot run it."""
    to_training, to_parallel = _updates(training, parallel)
    return training.model_copy(update=to_training), parallel.model_copy(update=to_parallel)


def resolve_training(training: TrainingSpec, parallel: ParallelSpec) -> TrainingSpec:
    """``resolve``'s training section. Of ``parallel`` it reads ``training_reads(parallel)``
    alone: the planner keeps one per distinct pair (``reports/plan_build.py``)."""
    return training.model_copy(update=_updates(training, parallel)[0])


def resolve_parallel(training: TrainingSpec, parallel: ParallelSpec) -> ParallelSpec:
    """``resolve``'s parallel section, or the ScenarioError of a stack that cannot run it. Of
    ``training`` it reads ``parallel_reads(training)`` alone."""
    return parallel.model_copy(update=_updates(training, parallel)[1])


def training_reads(parallel: ParallelSpec) -> tuple:
    """What ``resolve_training`` reads of the parallel section: whether its ZeRO stage was
    given, the stage, and whether there is a pipeline (the rows ``ByZero`` and
    ``ByPipeline``)."""
    return "zero" in _explicit(parallel), parallel.zero, parallel.pp > 1


def parallel_reads(training: TrainingSpec) -> tuple:
    """What ``resolve_parallel`` reads of the training section: the stack and the precision
    (DeepSpeed's BF16_Optimizer rule)."""
    return training.framework, training.precision


def _updates(training: TrainingSpec, parallel: ParallelSpec) -> tuple[dict, dict]:
    """The fields ``resolve`` sets, (training's, parallel's)."""
    stack = training.framework
    given = {f"training.{k}" for k in _explicit(training)} | {
        f"parallel.{k}" for k in _explicit(parallel)}
    zero, pipelined = parallel.zero, parallel.pp > 1
    interleaved = parallel.schedule in INTERLEAVED_ORDER
    updates: dict[str, dict[str, Any]] = {"training": {}, "parallel": {}}
    for row in DEFAULTS:
        section, name = row.field.split(".")
        if row.field in given:
            continue
        value = row.value(stack, Split(zero, pipelined, interleaved, parallel.sequence_parallel))
        if row.field == "parallel.recompute_modules" and (
                value is None or parallel.recompute != "selective"):
            continue  # null is Megatron-Core's default; modules apply to selective alone
        if row.field == "training.grad_dtype" and training.precision not in LOW_PRECISION:
            value = training.precision
        if row.field == "parallel.zero":
            zero = value
        updates[section][name] = value
    _check(stack, zero, parallel.pp)
    if zero_as_run(stack, zero, training.precision) != zero:
        updates["parallel"]["zero"] = zero_as_run(stack, zero, training.precision)
    return updates["training"], updates["parallel"]


def zero_as_run(stack: str, zero: int, precision: str) -> int:
    """The ZeRO stage ``stack`` runs when asked for ``zero``: DeepSpeed's bf16 (and fp8) path
    without ZeRO is the BF16_Optimizer, which shards like ZeRO-1 (``RULES``)."""
    return 1 if stack == "deepspeed" and zero == 0 and precision in LOW_PRECISION else zero


def _explicit(spec: TrainingSpec | ParallelSpec) -> set[str]:
    """Fields the scenario gave a value (null counts as left out)."""
    return {k for k in spec.model_fields_set if getattr(spec, k) is not None}


def _check(stack: str, zero: int, pp: int) -> None:
    if stack == "deepspeed" and pp > 1 and zero >= 2:
        raise ScenarioError("parallel.zero", f"DeepSpeed's pipeline engine runs ZeRO stage 0 "
                            f"or 1 only (deepspeed/runtime/pipe/engine.py); got zero {zero} "
                            f"with pp {pp}")


def markdown_table() -> str:
    """``DEFAULTS`` and ``RULES`` as docs/frameworks.md prints them."""
    lines = ["| field | " + " | ".join(FRAMEWORKS) + " | source |",
             "| --- |" + " --- |" * (len(FRAMEWORKS) + 1)]
    for row in DEFAULTS:
        field = f"`{row.field}`" + (f" ({row.when})" if row.when else "")
        cells = [str(v) if isinstance(v, CONDITIONAL) else row.null if v is None else show(v)
                 for v in (row.values[f] for f in FRAMEWORKS)]
        lines.append(f"| {field} | " + " | ".join(cells) + f" | {row.source} |")
    for what, values, source in RULES:
        lines.append(f"| {what} | " + " | ".join(values[f] for f in FRAMEWORKS)
                     + f" | {source} |")
    return "\n".join(lines) + "\n"
